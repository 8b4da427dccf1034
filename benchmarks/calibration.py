"""The step-time model against published training runs: each run compiled in jzero for its GPUs,
its predicted tokens/s per GPU beside the published figure.

    python benchmarks/calibration.py [--out benchmarks/results/calibration.json] [--only NAME] [--float8 | --float8-fit]

Every run here publishes its throughput with its exact shape, batch, hardware and parallelism:
MosaicML's llm-foundry MPT tables (scripts/train/benchmarking/README.md, "H100 80GB BF16": FSDP
FULL_SHARD, amp_bf16, an architecture like jzero's GPT: LayerNorm, a 4x GELU MLP, tied embeddings;
MPT's positions are learned and jzero's rotary, neither a matmul) and MaxText's Llama-2-7B on one
A3 VM (src/maxtext/configs/gpu/a3/llama_2_7b/README.md).
Each is compiled deviceless for its target at stage 3 (full sharding), and the model's terms are
solved for the efficiency that would match it exactly: the table's efficiency, :data:`EFFICIENCY`,
is the median of those, one value for every run. No run has its own factor.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # GPU targets compile on a CPU host
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jzero.config.loading import load_config  # noqa: E402
from jzero.ledger.prediction import StepParts, step_cost  # noqa: E402
from jzero.ledger.targets import parse_target, target_devices  # noqa: E402
from jzero.ledger.timing import EFFICIENCY, FLOAT8_EFFICIENCY, predict  # noqa: E402
from jzero.training.report import plan_report, report_inputs  # noqa: E402

MPT = "mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB BF16"
MAXTEXT = "AI-Hypercomputer/maxtext src/maxtext/configs/gpu/a3/llama_2_7b/README.md"


@dataclasses.dataclass(frozen=True)
class Run:
    """A published run: its jzero config (``--set`` words over configs/gpt-7b.yaml), target and figure."""

    name: str
    source: str
    quoted: str  # the published row, as printed
    target: str
    sets: tuple[str, ...]
    tokens_per_sec_per_gpu: float  # published (MaxText's: derived from its TFLOP/s, see below)
    base: str = "configs/gpt-7b.yaml"  # the config the sets apply to


def mpt(d_model: int, heads: int, layers: int, seq: int, batch: int, microbatches: int, remat: str) -> tuple[str, ...]:
    return (
        "model.vocab_size=50368", f"model.d_model={d_model}", f"model.n_heads={heads}", f"model.n_layers={layers}",
        f"model.seq_len={seq}", f"model.remat={remat}", "model.tie_embeddings=true", f"train.global_batch_size={batch}",
        f"train.microbatches={microbatches}", "precision.param_dtype=float32", "precision.compute_dtype=bfloat16",
    )  # fmt: skip


# MaxText counts 6 x params + causal attention (half of 12 L T d) per token: 492 TFLOP/s per chip over
# that count (Llama-2-7B: 6.74e9 params, 32 layers, d 4096, T 4096) is 492e12 / 4.366e10 tokens/s.
_MAXTEXT_FLOPS_PER_TOKEN = 6 * 6.738e9 + 12 * 32 * 4096 * 4096 / 2

RUNS = (
    Run("MPT-1B, 8 x H100", MPT, "1b | 2048 | 8 | 41.82 | ... | 14 | 1 | 112 | 45455 | False", "h100x8",
        mpt(2048, 16, 24, 2048, 112, 1, "none"), 45455),
    Run("MPT-7B, 8 x H100", MPT, "7b | 2048 | 8 | 46.44 | 46.44 | 6 | 1 | 48 | 10643 | False", "h100x8",
        mpt(4096, 32, 32, 2048, 48, 1, "none"), 10643),
    Run("MPT-7B seq 4096, remat, 8 x H100", MPT, "7b | 4096 | 8 | 40.42 | 53.9 | 16 | 2 | 256 | 8611 | True", "h100x8",
        mpt(4096, 32, 32, 4096, 256, 2, "full"), 8611),
    Run("MPT-3B, 64 x H100", MPT, "3b | 2048 | 64 | 40.8 | ... | 6 | 3 | 1152 | 22525 | False", "h100x64",
        mpt(2560, 20, 32, 2048, 1152, 3, "none"), 22525),
    # Multi-node, 13B and larger (issue 51): the same table's rows on 32 and 64 GPUs.
    Run("MPT-13B, 32 x H100", MPT, "13b | 2048 | 32 | 39.95 | 39.95 | ... | 2 | 1 | 64 | 4811 | False", "h100x32",
        mpt(5120, 40, 40, 2048, 64, 1, "none"), 4811),
    Run("MPT-13B, 64 x H100", MPT, "13b | 2048 | 64 | 39.86 | 39.86 | ... | 2 | 1 | 128 | 4800 | False", "h100x64",
        mpt(5120, 40, 40, 2048, 128, 1, "none"), 4800),
    Run("MPT-30B, remat, 32 x H100", MPT, "30b | 2048 | 32 | 43.92 | 58.57 | ... | 14 | 3 | 1344 | 2308 | True",
        "h100x32", mpt(7168, 56, 48, 2048, 1344, 3, "full"), 2308),
    Run("MPT-70B, remat, 32 x H100", MPT, "70b | 2048 | 32 | 36.15 | 48.2 | ... | 2 | 16 | 1024 | 882 | True",
        "h100x32", mpt(8192, 64, 80, 2048, 1024, 16, "full"), 882),
    Run("MPT-70B, remat, 64 x H100", MPT, "70b | 2048 | 64 | 42.57 | 56.76 | ... | 8 | 4 | 2048 | 1039 | True",
        "h100x64", mpt(8192, 64, 80, 2048, 2048, 4, "full"), 1039),
    # Llama-2-7B as jzero's Llama: 32 heads of keys and values, an 11,008-wide SwiGLU, 32,000 tokens.
    Run("MaxText Llama-2-7B, 8 x H100", MAXTEXT, "1x A3 (h100-80gb-8) | 492 TFLOP/sec/chip (per_device_batch_size=4, "
        "max_target_length=4096, remat_policy=minimal_flash, cudnn_flash_te)", "h100x8",
        ("model.vocab_size=32000", "model.n_kv_heads=32", "model.mlp_hidden=11008", "model.seq_len=4096",
         "train.global_batch_size=32", "model.remat=dots_with_no_batch_dims_saveable", "precision.param_dtype=float32",
         "precision.compute_dtype=bfloat16"), 492e12 / _MAXTEXT_FLOPS_PER_TOKEN, base="configs/llama3-8b.yaml"),
)  # fmt: skip


# Float8 rows (issue 54), predicted at EFFICIENCY and FLOAT8_EFFICIENCY and kept out of both fits: MPT-3B from
# llm-foundry's "H100 80GB FP8" table (amp_fp8: Transformer Engine's per-tensor scales), and Llama
# 3.1 8B from torchtitan's Table 1 (FSDP + torch.compile + Float8, selective activation
# checkpointing, on H100s with 96 GB of HBM2e at 2.4 TB/s and 500 W: slower than the SXM part the
# h100 target models, which its own footnote says).
MPT_FP8 = "mosaicml/llm-foundry scripts/train/benchmarking/README.md, H100 80GB FP8"
TORCHTITAN = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md, Table 1"
# The all-gather pipeliner holds two microbatches' saved values at once: 81.2 GB with it, over the
# 80 GB the run had (docs/planner.md, "Near the memory limit").
_UNPIPELINED = "compiler.xla_options.xla_gpu_enable_pipelined_all_gather=false"

# Float8's own efficiency (FLOAT8_EFFICIENCY), fitted apart from the rows above on published pairs
# of one job run in float8 and in bf16: llm-foundry's FP8 rows with a twin in its BF16 table (the
# same model, seq, batch, microbatches and remat on 8 H100s; the 1B at seq 8192 ran 64 rows in 4 in
# FP8 and 96 in 4 in bf16, each as published), and NVIDIA's MaxText Llama 2 70B recipe on 64 H100s
# (dgxc-benchmarking maxtext/README_70b.md: FSDP 64, 2 rows of 4,096 per GPU, remat save_qkv_proj,
# which jzero has not: compiled under full remat). Each pair's measured float8 speedup is matched with
# the bf16 run at EFFICIENCY, which keeps the bf16 model's own error out of float8's share. A pair
# counts where the model holds for its bf16 run: within the table's worst error (calibration.json's
# worst_error). Left out: the seq-32768 pairs (attention, bf16 in both, is most of their FLOPs:
# speedups 1.00 and 1.05) and the 350M rows (no twin).
@dataclasses.dataclass(frozen=True)
class Pair:
    """A published float8 run and its bf16 twin."""

    name: str
    float8: Run
    bf16: Run


def _mpt_pair(size: str, shape: tuple[int, int, int], seq: int, quoted: tuple[str, str], batches, tokens) -> Pair:
    name = f"MPT-{size} seq {seq}, 8 x H100"
    # The 3B's programs need over 80 GB with the all-gather pipeliner (81.4 GB at seq 512), as the
    # FP8 row above does: both runs of a 3B pair are compiled without it.
    unpipelined = (_UNPIPELINED,) if size == "3B" else ()
    runs = [
        Run(f"{name} {label}", source, row, "h100x8", (*mpt(*shape, seq, batch, micro, "none"), *unpipelined, *extra), published)
        for label, source, row, (batch, micro), published, extra in zip(
            ("FP8", "BF16"), (MPT_FP8, MPT), quoted, batches, tokens, (("precision.fp8=tensorwise",), ()), strict=True
        )
    ]
    return Pair(name, *runs)


_MAXTEXT_70B = "NVIDIA/dgxc-benchmarking maxtext/README_70b.md"
_LLAMA2_70B = ("model.vocab_size=32000", "model.rope_scaling=null", "model.seq_len=4096", "train.global_batch_size=128",
               "model.remat=full", "precision.param_dtype=float32", "precision.compute_dtype=bfloat16")  # fmt: skip
# Its step times over 128 rows of 4,096 tokens on 64 GPUs (the README's throughput formula).
_MAXTEXT_PAIR = Pair(
    "MaxText Llama 2 70B, 64 x H100",
    Run("MaxText Llama 2 70B FP8, 64 x H100", _MAXTEXT_70B, "Training step time | 4.324 (FP8, 64x H100)", "h100x64",
        (*_LLAMA2_70B, "precision.fp8=tensorwise"), 128 * 4096 / 4.324 / 64, base="configs/llama3.1-70b.yaml"),
    Run("MaxText Llama 2 70B BF16, 64 x H100", _MAXTEXT_70B, "Training step time | 6.999 (BF16, 64x H100)", "h100x64",
        _LLAMA2_70B, 128 * 4096 / 6.999 / 64, base="configs/llama3.1-70b.yaml"),
)  # fmt: skip


FLOAT8_PAIRS = (
    _mpt_pair("3B", (2560, 20, 32), 512, ("3b | 512 | 8 | 30.25 | ... | 40 | 6 | 1920 | ... | 36527 | ... | amp_fp8",
              "3b | 512 | 8 | 46.32 | ... | 40 | 6 | 1920 | ... | 27965 | amp_bf16"), ((1920, 6), (1920, 6)), (36527, 27965)),
    _mpt_pair("3B", (2560, 20, 32), 8192, ("3b | 8192 | 8 | 23.28 | ... | 3 | 6 | 144 | ... | 19146 | ... | amp_fp8",
              "3b | 8192 | 8 | 40.31 | ... | 3 | 6 | 144 | ... | 16578 | ... | amp_bf16"), ((144, 6), (144, 6)), (19146, 16578)),
    _mpt_pair("1B", (2048, 16, 24), 512, ("1b | 512 | 8 | 29.06 | ... | 56 | 4 | 1792 | ... | 70315 | ... | amp_fp8",
              "1b | 512 | 8 | 43.21 | ... | 56 | 4 | 1792 | ... | 52275 | amp_bf16"), ((1792, 4), (1792, 4)), (70315, 52275)),
    _mpt_pair("1B", (2048, 16, 24), 8192, ("1b | 8192 | 8 | 20.71 | ... | 2 | 4 | 64 | ... | 32010 | ... | amp_fp8",
              "1b | 8192 | 8 | 37.73 | ... | 3 | 4 | 96 | ... | 29157 | ... | amp_bf16"), ((64, 4), (96, 4)), (32010, 29157)),
    _MAXTEXT_PAIR,
)  # fmt: skip
_LLAMA_8B_ROWS = ("model.seq_len=8192", "model.remat=dots_with_no_batch_dims_saveable", "precision.param_dtype=float32",
                  "precision.compute_dtype=bfloat16")  # fmt: skip
_LLAMA_8B = (*_LLAMA_8B_ROWS, "train.global_batch_size=16")
# torchtitan's llama3_8b.toml on 4 and 8 hosts of 8 H200s, 400 Gb/s per GPU between hosts, with
# --float8.enable_fsdp_float8_all_gather and --float8.precompute_float8_dynamic_scale_for_fsdp.
TORCHTITAN_H200 = "pytorch/torchtitan benchmarks/llama3_8b_h200_2025-06_torchtitan.md, NUM_NODES | TPS/GPU | Memory(GiB)"
FLOAT8_RUNS = (
    Run("MPT-3B FP8, 8 x H100", MPT_FP8, "3b | 2048 | 8 | 27.7 | ... | 10 | 6 | 480 | ... | 30586 | ... | amp_fp8",
        "h100x8", (*mpt(2560, 20, 32, 2048, 480, 6, "none"), "precision.fp8=tensorwise", _UNPIPELINED), 30586),
    Run("torchtitan Llama 3.1 8B Float8, 8 x H100 96GB", TORCHTITAN, "FSDP + torch.compile + Float8 | 8,532 | 76.8",
        "h100hbm2ex8", (*_LLAMA_8B, "precision.fp8=tensorwise"), 8532, base="configs/llama3-8b.yaml"),
    Run("torchtitan Llama 3.1 8B bf16, 8 x H100 96GB", TORCHTITAN, "FSDP + torch.compile | 6,667 | 77.0",
        "h100hbm2ex8", _LLAMA_8B, 6667, base="configs/llama3-8b.yaml"),
    # Trainy's multi-host runs: Float8 with the float8 all-gather, 2 rows per GPU.
    *(Run(f"torchtitan Llama 3.1 8B Float8 + float8 gathers, {n} x H200", TORCHTITAN_H200, row, f"h200x{n}",
          (*_LLAMA_8B_ROWS, f"train.global_batch_size={2 * n}", "precision.fp8=tensorwise", "zero.fp8_gather=true"),
          published, base="configs/llama3-8b.yaml")
      for n, row, published in ((32, "4 | 10938 | 47.96", 10938), (64, "8 | 10753 | 46.97", 10753))),
)  # fmt: skip


def compile_run(run: Run):
    """Compile ``run`` for its target: its step cost, the target's hardware, its plan report and the
    seconds the compile took."""
    from jzero.training.job import build_job

    target = parse_target(run.target)
    config = load_config(ROOT / run.base, ["zero.stage=3", f"mesh.axes={{data: {target.count}}}", *run.sets])
    start = time.perf_counter()
    job = build_job(config, target_devices(target))
    _, compiled = job.compile_step()
    hardware = target.hardware()
    report = plan_report(job, compiled, hardware)
    parts = StepParts(report.model_flops, report.compiled_host, report.activations)
    cost = step_cost(report_inputs(job), parts, compiled.as_text(), _ops(compiled))
    return cost, hardware, report, time.perf_counter() - start


def measure(run: Run, compiled=None) -> dict:
    """Compile ``run`` for its target (or take ``compiled``, :func:`compile_run`'s); its step cost,
    the prediction at :data:`EFFICIENCY` (and :data:`FLOAT8_EFFICIENCY`) and the efficiencies that
    match the published figure."""
    cost, hardware, report, seconds = compiled or compile_run(run)
    predicted = predict(cost, hardware)
    gpus = parse_target(run.target).count
    published = run.tokens_per_sec_per_gpu * gpus
    return {
        "name": run.name,
        "source": run.source,
        "quoted": run.quoted,
        "target": run.target,
        "sets": list(run.sets),
        "published_tokens_per_sec_per_gpu": run.tokens_per_sec_per_gpu,
        "predicted_tokens_per_sec_per_gpu": predicted.tokens_per_sec / gpus,
        "error": predicted.tokens_per_sec / published - 1,
        "predicted_mfu": predicted.mfu,
        "bound": predicted.bound,
        "terms_s": {k: getattr(predicted, k) for k in ("compute_s", "memory_s", "exposed_communication_s", "host_transfer_s")},
        "executed_over_model_flops": cost.flops / cost.model_flops,
        "float8_share_of_flops": cost.float8_flops / cost.flops,
        "matching_efficiency": _solve(lambda e: predict(cost, hardware, e, e).tokens_per_sec, published),
        "matching_float8_efficiency": _solve(lambda e: predict(cost, hardware, float8_efficiency=e).tokens_per_sec, published)
        if cost.float8_flops else None,
        "device_peak_bytes": report.device_peak,
        "compile_s": seconds,
    }


def measure_pair(pair: Pair) -> dict:
    """Both runs of ``pair`` (:func:`measure`) and the float8 efficiency at which the model predicts
    the float8 speedup they measured, the bf16 run at :data:`EFFICIENCY`."""
    fp8, bf16 = compile_run(pair.float8), compile_run(pair.bf16)
    bf16_rate = predict(bf16[0], bf16[1]).tokens_per_sec
    published = pair.float8.tokens_per_sec_per_gpu / pair.bf16.tokens_per_sec_per_gpu
    speedup = lambda e: predict(fp8[0], fp8[1], float8_efficiency=e).tokens_per_sec / bf16_rate  # noqa: E731
    rows = {"float8": measure(pair.float8, fp8), "bf16": measure(pair.bf16, bf16)}
    return {
        "name": pair.name,
        "published_speedup": published,
        "predicted_speedup": speedup(FLOAT8_EFFICIENCY),
        "matching_float8_efficiency": _solve(speedup, published),
        **rows,
    }


def _ops(compiled):
    from jzero.ledger.hlo import parse_collectives

    return parse_collectives(compiled.as_text())


def _solve(rate, published: float) -> float | None:
    """The efficiency in (0.01, 1] at which ``rate`` (rising with it) reaches ``published``
    (bisection; None if none does)."""
    low, high = 0.01, 1.0
    if rate(high) < published or rate(low) > published:
        return None
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if rate(mid) < published else (low, mid)
    return (low + high) / 2


def _print(row: dict) -> None:
    float8 = row["matching_float8_efficiency"]
    print(
        f"{row['name']:<36} published {row['published_tokens_per_sec_per_gpu']:>8,.0f} tok/s/GPU  predicted "
        f"{row['predicted_tokens_per_sec_per_gpu']:>8,.0f}  error {100 * row['error']:+.1f}%  "
        f"matching efficiency {row['matching_efficiency']:.3f}"
        + (f", float8 alone {float8:.3f}" if float8 else "")
        + f"  ({row['bound']}-bound, compiled in {row['compile_s']:.0f} s)",
        flush=True,
    )


def _balanced(matching: list[float]) -> dict:
    # error ~ efficiency / matching - 1 for a compute-bound run: the minimax one balances the worst two
    return {
        "median": statistics.median(matching) if matching else None,
        "minimax": math.sqrt(min(matching) * max(matching)) if matching else None,
    }


def fit_float8(only: str | None) -> dict:
    """:data:`FLOAT8_PAIRS`, each pair's matching float8 efficiency and the balanced one."""
    pairs = []
    for pair in FLOAT8_PAIRS:
        if only and only not in pair.name:
            continue
        pairs.append(measure_pair(pair))
        row = pairs[-1]
        _print(row["float8"])
        _print(row["bf16"])
        print(f"  float8 speedup: published {row['published_speedup']:.3f}, predicted {row['predicted_speedup']:.3f}, "
              f"matching float8 efficiency {row['matching_float8_efficiency'] or float('nan'):.3f}", flush=True)  # fmt: skip
    bound = json.loads((ROOT / "benchmarks/results/calibration.json").read_text())["worst_error"]
    for row in pairs:
        row["in_fit"] = abs(row["bf16"]["error"]) <= bound and row["matching_float8_efficiency"] is not None
    balanced = _balanced([p["matching_float8_efficiency"] for p in pairs if p["in_fit"]])
    return {
        "pairs": pairs,
        "float8_efficiency": FLOAT8_EFFICIENCY,
        "bf16_error_bound": bound,
        **{f"{k}_float8_efficiency": v for k, v in balanced.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="default: benchmarks/results/calibration[_float8[_fit]].json")
    parser.add_argument("--only", default=None, help="run only the runs whose name contains this")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--float8", action="store_true", help="the float8 rows (FLOAT8_RUNS), outside both fits")
    mode.add_argument("--float8-fit", action="store_true", help="the float8 efficiency's fit (FLOAT8_PAIRS)")
    args = parser.parse_args()
    name = "calibration_float8_fit" if args.float8_fit else "calibration_float8" if args.float8 else "calibration"
    if args.float8_fit:
        result = fit_float8(args.only)
    else:
        rows = [measure(run) for run in (FLOAT8_RUNS if args.float8 else RUNS) if not args.only or args.only in run.name]
        for row in rows:
            _print(row)
        balanced = _balanced([r["matching_efficiency"] for r in rows if r["matching_efficiency"] is not None])
        result = {
            "runs": rows,
            "efficiency": EFFICIENCY,
            "float8_efficiency": FLOAT8_EFFICIENCY,
            "median_matching_efficiency": balanced["median"],
            "minimax_efficiency": balanced["minimax"],
            "worst_error": max((abs(r["error"]) for r in rows), default=None),
        }
    print(json.dumps({k: v for k, v in result.items() if k not in ("runs", "pairs")}))
    Path(args.out or ROOT / "benchmarks/results" / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
