"""Typed run configuration: YAML files plus dotted ``--set`` overrides, read into the frozen
dataclasses of :mod:`jzero.config.schema` and checked by :mod:`jzero.config.validation`.

Loading never imports JAX, so the CLI can read ``runtime.cpu_devices`` before JAX starts.
Every problem is raised as one :class:`ConfigError` that names the dotted key.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from jzero.checks import float32
from jzero.config.schema import MAX_FLOAT32, MIN_NORMAL_FLOAT32, Config
from jzero.config.validation import validate
from jzero.errors import ConfigError, checked_path, clip, show_value
from jzero.memory.remat import policy_name
from jzero.sharding.axes import MODEL

__all__ = [
    "MAX_YAML_BYTES",
    "dump_config",
    "from_dict",
    "read_text_file",
    "load_config",
    "parse_override",
]

MAX_YAML_BYTES = 1 << 20  # configs are a few KB; a bigger file is the wrong path (data, a checkpoint)


# ---------------------------------------------------------------------------------------------
# YAML: safe_load's loader, stricter in two ways


# YAML 1.1 (PyYAML's) reads 1e-3 and 1e3 as text; YAML 1.2 reads them as numbers, as people do.
_EXPONENT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$")
_MERGE = "tag:yaml.org,2002:merge"


class _GivenTwice(yaml.YAMLError):
    """A mapping that gives one key twice; ``line`` and ``first`` count from 1."""

    def __init__(self, name: str, line: int, first: int):
        self.name, self.line = name, line
        super().__init__(f"{show_value(name)} is given twice (first at line {first})")


class _Loader(yaml.SafeLoader):
    """``yaml.safe_load``'s loader, with its constructors (plain data only), that also reads ``1e-3``
    as a number and refuses a key given twice in one mapping. Keys merged in by ``<<`` may be
    given again: the mapping's own value wins, as YAML says."""

    def compose_mapping_node(self, anchor: Any) -> yaml.MappingNode:
        node = super().compose_mapping_node(anchor)  # an alias is not composed again: no alias bomb here
        seen: dict[tuple[str, str], int] = {}
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != _MERGE:
                line = key.start_mark.line + 1
                if (key.tag, key.value) in seen:
                    raise _GivenTwice(key.value, line, seen[key.tag, key.value])
                seen[key.tag, key.value] = line
        return node


class _Dumper(yaml.SafeDumper):
    """``yaml.safe_dump``'s dumper, which quotes text such as ``'1e3'`` that :class:`_Loader` reads as a number."""


for _cls in (_Loader, _Dumper):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", _EXPONENT, list("-+.0123456789"))


def _load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # a SafeLoader: nothing but plain data is built


# ---------------------------------------------------------------------------------------------
# Reading files and overrides


def _path(text: str, key: str) -> str:
    """A path as given, with a leading ``~`` made the home folder: the shell leaves it as it is in
    ``--set train.init_from=~/models/x`` (not a variable assignment). The OS refuses a NUL byte, and
    an empty path would mean the working folder."""
    if not text:
        raise ConfigError(key, "a path must not be empty")
    checked_path(key, text)
    return os.path.expanduser(text)


def read_text_file(path: Path, key: str) -> str:
    """A small UTF-8 file's text; every way reading it can fail is one ConfigError naming ``key`` and the path."""
    _path(str(path), key)
    try:
        if path.is_dir():
            raise ConfigError(key, f"{path} is a directory, not a YAML file")
        if not path.exists():
            raise ConfigError(key, f"file not found: {path}")
        if not path.is_file():  # a FIFO or a device would block or never end
            raise ConfigError(key, f"{path} is not a regular file")
        with open(path, "rb") as f:
            data = f.read(MAX_YAML_BYTES + 1)
    except OSError as err:
        raise ConfigError(key, f"cannot read {path}: {err.strerror or err}") from None
    if len(data) > MAX_YAML_BYTES:
        raise ConfigError(key, f"{path} is over {MAX_YAML_BYTES >> 20} MiB; a config is a small YAML file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise ConfigError(key, f"{path} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})") from None


def _read_yaml(path: Path, key: str) -> Any:
    """A YAML file's content, or one ConfigError naming ``key``, the path and, where it can, the line."""
    text = read_text_file(path, key)
    try:
        return _load_yaml(text)
    except _GivenTwice as err:
        raise ConfigError(key, f"{path} line {err.line}: {err}") from None
    except RecursionError:
        raise ConfigError(key, f"{path} is nested too deeply to read") from None
    except Exception as err:  # also YAML Python cannot build: the date 2001-13-01, a 5000-digit int
        mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
        detail = f"line {mark.line + 1}: {problem}" if mark and problem else (str(err).strip() or type(err).__name__)
        raise ConfigError(key, f"{path} is not valid YAML ({clip(detail.splitlines()[0])})") from None


def parse_override(text: str) -> tuple[str, Any]:
    """``"a.b=3"`` -> ``("a.b", 3)``; the value is read as a YAML scalar, as in a config file."""
    if "=" not in text:
        raise ConfigError("--set", f"expected KEY=VALUE, got {show_value(text)}")
    key, _, raw = text.partition("=")
    key = key.strip()
    if not key:
        raise ConfigError("--set", f"empty key in {show_value(text)}")
    try:
        value = _load_yaml(raw) if raw.strip() else None
    except _GivenTwice as err:
        raise ConfigError(key, f"the value gives {show_value(err.name)} twice") from None
    except RecursionError:
        raise ConfigError(key, "value is nested too deeply to read") from None
    except Exception:  # not YAML, or YAML Python cannot build (the date 2001-13-01): the text itself
        value = raw
    return key, value


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    node = tree
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(".".join(parts[: i + 1]), "is a value, not a section")
        node = child
    node[parts[-1]] = value


def _resolve_mesh(raw: dict[str, Any], base: Path) -> None:
    """A ``mesh:`` that is a string names a mesh file, relative to the config file's folder."""
    if isinstance(raw.get("mesh"), str):
        mesh_path = base / _path(raw["mesh"], "mesh")
        mesh = _read_yaml(mesh_path, "mesh")
        if not isinstance(mesh, dict):
            raise ConfigError("mesh", f"{mesh_path} must hold a mapping with 'axes:'")
        raw["mesh"] = mesh


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Read a run config.

    Args:
      path: a YAML config file (None: the defaults; an empty file is refused). A ``mesh:`` that is
        a string, in the file or from ``--set mesh=...``, names a mesh file relative to the config
        file's folder (the working directory when there is no file).
      overrides: ``KEY=VALUE`` strings, dotted keys, values read as YAML scalars.

    Returns:
      The validated, frozen :class:`~jzero.config.schema.Config`.

    Raises:
      ConfigError: one line naming the key or file and what is wrong.
    """
    raw: dict[str, Any] = {}
    base = Path.cwd()
    if path is not None:
        path = Path(path)
        loaded = _read_yaml(path, "config")
        if loaded is None:  # an empty file, or only comments: most likely not the file meant
            raise ConfigError("config", f"{path} holds no settings; start from a copy of configs/gpt-tiny.yaml")
        if not isinstance(loaded, dict):
            raise ConfigError("config", f"{path} must hold a mapping of sections")
        raw = loaded
        base = path.parent
    for item in overrides or []:
        key, value = parse_override(item)
        _resolve_mesh(raw, base)  # so that mesh.axes.* overrides apply inside a named mesh file
        _set_dotted(raw, key, value)
    _resolve_mesh(raw, base)
    return from_dict(raw)


# ---------------------------------------------------------------------------------------------
# Typed conversion and validation


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        inner = [o for o in options if o is not type(None)]
        if set(inner) == set(_SCALARS):  # any plain scalar, as YAML typed it (compiler.xla_options)
            return _scalar(value, key)
        if len(inner) > 1:  # e.g. str | list[str]: pick by the value's own shape
            inner = [o for o in inner if _kind(o) == _kind(value)] or inner
        return _coerce(value, inner[0], key)
    if dataclasses.is_dataclass(hint):
        if value is None:
            return hint()
        if not isinstance(value, dict):
            raise ConfigError(key, f"must be a section (mapping), got {show_value(value)}")
        return _build(hint, value, key)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, f"must be true or false, got {show_value(value)}")
    if hint is int:
        return _integer(value, key)
    if hint is float:
        return _float(value, key)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(key, f"must be a string, got {show_value(value)}")
        return value
    if origin is typing.Annotated:  # PathText, the one mark there is
        return _path(_coerce(value, str, key), key)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"must be a mapping, got {show_value(value)}")
        _, val_hint = typing.get_args(hint)
        return {str(k): _coerce(v, val_hint, f"{key}.{_name(k)}") for k, v in value.items()}
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(key, f"must be a list, got {show_value(value)}")
        (item_hint,) = typing.get_args(hint)
        return [_coerce(v, item_hint, f"{key}[{i}]") for i, v in enumerate(value)]
    raise TypeError(f"unsupported config type {hint!r} at {key}")


_SCALARS = (bool, int, float, str)


def _scalar(value: Any, key: str) -> bool | int | float | str:
    """A value kept as the type YAML gave it: true/false, an int64, a finite float or a string."""
    if not isinstance(value, _SCALARS):
        raise ConfigError(key, f"must be true, false, a number or a string, got {show_value(value)}")
    if isinstance(value, int) and not isinstance(value, bool):
        return _integer(value, key)
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(key, f"must be a finite number, got {show_value(value)}")
    return value


def _kind(hint_or_value: Any) -> str:
    """What shape a type hint takes, or a value has: list, mapping, bool or scalar."""
    x = hint_or_value
    if x is list or typing.get_origin(x) is list or isinstance(x, list):
        return "list"
    if x is dict or typing.get_origin(x) is dict or dataclasses.is_dataclass(x) or isinstance(x, dict):
        return "mapping"
    if x is bool or isinstance(x, bool):
        return "bool"
    return "scalar"


def _integer(value: Any, key: str) -> int:
    """An int, or a float of integral value (``1e6``); never text, never past int64."""
    number = value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        number = int(value)
    if isinstance(value, str) and len(digits := value.strip().lstrip("+-")) > 19 and digits.isdigit():
        number = 2**63  # past int64, and past what Python converts from --set (a file's YAML refuses it)
    if isinstance(number, bool) or not isinstance(number, int):
        raise _not_a_number(value, key, "an integer")
    if not -(2**63) <= number < 2**63:
        raise ConfigError(key, f"is out of range (more than 64 bits), got {show_value(value)}")
    return number


def _float(value: Any, key: str) -> float:
    """A number that stays finite, and nonzero if it is, as the float32 the step uses it in."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _not_a_number(value, key, "a number")
    try:
        number = float(value)
    except OverflowError:  # an int beyond any float
        number = math.inf
    if not math.isfinite(number):
        raise ConfigError(key, f"must be a finite number, got {show_value(value)}")
    narrow = float32(number)
    if math.isinf(narrow):
        why = "float32's largest, as the step uses it"
        raise ConfigError(key, f"must be at most {MAX_FLOAT32:g} in size ({why}), got {number:g}")
    if number and abs(narrow) < MIN_NORMAL_FLOAT32:
        why = "float32's smallest normal, as the step uses it; XLA on the CPU makes smaller ones 0"
        raise ConfigError(key, f"must be 0 or at least {MIN_NORMAL_FLOAT32:g} in size ({why}), got {number:g}")
    return number


def _not_a_number(value: Any, key: str, kind: str) -> ConfigError:
    """``must be an integer, got 'x'``; text that reads as a number was quoted, and a quoted number is a string."""
    note = " (a string: write it without quotes)" if isinstance(value, str) and _reads_as_number(value) else ""
    return ConfigError(key, f"must be {kind}, got {show_value(value)}{note}")


def _reads_as_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _name(key: Any) -> str:
    """A mapping key as it appears in a dotted error key, cut short."""
    return clip(key) if isinstance(key, str) else show_value(key)


def _build(cls: type, raw: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls, include_extras=True)
    fields = {f.name.removesuffix("_"): f.name for f in dataclasses.fields(cls)}  # YAML name -> field
    kwargs = {}
    for name, value in raw.items():
        key = f"{prefix}.{_name(name)}" if prefix else _name(name)
        if name not in fields:
            raise ConfigError(key, f"unknown key (known: {', '.join(sorted(fields))})")
        kwargs[fields[name]] = _coerce(value, hints[fields[name]], key)
    return cls(**kwargs)


def from_dict(raw: dict[str, Any], schema: type[Config] = Config) -> Config:
    """Build and validate a :class:`Config` from a plain (YAML-shaped) mapping.

    Args:
      raw: the mapping, sections by name.
      schema: the config's class: :class:`Config`, or a subclass whose sections add keys (each
        section's own ``check()`` then checks them).
    """
    config = _with_defaults(_build(schema, raw, ""))
    validate(config)
    return config


def _with_defaults(config: Config) -> Config:
    """Defaults that depend on other values, resolved once where the config is built: a mesh
    without a ``model`` axis gets one of size 1, ``runtime.distributed: off`` and
    ``runtime.compilation_cache: off`` (which YAML reads as false) are spelled ``off``;
    ``model.remat: true`` and ``false`` (its old values) are spelled ``full`` and ``none``."""
    axes = config.mesh.axes
    if MODEL not in axes:
        config = dataclasses.replace(config, mesh=dataclasses.replace(config.mesh, axes={**axes, MODEL: 1}))
    for key in ("distributed", "compilation_cache"):
        if getattr(config.runtime, key) is False:
            config = dataclasses.replace(config, runtime=dataclasses.replace(config.runtime, **{key: "off"}))
    if isinstance(config.model.remat, bool):
        remat = policy_name(config.model.remat)
        config = dataclasses.replace(config, model=dataclasses.replace(config.model, remat=remat))
    return config


def dump_config(config: Config) -> str:
    """The resolved config as YAML, mesh inline, loadable by :func:`load_config`."""
    return yaml.dump(config.to_dict(), Dumper=_Dumper, sort_keys=False)
