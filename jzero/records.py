"""Records: dataclasses whose field names are JSON keys, and their JSON.

Each instrument defines the records it returns beside itself (the compiled memory with the HLO's
memory reader, the prediction with the time model, the plan report in :mod:`jzero.ledger.report`);
this module is what they share: :func:`record` makes one, :func:`to_json` gives the JSON object the
command line prints, :func:`from_json` reads one back, strictly, and :func:`json_schema` is the JSON
Schema (draft 2020-12) of a record, generated from the type hints (``jzero plan --json-schema``).

Two field metadata keys shape the JSON: ``key``, the JSON name of a field whose name is a Python
keyword (``async``, ``from``, ``global``: :func:`json_key`), and ``omit``: the key is left out while
the field is None (a part only some programs have: :func:`omit_if_none`), so such a key is the one
kind a schema does not require.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import types
import typing
import warnings
from typing import Any

__all__ = ["RecordError", "extend", "from_json", "json_key", "json_schema", "omit_if_none", "record", "to_json"]


def omit_if_none() -> Any:
    """A field left out of the JSON while None (and so not required by the schema)."""
    return dataclasses.field(default=None, metadata={"omit": True})


def json_key(name: str) -> Any:
    """A field whose JSON key, ``name``, is a Python keyword."""
    return dataclasses.field(metadata={"key": name})


def record(cls: type) -> type:
    """A record class: a keyword-only dataclass, its field names the JSON keys (:func:`to_json`).

    ``record["key"]`` still reads a field, with a ``DeprecationWarning``, until 0.2.0: the
    instruments that returned dicts before 0.1 return records now (CHANGELOG.md)."""
    cls.__getitem__ = _item
    return dataclasses.dataclass(kw_only=True)(cls)


def extend(base: Any, cls: type, **more: Any) -> Any:
    """``base``, a record, as a record of ``cls``: a subclass of its class with the fields ``more`` gives.

    Args:
      base: the record.
      cls: a record class whose fields are ``base``'s class's and ``more``'s.
      **more: the fields ``cls`` adds.

    Returns:
      A new ``cls`` record sharing ``base``'s values (a shallow copy).
    """
    if not isinstance(base, cls.__mro__[1]):
        raise TypeError(f"{cls.__name__} extends {cls.__mro__[1].__name__}, not {type(base).__name__}")
    inherited = {f.name: getattr(base, f.name) for f in dataclasses.fields(cls.__mro__[1])}
    return cls(**inherited, **more)


def _item(self: Any, key: str) -> Any:
    warnings.warn(f"{type(self).__name__}[{key!r}] is now .{key}", DeprecationWarning, stacklevel=2)
    return getattr(self, key)


def _json_key(f: dataclasses.Field) -> str:
    return f.metadata.get("key", f.name)


def to_json(record: Any) -> Any:
    """A record (or a value inside one) as JSON data: the dict ``json.dumps`` writes.

    Args:
      record: a record (:func:`record`), or a list, dict or plain value holding them.

    Returns:
      Dicts keyed by the JSON names in field order; a field marked ``omit`` is left out while None.
    """
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        out = {}
        for f in dataclasses.fields(record):
            value = getattr(record, f.name)
            if not (value is None and f.metadata.get("omit")):
                out[_json_key(f)] = to_json(value)
        return out
    if isinstance(record, dict):
        return {k: to_json(v) for k, v in record.items()}
    if isinstance(record, list | tuple):
        return [to_json(v) for v in record]
    return record


class RecordError(ValueError):
    """JSON that is not the record asked for; the message names the key path."""


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


_PLAIN = {int: (int,), float: (int, float), str: (str,), bool: (bool,)}


def from_json(cls: Any, data: Any, path: str = "$") -> Any:
    """Read JSON data back as a record, strictly.

    Args:
      cls: the record's class (or a type hint: ``list[X]``, ``dict[str, X]``, ``X | None``, ...).
      data: what :func:`to_json` gave, or ``json.loads`` read.
      path: where ``data`` is, for the error message.

    Returns:
      The record; its values are the JSON's own (an integer stays an integer).

    Raises:
      ValueError: a missing or unknown key, or a value of another type, in one line naming its path
        (``$.stages.3.compiled: missing key 'peak'``).
    """
    origin, args = typing.get_origin(cls), typing.get_args(cls)
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return from_json(inner, data, path)
    if dataclasses.is_dataclass(cls):
        return _record_from_json(cls, data, path)
    if origin is list:
        _expect(data, list, path)
        return [from_json(args[0], v, f"{path}[{i}]") for i, v in enumerate(data)]
    if origin is dict:
        _expect(data, dict, path)
        return {k: from_json(args[1], v, f"{path}.{k}") for k, v in data.items()}
    if cls is Any:
        return data
    plain = _PLAIN[cls]
    if not isinstance(data, plain) or (isinstance(data, bool) and bool not in plain):
        raise RecordError(f"{path}: expected {cls.__name__}, got {type(data).__name__}")
    return data


def _expect(data: Any, kind: type, path: str) -> None:
    if not isinstance(data, kind):
        raise RecordError(f"{path}: expected {'an object' if kind is dict else 'a list'}, got {type(data).__name__}")


def _record_from_json(cls: type, data: Any, path: str) -> Any:
    _expect(data, dict, path)
    fields = {_json_key(f): f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise RecordError(f"{path}: unknown key {unknown[0]!r} for {cls.__name__}")
    values = {}
    for key, f in fields.items():
        if key in data:
            values[f.name] = from_json(_hints(cls)[f.name], data[key], f"{path}.{key}")
        elif not f.metadata.get("omit"):
            raise RecordError(f"{path}: missing key {key!r} for {cls.__name__}")
    return cls(**values)


_ATTRIBUTE = re.compile(r"^\s+(\w+): (.+?)\s*$")


def _descriptions(cls: type) -> dict[str, str]:
    """Each field's line in its class's docstring Attributes (the first line of each; a subclass's own win)."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = klass.__dict__.get("__doc__") or ""
        if "Attributes:" in doc:
            for line in doc.split("Attributes:", 1)[1].splitlines():
                if m := _ATTRIBUTE.match(line):
                    out[m.group(1)] = m.group(2)
    return out


def json_schema(cls: type) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a record's JSON, generated from its type hints.

    Every record is a ``$defs`` entry: an object of exactly its fields (``additionalProperties:
    false``), each required but those left out while None, each described from its class's
    docstring. ``dict[str, X]`` is an object of X values, ``X | None`` also accepts null, a float
    also accepts integers.

    Args:
      cls: the record's class; ``jzero plan --json-schema`` prints ``json_schema(PlanReport)``'s.

    Returns:
      The schema, a dict.
    """
    defs: dict[str, Any] = {}
    top = _schema_of(cls, defs)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **top, "$defs": dict(sorted(defs.items()))}


_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}


def _schema_of(hint: Any, defs: dict[str, Any]) -> dict[str, Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_schema_of(a, defs) for a in args]}
    if origin is list:
        return {"type": "array", "items": _schema_of(args[0], defs)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema_of(args[1], defs)}
    if dataclasses.is_dataclass(hint):
        if hint.__name__ not in defs:
            defs[hint.__name__] = {}  # a placeholder first: a record may hold its own kind
            defs[hint.__name__] = _record_schema(hint, defs)
        return {"$ref": f"#/$defs/{hint.__name__}"}
    return {} if hint is Any else {"type": _TYPES[hint]}


def _record_schema(cls: type, defs: dict[str, Any]) -> dict[str, Any]:
    hints, said = _hints(cls), _descriptions(cls)
    properties, required = {}, []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if f.metadata.get("omit"):  # absent rather than null
            hint = typing.Union[tuple(a for a in typing.get_args(hint) if a is not type(None))]  # noqa: UP007
        else:
            required.append(_json_key(f))
        properties[_json_key(f)] = {**_schema_of(hint, defs), **({"description": said[f.name]} if f.name in said else {})}
    doc = (cls.__doc__ or "").strip().splitlines()[0]
    return {"type": "object", "description": doc, "properties": properties, "required": required, "additionalProperties": False}
