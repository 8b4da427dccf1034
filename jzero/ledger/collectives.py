"""TODO"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from jzero.ledger.hlo_text import (
    _BRANCHES,
    Computations,
    _array_bytes,
    _callees,
    _computations,
    _Instruction,
    _results,
    trip_count,
)
from jzero.records import json_key, record

__all__ = [
    "COLLECTIVES",
    "AsyncCollective",
    "async_collectives",
    "collective_kinds",
    "Collective",
    "CollectiveKind",
    "communication_by_dtype",
    "communication_bytes",
    "group_size",
    "paper_bytes",
    "parse_collectives",
    "summarize_collectives",
]

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")


_GROUPS = re.compile(
    r"replica_groups=(mesh\[[^\]]*\](?:,\s*device_ids=[^{]*?)?\s*\{[^}]*\}"
    r"|\{\{[^ ]*\}\}|\{\}|\[[\d,]*\]<=\[[\d,]*\](?:T\([\d,]*\))?)"
)


# Instructions that do no work on the device: between an async collective's start and done they
# leave it exposed; anything else there (a fusion, a GEMM custom-call, a loop) overlaps it.
_NO_COMPUTE = {
    "get-tuple-element", "tuple", "bitcast", "parameter", "constant", "after-all", "partition-id",
    "replica-id", "add-dependency", "opt-barrier", "copy-start", "copy-done",
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective op of a compiled program, as one device sees it."""

    kind: str
    bytes: int  # size of the op's results, per device (all of them, for a combined op)
    replica_groups: str
    group_size: int | None  # devices in each replica group, when the HLO says
    computation: str
    in_loop: bool  # inside a while loop body (e.g. the scan over layers)
    executions: int = 1  # times it runs per step (loops' trip counts; 0 in a conditional branch not counted)
    dtypes: tuple[tuple[str, int], ...] = ()  # (element type, result bytes) of each type in its results
    arrays: tuple[tuple[str, tuple[int, ...]], ...] = ()  # (element type, dims) of each result array
    name: str = ""
    is_async: bool = False  # a -start/-done pair
    overlapped: bool | None = None  # async: compute is scheduled between its start and done (None: not async)

    @property
    def dtype(self) -> str:
        """The results' element type (types joined by ``+`` for a combined op of several)."""
        return "+".join(d for d, _ in self.dtypes)


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

    Async ops (``-start``/``-done``) count once, by their real results, and say whether compute is
    scheduled between start and done. Ops in a conditional's branches count as one branch runs: the
    one that moves the most bytes.

    Args:
      hlo_text: ``compiled.as_text()`` of an SPMD program (a scheduled module lists each
        computation's instructions in execution order).

    Returns:
      One :class:`Collective` per op: its kind, result bytes and element types per device, replica
      groups, the computation it sits in, whether that is a loop body, how often it runs per step,
      and for async ops whether compute overlaps them.
    """
    computations, entry = _computations(hlo_text)
    found: dict[str, list[Collective]] = {}
    for name, instructions in computations.items():
        for i, ins in enumerate(instructions):
            kind = ins.op.removesuffix("-start")
            if kind not in COLLECTIVES:
                continue
            results = _results(ins, kind)
            by_dtype: dict[str, int] = {}
            for dtype, dims in results:
                by_dtype[dtype] = by_dtype.get(dtype, 0) + _array_bytes(dtype, dims)
            groups = _GROUPS.search(ins.line)
            is_async = ins.op.endswith("-start")
            found.setdefault(name, []).append(
                Collective(
                    kind=kind,
                    bytes=sum(by_dtype.values()),
                    replica_groups=groups.group(1) if groups else "",
                    group_size=group_size(groups.group(1)) if groups else None,
                    computation=name,
                    in_loop=False,
                    dtypes=tuple(by_dtype.items()),
                    arrays=tuple(results),
                    name=ins.name,
                    is_async=is_async,
                    overlapped=_overlapped(instructions, i) if is_async else None,
                )
            )

    calls = {name: [(ins, _callees(ins.line)) for ins in instructions] for name, instructions in computations.items()}
    executions = _executions(calls, found, entry, computations)
    in_loop = _in_loop(calls)
    return [
        dataclasses.replace(op, in_loop=name in in_loop, executions=executions.get(name, 1))
        for name in computations
        for op in found.get(name, ())
    ]


def _overlapped(instructions: list[_Instruction], start: int) -> bool | None:
    """Whether an instruction that does work lies between the async op at ``start`` and its done
    (None when the done is not in the same computation)."""
    ref = re.compile(r"[(,\s]%?" + re.escape(instructions[start].name) + r"[),\s]")
    compute = False
    for ins in instructions[start + 1 :]:
        if ins.op.endswith("-done") and ref.search(ins.line.split("=", 1)[1]):
            return compute
        compute = compute or not (ins.op in _NO_COMPUTE or ins.op.endswith(("-start", "-done")))
    return None


def _in_loop(calls: dict[str, list]) -> set[str]:
    """Computations reached from a while loop's body."""
    inside: set[str] = set()
    frontier = [c for sites in calls.values() for _, callees in sites for attr, c in callees if attr == "body"]
    while frontier:
        name = frontier.pop()
        if name not in inside:
            inside.add(name)
            frontier.extend(c for _, callees in calls.get(name, ()) for _, c in callees)
    return inside


def _executions(
    calls: dict[str, list], found: dict[str, list[Collective]], entry: str | None, computations: Computations
) -> dict[str, int]:
    """How many times each computation runs per call of the entry.

    A while body runs its loop's trip count (:func:`trip_count`) times per run of its caller; of a
    conditional's branches only the one whose collectives move the most bytes counts (once); anything else runs
    once per call. Computations the entry does not reach are left out.
    """
    if entry is None:
        return {}
    edges: dict[str, list[tuple[str, int]]] = {}  # caller -> (callee, times per caller run)
    cost: dict[str, float] = {}

    def weigh(name: str) -> float:  # paper bytes of one run of ``name``, with what it calls
        if name not in cost:
            cost[name] = 0.0  # the call graph is acyclic; this only guards against a malformed module
            own = sum(paper_bytes(op) for op in found.get(name, ()))
            out = []
            for ins, callees in calls.get(name, ()):
                branches = [c for attr, c in callees if attr in _BRANCHES]
                if branches:
                    out.append((max(branches, key=weigh), 1))
                trip = trip_count(ins, computations) if ins.op == "while" else None
                for attr, callee in callees:
                    if attr not in _BRANCHES:
                        out.append((callee, trip if attr == "body" and trip is not None else 1))
            edges[name] = out
            cost[name] = own + sum(weigh(c) * k for c, k in out)
        return cost[name]

    weigh(entry)
    order: list[str] = []  # callers before callees
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name not in seen:
            seen.add(name)
            for callee, _ in edges.get(name, ()):
                visit(callee)
            order.append(name)

    visit(entry)
    counts = dict.fromkeys(seen, 0)
    counts[entry] = 1
    for name in reversed(order):
        for callee, factor in edges.get(name, ()):
            counts[callee] += counts[name] * factor
    # A branch not taken is reached only through its conditional: it runs 0 times, not "unknown".
    for sites in calls.values():
        for _, callees in sites:
            for attr, callee in callees:
                if attr in _BRANCHES:
                    counts.setdefault(callee, 0)
    return counts


def paper_bytes(op: Collective) -> int:
    """Bytes one run of ``op`` sends per device, in the paper's accounting: an all-gather or a
    reduce-scatter moves the whole tensor once, an all-reduce twice (a reduce-scatter, then an
    all-gather)."""
    whole = op.bytes * (op.group_size or 1) if op.kind == "reduce-scatter" else op.bytes
    return whole * (2 if op.kind == "all-reduce" else 1)


def communication_bytes(ops: list[Collective]) -> dict[str, int]:
    """Bytes each device sends per step, by op kind, in the paper's accounting: an all-gather or a
    reduce-scatter moves the whole tensor once, an all-reduce twice (a reduce-scatter then an
    all-gather). Loop bodies count once per iteration, a conditional's branches as one runs."""
    out: dict[str, int] = {}
    for op in ops:
        out[op.kind] = out.get(op.kind, 0) + paper_bytes(op) * op.executions
    return out


def communication_by_dtype(ops: list[Collective]) -> dict[str, dict[str, int]]:
    """:func:`communication_bytes` split by element type: op kind -> {dtype: bytes per step}."""
    out: dict[str, dict[str, int]] = {}
    for op in ops:
        per_kind = out.setdefault(op.kind, {})
        for dtype, nbytes in op.dtypes:
            share = paper_bytes(op) * nbytes // op.bytes if op.bytes else 0
            per_kind[dtype] = per_kind.get(dtype, 0) + share * op.executions
    return out


def summarize_collectives(ops: list[Collective]) -> dict[str, dict[str, Any]]:
    """Op kind -> {count, bytes, in_loop, dtypes, async, overlapped}: ``count`` ops in the program
    text (a loop body's ops count once, however many times the loop runs), their result bytes,
    how many sit in a loop, their element types, how many are async and how many of those have
    compute scheduled between start and done."""
    out: dict[str, dict[str, Any]] = {}
    for op in ops:
        entry = out.setdefault(op.kind, {"count": 0, "bytes": 0, "in_loop": 0, "dtypes": [], "async": 0, "overlapped": 0})
        entry["count"] += 1
        entry["bytes"] += op.bytes
        entry["in_loop"] += int(op.in_loop)
        entry["dtypes"] = sorted({*entry["dtypes"], *(d for d, _ in op.dtypes)})
        entry["async"] += int(op.is_async)
        entry["overlapped"] += int(bool(op.overlapped))
    return out


@record
class CollectiveKind:
    """One kind of collective in the compiled HLO (a loop body's ops count once).

    Attributes:
      count: how many ops.
      bytes: their result bytes.
      dtypes: their element types.
      async_: how many are asynchronous (JSON key ``async``).
      overlapped: how many asynchronous ones overlap compute.
    """

    count: int
    bytes: int
    dtypes: list[str]
    async_: int = json_key("async")
    overlapped: int


@record
class AsyncCollective:
    """An asynchronous collective of the compiled step.

    Attributes:
      name: its HLO name.
      kind: its op kind.
      dtype: its element type.
      bytes: its result bytes.
      computation: the HLO computation it is in.
      executions: how often it runs per step.
      overlapped: whether compute runs between its start and done.
    """

    name: str
    kind: str
    dtype: str
    bytes: int
    computation: str
    executions: int
    overlapped: bool


def collective_kinds(summary: dict[str, dict[str, Any]]) -> dict[str, CollectiveKind]:
    """:func:`summarize_collectives`' figures per kind, as records."""
    return {
        k: CollectiveKind(count=v["count"], bytes=v["bytes"], dtypes=v["dtypes"], async_=v["async"], overlapped=v["overlapped"])
        for k, v in summary.items()
    }


def async_collectives(ops: list[Collective]) -> list[AsyncCollective]:
    """Each asynchronous collective: where it runs, how often, and whether compute overlaps it."""
    return [
        AsyncCollective(
            name=o.name, kind=o.kind, dtype=o.dtype, bytes=o.bytes, computation=o.computation, executions=o.executions,
            overlapped=o.overlapped,
        )  # fmt: skip
        for o in ops
        if o.is_async
    ]
