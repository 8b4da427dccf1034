"""TODO"""

from __future__ import annotations

import collections
import re
from typing import Any

import jax

from jzero.ledger.hlo_text import _ARRAY, _array_bytes, _dims
from jzero.memory import offload
from jzero.records import record

__all__ = [
    "CompiledHost",
    "CompiledMemory",
    "compiled_memory",
    "flops_per_device",
    "host_entry_bytes",
    "live_bytes_per_device",
    "live_bytes_per_process",
]

_ENTRY_LAYOUT = re.compile(r"entry_computation_layout=\{\((?P<args>.*?)\)->(?P<outs>.*?)\}(?:,\s*\w+=|$)", re.MULTILINE)


def host_entry_bytes(hlo_text: str) -> dict[str, int]:
    """Bytes per device of the program's arguments and outputs in host memory (layout ``S(5)`` in
    its entry layout): what a ``pinned_host`` sharding keeps off the device."""
    match = _ENTRY_LAYOUT.search(hlo_text)
    if not match:
        return {"argument": 0, "output": 0}

    def host(text: str) -> int:
        return sum(_array_bytes(m.group("dtype"), _dims(m)) for m in _ARRAY.finditer(text) if "S(5)" in (m.group("layout") or ""))

    return {"argument": host(match.group("args")), "output": host(match.group("outs"))}


def compiled_memory(compiled: Any, hlo_text: str | None = None) -> dict[str, int]:
    """XLA's memory analysis of a compiled SPMD program: bytes per device.

    ``peak`` counts everything XLA places; ``device_peak`` leaves out the arguments and outputs in
    host memory. (The CPU backend reports host-memory arguments as device arguments and its host
    fields as 0, so those are read from the entry layout: ``hlo_text``, ``compiled.as_text()``
    when the caller has it already.)
    """
    mem = compiled.memory_analysis()
    argument, output, alias = int(mem.argument_size_in_bytes), int(mem.output_size_in_bytes), int(mem.alias_size_in_bytes)
    temp = int(mem.temp_size_in_bytes)
    # An upper bound: everything live at once, donated outputs sharing their arguments' buffers.
    # (XLA's own peak_memory_in_bytes on CPU leaves the temporaries out.)
    peak = argument + output - alias + temp
    if int(mem.host_argument_size_in_bytes) or int(mem.host_output_size_in_bytes):
        host = {"argument": int(mem.host_argument_size_in_bytes), "output": int(mem.host_output_size_in_bytes)}
        device_peak = peak
    else:
        host = host_entry_bytes(compiled.as_text() if hlo_text is None else hlo_text)
        # A donated host argument aliases its host output.
        host_alias = min(host["argument"], host["output"], alias)
        device_peak = peak - host["argument"] - host["output"] + host_alias
    return {
        "argument": argument,
        "output": output,
        "temp": temp,
        "alias": alias,
        "peak": peak,
        "host_argument": host["argument"],
        "host_output": host["output"],
        "device_peak": device_peak,
    }


def flops_per_device(compiled: Any) -> float | None:
    """XLA's cost analysis of the partitioned (per-device) program; a loop body counts once."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) and cost else cost
    return float(cost["flops"]) if cost and "flops" in cost else None


def live_bytes_per_device(tree: Any, memory_kind: str | None = "device") -> int:
    """What a pytree of arrays really holds per device.

    Args:
      tree: live (sharded) arrays.
      memory_kind: count only the arrays in this memory (``device``, or ``pinned_host`` for each
        device's shards in host memory); None counts all.

    Returns:
      The largest, over this process's devices, of the bytes their shards of ``tree`` occupy.
    """
    per_device: collections.Counter = collections.Counter()
    for leaf in jax.tree.leaves(tree):
        if memory_kind is not None and offload.memory_kind(leaf.sharding) != memory_kind:
            continue
        for shard in leaf.addressable_shards:
            per_device[shard.device.id] += shard.data.nbytes
    return max(per_device.values()) if per_device else 0


def live_bytes_per_process(tree: Any) -> int:
    """The bytes this process's devices hold of a pytree of live (sharded) arrays."""
    return sum(shard.data.nbytes for leaf in jax.tree.leaves(tree) for shard in leaf.addressable_shards)


@record
class CompiledMemory:
    """XLA's memory analysis of the compiled step, bytes per device.

    Attributes:
      argument: the arguments.
      output: the outputs.
      temp: the temporaries.
      peak: arguments + temporaries + unaliased outputs.
    """

    argument: int
    output: int
    temp: int
    peak: int


@record
class CompiledHost:
    """The compiled step's arguments and outputs that rest in host memory, bytes per device.

    Attributes:
      argument: the arguments in host memory.
      output: the outputs in host memory.
    """

    argument: int
    output: int
