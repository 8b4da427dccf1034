"""Element types: one row each, with every name jzero meets it by and its size.

JAX and numpy call a type ``bfloat16``, XLA's HLO text ``bf16``, a safetensors header ``BF16``. The
HLO reader, the checkpoint files, the precision settings and the quantized collectives all read
this one table, so a type (float8, say) is added in one place.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = [
    "FP8_RECIPES",
    "PRECISION_DTYPES",
    "QUANTIZED_WIDTHS",
    "TABLE",
    "DType",
    "array_bytes",
    "by_hlo",
    "by_name",
    "hlo_bytes",
]


@dataclasses.dataclass(frozen=True)
class DType:
    """One element type.

    Attributes:
      name: numpy's and JAX's name (``bfloat16``).
      hlo: XLA's, in HLO text (``bf16``).
      nbytes: bytes per element (0.5 for the 4-bit types).
      safetensors: the safetensors header's code, or None where it has none.
      floating: a floating-point type.
    """

    name: str
    hlo: str
    nbytes: float
    safetensors: str | None = None
    floating: bool = False


TABLE: tuple[DType, ...] = (
    DType("bool", "pred", 1, "BOOL"),
    DType("int4", "s4", 0.5), DType("uint4", "u4", 0.5),
    DType("int8", "s8", 1, "I8"), DType("uint8", "u8", 1, "U8"),
    DType("float8_e4m3fn", "f8e4m3fn", 1, "F8_E4M3", True), DType("float8_e5m2", "f8e5m2", 1, "F8_E5M2", True),
    DType("int16", "s16", 2, "I16"), DType("uint16", "u16", 2, "U16"),
    DType("float16", "f16", 2, "F16", True), DType("bfloat16", "bf16", 2, "BF16", True),
    DType("int32", "s32", 4, "I32"), DType("uint32", "u32", 4, "U32"), DType("float32", "f32", 4, "F32", True),
    DType("int64", "s64", 8, "I64"), DType("uint64", "u64", 8, "U64"), DType("float64", "f64", 8, "F64", True),
    DType("complex64", "c64", 8), DType("complex128", "c128", 16),
)  # fmt: skip
_BY_NAME = {d.name: d for d in TABLE}
_BY_HLO = {d.hlo: d for d in TABLE}

# What ``precision.*_dtype`` may name: the types jzero trains and reduces in.
PRECISION_DTYPES = ("float32", "bfloat16", "float16")
# ``precision.fp8``: no float8 matmuls, or float8 with one scale per tensor or per row
# (:mod:`jzero.memory.float8`).
FP8_RECIPES = ("none", "tensorwise", "rowwise")
# The integer types ZeRO++'s quantized collectives send, widest first (qwZ: int8; qgZ: either).
QUANTIZED_WIDTHS = ("int8", "int4")


def by_name(name: str) -> DType:
    """The row of numpy's name ``name`` (``KeyError`` if none)."""
    return _BY_NAME[name]


def by_hlo(hlo: str) -> DType | None:
    """The row of HLO's name ``hlo``, or None for a type the table lacks (a token, a tuple)."""
    return _BY_HLO.get(hlo)


def hlo_bytes(hlo: str) -> float:
    """Bytes per element of HLO's type ``hlo``; 0 for what holds no array data (a token)."""
    found = _BY_HLO.get(hlo)
    return found.nbytes if found is not None else 0


def array_bytes(shape: Iterable[int], dtype: Any) -> int:
    """Bytes of an array of ``shape`` and ``dtype`` (anything ``numpy.dtype`` takes)."""
    return math.prod(shape) * np.dtype(dtype).itemsize
