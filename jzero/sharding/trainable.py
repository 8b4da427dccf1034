"""Which parameters train (``train.trainable``, or LoRA's adapters), and the trees that hold only those.

A frozen parameter has no gradient and no optimizer state at any stage: its place in the gradient,
optimizer-state and update trees is ``None``, an empty subtree to ``jax.tree`` and optax, so nothing
is allocated, reduced, gathered or updated for it. It still rests at its stage's spec and is
gathered for the forward like any other.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from typing import Any

import jax

from jzero.errors import PlanError
from jzero.trees import path_str

__all__ = ["KEY", "frozen_out", "merged", "trainable_mask"]

KEY = "train.trainable"


def trainable_mask(params: Any, patterns: Sequence[str] | None) -> Any:
    """A bool per parameter (``params``' structure, unboxed): whether any of ``patterns`` finds its path.

    Args:
      params: the parameters, or their shapes (no Flax boxes).
      patterns: path regexes (``re.search`` on ``layers/attn/qkv/kernel``); None trains everything.

    Raises:
      PlanError: naming ``train.trainable[i]``: a pattern is not a regex, or finds no parameter.
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    paths = [path_str(path) for path, _ in leaves]
    if patterns is None:
        return jax.tree.unflatten(treedef, [True] * len(paths))
    found = [_finder(pattern, i, paths) for i, pattern in enumerate(patterns)]
    return jax.tree.unflatten(treedef, [any(f(p) for f in found) for p in paths])


def _finder(pattern: str, i: int, paths: Sequence[str]):
    where = f"{KEY}[{i}]"
    try:
        compiled = re.compile(pattern)
    except re.error as err:
        raise PlanError(where, f"bad regex {pattern!r}: {err}") from None
    if paths and not any(compiled.search(p) for p in paths):
        nearest = difflib.get_close_matches(pattern, paths, n=1, cutoff=0)[0]
        raise PlanError(where, f"{pattern!r} matches no parameter path (the nearest is {nearest!r})")
    return lambda path: compiled.search(path) is not None


def frozen_out(tree: Any, mask: Any) -> Any:
    """``tree`` (a parameters-shaped tree) with ``None`` at each frozen parameter."""
    return jax.tree.map(lambda x, train: x if train else None, tree, mask)


def merged(trainable: Any, full: Any) -> Any:
    """``full`` with each parameter that ``trainable`` holds (not ``None``) taken from ``trainable``."""
    return jax.tree.map(lambda t, f: f if t is None else t, trainable, full, is_leaf=lambda x: x is None)
