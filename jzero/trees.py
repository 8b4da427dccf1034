"""A pytree's paths as text, ``params/blocks/mlp_in/kernel``: the one spelling that plans, units,
checkpoints and exports all use for a tensor."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

__all__ = ["path_str", "tree_paths"]


def path_str(path: Sequence[Any]) -> str:
    """``a/b/kernel`` for a tree path; NNX's trailing ``.value`` attribute is left out."""
    if path and getattr(path[-1], "name", None) == "value":
        path = path[:-1]
    return jax.tree_util.keystr(tuple(path), simple=True, separator="/")


def tree_paths(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> dict[str, Any]:
    """``{"params/blocks/mlp_in/kernel": leaf, ...}`` for any pytree (dicts, lists, dataclasses)."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
    return {path_str(path): leaf for path, leaf in leaves}
