"""Whether the compiled program's parameter gathers send the element type the config asked for.

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

__all__ = ["HLO_TYPES", "parameter_gathers"]

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
