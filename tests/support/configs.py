"""The tests' tiny configs: a model small enough to compile in seconds on 2 cores."""

import sysconfig
from pathlib import Path

from jzero.config.loading import Config, load_config

TINY = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "model.seq_len=16",
    "train.global_batch_size=16",
    "data.max_bytes=200000",
    "train.eval_every=0",  # configs/gpt-tiny.yaml evaluates; training/test_eval.py tests that, the others need not compile it
]


STDLIB_GLOB = str(Path(sysconfig.get_paths()["stdlib"]) / "*.py")  # the default data's files, as a data.path


def tiny_config(*overrides: str) -> Config:
    """A model small enough to compile in seconds on 2 cores."""
    return load_config(None, [*TINY, *overrides])


STEPS = 20
LR = "optimizer.learning_rate=1e-3"
BF16 = ["precision.param_dtype=bfloat16", "precision.compute_dtype=bfloat16"]  # mixed precision (fp32 master)

ROOT = Path(__file__).resolve().parents[2]  # the repository
CONFIG = str(ROOT / "configs/gpt-tiny.yaml")
# ZeRO++ on the tiny model: qwZ int8 (its shards hold 128+ elements, so 64 per scale), hpZ over two hosts.
QWZ = ["zero.quantized_weights=int8", "zero.quantization_block=64"]
HPZ = ["mesh.axes={replica: 2, data: 4}", "zero.hierarchical=hpz"]
