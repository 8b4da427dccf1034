"""The two tokenizers a run can have: bytes (vocabulary 256, no file) or a Hugging Face
``tokenizers`` BPE saved as ``tokenizer.json``."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jzero.errors import ConfigError

__all__ = [
    "BYTES",
    "EOS",
    "EOS_TOKENS",
    "MIN_BPE_VOCAB",
    "PAD",
    "SPECIAL_TOKENS",
    "BpeTokenizer",
    "ByteTokenizer",
    "Tokenizer",
    "load_tokenizer",
    "train_bpe",
]

EOS = "<|endoftext|>"  # ends every document in a token file jzero's BPE writes
# A given tokenizer's end of document: the first of these it has (GPT-2's and jzero's, Llama 3's, Llama 2's).
EOS_TOKENS = (EOS, "<|end_of_text|>", "</s>")
PAD = "<|pad|>"
SPECIAL_TOKENS = (EOS, PAD)
MIN_BPE_VOCAB = 256 + len(SPECIAL_TOKENS)  # a byte-level BPE always holds every byte, then the special tokens


class Tokenizer:
    """What training and sampling need of a tokenizer.

    Attributes:
      vocab_size: ids run from 0 to ``vocab_size - 1``; ``model.vocab_size`` must hold them.
      eos_id: the end-of-document id, or None (bytes have none).
      digest: the SHA-256 of what defines it, recorded in a token file's header.
    """

    vocab_size: int
    eos_id: int | None
    digest: str

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids; text that is cut mid-character decodes with U+FFFD."""

    vocab_size = 256
    eos_id = None
    digest = hashlib.sha256(b"bytes").hexdigest()

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode("utf-8", errors="replace")


BYTES = ByteTokenizer()


class BpeTokenizer(Tokenizer):
    """A Hugging Face ``tokenizers`` tokenizer read from its ``tokenizer.json``."""

    def __init__(self, path: str | Path, key: str = "--tokenizer"):
        from tokenizers import Tokenizer as HfTokenizer  # only BPE runs need it

        path = Path(path)
        try:
            raw = path.read_bytes()
            self.hf = HfTokenizer.from_str(raw.decode("utf-8"))
        except OSError as err:
            raise ConfigError(key, f"cannot read {path}: {err.strerror or err}") from None
        except Exception as err:  # tokenizers raises plain Exceptions for a malformed file
            raise ConfigError(key, f"{path} is not a tokenizers tokenizer.json: {str(err).splitlines()[0]}") from None
        self.path = path
        self.vocab_size = self.hf.get_vocab_size(with_added_tokens=True)
        self.eos_id = next((i for i in map(self.hf.token_to_id, EOS_TOKENS) if i is not None), None)
        self.digest = hashlib.sha256(raw).hexdigest()

    def encode(self, text: str) -> list[int]:
        return self.hf.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids, skip_special_tokens=False)


def load_tokenizer(path: str | Path | None, key: str = "--tokenizer") -> Tokenizer:
    """The BPE tokenizer at ``path``, or bytes when ``path`` is None; ``key`` names it in errors."""
    return BYTES if path is None else BpeTokenizer(path, key)


def train_bpe(texts: Iterable[str], vocab_size: int) -> Any:
    """Train a byte-level BPE on ``texts``, streamed, with :data:`SPECIAL_TOKENS` as ids 0 and 1.

    Byte-level: every byte is in the vocabulary, so any text encodes and decodes back exactly.

    Args:
      texts: the documents; read once, one at a time.
      vocab_size: at most this many ids (fewer when the text runs out of merges); at least
        :data:`MIN_BPE_VOCAB`.

    Returns:
      The trained ``tokenizers.Tokenizer`` (``save`` writes its ``tokenizer.json``).
    """
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = HfTokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # jzero data prepare draws its own bar
    )
    hf.train_from_iterator(texts, trainer=trainer)
    return hf
