"""Names that load on first use (PEP 562), for a package's table of public names, and names and
modules that moved, still answering from their old place with a warning.

``import jzero`` imports nothing else: the command line installs its Ctrl-C handler before JAX's
seconds of importing begin, and ``jzero.make_plan`` imports the plan module when first used.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["MOVED_NAMES", "lazy_names", "moved_modules", "moved_names"]


def lazy_names(package: str, table: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` for ``table``, ``{name: module}``.

    Args:
      package: the package's ``__name__``.
      table: each public name and the module that defines it.

    Returns:
      ``(__getattr__, __dir__)``. A name not in the table may be a submodule (``jzero.ledger``).
      Each name found is kept on the package, so later uses skip this.
    """

    def __getattr__(name: str) -> Any:
        if name in table:
            value = getattr(importlib.import_module(table[name]), name)
        elif "__path__" in vars(sys.modules[package]) and importlib.util.find_spec(f"{package}.{name}") is not None:
            # a subpackage (jzero.ledger); a plain module has none, and asking would recurse for __path__
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *table})

    return __getattr__, __dir__


MOVED_NAMES: dict[str, dict[str, str]] = {}  # module -> its moved_names table; tests/test_api.py resolves each


def moved_names(module: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A module's ``__getattr__`` for names that moved away from it.

    Args:
      module: the old module's ``__name__``.
      table: ``{old name: "new.module.new_name"}`` (or ``"new.module.Class.method"``).

    Returns:
      ``__getattr__``: each old name answers with its new home's object and a ``DeprecationWarning``
      naming that home; any other name is an ``AttributeError``.
    """
    MOVED_NAMES[module] = dict(table)
    return _answering_from_new_homes(module, table)


def _answering_from_new_homes(module: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """:func:`moved_names`' ``__getattr__``, unregistered (a moved module's stand-in answers for every name)."""

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} is now {table[name]}", DeprecationWarning, stacklevel=2)
        return _resolve(table[name])

    return __getattr__


def _resolve(dotted: str) -> Any:
    """The object a dotted name names: a module's attribute, or an attribute of one
    (``"jzero.memory.config.PrecisionConfig.build"``)."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            found = getattr(found, attr)
        return found
    raise ModuleNotFoundError(dotted)


def moved_modules(table: Mapping[str, str]) -> None:
    """Keep each moved module importable from its old name.

    Args:
      table: ``{old module: new module}``, both full names (``"jzero.plan": "jzero.sharding.plan"``).

    Importing an old name gives a stand-in module: each name read from it is the new module's, with a
    ``DeprecationWarning`` naming its new home. Nothing is imported until an old name is.
    """
    if not any(isinstance(f, _MovedModules) and f.table == table for f in sys.meta_path):
        sys.meta_path.append(_MovedModules(dict(table)))


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The import system's finder and loader for :func:`moved_modules`' old names."""

    def __init__(self, table: dict[str, str]):
        self.table = table

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        return importlib.util.spec_from_loader(name, self) if name in self.table else None

    def create_module(self, spec: Any) -> types.ModuleType:
        return types.ModuleType(spec.name, f"Moved to {self.table[spec.name]}.")

    def exec_module(self, module: types.ModuleType) -> None:
        new = self.table[module.__name__]
        module.__getattr__ = _answering_from_new_homes(module.__name__, _Everything(new))
        module.__dir__ = lambda: dir(importlib.import_module(new))


class _Everything(Mapping[str, str]):
    """``{name: "module.name"}`` for every name ``module`` has, read when asked: ``dir`` misses the
    names a module itself serves as moved (``jzero.mesh.on_gpus``)."""

    def __init__(self, module: str):
        self.module = module

    def __getitem__(self, name: str) -> str:
        if not hasattr(importlib.import_module(self.module), name):
            raise KeyError(name)
        return f"{self.module}.{name}"

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and not name.startswith("__") and hasattr(importlib.import_module(self.module), name)

    def __iter__(self):
        return iter(dir(importlib.import_module(self.module)))

    def __len__(self) -> int:
        return len(dir(importlib.import_module(self.module)))
