"""Names that load on first use (PEP 562), for a package's table of public names, and names that
moved, still answering from their old module with a warning.

``import jzero`` imports nothing else: the command line installs its Ctrl-C handler before JAX's
seconds of importing begin, and ``jzero.make_plan`` imports the plan module when first used.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names", "moved_names"]


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
        elif importlib.util.find_spec(f"{package}.{name}") is not None:  # a subpackage: jzero.ledger
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *table})

    return __getattr__, __dir__


def moved_names(module: str, table: Mapping[str, str]) -> Callable[[str], Any]:
    """A module's ``__getattr__`` for names that moved away from it.

    Args:
      module: the old module's ``__name__``.
      table: ``{old name: "new.module.new_name"}``.

    Returns:
      ``__getattr__``: each old name answers with its new home's object and a ``DeprecationWarning``
      naming that home; any other name is an ``AttributeError``.
    """

    def __getattr__(name: str) -> Any:
        if name not in table:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} is now {table[name]}", DeprecationWarning, stacklevel=2)
        home, _, attr = table[name].rpartition(".")
        return getattr(importlib.import_module(home), attr)

    return __getattr__
