"""Whether the compiled program's parameter gathers and gradient reductions send the element type the
config asked for.

A gradient reduction under qgZ is an all-to-all: its values travel as ``s8`` (int4 packed two to
a byte) beside ``f32`` scales, and any ``reduce-scatter`` left in the program is a gradient
reduced at full precision, which is reported.

A parameter gather is recognised by its size: each array an all-gather returns has as many
elements, per device, as one parameter gathered whole (or one layer of a scanned stack). With qwZ
every quantized parameter's gather must be int (``s8``); a gather in another type whose size is a
quantized parameter's, and no full-precision parameter's or scales', is one XLA (or a model that
gathers by itself) sent at full precision, and it is reported rather than silently counted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from jzero.dtypes import QUANTIZED_WIDTHS, by_name
from jzero.ledger.collectives import Collective
from jzero.records import record

__all__ = [
    "HLO_TYPES",
    "GatherMismatch",
    "GradientReductions",
    "ParameterGathers",
    "ReductionMismatch",
    "gradient_reductions",
    "parameter_gathers",
]


@record
class GatherMismatch:
    """A gather of a quantized parameter's size sent at another element type.

    Attributes:
      name: the op's HLO name.
      dtype: the element type it sends.
      elements: its elements.
    """

    name: str
    dtype: str
    elements: int


@record
class ParameterGathers:
    """What the compiled parameter gathers send (:func:`jzero.ledger.element_types.parameter_gathers`).

    Attributes:
      type: the HLO type the quantized values travel as.
      quantized_bytes: the bytes of those gathers per device per step.
      mismatched: the gathers of a quantized parameter's size sent otherwise.
    """

    type: str
    quantized_bytes: int
    mismatched: list[GatherMismatch]


@record
class ReductionMismatch:
    """A gradient reduction not sent as a quantized all-to-all.

    Attributes:
      name: the op's HLO name.
      kind: its op kind.
      dtype: its element type.
      bytes: its bytes per step.
    """

    name: str
    kind: str
    dtype: str
    bytes: int


@record
class GradientReductions:
    """What the compiled gradient reductions send (:func:`jzero.ledger.element_types.gradient_reductions`).

    Attributes:
      type: the HLO type the values travel as.
      width: the quantization asked for.
      quantized_bytes: the all-to-alls' values, bytes per step.
      scale_bytes: their scales, bytes per step.
      mismatched: the reductions sent otherwise.
    """

    type: str
    width: str
    quantized_bytes: int
    scale_bytes: int
    mismatched: list[ReductionMismatch]


# The HLO element type each quantization width is sent as.
HLO_TYPES = {width: by_name(width).hlo for width in QUANTIZED_WIDTHS}  # a quantized width's type in HLO text


def parameter_gathers(
    ops: Iterable[Collective], width: str, quantized: Iterable[int], others: Iterable[int]
) -> ParameterGathers:
    """The all-gathers of quantized parameters, by element type.

    Args:
      ops: the program's collectives (:func:`jzero.ledger.hlo.parse_collectives`).
      width: the quantization asked for (``int8``).
      quantized: elements per device of each quantized parameter gathered whole.
      others: elements per device of what else is gathered on purpose: full-precision parameters and
        the scales.

    Returns:
      ``type``, ``quantized_bytes`` and ``mismatched``: the HLO type asked for, the bytes per step of
      the gathers in it (loops times their trip counts), and each other-typed array whose size is
      a quantized parameter's (``name``, ``dtype``, ``elements``).
    """
    wanted = HLO_TYPES[width]
    sizes, expected = set(quantized), set(others)
    sent, mismatched = 0, []
    for op in ops:
        if op.kind != "all-gather":
            continue
        sent += sum(nbytes for dtype, nbytes in op.dtypes if dtype == wanted) * op.executions
        for dtype, dims in op.arrays:
            elements = math.prod(dims)
            if dtype != wanted and elements in sizes and elements not in expected:
                mismatched.append(GatherMismatch(name=op.name, dtype=dtype, elements=elements))
    return ParameterGathers(type=wanted, quantized_bytes=sent, mismatched=mismatched)


def gradient_reductions(ops: Iterable[Collective], width: str) -> GradientReductions:
    """qgZ's gradient reductions, by element type.

    Args:
      ops: the program's collectives (:func:`jzero.ledger.hlo.parse_collectives`).
      width: the quantization asked for (``int8`` or ``int4``).

    Returns:
      ``type``, ``quantized_bytes``, ``scale_bytes`` and ``mismatched``: the HLO type the values travel
      as (``s8`` for both widths: XLA widens ``s4``, so int4 is packed), the bytes per step of the
      all-to-alls' values and of their scales, and each reduce-scatter or other-typed all-to-all
      left (``name``, ``kind``, ``dtype``, ``bytes`` per step).
    """
    wanted = HLO_TYPES["int8"]
    sent = {wanted: 0, "f32": 0}
    mismatched = []
    for op in ops:
        if op.kind == "all-to-all":
            for dtype, nbytes in op.dtypes:
                if dtype in sent:
                    sent[dtype] += nbytes * op.executions
                else:
                    mismatched.append(ReductionMismatch(name=op.name, kind=op.kind, dtype=dtype, bytes=nbytes * op.executions))
        elif op.kind == "reduce-scatter":
            mismatched.append(ReductionMismatch(name=op.name, kind=op.kind, dtype=op.dtype, bytes=op.bytes * op.executions))
    quantized, scales = sent[wanted], sent["f32"]
    return GradientReductions(type=wanted, width=width, quantized_bytes=quantized, scale_bytes=scales, mismatched=mismatched)
