"""Language-model batches, on a grain ``MapDataset``: bytes of text files, or a token folder.

The training data is the bytes of ``data.path`` (up to ``data.max_bytes``, in memory) or the
training split of a ``jzero data prepare`` folder (``data.tokens``), read through a memory map: a
window's ids are sliced from the file when it is used, and the pages it touched are unmapped once
it is copied out (:func:`jzero.data.tokens.release_pages`), so memory does not grow with the file.

The order is a pure function of the seed: example ``i`` of the shuffled, repeated dataset is the
same on every mesh, stage and process count, and the global batch at step ``k`` is examples
``[k * B, (k + 1) * B)``. Each process reads only the rows its devices hold, so the iterator's whole
state is the next step number.

Validation (``train.eval_every > 0``) uses ``train.eval_batches`` fixed global batches of
consecutive windows, never shuffled: from the token folder's ``eval.bin``, from ``data.eval_path``,
for the stdlib's top-level sources from its packages' sources, or for other bytes from the last
windows of ``data.path``, which training then leaves out.
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

import grain
import jax
import numpy as np
from jax.sharding import Sharding

from jzero.config.schema import Config
from jzero.data.sources import expand_source
from jzero.data.tokens import TOKENIZER_FILE, TokenHeader, largest_id, open_split, read_header, release_pages
from jzero.errors import ConfigError

__all__ = [
    "EvalBatches",
    "TextBatches",
    "eval_data",
    "load_bytes",
    "resolve_files",
    "run_tokenizer_path",
    "stdlib_package_sources",
    "stdlib_sources",
    "text_batches",
    "train_data",
]


def stdlib_sources() -> list[Path]:
    """The Python standard library's own top-level ``.py`` files: real text, no download."""
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))


def stdlib_package_sources() -> list[Path]:
    """The ``.py`` files of the standard library's packages (its sub-folders, ``site-packages``
    left out): whole documents that :func:`stdlib_sources` never holds, the default's validation split."""
    root = Path(sysconfig.get_paths()["stdlib"])
    # site-packages is pruned, not walked and filtered: a Python with packages installed beside its
    # stdlib holds thousands of files there (docs/design.md, "Start-up").
    found = []
    for top in (p for p in root.iterdir() if p.is_dir() and p.name != "site-packages"):
        for folder, names, files in os.walk(top):
            names[:] = [n for n in names if n != "site-packages"]
            found += [Path(folder, f) for f in files if f.endswith(".py")]
    return sorted(found)


def resolve_files(path: str | None, key: str = "data.path") -> list[Path]:
    """``path`` may be a file, a folder (all files under it) or a glob; None means the stdlib sources."""
    if path is not None:
        return expand_source(path, key)
    if not (files := stdlib_sources()):
        raise ConfigError(key, "no files found at the Python stdlib")
    return files


def load_bytes(files: list[Path], max_bytes: int) -> np.ndarray:
    """Concatenate the files' bytes, in order, up to ``max_bytes``."""
    chunks, total = [], 0
    for f in files:
        if total >= max_bytes:
            break
        with open(f, "rb") as fh:
            data = fh.read(max_bytes - total)
        chunks.append(np.frombuffer(data, dtype=np.uint8))
        total += len(data)
    return np.concatenate(chunks) if chunks else np.zeros((0,), np.uint8)


def _window(tokens: np.ndarray, index: int, seq_len: int) -> np.ndarray:
    """Window ``index``: ``seq_len + 1`` ids from ``index * seq_len``; the last is the next window's first."""
    start = index * seq_len
    window = tokens[start : start + seq_len + 1].astype(np.int32)
    release_pages(tokens)  # copied out: a memory map's pages leave the RSS (the kernel maps megabytes per window)
    return window


def _device_array(shape: tuple[int, int], sharding: Sharding, rows: Callable[[int, int], np.ndarray]) -> jax.Array:
    """One global array whose callback loads only the rows ``[start, stop)`` a device holds."""

    def load(index: tuple[slice, ...]) -> np.ndarray:
        block = rows(index[0].start or 0, shape[0] if index[0].stop is None else index[0].stop)
        return block[:, index[1]] if len(index) > 1 else block

    return jax.make_array_from_callback(shape, sharding, load)


class TextBatches:
    """Deterministic global batches of ``seq_len + 1`` windows of a 1-D id array, addressable by step.

    ``tokens`` may be any 1-D integer array, an ``np.memmap`` of a token file included: windows are
    sliced from it on demand.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, global_batch_size: int, seed: int, key: str = "data.path"):
        n_windows = (len(tokens) - 1) // seq_len
        if n_windows < 1:
            unit = "bytes" if key == "data.path" else "tokens"
            raise ConfigError(key, f"holds {len(tokens)} {unit}; model.seq_len={seq_len} needs at least {seq_len + 1}")
        self.tokens = tokens
        self.seq_len = seq_len
        self.global_batch_size = global_batch_size
        self.seed = seed
        self.key = key
        self.num_windows = n_windows
        # Shuffle before repeat: each epoch is a fresh permutation of whole windows.
        self.dataset = grain.MapDataset.range(n_windows).shuffle(seed=seed).repeat().map(self._window)

    def _window(self, index: int) -> np.ndarray:
        return _window(self.tokens, index, self.seq_len)

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
        return _device_array(self.shape, sharding, lambda start, stop: self.rows(step, start, stop))

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
        """The step a saved :meth:`state` continues at; a state from another order is refused, unless
        it is before the first batch (``jzero checkpoint import``'s step 0): no order has begun."""
        if saved.get("next_step") == 0:
            return 0
        keys = {"seed": "seed", "global_batch_size": "train.global_batch_size", "seq_len": "model.seq_len",
                "num_windows": self.key}  # fmt: skip
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


class EvalBatches:
    """The validation batches: ``num_batches`` global batches of consecutive windows, unshuffled.

    Batch ``i`` holds windows ``[i * B, (i + 1) * B)`` of the validation ids, the same at every eval.

    Raises:
      ConfigError: ``train.eval_batches``: the ids hold fewer than ``num_batches * B`` windows.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, global_batch_size: int, num_batches: int, where: str):
        n_windows = max(len(tokens) - 1, 0) // seq_len
        need = num_batches * global_batch_size
        if n_windows < need:
            raise ConfigError(
                "train.eval_batches",
                f"the validation split ({where}) holds {n_windows:,} windows of seq_len+1 = {seq_len + 1} tokens; "
                f"{num_batches} batches of {global_batch_size} need {need:,}",
            )
        self.tokens = tokens
        self.seq_len = seq_len
        self.global_batch_size = global_batch_size
        self.num_batches = num_batches

    def __len__(self) -> int:
        return self.num_batches

    @property
    def shape(self) -> tuple[int, int]:
        return (self.global_batch_size, self.seq_len + 1)

    def rows(self, i: int, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``[start, stop)`` of eval batch ``i``."""
        if not 0 <= i < self.num_batches:
            raise IndexError(f"eval batch {i} of {self.num_batches}")
        stop = self.global_batch_size if stop is None else stop
        base = i * self.global_batch_size
        return np.stack([_window(self.tokens, base + r, self.seq_len) for r in range(start, stop)])

    def global_batch(self, i: int) -> np.ndarray:
        """Eval batch ``i``, ``[B, seq_len + 1]`` int32."""
        return self.rows(i)

    def device_batch(self, i: int, sharding: Sharding) -> jax.Array:
        """Eval batch ``i`` as one array; each process loads only its own rows."""
        return _device_array(self.shape, sharding, lambda start, stop: self.rows(i, start, stop))


def _token_header(folder: str, key: str, model_vocab: int) -> TokenHeader:
    """A token folder's header, once ``model.vocab_size`` is known to hold its tokenizer's ids."""
    header = read_header(folder, key)
    if header.vocab_size > model_vocab:
        raise ConfigError(
            "model.vocab_size",
            f"holds {model_vocab:,} ids, the tokenizer at {folder} has {header.vocab_size:,}: set at least {header.vocab_size}",
        )
    return header


def _open_ids(folder: str, split: str, key: str, header: TokenHeader, model_vocab: int) -> np.ndarray:
    """A split's ids (:func:`jzero.data.tokens.open_split`), once every one is below ``model.vocab_size``:
    the model has no embedding for one past it, and every step that met it would be NaN."""
    ids = open_split(folder, split, key, header)
    path = Path(folder) / header.splits[split].file
    top = largest_id(path, ids.dtype)
    if top >= model_vocab:
        raise ConfigError(key, f"{path} holds token id {top:,}, not below model.vocab_size={model_vocab:,}")
    return ids


def _eval_tokens_needed(config: Config) -> int:
    """The ids ``train.eval_batches`` global batches of windows span."""
    return config.train.eval_batches * config.train.global_batch_size * config.model.seq_len + 1


def _held_out(config: Config, n_bytes: int) -> int:
    """How many bytes at the end of ``data.path`` are the validation split (0: eval is off,
    ``data.eval_path`` is given, or the data is the stdlib's, validated on its packages); at least one
    training window is left, or it is an error."""
    if config.train.eval_every == 0 or config.data.eval_path is not None or config.data.path is None:
        return 0
    need, seq_len = _eval_tokens_needed(config), config.model.seq_len
    if n_bytes - need < seq_len + 1:
        held = config.train.eval_batches * config.train.global_batch_size
        windows = max(n_bytes - seq_len - 2, 0) // seq_len  # what a split could hold with one training window left
        raise ConfigError(
            "train.eval_batches",
            f"the validation split (the last windows of data.path's {n_bytes:,} bytes) can hold {windows:,} windows "
            f"of seq_len+1 = {seq_len + 1} tokens and leave one to train on; {config.train.eval_batches} batches need {held:,}",
        )
    return need


def train_data(config: Config) -> TextBatches:
    """The training batches ``config`` names: the bytes of ``data.path`` or the ids of ``data.tokens``.

    Args:
      config: the run's config.

    Returns:
      The :class:`TextBatches` of its seed, batch and sequence length. For a ``data.path`` with eval
      on and no ``data.eval_path``, the last windows (the validation split) are left out.

    Raises:
      ConfigError: no data at ``data.path``; a token folder that is not one (:func:`jzero.data.tokens.open_split`);
        a tokenizer larger than ``model.vocab_size``, or an id at or past it; too little data for one window.
    """
    m, t, d = config.model, config.train, config.data
    if d.tokens is not None:
        header = _token_header(d.tokens, "data.tokens", m.vocab_size)
        tokens = _open_ids(d.tokens, "train", "data.tokens", header, m.vocab_size)
        return TextBatches(tokens, m.seq_len, t.global_batch_size, config.seed, key="data.tokens")
    tokens = load_bytes(resolve_files(d.path), d.max_bytes)
    held = _held_out(config, len(tokens))
    return TextBatches(tokens[: len(tokens) - held], m.seq_len, t.global_batch_size, config.seed)


def eval_data(config: Config) -> EvalBatches | None:
    """The validation batches ``config`` names, or None when ``train.eval_every`` is 0.

    From the token folder's ``eval.bin``; or ``data.eval_path``, read as the training data is (a
    token folder of the same tokenizer, whose ``tokens.bin`` is used, or files of bytes); or, for the
    stdlib's top-level sources (``data.path`` null), its packages' sources (:func:`stdlib_package_sources`);
    or the last windows of ``data.path``'s bytes, which :func:`train_data` leaves out.

    Args:
      config: the run's config.

    Returns:
      ``train.eval_batches`` global batches (:class:`EvalBatches`), or None.

    Raises:
      ConfigError: ``train.eval_batches`` larger than the validation split; the data's errors, as in
        :func:`train_data`; a ``data.eval_path`` folder tokenized by another tokenizer.
    """
    m, t = config.model, config.train
    if t.eval_every == 0:
        return None
    tokens, where = _eval_tokens(config)
    return EvalBatches(tokens, m.seq_len, t.global_batch_size, t.eval_batches, where)


def _eval_tokens(config: Config) -> tuple[np.ndarray, str]:
    """The validation ids and where they are, for errors."""
    d, vocab = config.data, config.model.vocab_size
    if d.tokens is not None:
        header = _token_header(d.tokens, "data.tokens", vocab)
        if d.eval_path is None:
            return _open_ids(d.tokens, "eval", "data.tokens", header, vocab), str(Path(d.tokens) / "eval.bin")
        other = _token_header(d.eval_path, "data.eval_path", vocab)
        if other.tokenizer_hash != header.tokenizer_hash:
            raise ConfigError("data.eval_path", f"{d.eval_path} was tokenized by another tokenizer than data.tokens ({d.tokens})")
        return _open_ids(d.eval_path, "train", "data.eval_path", other, vocab), str(Path(d.eval_path) / "tokens.bin")
    if d.eval_path is not None:  # only the bytes the batches use are read
        files = resolve_files(d.eval_path, "data.eval_path")
        return load_bytes(files, _eval_tokens_needed(config)), f"data.eval_path {d.eval_path}"
    if d.path is None:
        return load_bytes(stdlib_package_sources(), _eval_tokens_needed(config)), "the stdlib's package sources"
    full = load_bytes(resolve_files(d.path), d.max_bytes)
    return full[len(full) - _held_out(config, len(full)) :].copy(), "the last windows of data.path"


def run_tokenizer_path(config: Config) -> Path | None:
    """The ``tokenizer.json`` of the run's data: the token folder's, or None for bytes."""
    return None if config.data.tokens is None else Path(config.data.tokens) / TOKENIZER_FILE


def text_batches(path: str | None, max_bytes: int, seq_len: int, global_batch_size: int, seed: int) -> TextBatches:
    """The batches of the bytes at ``path`` (None: the stdlib sources), up to ``max_bytes``; no hold-out."""
    return TextBatches(load_bytes(resolve_files(path), max_bytes), seq_len, global_batch_size, seed)
