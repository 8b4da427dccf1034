"""One parameter's plan (:class:`TensorPlan`: where it lives at rest, as a gradient and in the
optimizer), the optimizer leaves that follow it, and the units stage 3 gathers it in. The parts of
:func:`jzero.sharding.plan.make_plan` that work tensor by tensor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jzero.communication.units import unit_names
from jzero.dtypes import array_bytes
from jzero.sharding.axes import LAYERS
from jzero.sharding.partition import data_partition
from jzero.sharding.stages import StageRule
from jzero.trees import path_str

__all__ = ["TensorPlan", "gather_units", "optimizer_leaf_shardings"]


@dataclasses.dataclass(frozen=True)
class TensorPlan:
    """One parameter: where it lives at rest, as a gradient, and in the optimizer."""

    path: str
    shape: tuple[int, ...]
    dtype: np.dtype
    logical: tuple[str | None, ...] | None
    replicated_spec: P  # R: model axes only
    sharded_spec: P  # D: R plus the data axis, or R when nothing divides
    data_dim: int | None  # the dimension ``data`` splits in D; None if none divides
    param_spec: P
    grad_spec: P
    optimizer_spec: P  # the optimizer state's spec, and where the update runs
    trainable: bool = True  # False: frozen (train.trainable), with no gradient and no optimizer state

    @property
    def nbytes(self) -> int:
        return array_bytes(self.shape, self.dtype)


def gather_units(tensors: list[TensorPlan], setting: str | Sequence[str]) -> tuple[dict[str, int], tuple[str, ...]]:
    """The units of the parameters stage 3 gathers (those partitioned at rest): path -> number, and
    each number's name. ``setting``: ``zero.gather_units``."""
    scanned = any(LAYERS in (t.logical or ()) for t in tensors)
    names = unit_names([t.path for t in tensors], [t.nbytes for t in tensors], setting, scanned=scanned)
    numbers: dict[str, int] = {}
    gathered = [t.path for t in tensors if t.path in names and t.param_spec != t.replicated_spec]
    units = {path: numbers.setdefault(names[path], len(numbers)) for path in gathered}
    return units, tuple(numbers)


def optimizer_leaf_shardings(opt_state: Any, tensors: list[TensorPlan], mesh: Mesh, rule: StageRule):
    """Each optimizer leaf follows the parameter whose path it ends with (and whose shape it has)."""
    by_path = {tuple(t.path.split("/")): t for t in tensors}
    lengths = sorted({len(k) for k in by_path}, reverse=True)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(opt_state)
    specs, report = [], []
    for path, leaf in leaves:
        keys = tuple(jax.tree_util.keystr((k,), simple=True) for k in path)
        shape = tuple(getattr(leaf, "shape", ()))
        dtype = np.dtype(getattr(leaf, "dtype", np.float32))
        matches = (by_path.get(keys[-n:]) for n in lengths if len(keys) >= n)
        owner = next((t for t in matches if t is not None and t.shape == shape), None)
        if owner is not None:
            spec = owner.optimizer_spec
        elif not shape or not rule.optimizer:
            spec = P()
        else:
            spec, _ = data_partition(shape, P(), mesh)
        specs.append(spec)
        report.append((path_str(path), shape, dtype, spec))
    return report, treedef.unflatten([NamedSharding(mesh, s) for s in specs])
