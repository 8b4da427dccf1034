"""What checkpoint verification costs: save and restore with jzero's manifest and without it.

    python benchmarks/checkpoint_verify.py [CONFIG] [--set KEY=VALUE ...] [--rounds 3] [--out DIR]

The state is the config's full train state (by default gpt2-small: 123.7M parameters, fp32 AdamW,
1.48 GB) with random moments, as in ``checkpoint_save.py``. It compares
:class:`jzero.checkpoint.runs.RunCheckpoints` as it is (the manifest is hashed in Orbax's commit
callback, and checked before every read) with the same class minus exactly that work:

- saves: each round saves the state asynchronously both ways, each into a fresh folder: the loop's
  blocking time (until ``save`` returns) and the time to the commit;
- restores: after an untimed one, each round restores one committed checkpoint onto the same
  shardings both ways (the files in the page cache, as after a save), and times the verification
  alone.

The two take turns going first, so machine noise hits both alike. Figures are medians; the ratios are
with over without, from the same run. Verification reads every file once more: from a cold disk it
costs a full extra read.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from checkpoint_save import arguments, trained_state  # this folder is on sys.path when run as a script


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _rounds(s, state, root: Path, rounds: int) -> dict[str, list[float]]:
    import jax

    from jzero.checkpoint.runs import RunCheckpoints, verify_step
    from jzero.config.schema import CheckpointConfig

    class Unverified(RunCheckpoints):
        """jzero's checkpoints with exactly the manifest's work removed: no hashing at the commit,
        no check before the read."""

        def _seal(self) -> None:
            pass

        def _verify(self, step, warn) -> None:
            pass

    times: dict[str, list[float]] = {}
    target = s.abstract_state()
    kinds = [("verified", RunCheckpoints), ("unverified", Unverified)]
    warm = RunCheckpoints(root / "warm-up", CheckpointConfig(every=1, keep=1))  # compiles the finite check, untimed
    warm.save(1, state, {}, {})
    warm.close()
    for r in range(rounds):  # saves: a fresh folder each
        for kind, cls in kinds[:: 1 if r % 2 == 0 else -1]:  # each goes first in every other round
            ckpts = cls(root / f"{kind}-{r}", CheckpointConfig(every=1, keep=1))
            t0 = time.perf_counter()
            ckpts.save(1, state, {}, {})
            times.setdefault(f"{kind}_blocked", []).append(time.perf_counter() - t0)
            ckpts.wait()
            times.setdefault(f"{kind}_commit", []).append(time.perf_counter() - t0)
            ckpts.close()
        print(", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
    for folder in root.iterdir():  # the saves' folders go, and their writes reach the disk, before the reads
        if folder.name != "warm-up":
            shutil.rmtree(folder)
    os.sync()
    readers = {kind: cls(root / "warm-up") for kind, cls in kinds}
    jax.block_until_ready(readers["verified"].restore(1, target).state)  # untimed: compiles, fills the page cache
    for r in range(rounds):  # restores: the same committed checkpoint, read each way in turn
        for kind, _ in kinds[:: 1 if r % 2 == 0 else -1]:
            t0 = time.perf_counter()
            jax.block_until_ready(readers[kind].restore(1, target).state)
            times.setdefault(f"{kind}_restore", []).append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        verify_step(readers["verified"].step_dir(1))
        times.setdefault("verify_alone", []).append(time.perf_counter() - t0)
        shown = ("verified_restore", "unverified_restore", "verify_alone")
        print(", ".join(f"{k} {times[k][-1]:.2f} s" for k in shown), flush=True)
    return times


def main(argv: list[str] | None = None) -> dict:
    args = arguments(__doc__).parse_args(argv)
    s, state = trained_state(args.config, args.set)

    import jax

    from jzero.sharding.mesh import mesh_shape

    root = Path(tempfile.mkdtemp(prefix="jzero-verify-bench-"))
    try:
        times = _rounds(s, state, root, args.rounds)
        on_disk = sum(f.stat().st_size for f in (root / "warm-up" / "checkpoints" / "1").rglob("*") if f.is_file())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "config": args.config,
        "overrides": args.set,
        "num_params": s.plan.num_params,
        "mesh": mesh_shape(s.mesh),
        "backend": jax.default_backend(),
        "bytes_on_disk": on_disk,
        "rounds": args.rounds,
        "times_s": times,
        "median_s": med,
        "ratios": {k: med[f"verified_{k}"] / med[f"unverified_{k}"] for k in ("blocked", "commit", "restore")},
        "verify_over_unverified_restore": med["verify_alone"] / med["unverified_restore"],
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "checkpoint_verify.json").write_text(json.dumps(result, indent=2))
    md = [
        f"{s.plan.num_params:,} parameters on {mesh_shape(s.mesh)} ({jax.default_backend()}), {on_disk / 1e9:.2f} GB on disk; "
        f"median of {args.rounds} alternating rounds",
        "",
        "| | with the manifest | without | ratio |",
        "|---|---|---|---|",
        *(
            f"| {label} | {med[f'verified_{k}']:.2f} s | {med[f'unverified_{k}']:.2f} s | {result['ratios'][k]:.2f} |"
            for k, label in (("blocked", "save: loop blocked"), ("commit", "save: committed after"), ("restore", "restore"))
        ),
        "",
        f"Verification alone: {med['verify_alone']:.2f} s, {result['verify_over_unverified_restore']:.2f} of the restore "
        "without it (the restores' own spread is wider: see times_s in the JSON).",
    ]
    (out / "checkpoint_verify.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return result


if __name__ == "__main__":
    main()
