"""Gathering units: which parameters ZeRO-3 gathers together, one unit at a time (FSDP's
``fully_shard`` per block, chosen from outside the model).

A unit is a subtree of the parameters, named by its path prefix: ``transformer/h/3`` of a Hugging
Face GPT-2, ``layers_3`` of a linen model that names its blocks, ``layers/3`` of an NNX list. The
choice is a pure function of the parameters' paths and bytes, so ``plan`` shows it before anything
compiles. How a unit is gathered is :mod:`jzero.communication.gather`'s.

- ``none``: no units; XLA places the gathers (a scanned layer stack gathers one layer per loop step).
- ``auto``: the repeated submodules whose parameters weigh most (``h/0``, ``h/1``, ...); none for a
  model with a scanned layer stack, which keeps the loop's own gather.
- a list of regexes, each matched against whole trailing components of the path prefixes
  (``h/\\d+`` matches ``transformer/h/3``).

Every parameter outside the units is gathered alone, where it is read.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from jzero.errors import JzeroError, PlanError, show_value

__all__ = ["AUTO", "NONE", "check", "choose_units", "unit_names"]

AUTO, NONE = "auto", "none"
KEY = "zero.gather_units"
_NUMBERED = re.compile(r"^(?P<stem>.*?)(?P<number>\d+)$")


def _prefixes(path: str) -> list[str]:
    parts = path.split("/")
    return ["/".join(parts[:n]) for n in range(1, len(parts))]


def _auto(paths: Sequence[str], nbytes: Sequence[int]) -> dict[str, str]:
    """path -> unit prefix, for the heaviest family of numbered prefixes (two members at least)."""
    families: dict[str, dict[str, int]] = {}  # template -> member prefix -> bytes
    for path, size in zip(paths, nbytes, strict=True):
        for prefix in _prefixes(path):
            head, _, last = prefix.rpartition("/")
            match = _NUMBERED.match(last)
            if match:
                template = f"{head}/{match.group('stem')}#" if head else f"{match.group('stem')}#"
                members = families.setdefault(template, {})
                members[prefix] = members.get(prefix, 0) + size
    candidates = [(sum(m.values()), -len(t), t) for t, m in families.items() if len(m) >= 2]
    if not candidates:
        return {}
    members = families[max(candidates)[2]]
    return {path: prefix for path in paths for prefix in _prefixes(path) if prefix in members}


def check(gather_units: Any, error: type[JzeroError] = PlanError) -> list[tuple[str, re.Pattern]]:
    """A ``zero.gather_units`` value's regexes, compiled (none for ``auto`` and ``none``).

    Raises:
      error: the value is not ``auto``, ``none`` or a non-empty list of regexes, naming the key.
    """
    if isinstance(gather_units, str) and gather_units in (AUTO, NONE):
        return []
    if isinstance(gather_units, str) or not gather_units or not all(isinstance(p, str) and p for p in gather_units):
        raise error(KEY, f"must be {AUTO}, {NONE} or a list of regexes, got {show_value(gather_units)}")
    compiled = []
    for pattern in gather_units:
        try:
            compiled.append((pattern, re.compile(rf"(?:^|/)(?:{pattern})$")))
        except re.error as err:
            raise error(KEY, f"{pattern!r} is not a regular expression ({err})") from None
    return compiled


def _matching(paths: Sequence[str], patterns: Sequence[str]) -> dict[str, str]:
    """path -> unit prefix, from regexes over whole trailing components of the prefixes."""
    compiled = check(list(patterns))
    units: dict[str, str] = {}
    used = set()
    for path in paths:
        hits = [(prefix, pattern) for prefix in _prefixes(path) for pattern, rx in compiled if rx.search(prefix)]
        if len({prefix for prefix, _ in hits}) > 1:
            (outer, first), (inner, second) = hits[0], hits[-1]
            raise PlanError(KEY, f"{second!r} matches {inner!r} inside {outer!r} (matched by {first!r}): units overlap")
        if hits:
            units[path] = hits[0][0]
            used.update(pattern for _, pattern in hits)
    for pattern, _ in compiled:
        if pattern not in used:
            raise PlanError(KEY, f"{pattern!r} matches no parameter path prefix (e.g. {_prefixes(paths[0])[-1:] or paths[:1]})")
    return units


def choose_units(
    paths: Sequence[str], nbytes: Sequence[int], gather_units: str | Sequence[str], *, scanned: bool = False
) -> dict[str, int]:
    """Which unit each parameter is gathered in: :func:`unit_names`, numbered.

    Returns:
      path -> unit number, in the order the units first appear; empty for no units.
    """
    numbers: dict[str, int] = {}
    names = unit_names(paths, nbytes, gather_units, scanned=scanned)
    return {path: numbers.setdefault(name, len(numbers)) for path, name in names.items()}


def unit_names(
    paths: Sequence[str], nbytes: Sequence[int], gather_units: str | Sequence[str], *, scanned: bool = False
) -> dict[str, str]:
    """The unit each parameter is gathered in, by name.

    Args:
      paths: the parameters' tree paths (``a/b/kernel``).
      nbytes: their whole bytes, in the same order.
      gather_units: ``none``, ``auto`` or a list of regexes over path prefixes.
      scanned: the model has a scanned layer stack (``auto`` then chooses none).

    Returns:
      path -> its unit's name: the path prefix the unit's parameters share (``layers_3``), or for a
      parameter outside every unit, which is a unit of its own, its path. Empty for no units.

    Raises:
      PlanError: a regex that is not one, matches nothing, or nests one unit inside another.
    """
    check(gather_units)
    if gather_units == NONE or (gather_units == AUTO and scanned) or not paths:
        return {}
    prefix = _auto(paths, nbytes) if gather_units == AUTO else _matching(paths, list(gather_units))
    return {path: prefix.get(path, path) for path in paths} if prefix else {}
