"""Compiled HLO text read into computations and their instructions, shared by the ledger's readers:
each instruction's op, result types and callees, the computations by name (parsed once a text),
loops' trip counts, and a memoised sum over a program's computations."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from jzero.dtypes import hlo_bytes

__all__ = ["Computations", "trip_count"]

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
    return int(math.prod(dims) * hlo_bytes(dtype))


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
    collective pipeliner writes neither count nor start on a loop it peels: docs/design.md, "The GPU
    target", "The collective pipeliner remakes loops"). None when they do not say: a bound or a
    start that is not a constant (a traced ``while_loop``).

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


_BRANCHES = ("branch_computations", "true_computation", "false_computation")


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
