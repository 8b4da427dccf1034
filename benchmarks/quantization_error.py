"""qwZ's error and scale bytes against the block size, on a trained run's parameters.

    python benchmarks/quantization_error.py RUN_DIR [--step N] [--blocks 64 256 1024 2048 4096 8192]

Every parameter of two or more dimensions (one layer of a scanned stack at a time) is cut into
blocks of consecutive elements, quantized to int8 with one float32 scale per block
(:func:`jzero.communication.quantize.quantize`) and dequantized. The table gives, per block size, the error
over all of them (root-mean-square error over root-mean-square value) and the bytes a gather sends
per element: 1 for the int8 value plus 4/block for the scales (bf16 sends 2).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np

from jzero.checkpoint.export import restore_numpy
from jzero.checkpoint.runs import RunCheckpoints
from jzero.communication.quantize import dequantize, quantize

ROOT = Path(__file__).resolve().parents[1]


def matrices(run_dir: Path, step: int | None) -> list[np.ndarray]:
    """The run's parameters of two or more dimensions, a scanned stack split into its layers."""
    checkpoints = RunCheckpoints(run_dir, read_only=True)
    step = step if step is not None else max(checkpoints.steps())
    params = restore_numpy(checkpoints.step_dir(step) / "state", None)
    out = []
    for path, value in params.items():
        if not path.startswith("params/") or value.ndim < 2:
            continue
        out.extend(value if path.startswith("params/blocks/") else [value])
    return [m.astype(np.float32) for m in out if m.ndim >= 2]


def error(values: list[np.ndarray], block: int) -> float:
    squared = total = 0.0
    for m in values:
        flat = m.reshape(-1)
        pad = -len(flat) % block
        blocks = jnp.asarray(np.pad(flat, (0, pad)).reshape(-1, block))
        back = np.asarray(dequantize(*quantize(blocks), jnp.float32)).reshape(-1)[: len(flat)]
        squared += float(np.sum((back - flat) ** 2, dtype=np.float64))
        total += float(np.sum(flat.astype(np.float64) ** 2))
    return (squared / total) ** 0.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--step", type=int)
    parser.add_argument("--blocks", type=int, nargs="+", default=[64, 256, 1024, 2048, 4096, 8192])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    values = matrices(args.run_dir, args.step)
    rows = {block: {"relative_rms_error": error(values, block), "bytes_per_element": 1 + 4 / block} for block in args.blocks}
    lines = [
        f"`python benchmarks/quantization_error.py {args.run_dir}`: {len(values)} matrices, "
        f"{sum(v.size for v in values):,} elements",
        "",
        "| block | relative RMS error | bytes per element sent (bf16: 2) |",
        "|---|---|---|",
        *(f"| {b} | {r['relative_rms_error']:.5f} | {r['bytes_per_element']:.4f} |" for b, r in rows.items()),
    ]
    text = "\n".join(lines)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "quantization_error.md").write_text(text + "\n")
    (args.out / "quantization_error.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
