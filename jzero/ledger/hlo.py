"""Where the bytes went: live per-device bytes, compiled memory, and the collectives in the HLO."""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import jax

from jzero.memory import offload

__all__ = [
    "COLLECTIVES",
    "Collective",
    "communication_by_dtype",
    "communication_bytes",
    "compiled_memory",
    "flops_per_device",
    "forward_loop",
    "forward_loop_writes",
    "group_size",
    "host_entry_bytes",
    "live_bytes_per_device",
    "live_bytes_per_process",
    "paper_bytes",
    "parse_collectives",
    "saved_activations",
    "summarize_collectives",
    "trip_count",
]

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_DTYPE_BYTES = {
    "pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1,
    "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
    "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip
_ARRAY = re.compile(r"(?P<dtype>[a-z][a-z0-9]*)\[(?P<dims>[^\]]*)\](?P<layout>\{[^}]*\})?")
_COMMENT = re.compile(r"/\*.*?\*/")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<rest>.*)$")
_OPCODE = re.compile(r"\s*(?P<op>[\w\-]+)\(")
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?(?P<name>[\w.\-]+)\s.*\{\s*$")
_CALLEE_LIST = r"\{?\s*(%?[\w.\-]+(?:\s*,\s*%[\w.\-]+)*)\s*\}?"
_CALLS = re.compile(r"\b(calls|to_apply|body|condition|branch_computations|true_computation|false_computation)=" + _CALLEE_LIST)
_TRIP_COUNT = re.compile(r'known_trip_count"?\s*:\s*\{\s*"?n"?\s*:\s*"?(\d+)')
_INIT_STEP = re.compile(r'known_init_step"?\s*:\s*\{\s*"?init"?\s*:\s*"?(-?\d+)"?\s*,\s*"?step"?\s*:\s*"?(-?\d+)')
_INT_CONSTANT = re.compile(r"^[su]\d+$")
_NAME = re.compile(r"%([\w.\-]+)")
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


def _parse_type(text: str) -> tuple[Any, str]:
    """One HLO type at the start of ``text`` -> (a list for a tuple, else ``(dtype, dims)``; the rest)."""
    text = text.lstrip()
    if text.startswith("("):
        items, rest = [], text[1:]
        while not rest.lstrip().startswith(")"):
            item, rest = _parse_type(rest)
            items.append(item)
            rest = rest.lstrip().removeprefix(",")
        return items, rest.lstrip()[1:]
    match = _ARRAY.match(text)
    if not match:
        raise ValueError(f"not an HLO type: {text[:40]!r}")
    return (match.group("dtype"), _dims(match)), text[match.end() :]


def _dims(match: re.Match) -> tuple[int, ...]:
    """An array type's dimensions (a dynamic one, ``<=N``, at its bound)."""
    return tuple(int(d.lstrip("<=")) for d in match.group("dims").split(",") if d)


def _leaves(node: Any) -> list[tuple[str, tuple[int, ...]]]:
    return [leaf for item in node for leaf in _leaves(item)] if isinstance(node, list) else [node]


def _array_bytes(dtype: str, dims: tuple[int, ...]) -> int:
    return int(math.prod(dims) * _DTYPE_BYTES.get(dtype, 0))


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


@dataclasses.dataclass(frozen=True)
class _Instruction:
    name: str
    op: str
    type: Any
    line: str


Computations = Mapping[str, tuple[_Instruction, ...]]  # each computation's instructions, by name


def _instruction(line: str) -> _Instruction | None:
    match = _INSTRUCTION.match(line)
    if not match:
        return None
    rest = _COMMENT.sub("", match.group("rest"))
    try:
        type_, rest = _parse_type(rest)
    except ValueError:
        return None
    op = _OPCODE.match(rest)
    return _Instruction(match.group("name"), op.group("op"), type_, line) if op else None


def _results(ins: _Instruction, kind: str) -> list[tuple[str, tuple[int, ...]]]:
    """The result arrays of a collective. An async all-reduce's type is its result; the other
    async starts return ``(operands, results, ...)``, where each part is a tuple when the op
    combines several tensors."""
    if ins.op.endswith("-start") and kind != "all-reduce" and isinstance(ins.type, list) and len(ins.type) >= 2:
        return _leaves(ins.type[1])
    return _leaves(ins.type)


def _callees(line: str) -> list[tuple[str, str]]:
    """``(attribute, computation)`` for each computation an instruction calls."""
    return [(m.group(1), c.strip().lstrip("%")) for m in _CALLS.finditer(line) for c in m.group(2).split(",")]


def _bound(name: str, computations: Computations, depth: int = 0) -> tuple[str, int] | None:
    """``(direction, constant)`` of a loop condition's ``compare(counter, constant)``, looked for in
    the condition and the fusions it calls."""
    body = computations.get(name, ())
    constants = {
        ins.name: int(ins.line.split("constant(", 1)[1].split(")")[0])
        for ins in body
        if ins.op == "constant" and isinstance(ins.type, tuple) and not ins.type[1] and _INT_CONSTANT.match(ins.type[0])
    }
    for ins in body:
        direction = re.search(r"direction=(LT|LE)\b", ins.line) if ins.op == "compare" else None
        operands = _NAME.findall(ins.line.split("compare(", 1)[1].split(")")[0]) if direction else []
        if len(operands) == 2 and operands[1] in constants:
            return direction.group(1), constants[operands[1]]
    for ins in body:
        for _, callee in _callees(ins.line) if depth < 2 else ():
            if (found := _bound(callee, computations, depth + 1)) is not None:
                return found
    return None


_INDUCTION = re.compile(r'known_induction_variable"?\s*:\s*\{\s*"?tuple_index"?\s*:\s*"?(\d+)')


def _initial_counter(loop: _Instruction, computations: Computations) -> int | None:
    """The constant a ``while``'s counter starts from, in the tuple it is given (through copies)."""
    caller = next((body for body in computations.values() if any(i is loop for i in body)), [])
    scope = {i.name: i for i in caller}
    init = scope.get(next(iter(_NAME.findall(loop.line.split(" while(", 1)[-1])), ""))
    index = int(m.group(1)) if (m := _INDUCTION.search(loop.line)) else 0
    if init is None or init.op != "tuple":
        return None
    value = scope.get(_NAME.findall(init.line.split(" tuple(", 1)[1])[index])
    while value is not None and value.op in ("copy", "bitcast"):
        value = scope.get(_NAME.findall(value.line.split(f" {value.op}(", 1)[1])[0])
    if value is None or value.op != "constant":
        return None
    return int(value.line.split("constant(", 1)[1].split(")")[0])


def trip_count(ins: _Instruction, computations: Computations) -> int | None:
    """How many times a ``while`` runs its body: XLA's ``known_trip_count`` where it wrote one.

    Without it, the condition's ``compare(counter, C)`` (``LT`` or ``LE``) gives it, from XLA's
    ``known_init_step`` or else from the counter's constant in the loop's initial tuple, by 1 (XLA's
    collective pipeliner writes neither count nor start on a loop it peels: measured, a microbatch
    loop of 3 ran from 1 while below 2). None when they do not say: a bound or a start that is not
    a constant (a traced ``while_loop``).

    Args:
      ins: the ``while`` instruction.
      computations: the module's computations (:func:`_computations`).
    """
    if known := _TRIP_COUNT.search(ins.line):
        return int(known.group(1))
    condition = next((c for attr, c in _callees(ins.line) if attr == "condition"), None)
    bound = _bound(condition, computations) if condition else None
    if bound is None:
        return None
    init, step = map(int, m.groups()) if (m := _INIT_STEP.search(ins.line)) else (_initial_counter(ins, computations), 1)
    if init is None or step <= 0:
        return None
    end = bound[1] + (bound[0] == "LE")
    return max(0, -(-(end - init) // step))


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


_BRANCHES = ("branch_computations", "true_computation", "false_computation")


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


@functools.lru_cache(maxsize=4)  # a report reads one program's text about seven times
def _computations(hlo_text: str) -> tuple[Computations, str | None]:
    """Each computation's instructions, in order, and the entry's name (read-only: shared)."""
    computations: dict[str, list[_Instruction]] = {}  # built here, handed out read-only
    current = entry = None
    for line in hlo_text.splitlines():
        match = _COMPUTATION.match(line)
        if match and "=" not in line.split("(")[0]:
            current = match.group("name")
            computations[current] = []
            entry = current if line.startswith("ENTRY") else entry
        elif current is not None and (ins := _instruction(line)):
            computations[current].append(ins)
    return MappingProxyType({name: tuple(body) for name, body in computations.items()}), entry


_OP_NAME = re.compile(r'op_name="([^"]*)"')
_OPERANDS = re.compile(r"\btuple\((?P<args>[^)]*)\)")
_GTE_INDEX = re.compile(r"get-tuple-element\(%?(?P<of>[\w.\-]+)\),\s*index=(?P<index>\d+)")


class _ComputationSum:
    """A figure of one run of each computation of a program, memoised: the sum of
    :meth:`instruction` over its instructions (a subclass says what an instruction adds)."""

    def __init__(self, hlo_text: str):
        self.computations, self.entry = _computations(hlo_text)
        self.memo: dict[str, int] = {}

    def computation(self, name: str) -> int:
        if name not in self.memo:
            self.memo[name] = 0  # guards a malformed, cyclic module
            self.memo[name] = sum(self.instruction(ins, name) for ins in self.computations.get(name, ()))
        return self.memo[name]

    def instruction(self, ins: _Instruction, where: str) -> int:
        raise NotImplementedError

    def program(self) -> int:
        """One run of the entry computation."""
        return self.computation(self.entry) if self.entry else 0


def _loop_op_names(ins: _Instruction, computations: Computations) -> list[str]:
    """The op names of a ``while``: its own, or where XLA made the loop anew, its body's ops'."""
    body = dict(_callees(ins.line)).get("body")
    return [m.group(1) for m in map(_OP_NAME.search, [ins.line]) if m] or [
        m.group(1) for m in (_OP_NAME.search(i.line) for i in computations.get(body, ())) if m
    ]


def forward_loop(ins: _Instruction, computations: Computations) -> tuple[str, int] | None:
    """``(body, trip count)`` of a differentiated scan's forward loop, else None.

    The forward is named ``jvp(...)`` and the backward ``transpose(jvp(...))``, on the ``while`` or,
    where XLA made the loop anew (its collective pipeliner peels an iteration), on its body's ops. A
    pipelined loop runs fewer iterations than its stacks have rows: a stack has at least as many.
    """
    if ins.op != "while":
        return None
    body = dict(_callees(ins.line)).get("body")
    if body not in computations:
        return None
    names = _loop_op_names(ins, computations)
    if not any("jvp(" in n for n in names) or any("transpose(" in n for n in names):
        return None
    trip = trip_count(ins, computations)
    return (body, trip) if trip else None


def forward_loop_writes(hlo_text: str) -> list[list[tuple[str, tuple[int, ...], bool, bool]]]:
    """The stacks each forward layer loop writes for the backward, from compiled HLO.

    A differentiated scan is two while loops: the forward (``jvp(...)`` in its op name) writes
    each iteration's residuals into stacked buffers, the backward (``transpose(jvp(...))``) reads
    them. These are the forward loop's outputs that the loop writes (not carried through
    unchanged) and that have one row per iteration.

    Returns:
      Per forward loop, ``(dtype, dims, in_host_memory, like_a_read_only_input)`` for each such
      stack; the last says a state the loop only reads has the same type (a parameter stack).
    """
    computations, _ = _computations(hlo_text)
    loops = []
    for ins in (ins for body in computations.values() for ins in body):
        found = forward_loop(ins, computations)
        if found is not None:
            loops.append(_loop_stacks(ins, computations, *found))
    return loops


def _loop_stacks(ins: _Instruction, computations: Computations, body: str, rows: int) -> list:
    """:func:`forward_loop_writes`' stacks of one forward loop."""
    state_type = ins.line.split("=", 1)[1].split(" while(")[0]
    items = list(_ARRAY.finditer(state_type))
    written = _written_elements(computations[body])
    read_only = {item.group("dtype", "dims") for i, item in enumerate(items) if i not in written}
    stacks = []
    for index, item in enumerate(items):
        dims = _dims(item)
        if index in written and len(dims) > 1 and dims[0] >= rows:
            host = "S(5)" in (item.group("layout") or "")
            stacks.append((item.group("dtype"), dims, host, item.group("dtype", "dims") in read_only))
    return stacks


def saved_activations(hlo_text: str, batch_rows: int | None = None) -> dict[str, int]:
    """What the forward layer loops save for the backward, per device, from compiled HLO, at the
    most that is live at once: the stacks of :func:`forward_loop_writes` that hold activations, a
    batch of examples, or without ``batch_rows``, a shape unlike any parameter stack the loop reads
    (JAX also saves the slices of parameters it used). A buffer in host memory (layout ``S(5)``)
    counts as host bytes.

    A forward loop's stacks are live until a backward loop reads them (the last forward's, in
    program order), so the microbatches of a step (a loop XLA peeled into the step's first and
    last microbatch and the microbatch loop's own) count once, and two forward loops before their
    backwards count both.

    Args:
      hlo_text: ``compiled.as_text()`` of an SPMD program.
      batch_rows: the batch rows each device computes at once; when given, a saved stack must have
        them as its second dimension.

    Returns:
      ``{"device", "host", "loops"}``: bytes per device at the peak, and how many forward layer
      loops save.
    """
    computations, entry = _computations(hlo_text)
    live = _LiveSaved(computations, batch_rows)
    device, host = live.peak(entry) if entry else (0, 0)
    return {"device": device, "host": host, "loops": live.loops}


class _LiveSaved:
    """The saved stacks live at once, computation by computation, in program order."""

    def __init__(self, computations: Computations, batch_rows: int | None):
        self.computations, self.rows, self.loops = computations, batch_rows, 0
        self.memo: dict[str, tuple[int, int]] = {}

    def peak(self, name: str) -> tuple[int, int]:
        """``(device, host)`` at the most live in one run of ``name``."""
        if name in self.memo:
            return self.memo[name]
        self.memo[name] = (0, 0)  # guards a malformed, cyclic module
        live, pending, best = (0, 0), [], (0, 0)
        for ins in self.computations.get(name, ()):
            if (found := forward_loop(ins, self.computations)) is not None:
                saved = self.saved(_loop_stacks(ins, self.computations, *found))
                pending.append(saved)
                live = (live[0] + saved[0], live[1] + saved[1])
            elif _is_backward_loop(ins, self.computations) and pending:
                done = pending.pop()
                live = (live[0] - done[0], live[1] - done[1])
            else:
                inner = max((self.peak(c) for _, c in _callees(ins.line) if c in self.computations), key=sum, default=(0, 0))
                live_inner = (live[0] + inner[0], live[1] + inner[1])
                best = max(best, live_inner, key=sum)
            best = max(best, live, key=sum)
        self.memo[name] = best
        return best

    def saved(self, stacks: list) -> tuple[int, int]:
        device = host = 0
        for dtype, dims, in_host, like_input in stacks:
            if _per_example(dims, self.rows) if self.rows else not like_input:
                nbytes = _array_bytes(dtype, dims)
                host, device = (host + nbytes, device) if in_host else (host, device + nbytes)
        self.loops += int(device + host > 0)
        return device, host


def _is_backward_loop(ins: _Instruction, computations: Computations) -> bool:
    """A differentiated scan's backward loop: ``transpose(jvp(...))`` on the ``while`` or its body's ops."""
    return ins.op == "while" and any("transpose(" in n for n in _loop_op_names(ins, computations))


def _per_example(dims: tuple[int, ...], rows: int) -> bool:
    """A stack of a batch's activations: ``[iterations, rows, ...]``, or ``[iterations, 1, rows, ...]``
    where the step maps over batch groups (``vmap``) and each device has one. An activation has a
    position axis too: a parameter slice ``[iterations, n]`` with ``n == rows`` is not one."""
    return len(dims) > 2 and (dims[1] == rows or (len(dims) > 3 and dims[1] == 1 and dims[2] == rows))


def _written_elements(body: list[_Instruction]) -> set[int]:
    """Indices of a while body's state that the body changes (not ``get-tuple-element(param), index=i``
    handed back at position i)."""
    params = {ins.name for ins in body if ins.op == "parameter"}
    reads = {}
    for ins in body:
        match = _GTE_INDEX.search(ins.line)
        if match and match.group("of") in params:
            reads[ins.name] = int(match.group("index"))
    root = next((ins for ins in body if ins.line.lstrip().startswith("ROOT")), None)
    match = _OPERANDS.search(root.line) if root else None
    if not match:
        return set()
    operands = [a.strip().lstrip("%") for a in match.group("args").split(",")]
    return {i for i, name in enumerate(operands) if reads.get(name) != i}


_ENTRY_LAYOUT = re.compile(r"entry_computation_layout=\{\((?P<args>.*?)\)->(?P<outs>.*?)\}(?:,\s*\w+=|$)", re.MULTILINE)


def host_entry_bytes(hlo_text: str) -> dict[str, int]:
    """Bytes per device of the program's arguments and outputs in host memory (layout ``S(5)`` in
    its entry layout): what a ``pinned_host`` sharding keeps off the device."""
    match = _ENTRY_LAYOUT.search(hlo_text)
    if not match:
        return {"argument": 0, "output": 0}

    def host(text: str) -> int:
        return sum(
            _array_bytes(m.group("dtype"), _dims(m))
            for m in _ARRAY.finditer(text)
            if "S(5)" in (m.group("layout") or "")
        )

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
