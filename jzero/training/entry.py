"""A model of yours named by the config: ``model.entry``'s file or module loaded, and its function's
``(init_fn, loss_fn)`` checked. What :func:`jzero.training.job.build_job` trains for ``model.name: own``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from jzero.config.schema import Config
from jzero.errors import ConfigError, show_value
from jzero.models.names import OWN

__all__ = ["own_model"]


def own_model(config: Config) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """A model of yours, from ``model.entry``: ``FILE.py:FUNCTION`` (relative to the working
    directory) or ``MODULE:FUNCTION`` (importable), where ``FUNCTION(config)`` returns
    ``(init_fn, loss_fn)``. What the command line trains and plans for ``model.name: own``.

    Args:
      config: a config with ``model.name: own``.

    Returns:
      ``(init_fn, loss_fn)``, as :func:`jzero.training.job.build_job` takes them.

    Raises:
      ConfigError: naming ``model.entry``: it is not set, its file or module is not found, it has no
        such function, or the function returns something else. An error raised inside your module
        or function is raised as it is.
    """
    where, sep, name = (config.model.entry or "").rpartition(":")
    if not sep:
        passed = "or init_fn and loss_fn passed to jzero.build_job"
        raise ConfigError("model.entry", f"model.name: {OWN} needs FILE.py:FUNCTION (or MODULE:FUNCTION) here, {passed}")
    module = _entry_module(where)
    function = getattr(module, name, None)
    if not callable(function):
        raise ConfigError("model.entry", f"{where} has no function {name!r}")
    parts = function(config)
    if not (isinstance(parts, tuple) and len(parts) == 2 and all(callable(p) for p in parts)):
        raise ConfigError("model.entry", f"{name}(config) must return (init_fn, loss_fn), got {show_value(parts)}")
    return parts


def _entry_module(where: str) -> ModuleType:
    """The module a ``model.entry`` names: a ``.py`` file, loaded once under its own name (Flax
    modules, being dataclasses, look their module up in ``sys.modules``), or an importable module."""
    if not where.endswith(".py"):
        try:
            return importlib.import_module(where)
        except ModuleNotFoundError as err:
            raise ConfigError("model.entry", f"no module {err.name!r} (from {where!r})") from None
    path = Path(where).resolve()
    if not path.is_file():
        raise ConfigError("model.entry", f"file not found: {where}")
    name = f"jzero_model_{hashlib.sha1(str(path).encode()).hexdigest()[:12]}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]
