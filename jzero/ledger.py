"""Where the bytes went: live per-device bytes, compiled memory, and the collectives in the HLO."""

from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import Any

import jax

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_DTYPE_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip
_SHAPE = re.compile(r"\b(" + "|".join(_DTYPE_BYTES) + r")\[([\d,]*)\]")
_OP = re.compile(r"=\s*(?P<shape>.*?)\s(?P<op>" + "|".join(COLLECTIVES) + r")(?P<start>-start)?\(")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(r"(?:calls|to_apply|body|condition|branch_computations)=\{?([^}\s,]+(?:,\s*%[\w.\-]+)*)\}?")
_WHILE_BODY = re.compile(r"\swhile\(.*body=%?([\w.\-]+)")
_GROUPS = re.compile(
    r"replica_groups=(mesh\[[^\]]*\](?:,\s*device_ids=[^{]*?)?\s*\{[^}]*\}"
    r"|\{\{[^ ]*\}\}|\{\}|\[[\d,]*\]<=\[[\d,]*\](?:T\([\d,]*\))?)"
)


def _shape_bytes(text: str) -> int:
    return int(sum(math.prod(int(d) for d in dims.split(",") if d) * _DTYPE_BYTES[dt] for dt, dims in _SHAPE.findall(text)))


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str
    bytes: int  # size of the op's result, per device
    replica_groups: str
    group_size: int | None  # devices in each replica group, when the HLO says
    computation: str
    in_loop: bool  # inside a while loop body (e.g. the scan over layers)
    executions: int = 1  # times it runs per step: the product of the enclosing loops' trip counts


def group_size(groups: str) -> int | None:
    """Devices per replica group, from any of XLA's three spellings of ``replica_groups``."""
    if groups.startswith("mesh["):
        sizes = dict(re.findall(r"'([^']+)'=(\d+)", groups.split("]")[0]))
        used = re.findall(r"'([^']+)'", groups.split("]", 1)[1])
        return math.prod(int(sizes[a]) for a in used)
    if groups.startswith("{{"):
        return len(groups[2:].split("}")[0].split(","))
    if groups.startswith("["):
        return int(groups[1:].split("]")[0].split(",")[-1])
    return None


def parse_collectives(hlo_text: str) -> list[Collective]:
    """Every collective op in compiled HLO text.

    Args:
      hlo_text: ``compiled.as_text()`` of an SPMD program.

    Returns:
      One :class:`Collective` per op: its kind, result bytes per device, replica groups, the
      computation it sits in, whether that is a loop body, and how often it runs per step.
    """
    computations: dict[str, list[str]] = {}
    current = entry = None
    for line in hlo_text.splitlines():
        match = _COMPUTATION.match(line)
        if match and "=" not in line.split("(")[0]:
            current = match.group("name")
            computations[current] = []
            entry = current if line.startswith("ENTRY") else entry
        elif current is not None:
            computations[current].append(line)

    callees = {
        name: {c.strip().lstrip("%") for m in _CALLS.finditer("\n".join(lines)) for c in m.group(1).split(",")}
        for name, lines in computations.items()
    }
    in_loop: set[str] = set()
    frontier = [m.group(1) for lines in computations.values() for line in lines if (m := _WHILE_BODY.search(line))]
    while frontier:
        name = frontier.pop()
        if name not in in_loop:
            in_loop.add(name)
            frontier.extend(callees.get(name, ()))

    executions = _executions(computations, entry)
    found = []
    for name, lines in computations.items():
        for line in lines:
            match = _OP.search(line)
            if not match:
                continue
            shape = match.group("shape")
            if match.group("start") and shape.startswith("("):
                # Async start ops return (operands..., result): count the result only.
                shape = _SHAPE.findall(shape)[-1]
                shape = f"{shape[0]}[{shape[1]}]"
            groups = _GROUPS.search(line)
            found.append(
                Collective(
                    kind=match.group("op"),
                    bytes=_shape_bytes(shape),
                    replica_groups=groups.group(1) if groups else "",
                    group_size=group_size(groups.group(1)) if groups else None,
                    computation=name,
                    in_loop=name in in_loop,
                    executions=executions.get(name, 1),
                )
            )
    return found


_TRIP_COUNT = re.compile(r'known_trip_count"?\s*:\s*\{\s*"?n"?\s*:\s*"?(\d+)')


def _executions(computations: dict[str, list[str]], entry: str | None) -> dict[str, int]:
    """How many times each computation runs per call of the entry: a while body runs its loop's
    known trip count times per run of its caller; anything else once per call."""
    calls: dict[str, list[tuple[str, int]]] = {}
    for name, lines in computations.items():
        for line in lines:
            body = _WHILE_BODY.search(line)
            trip = _TRIP_COUNT.search(line)
            for m in _CALLS.finditer(line):
                for callee in (c.strip().lstrip("%") for c in m.group(1).split(",")):
                    factor = int(trip.group(1)) if body and trip and callee == body.group(1) else 1
                    calls.setdefault(name, []).append((callee, factor))
    counts: dict[str, int] = {}
    order: list[str] = []  # callers before callees (the call graph is acyclic)
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for callee, _ in calls.get(name, ()):
            visit(callee)
        order.append(name)

    if entry is None:
        return {}
    visit(entry)
    counts[entry] = 1
    for name in reversed(order):
        for callee, factor in calls.get(name, ()):
            counts[callee] = counts.get(callee, 0) + counts.get(name, 0) * factor
    return counts


def communication_bytes(ops: list[Collective]) -> dict[str, int]:
    """Bytes each device sends per step, by op kind, in the paper's accounting: an all-gather or a
    reduce-scatter moves the whole tensor once, an all-reduce twice (a reduce-scatter then an
    all-gather). Loop bodies count once per iteration."""
    out: dict[str, int] = {}
    for op in ops:
        whole = op.bytes * (op.group_size or 1) if op.kind == "reduce-scatter" else op.bytes
        factor = 2 if op.kind == "all-reduce" else 1
        out[op.kind] = out.get(op.kind, 0) + whole * factor * op.executions
    return out


def summarize_collectives(ops: list[Collective]) -> dict[str, dict[str, int]]:
    """Op kind -> {count, bytes, in_loop}: ``count`` ops in the program text (a loop body's ops
    count once, however many times the loop runs)."""
    out: dict[str, dict[str, int]] = {}
    for op in ops:
        entry = out.setdefault(op.kind, {"count": 0, "bytes": 0, "in_loop": 0})
        entry["count"] += 1
        entry["bytes"] += op.bytes
        entry["in_loop"] += int(op.in_loop)
    return out


def compiled_memory(compiled: Any) -> dict[str, int]:
    """XLA's memory analysis of a compiled SPMD program: bytes per device."""
    mem = compiled.memory_analysis()
    return {
        "argument": int(mem.argument_size_in_bytes),
        "output": int(mem.output_size_in_bytes),
        "temp": int(mem.temp_size_in_bytes),
        "alias": int(mem.alias_size_in_bytes),
        # An upper bound: everything live at once, donated outputs sharing their arguments' buffers.
        # (XLA's own peak_memory_in_bytes on CPU leaves the temporaries out.)
        "peak": int(mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes + mem.temp_size_in_bytes),
    }


def flops_per_device(compiled: Any) -> float | None:
    """XLA's cost analysis of the partitioned (per-device) program; a loop body counts once."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) and cost else cost
    return float(cost["flops"]) if cost and "flops" in cost else None


def live_bytes_per_device(tree: Any) -> int:
    """What a pytree of arrays really holds per device.

    Args:
      tree: live (sharded) arrays.

    Returns:
      The largest, over this process's devices, of the bytes their shards of ``tree`` occupy.
    """
    per_device: collections.Counter = collections.Counter()
    for leaf in jax.tree.leaves(tree):
        for shard in leaf.addressable_shards:
            per_device[shard.device.id] += shard.data.nbytes
    return max(per_device.values()) if per_device else 0
