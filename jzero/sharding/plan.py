"""ZeRO stages as sharding specs: (abstract state, mesh, stage, rules) -> shardings + a report.

One rule table (:data:`jzero.sharding.stages.STAGES`) says which of parameters, gradients and optimizer state a stage
partitions over ``data``. Every tensor gets two specs:

- ``R``: its model-parallel spec (path rules, else logical names through the rules), replicated
  over ``data``;
- ``D``: ``R`` plus ``data`` on the largest dimension that ``data`` divides and no model axis uses
  (the scan axis ``layers`` only as a last resort, so stage 3 can still gather one layer at a time),
  plus ``model`` too when ``R`` leaves the tensor whole on it (see :func:`jzero.sharding.partition.zero_axes`).

A stage then picks ``R`` or ``D`` for each of the three roles. Optimizer state follows its parameter,
matched by tree path suffix and shape; other optimizer leaves get their own ``D`` and scalars stay
replicated.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jzero.communication.quantize import Layout, layout
from jzero.dtypes import array_bytes
from jzero.errors import PlanError
from jzero.lazy import moved_names
from jzero.memory.offload import on_host
from jzero.memory.precision import MasterState
from jzero.sharding.axes import DATA, LAYERS, MODEL, REPLICA, model_ways
from jzero.sharding.partition import data_partition, drop_first, hierarchy, shard_bytes, without_axis
from jzero.sharding.rules import axes_of, check_path_rules, logical_names, logical_to_mesh, model_spec, normal_rules
from jzero.sharding.stages import StageRule, StateBytes, ZeroOptions, per_device_parts
from jzero.sharding.state import TrainState
from jzero.sharding.tensor_plan import TensorPlan, gather_units, optimizer_leaf_shardings
from jzero.sharding.trainable import frozen_out, trainable_mask
from jzero.trees import path_str

__all__ = ["Plan", "TensorPlan", "make_plan"]

# The plan uses the other moved names, so they import from here as they always did; these two it does not.
__getattr__ = moved_names(
    __name__, {"default_rules": "jzero.sharding.rules.default_rules", "zero_axes": "jzero.sharding.partition.zero_axes"}
)


class _Gathers:
    """What a plan's step gathers: each parameter's all-gather, qwZ's and qgZ's blocks, hpZ's
    secondary partition, stage 3's units and a layer's bytes (a part of :class:`Plan`)."""

    def secondary_spec(self, spec: P) -> P:
        """hpZ: a resting spec without ``replica``, the secondary partition within a host."""
        return P(*(without_axis(e, REPLICA) for e in spec))

    def parameter_gather(self, t: TensorPlan) -> tuple[tuple[int, ...], P, P] | None:
        """``(shape, from, to)`` of the all-gather that makes a parameter whole for the forward: at
        stage 3 its resting spec to its model spec (for one layer of a scanned stack, gathered in
        the loop), at stages 1-2 the updated slice to its resting spec; None if it has none."""
        source, target = (t.param_spec, t.replicated_spec) if self.rule.params else (t.optimizer_spec, t.param_spec)
        if source == target:
            return None
        shape = t.shape
        if self.rule.params and (t.logical or (None,))[0] == LAYERS:
            shape, source, target = shape[1:], drop_first(source, len(shape)), drop_first(target, len(shape))
        return shape, source, target

    def weight_layouts(self) -> dict[str, Layout | str]:
        """qwZ: each gathered parameter's blocks (:func:`jzero.communication.quantize.layout`), or why it is
        gathered at full precision; empty when weights are not quantized."""
        if not self.zero.qwz:
            return {}
        out: dict[str, Layout | str] = {}
        for t in self.tensors:
            gathered = self.parameter_gather(t)
            if gathered is None:
                continue
            shape, source, _ = gathered
            if source == P(*([None] * len(shape))):
                out[t.path] = "split along its layers dimension"
            elif (t.logical or (None,))[0] == LAYERS and len(t.shape) < 3:
                out[t.path] = "1-D"  # a stack of 1-D layers, gathered whole at stages 1-2
            else:
                out[t.path] = layout(shape, source, self.mesh, self.zero.quantization_block)
        return out

    def gradient_blocks(self) -> dict[str, int]:
        """qgZ: the quantization block of each gathered parameter's gradient, the plan's block or,
        for a shard smaller than it, the largest power of two that fits (at least 2, the two int4
        values of a byte); empty without qgZ. Every one is quantized: an all-to-all's rows are
        padded to whole blocks, so no shape falls back to full precision."""
        if not self.qgz:
            return {}
        out = {}
        for t in self.tensors:
            gathered = self.parameter_gather(t)
            if gathered is not None:
                shape, source, _ = gathered
                local = shard_bytes(shape, np.int8, source, self.mesh)
                out[t.path] = max(2, min(self.zero.quantization_block, 1 << (local.bit_length() - 1)))
        return out

    @property
    def unit_tensors(self) -> dict[str, list[str]]:
        """Stage 3's gathering units, each by name with its tensors' paths, in the order the units
        first appear: ``{"layers_0": ["layers_0/attn/kernel", ...], "embed/embedding": [...]}``. A
        unit's name is the path prefix its tensors share, or the path of a tensor gathered alone.
        Empty when XLA places the gathers (no units, or a stage below 3)."""
        out: dict[str, list[str]] = {}
        for path, number in self.units.items():
            out.setdefault(self.unit_names[number], []).append(path)
        return out

    def unit_bytes(self, dtype: Any = None) -> list[int]:
        """Each unit's gathered bytes per device (model axes still split), in ``dtype`` (default: the
        parameters' own)."""
        out: dict[int, int] = {}
        for t in self.tensors:
            if t.path in self.units:
                nbytes = shard_bytes(t.shape, dtype or t.dtype, t.replicated_spec, self.mesh)
                out[self.units[t.path]] = out.get(self.units[t.path], 0) + nbytes
        return [out[k] for k in sorted(out)]

    def layer_bytes(self, dtype: Any = None) -> int:
        """One layer's gathered bytes per device (model axes still split), in ``dtype`` (default:
        the parameters' own): the largest gathering unit or, for a scanned stack, one slice of its
        ``layers`` dimension; 0 with neither."""
        if self.units:
            return max(self.unit_bytes(dtype))
        stacked = [t for t in self.tensors if LAYERS in (t.logical or ())]
        if not stacked:
            return 0
        layers = stacked[0].shape[stacked[0].logical.index(LAYERS)]
        return sum(shard_bytes(t.shape, dtype or t.dtype, t.replicated_spec, self.mesh) for t in stacked) // layers


class _Bytes:
    """What each device holds of the model states, where, and the paper's figure for it (a part of
    :class:`Plan`)."""

    def secondary_bytes(self, dtype: Any = None) -> int:
        """hpZ: per device, the secondary copy of every gathered parameter, in ``dtype`` (default
        their own): the paper's parameter bytes over the devices of a host (``data``) and N_m."""
        if not self.hpz:
            return 0
        return sum(
            shard_bytes(t.shape, dtype or t.dtype, self.secondary_spec(t.param_spec), self.mesh)
            for t in self.tensors
            if t.param_spec != t.replicated_spec
        )

    def state_bytes(self) -> StateBytes:
        """Model-state bytes of each device's shards, wherever they rest (the largest shard of each tensor)."""
        params = sum(shard_bytes(t.shape, t.dtype, t.param_spec, self.mesh) for t in self.tensors)
        grads = sum(shard_bytes(t.shape, t.dtype, t.grad_spec, self.mesh) for t in self.tensors if t.trainable)
        opt = sum(shard_bytes(s, d, spec, self.mesh) for _, s, d, spec in self.opt_leaves)
        return StateBytes.of(params, grads, opt)

    def per_device_bytes(self) -> StateBytes:
        """Model-state bytes per device in device memory, from the specs; an offloaded group counts 0."""
        return self._split(on_host=False)

    def host_bytes(self) -> StateBytes:
        """Model-state bytes per device that rest in pinned host memory (an offloaded group's shards)."""
        return self._split(on_host=True)

    def _split(self, on_host: bool) -> StateBytes:
        every = self.state_bytes()
        params = every.params if self.zero.offload_params == on_host else 0
        optimizer = every.optimizer if self.zero.offload_optimizer == on_host else 0
        return StateBytes.of(params, 0 if on_host else every.grads, optimizer)  # gradients never rest on the host

    def ideal_per_device_bytes(self) -> StateBytes:
        """The paper's formula: each state's full bytes, over N_d when the stage partitions it, over N_m.

        For fp32 Adam this is 4Ψ, 4Ψ and 8Ψ (K = 8), each divided by N_d where sharded; with frozen
        parameters the gradients and the optimizer state count the trainable Ψ only.
        """
        full_params = sum(t.nbytes for t in self.tensors)
        full_grads = sum(t.nbytes for t in self.tensors if t.trainable)
        full_opt = sum(array_bytes(s, d) for _, s, d, _ in self.opt_leaves)
        n_m = model_ways(self.mesh.shape)
        parts = per_device_parts(full_params, full_grads, full_opt, self.zero.stage, self.partition_size, n_m)
        return StateBytes.of(*(int(round(parts[k])) for k in ("params", "grads", "optimizer")))


@dataclasses.dataclass
class Plan(_Gathers, _Bytes):
    """The shardings of one stage on one mesh, and what they cost per device."""

    mesh: Mesh
    zero: ZeroOptions  # the stage and every ZeRO option, as planned (each readable on the plan too)
    rules: tuple[tuple[str, str | None], ...]
    params: Any  # NamedSharding tree: parameters at rest
    grads: Any  # gradients after reduction
    optimizer: Any  # parameters and gradients where the optimizer updates them: as its state is sharded
    opt_state: Any
    batch: NamedSharding
    state: TrainState  # shardings of the whole train state (for jit in/out_shardings)
    tensors: list[TensorPlan]
    opt_leaves: list[tuple[str, tuple[int, ...], np.dtype, P]]
    # Stage 3's gathering units (:mod:`jzero.communication.units`): parameter path -> unit, for those the step
    # gathers unit by unit; empty when XLA places the gathers.
    units: dict[str, int] = dataclasses.field(default_factory=dict)
    unit_names: tuple[str, ...] = ()  # unit number -> its name (:func:`jzero.communication.units.unit_names`)
    # One line per group of units the loss could not split (jzero.communication.loss_units.split_units): left to XLA.
    merged_units: tuple[str, ...] = ()
    # The path regexes of the parameters that train (train.trainable; TensorPlan.trainable); None: all do.
    trainable: tuple[str, ...] | None = None

    def trainable_mask(self) -> Any:
        """A bool per parameter (the parameters' structure): whether it trains."""
        return jax.tree.unflatten(jax.tree.structure(self.params), [t.trainable for t in self.tensors])

    def trainable_view(self) -> Plan:
        """The plan of the parameters that train, as the step differentiates and updates them: its
        ``params``, ``grads`` and ``optimizer`` trees hold ``None`` at each frozen parameter, and its
        tensors leave them out (:mod:`jzero.sharding.trainable`). The plan itself when all train."""
        if self.trainable is None:
            return self
        mask = self.trainable_mask()
        trees = {name: frozen_out(getattr(self, name), mask) for name in ("params", "grads", "optimizer")}
        return dataclasses.replace(self, tensors=[t for t in self.tensors if t.trainable], **trees)

    def __getattr__(self, name: str) -> Any:
        """Each option of :attr:`zero` read on the plan: ``plan.stage``, ``plan.offload_params``."""
        if name in _ZERO_FIELDS and "zero" in self.__dict__:
            return getattr(self.__dict__["zero"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def hpz(self) -> bool:
        return self.zero.hpz

    @property
    def qgz(self) -> bool:
        """The loss runs under ``jax.shard_map`` (:func:`jzero.sharding.gathers.manual_loss`), its gradient
        reduced by quantized all-to-alls."""
        return self.zero.qgz

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """The mesh axes the batch is split over, major first."""
        axes = self.batch.spec[0]
        return axes if isinstance(axes, tuple) else (axes,)

    @property
    def persistent(self) -> list[TensorPlan]:
        """Stage 3: parameters left whole at rest for their size (``zero.persist_below_bytes``)."""
        if not self.rule.params:
            return []
        return [t for t in self.tensors if t.data_dim is not None and t.param_spec == t.replicated_spec]

    @property
    def rule(self) -> StageRule:
        return self.zero.rule

    @property
    def data_size(self) -> int:
        return int(self.mesh.shape[DATA])

    @property
    def partition_size(self) -> int:
        """N_d of the paper's formulas: the ``data`` axis, times ``replica`` under hpZ."""
        return self.data_size * (int(self.mesh.shape.get(REPLICA, 1)) if self.hpz else 1)

    @property
    def replicated(self) -> list[TensorPlan]:
        """Parameters that no dimension lets ``data`` split: they stay whole on every device."""
        return [t for t in self.tensors if t.data_dim is None]

    @property
    def not_on_model(self) -> list[TensorPlan]:
        """With a ``model`` axis of size > 1: parameters no rule splits over it (whole per model group
        before ZeRO)."""
        if int(self.mesh.shape.get(MODEL, 1)) == 1:
            return []
        return [t for t in self.tensors if not any(MODEL in axes_of(e) for e in t.replicated_spec)]

    @property
    def num_params(self) -> int:
        return sum(math.prod(t.shape) for t in self.tensors)


_ZERO_FIELDS = frozenset(f.name for f in dataclasses.fields(ZeroOptions))


def _tensor_plan(
    name: str,
    leaf: Any,
    logical: tuple | None,
    mesh: Mesh,
    rules: Sequence[Sequence[Any]],
    path_rules: Sequence[Sequence[Any]],
    rule: StageRule,
    persist_below_bytes: int,
    hierarchy: tuple[str, ...] = (),
) -> TensorPlan:
    """One parameter's R and D specs, and which of them the stage gives each role."""
    shape = tuple(leaf.shape)
    rspec = model_spec(name, shape, logical, mesh, rules, path_rules)
    dspec, dim = data_partition(shape, rspec, mesh, logical, hierarchy)
    return TensorPlan(
        path=name,
        shape=shape,
        dtype=np.dtype(leaf.dtype),
        logical=logical,
        replicated_spec=rspec,
        sharded_spec=dspec,
        data_dim=dim,
        param_spec=dspec if rule.params and array_bytes(shape, leaf.dtype) >= persist_below_bytes else rspec,
        grad_spec=dspec if rule.grads else rspec,
        optimizer_spec=dspec if rule.optimizer else rspec,
    )


def _tensor_plans(
    abstract_params: Any,
    mesh: Mesh,
    rules: Sequence[Sequence[Any]],
    path_rules: Sequence[Sequence[Any]],
    rule: StageRule,
    persist_below_bytes: int,
    hierarchy: tuple[str, ...] = (),
) -> tuple[list[TensorPlan], Any]:
    """Every parameter's :class:`TensorPlan`, in tree order, and the unboxed parameters' treedef."""
    names = logical_names(abstract_params)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(nn.unbox(abstract_params))
    tensors = []
    for path, leaf in leaves:
        name = path_str(path)
        logical = names.get(name)
        tensors.append(_tensor_plan(name, leaf, logical, mesh, rules, path_rules, rule, persist_below_bytes, hierarchy))
    return tensors, treedef


def _plan_shardings(
    abstract_state: TrainState,
    tensors: list[TensorPlan],
    treedef: Any,
    mesh: Mesh,
    rule: StageRule,
    offload_optimizer: bool,
    offload_params: bool,
) -> dict[str, Any]:
    """The Plan's sharding trees (params, grads, optimizer, opt_state, state) and its optimizer leaves."""

    def tree(specs):
        return treedef.unflatten([NamedSharding(mesh, s) for s in specs])

    param_shardings = tree(t.param_spec for t in tensors)
    if offload_params:
        param_shardings = on_host(param_shardings)
    grad_shardings = tree(t.grad_spec for t in tensors)
    optimizer_shardings = tree(t.optimizer_spec for t in tensors)

    opt_leaves, opt_shardings = optimizer_leaf_shardings(abstract_state.opt_state, tensors, mesh, rule)
    if offload_optimizer:
        opt_shardings = on_host(opt_shardings)
    replicated = NamedSharding(mesh, P())
    state = TrainState(
        step=replicated,
        params=param_shardings,
        opt_state=opt_shardings,
        skipped=replicated,
        loss_scale=jax.tree.map(lambda _: replicated, abstract_state.loss_scale),
    )
    return {
        "params": param_shardings,
        "grads": grad_shardings,
        "optimizer": optimizer_shardings,
        "opt_state": opt_shardings,
        "state": state,
        "opt_leaves": opt_leaves,
    }


def make_plan(
    abstract_state: TrainState,
    mesh: Mesh,
    stage: int | ZeroOptions,
    rules: Sequence[Sequence[Any]] | None = None,
    path_rules: Sequence[Sequence[Any]] = (),
    *,
    trainable: Sequence[str] | None = None,
    **options: Any,
) -> Plan:
    """The shardings of a ZeRO stage on a mesh.

    Args:
      abstract_state: from :func:`jzero.sharding.placement.abstract_state`; its params may keep Flax
        ``Partitioned`` boxes (or be an NNX ``State``), whose logical names ``rules`` map to mesh axes.
      mesh: a mesh with a ``data`` axis.
      stage: the ZeRO stage, 0 to 3 (:data:`jzero.sharding.stages.STAGES`), or the whole
        :class:`~jzero.sharding.stages.ZeroOptions` (a config's ``zero:``).
      rules: ordered ``[logical_name, mesh_axis_or_null]`` pairs (default: :func:`jzero.sharding.rules.default_rules`).
      path_rules: ``[regex, [mesh_axis_or_null per dim]]`` pairs that place parameters by path (first
        match wins, before logical names; ``re.search`` on the ``/``-joined path): the way to put an
        unannotated model's tensors on ``model``. Each must place at least one parameter.
      trainable: path regexes of the parameters that train (``train.trainable``); the others have
        no gradient and no optimizer state. None: all train. ``abstract_state`` must have been made
        with the same (:func:`jzero.sharding.placement.abstract_state`).
      **options: fields of :class:`~jzero.sharding.stages.ZeroOptions` (``offload_optimizer=True``,
        ``quantized_gradients="int8"``, ...), over ``stage``'s.

    Returns:
      The :class:`Plan`: shardings for parameters, gradients, the update, the optimizer state, the
      batch and the whole train state, and each tensor's specs and bytes.

    Raises:
      PlanError: a mesh without ``data``, an option the stage, precision or mesh cannot have
        (:meth:`jzero.sharding.stages.ZeroOptions.check`), a rule that does not fit a tensor, or a path rule
        that places none (:func:`check_path_rules`).
      TypeError: an option that is not a field of :class:`~jzero.sharding.stages.ZeroOptions`.
    """
    base = stage if isinstance(stage, ZeroOptions) else ZeroOptions(stage=stage)
    zero = dataclasses.replace(base, **options)
    if DATA not in mesh.shape:
        raise PlanError("mesh", f"must have a {DATA!r} axis, has {', '.join(mesh.axis_names)}")
    axes = {a: int(n) for a, n in mesh.shape.items()}
    zero.check(axes, master_copy=isinstance(abstract_state.opt_state, MasterState))
    order = hierarchy(mesh, zero.hpz, zero.qgz)
    rules = normal_rules(rules, mesh)

    leaves = jax.tree_util.tree_flatten_with_path(nn.unbox(abstract_state.params))[0]
    check_path_rules(path_rules, [path_str(path) for path, _ in leaves])
    rule = zero.rule
    tensors, treedef = _tensor_plans(abstract_state.params, mesh, rules, path_rules, rule, zero.persist_below_bytes, order)
    if trainable is not None:
        mask = jax.tree.leaves(trainable_mask(nn.unbox(abstract_state.params), trainable))
        tensors = [dataclasses.replace(t, trainable=m) for t, m in zip(tensors, mask, strict=True)]
    shardings = _plan_shardings(abstract_state, tensors, treedef, mesh, rule, zero.offload_optimizer, zero.offload_params)
    batch_axes = logical_to_mesh("batch", rules) or DATA
    units, unit_names = gather_units(tensors, zero.gather_units) if rule.params else ({}, ())
    if units and zero.qgz:
        needs = "it needs a model that gathers itself, as jzero's GPT"
        raise PlanError("zero.quantized_gradients", f"not yet with gathering units (zero.gather_units): {needs}")
    return Plan(
        mesh=mesh,
        zero=zero,
        rules=rules,
        batch=NamedSharding(mesh, P(batch_axes)),
        tensors=tensors,
        units=units,
        unit_names=unit_names,
        trainable=None if trainable is None else tuple(trainable),
        **shardings,
    )
