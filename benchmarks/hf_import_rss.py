"""Host memory of a Hugging Face import: peak RSS streaming the shards, against reading the whole model.

    python benchmarks/hf_import_rss.py [--layers 8] [--d-model 512] [--vocab 32000] [--out benchmarks/results]

A Llama checkpoint in PyTorch's naming and layout (random float32 weights, several safetensors files
and their index, ``config.json``) is written to a temporary folder: its largest tensor is the
embedding, and the whole checkpoint several times that. A fresh process per row, on 8 simulated CPU
devices at stage 3, builds the job (baseline: JAX, the plan, no weights), then places the weights
and reports VmHWM (peak RSS) from ``/proc/self/status``:

- ``stream``: :func:`jzero.checkpoint.hf.placed_params`, each device's shard read from the memory-mapped
  files by ``jax.make_array_from_callback``, as ``jzero checkpoint import`` and ``train.init_from`` do;
- ``whole``: every tensor read into host memory, stacked and transposed, then placed
  (``jax.device_put``): what a converter that holds the model does.

On the CPU the devices' memory is the host's, so the placed parameters themselves (the checkpoint's
bytes, spread over the 8 devices) are in the RSS of both: the table gives the peak over the
baseline, and that less the parameters' bytes, which is the reading's own cost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def write_checkpoint(folder: Path, layers: int, d: int, vocab: int) -> int:
    """A random Llama in Hugging Face's layout, in files of about 4 tensors each; its weights' bytes."""
    from safetensors.numpy import save_file

    heads, kv, mlp = 8, 4, 3 * d
    hd = d // heads
    shapes = {"model.embed_tokens.weight": (vocab, d), "model.norm.weight": (d,), "lm_head.weight": (vocab, d)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                   p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (kv * hd, d),
                   p + "self_attn.v_proj.weight": (kv * hd, d), p + "self_attn.o_proj.weight": (d, d),
                   p + "mlp.gate_proj.weight": (mlp, d), p + "mlp.up_proj.weight": (mlp, d),
                   p + "mlp.down_proj.weight": (d, mlp)}  # fmt: skip
    rng, names, weight_map = np.random.default_rng(0), list(shapes), {}
    groups = [names[i : i + 4] for i in range(0, len(names), 4)]
    for k, group in enumerate(groups):
        file = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file({n: rng.standard_normal(shapes[n], np.float32) * 0.02 for n in group}, folder / file)
        weight_map |= dict.fromkeys(group, file)
    total = sum(int(np.prod(s)) * 4 for s in shapes.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab, "hidden_size": d,
              "intermediate_size": mlp, "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
              "max_position_embeddings": 128, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
              "tie_word_embeddings": False}  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    return total


def _vmhwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


def measure(folder: Path, mode: str) -> dict[str, int]:
    """In this process (on 8 CPU devices): the baseline and the peak RSS placing the weights by ``mode``."""
    import jax

    from jzero.checkpoint.hf import NAMES, HFCheckpoint, model_section, placed_params
    from jzero.config.loading import load_config
    from jzero.training.job import build_job

    words = [f"model.{k}={json.dumps(v)}" for k, v in model_section(folder).items()]
    job = build_job(load_config(None, [*words, "model.seq_len=16", "train.global_batch_size=8", "zero.stage=3",
                                       "mesh.axes={data: 8}", "runtime.cpu_devices=8"]))  # fmt: skip
    base = _vmhwm()
    if mode == "stream":
        params = placed_params(folder, job.plan)
    else:
        tensors = HFCheckpoint(folder).tensors
        layers = job.config.model.n_layers
        whole = {}
        for t in job.plan.tensors:
            name, transposed = NAMES[t.path]
            read = [np.array(tensors[name.format(i)]) for i in range(layers)] if "{}" in name else [np.array(tensors[name])]
            read = [a.T if transposed else a for a in read]
            whole[t.path] = np.stack(read) if "{}" in name else read[0]
        arrays = [jax.device_put(whole[t.path], jax.sharding.NamedSharding(job.mesh, t.param_spec)) for t in job.plan.tensors]
        params = jax.tree.unflatten(jax.tree.structure(job.plan.params), arrays)
    jax.block_until_ready(params)
    return {"baseline": base, "peak": _vmhwm(), "params": sum(t.nbytes for t in job.plan.tensors)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--measure", nargs=2, metavar=("FOLDER", "MODE"), help=argparse.SUPPRESS)  # the child process
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(Path(args.measure[0]), args.measure[1])))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        size = write_checkpoint(folder, args.layers, args.d_model, args.vocab)
        largest = args.vocab * args.d_model * 4
        rows = {}
        for mode in ("stream", "whole"):
            env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=8", "JAX_PLATFORMS": "cpu"}
            child = [sys.executable, __file__, "--measure", str(folder), mode]
            done = subprocess.run(child, capture_output=True, text=True, env=env)
            if done.returncode:
                raise SystemExit(done.stderr[-3000:])
            rows[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    mib = 2**20
    lines = [f"checkpoint {size / mib:.1f} MiB in float32, its largest tensor {largest / mib:.1f} MiB "
             f"({size / largest:.1f}x); command: python benchmarks/hf_import_rss.py --layers {args.layers} "
             f"--d-model {args.d_model} --vocab {args.vocab}", "",
             "| mode | baseline RSS | peak RSS | peak over baseline | less the placed parameters | that over the checkpoint |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for mode, r in rows.items():
        over = r["peak"] - r["baseline"]
        own = over - r["params"]
        lines.append(f"| {mode} | {r['baseline'] / mib:.0f} MiB | {r['peak'] / mib:.0f} MiB | {over / mib:.0f} MiB | "
                     f"{own / mib:.0f} MiB | {own / size:.2f} |")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"checkpoint_bytes": size, "largest_tensor": largest, **rows}
    (args.out / "hf_import_rss.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "hf_import_rss.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
