"""Byte-level language-model batches from real text, on a grain ``MapDataset``.

The order is a pure function of the seed: example ``i`` of the shuffled, repeated dataset is the
same on every mesh, stage and process count, and the global batch at step ``k`` is examples
``[k * B, (k + 1) * B)``. Each process reads only the rows its devices hold, so the iterator's whole
state is the next step number.
"""

from __future__ import annotations

import glob
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import grain
import jax
import numpy as np
from jax.sharding import Sharding

from jzero.errors import ConfigError

__all__ = [
    "TextBatches",
    "load_bytes",
    "resolve_files",
    "stdlib_sources",
    "text_batches",
]


def stdlib_sources() -> list[Path]:
    """The Python standard library's own top-level ``.py`` files: real text, no download."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def resolve_files(path: str | None) -> list[Path]:
    """``path`` may be a file, a folder (all files under it) or a glob; None means the stdlib sources."""
    if path is None:
        files = stdlib_sources()
    elif Path(path).is_file():
        files = [Path(path)]
    elif Path(path).is_dir():
        files = sorted(p for p in Path(path).rglob("*") if p.is_file())
    else:
        files = sorted(Path(p) for p in glob.glob(path, recursive=True) if Path(p).is_file())
    if not files:
        raise ConfigError("data.path", f"no files found at {path or 'the Python stdlib'}")
    return files


def load_bytes(files: list[Path], max_bytes: int) -> np.ndarray:
    """Concatenate the files' bytes, in order, up to ``max_bytes``."""
    chunks, total = [], 0
    for f in files:
        if total >= max_bytes:
            break
        data = f.read_bytes()[: max_bytes - total]
        chunks.append(np.frombuffer(data, dtype=np.uint8))
        total += len(data)
    return np.concatenate(chunks) if chunks else np.zeros((0,), np.uint8)


class TextBatches:
    """Deterministic global batches of ``seq_len + 1`` byte windows, addressable by step."""

    def __init__(self, tokens: np.ndarray, seq_len: int, global_batch_size: int, seed: int):
        n_windows = (len(tokens) - 1) // seq_len
        if n_windows < 1:
            raise ConfigError("data.path", f"holds {len(tokens)} bytes; model.seq_len={seq_len} needs at least {seq_len + 1}")
        self.tokens = tokens
        self.seq_len = seq_len
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.num_windows = n_windows
        # Shuffle before repeat: each epoch is a fresh permutation of whole windows.
        self.dataset = grain.MapDataset.range(n_windows).shuffle(seed=seed).repeat().map(self._window)

    def _window(self, index: int) -> np.ndarray:
        start = index * self.seq_len
        return self.tokens[start : start + self.seq_len + 1].astype(np.int32)

    @property
    def shape(self) -> tuple[int, int]:
        return (self.global_batch_size, self.seq_len + 1)

    def rows(self, step: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` of the global batch at ``step``."""
        stop = self.global_batch_size if stop is None else stop
        base = step * self.global_batch_size
        return np.stack([self.dataset[base + r] for r in range(start, stop)])

    def global_batch(self, step: int) -> np.ndarray:
        return self.rows(step)

    def device_batch(self, step: int, sharding: Sharding) -> jax.Array:
        """The global batch at ``step`` as one array; each process loads only its own rows."""

        def load(index: tuple[slice, ...]) -> np.ndarray:
            rows = index[0]
            block = self.rows(step, rows.start or 0, rows.stop)
            return block[:, index[1]] if len(index) > 1 else block

        return jax.make_array_from_callback(self.shape, sharding, load)

    def state(self, next_step: int) -> dict[str, int]:
        """The iterator's state before ``next_step``: what a checkpoint stores to continue the order."""
        return {
            "next_step": next_step,
            "seed": self.seed,
            "global_batch_size": self.global_batch_size,
            "seq_len": self.seq_len,
            "num_windows": self.num_windows,
        }

    def check_state(self, saved: dict[str, int]) -> int:
        """The step a saved :meth:`state` continues at; a state from another order is refused."""
        keys = {"seed": "seed", "global_batch_size": "train.global_batch_size", "seq_len": "model.seq_len",
                "num_windows": "data.path"}  # fmt: skip
        for name, key in keys.items():
            if saved.get(name) != getattr(self, name):
                what = "windows in the data" if name == "num_windows" else name
                raise ConfigError(
                    key,
                    f"the checkpoint's sample order has {what} = {saved.get(name)}, this run {getattr(self, name)}; "
                    "resuming would not continue it",
                )
        return int(saved["next_step"])

    def iterate(self, sharding: Sharding, start_step: int = 0) -> Iterator[tuple[int, jax.Array]]:
        step = start_step
        while True:
            yield step, self.device_batch(step, sharding)
            step += 1


def text_batches(path: str | None, max_bytes: int, seq_len: int, global_batch_size: int, seed: int) -> TextBatches:
    return TextBatches(load_bytes(resolve_files(path), max_bytes), seq_len, global_batch_size, seed)
