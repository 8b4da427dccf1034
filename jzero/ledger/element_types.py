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

from jzero.ledger.hlo import Collective

__all__ = ["HLO_TYPES", "gradient_reductions", "parameter_gathers"]

# The HLO element type each quantization width is sent as.
HLO_TYPES = {"int8": "s8", "int4": "s4"}


def parameter_gathers(
    ops: Iterable[Collective], width: str, quantized: Iterable[int], others: Iterable[int]
) -> dict[str, object]:
    """The all-gathers of quantized parameters, by element type.

    Args:
      ops: the program's collectives (:func:`jzero.ledger.hlo.parse_collectives`).
      width: the quantization asked for (``int8``).
      quantized: elements per device of each quantized parameter gathered whole.
      others: elements per device of what else is gathered on purpose: full-precision parameters and
        the scales.

    Returns:
      ``{"type", "quantized_bytes", "mismatched"}``: the HLO type asked for, the bytes per step of
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
                mismatched.append({"name": op.name, "dtype": dtype, "elements": elements})
    return {"type": wanted, "quantized_bytes": sent, "mismatched": mismatched}


def gradient_reductions(ops: Iterable[Collective], width: str) -> dict[str, object]:
    """qgZ's gradient reductions, by element type.

    Args:
      ops: the program's collectives (:func:`jzero.ledger.hlo.parse_collectives`).
      width: the quantization asked for (``int8`` or ``int4``).

    Returns:
      ``{"type", "quantized_bytes", "scale_bytes", "mismatched"}``: the HLO type the values travel
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
                    mismatched.append({"name": op.name, "kind": op.kind, "dtype": dtype, "bytes": nbytes * op.executions})
        elif op.kind == "reduce-scatter":
            mismatched.append({"name": op.name, "kind": op.kind, "dtype": op.dtype, "bytes": op.bytes * op.executions})
    return {"type": wanted, "width": width, "quantized_bytes": sent[wanted], "scale_bytes": sent["f32"], "mismatched": mismatched}
