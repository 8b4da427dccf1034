"""The compiled train step (the state it steps is made by :mod:`jzero.sharding.placement`).

The step is one ``jax.jit`` function whose in/out shardings come from a :class:`~jzero.sharding.plan.Plan`.
Inside it, sharding constraints tell XLA where each tensor must be; XLA inserts the collectives:

1. gradients are constrained to the stage's gradient spec (all-reduce at stages 0-1,
   reduce-scatter at stages 2-3). At stage 1 the all-reduce runs once, after the layer loop, so
   GPU XLA fuses it with the update's slice into a reduce-scatter: the paper's 2Ψ with the gather,
   where an all-reduce inside the loop made it 3Ψ;
2. gradients and parameters are constrained to the update spec, so at stages >= 1 the optimizer
   runs on the device's 1/N_d slice (at stage 1 this slices the all-reduced gradient locally);
3. the new parameters are constrained to their at-rest spec: all-gathered at stages 1-2, left
   sharded at stage 3.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jzero.communication.gather import UnitSpec, gather, unit_options
from jzero.communication.quantize import Layout
from jzero.lazy import moved_names
from jzero.memory.offload import on_device, to_device, to_host
from jzero.memory.precision import FP32, MasterState, Precision, cast
from jzero.sharding import placement
from jzero.sharding.axes import LAYERS
from jzero.sharding.gathers import LossFn, unit_loss
from jzero.sharding.plan import Plan
from jzero.sharding.state import TrainState
from jzero.sharding.trainable import frozen_out, merged

__all__ = ["LossFn", "activation_rules", "make_eval_step", "make_train_step"]
_MOVED = {
    "jzero.sharding.placement": ("abstract_state", "check_precision", "sharded_abstract", "sharded_init", "state_from_params"),
    "jzero.sharding.gathers": ("manual_loss", "model_gather", "units_in_effect"),  # unit_loss too, imported here
}
__getattr__ = moved_names(__name__, {name: f"{home}.{name}" for home, names in _MOVED.items() for name in names})


@contextlib.contextmanager
def activation_rules(plan: Plan, *, batch_local: bool = False) -> Iterator[None]:
    """Make the model's logical activation constraints act on ``plan.mesh``.

    ``batch_local``: the ``batch`` name maps to no mesh axis, for code ``vmap``-ed over the
    batch's device groups (whose own dimension carries those axes).
    """
    rules = ((("batch", None),) if batch_local else ()) + tuple(plan.rules)  # first match wins
    with jax.sharding.use_abstract_mesh(plan.mesh.abstract_mesh), nn.logical_axis_rules(rules):
        yield


def _constrain(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(jax.lax.with_sharding_constraint, tree, shardings)


def _apply_update(tx: optax.GradientTransformation, grads: Any, opt_state: Any, params: Any) -> tuple[Any, Any]:
    """One optimizer update. With a master copy the update lands on it, and the working params
    are the master recast to their own dtype."""
    if isinstance(opt_state, MasterState):
        updates, inner = tx.update(grads, opt_state.inner, opt_state.master)
        master = optax.apply_updates(opt_state.master, updates)
        new_params = jax.tree.map(lambda m, p: m.astype(p.dtype), master, params)
        return new_params, MasterState(master=master, inner=inner)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def _loss_in_f32(loss_fn: LossFn, plan: Plan, precision: Precision) -> LossFn:
    """``loss_fn`` on the resting parameters (gathered unit by unit, or cast whole), as float32."""
    gathered_loss = unit_loss(loss_fn, plan, precision)

    def compute_loss(params: Any, batch: Any) -> jax.Array:
        if gathered_loss is not None:
            return gathered_loss(params, batch).astype(jnp.float32)
        return loss_fn(cast(params, precision.compute_dtype), batch).astype(jnp.float32)

    return compute_loss


def _scaled(compute_loss: LossFn, scale: jax.Array | None) -> Callable[[Any, Any], tuple[jax.Array, jax.Array]]:
    """``(params, batch) -> (loss * scale, loss)``: what is differentiated, with the true loss as aux."""

    def scaled_loss(p, mb):
        loss = compute_loss(p, mb)
        return (loss * scale if scale is not None else loss), loss

    return scaled_loss


def _accumulate(acc: Any, grads: Any) -> Any:
    """Add one slice's gradient to the buffer, in the buffer's dtype."""
    return jax.tree.map(lambda a, g: a + g.astype(a.dtype), acc, grads)


def _one_grad(
    compute_loss: LossFn, plan: Plan, precision: Precision, params: Any, mb: Any, scale: jax.Array | None
) -> tuple[jax.Array, Any]:
    """One slice's mean loss and gradient, cast to ``grad_reduce_dtype`` and constrained to the gradient spec."""
    (_, loss), grads = jax.value_and_grad(_scaled(compute_loss, scale), has_aux=True)(params, mb)
    if plan.zero.offload_params:  # a host-resting leaf's gradient comes back to host memory
        grads = to_device(grads)
    return loss, _constrain(cast(grads, precision.grad_reduce_dtype), plan.grads)


def _microbatch_loop(
    compute_loss: LossFn, plan: Plan, precision: Precision, microbatches: int, params: Any, batch: Any, scale: jax.Array | None
) -> tuple[jax.Array, Any]:
    """Mean loss and gradient over ``microbatches`` sequential slices, each one's reduced gradient summed into a buffer."""
    # Slice m holds rows m, m + M, m + 2M, ...: each device keeps its own rows in every slice.
    slices = jax.tree.map(lambda x: x.reshape(x.shape[0] // microbatches, microbatches, *x.shape[1:]).swapaxes(0, 1), batch)

    def body(acc, mb):
        loss, grads = _one_grad(compute_loss, plan, precision, params, mb, scale)
        return _constrain(_accumulate(acc, grads), plan.grads), loss

    # The buffer has the gradients' spec: 1/N_d per device at stages >= 2.
    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, precision.master_dtype), params)
    acc, losses = jax.lax.scan(body, _constrain(zeros, plan.grads), slices)
    return losses.mean(), jax.tree.map(lambda a: a / microbatches, acc)


def _batch_groups(plan: Plan) -> tuple[tuple[str, ...], int, Any]:
    """The batch's mesh axes, the number of batch groups they make, and the grad shardings with a group dim on them."""
    axes = plan.batch_axes
    groups = math.prod(plan.mesh.shape[a] for a in axes)
    on_groups = [NamedSharding(plan.mesh, P(axes, *s.spec)) for s in jax.tree.leaves(plan.grads)]
    return axes, groups, jax.tree.unflatten(jax.tree.structure(plan.grads), on_groups)


def _reduce_groups(a: jax.Array, p: jax.Array, count: int, precision: Precision) -> jax.Array:
    """Sum the per-group gradients, each over ``count``: the step's one reduction, run in ``grad_reduce_dtype``."""
    a = (a / count).astype(precision.grad_reduce_dtype or p.dtype)
    # lax.reduce, not .sum(): jnp sums 16-bit floats in f32, which would send twice the bytes.
    return jax.lax.reduce(a, jnp.zeros((), a.dtype), jax.lax.add, (0,))


def _local_accumulation(
    compute_loss: LossFn, plan: Plan, precision: Precision, microbatches: int, params: Any, batch: Any, scale: jax.Array | None
) -> tuple[jax.Array, Any]:
    """Stages 0-1: each batch group (the devices of one ``data`` x ``replica`` coordinate)
    accumulates its own unreduced gradient over the microbatches; one all-reduce follows. Stage 1
    comes here at M = 1 too: with the all-reduce outside the layer loop and the update's slice
    right after it, GPU XLA makes the pair one reduce-scatter.

    ``vmap`` over the groups, with the group dimension on the batch's mesh axes, is how GSPMD
    is told the per-group gradients are separate tensors rather than one to be reduced.
    """
    axes, groups, on_groups = _batch_groups(plan)

    def split(x):  # [B, ...] -> [M, groups, B / (groups M), ...]; rows stay on their device
        x = x.reshape(groups, x.shape[0] // (groups * microbatches), microbatches, *x.shape[1:])
        return jnp.moveaxis(x, 2, 0)

    group_grad = jax.vmap(jax.value_and_grad(_scaled(compute_loss, scale), has_aux=True), in_axes=(None, 0), spmd_axis_name=axes)

    def body(acc, mb):
        with activation_rules(plan, batch_local=True):
            (_, losses), grads = group_grad(params, mb)
        return _constrain(_accumulate(acc, grads), on_groups), losses

    zeros = jax.tree.map(lambda p: jnp.zeros((groups, *p.shape), precision.master_dtype), params)
    acc, losses = jax.lax.scan(body, _constrain(zeros, on_groups), jax.tree.map(split, batch))
    grads = jax.tree.map(lambda a, p: _reduce_groups(a, p, groups * microbatches, precision), acc, params)
    return losses.mean(), _constrain(grads, plan.grads)


def _grads_and_loss(
    compute_loss: LossFn, plan: Plan, precision: Precision, microbatches: int, params: Any, batch: Any, scale: jax.Array | None
) -> tuple[jax.Array, Any]:
    """Mean loss and reduced gradient over the global batch, in ``microbatches`` sequential slices."""
    if not plan.rule.grads and (microbatches > 1 or plan.rule.optimizer):
        return _local_accumulation(compute_loss, plan, precision, microbatches, params, batch, scale)
    if microbatches == 1:
        return _one_grad(compute_loss, plan, precision, params, batch, scale)
    return _microbatch_loop(compute_loss, plan, precision, microbatches, params, batch, scale)


def _fetched_in_loop(plan: Plan, fetched_by_model: bool) -> Any:
    """A bool per parameter: True where the model fetches it itself, inside its loop (its ``layers`` dimension)."""
    in_loop = [fetched_by_model and LAYERS in (t.logical or ()) for t in plan.tensors]
    return jax.tree.unflatten(jax.tree.structure(plan.params), in_loop)


def _params_for_forward(plan: Plan, in_loop: Any, params: Any) -> Any:
    """With offloaded parameters, move to the device those the model does not fetch itself."""
    if not plan.zero.offload_params:
        return params
    return jax.tree.map(lambda p, model_fetches: p if model_fetches else to_device(p), params, in_loop)


def _guarded_update(
    tx: optax.GradientTransformation,
    plan: Plan,
    precision: Precision,
    resting: Any,
    opt_state: Any,
    grads: Any,
    scale: jax.Array | None,
) -> tuple[Any, Any, jax.Array, jax.Array]:
    """Unscale, take the norm and, only if it is finite, update: ``(new_params, opt_state, grad_norm, finite)``, at rest.
    ``plan`` is the trainable view (:meth:`jzero.sharding.plan.Plan.trainable_view`): its trees hold
    the parameters that train, as do ``resting`` (those parameters as they rest), ``grads``, the
    optimizer state and ``new_params``."""
    grads = cast(grads, precision.master_dtype)  # the update runs in master precision
    if scale is not None:
        grads = jax.tree.map(lambda g: g / scale, grads)
    # The norm of the update's slices: at stage 1, a norm of the whole reduced gradient would
    # need it whole on every device, and the reduction would stay an all-reduce.
    grads = _constrain(grads, plan.optimizer)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(grad_norm)
    params = _constrain(to_device(resting) if plan.zero.offload_params else resting, plan.optimizer)
    # Offloaded optimizer state streams in for the update and back out after it.
    opt_state = to_device(opt_state) if plan.zero.offload_optimizer else opt_state
    # A non-finite step applies nothing. (lax.cond, not a select: the skip branch hands the
    # donated buffers straight back instead of holding a second copy of the state.)
    new_params, opt_state = jax.lax.cond(
        finite,
        lambda: _apply_update(tx, grads, opt_state, params),
        lambda: (params, opt_state),
    )
    new_params = _gather_updated(plan, new_params)
    new_params = to_host(new_params) if plan.zero.offload_params else new_params
    opt_state = to_host(opt_state) if plan.zero.offload_optimizer else opt_state
    return new_params, opt_state, grad_norm, finite


def _trained_part(plan: Plan, params: Any) -> Any:
    """``params`` with ``None`` at each frozen parameter (``train.trainable``); all of them when all train."""
    return params if plan.trainable is None else frozen_out(params, plan.trainable_mask())


def _differentiated(compute_loss: LossFn, plan: Plan, params: Any) -> tuple[LossFn, Any]:
    """The loss of the parameters that train, and those parameters: the frozen ones enter the loss
    as constants, so autodiff makes no gradient for them (``train.trainable``)."""
    if plan.trainable is None:
        return compute_loss, params
    return (lambda trained, batch: compute_loss(merged(trained, params), batch)), _trained_part(plan, params)


def _gather_updated(plan: Plan, new_params: Any) -> Any:
    """The updated parameters to their resting spec: at stages 1-2 the all-gather of the updated
    slices, quantized where qwZ gives the leaf a layout (from the exact master, so nothing compounds)."""
    layouts = plan.weight_layouts()
    if not layouts or plan.rule.params:
        return _constrain(new_params, on_device(plan.params))

    def one(t, x, sharding):
        lay = layouts.get(t.path)
        if not isinstance(lay, Layout):
            return jax.lax.with_sharding_constraint(x, sharding)
        return gather(x, UnitSpec(plan.mesh, t.optimizer_spec, t.param_spec, layout=lay))

    shardings = jax.tree.leaves(on_device(plan.params))
    leaves = [one(t, x, s) for t, x, s in zip(plan.tensors, jax.tree.leaves(new_params), shardings, strict=True)]
    return jax.tree.unflatten(jax.tree.structure(new_params), leaves)


def _step_outputs(
    state: TrainState,
    new_params: Any,
    opt_state: Any,
    loss: jax.Array,
    grad_norm: jax.Array,
    finite: jax.Array,
    precision: Precision,
    scale: jax.Array | None,
) -> tuple[TrainState, dict[str, jax.Array]]:
    """The next train state (step, skip count and loss scale advanced) and the step's metrics."""
    new_state = TrainState(
        step=state.step + 1,
        params=new_params,
        opt_state=opt_state,
        skipped=state.skipped + (~finite).astype(jnp.int32),
        loss_scale=state.loss_scale.next(finite, precision.loss_scale_window) if scale is not None else None,
    )
    metrics = {"loss": loss, "grad_norm": grad_norm, "skipped": new_state.skipped}
    if scale is not None:
        metrics["loss_scale"] = new_state.loss_scale.scale
    return new_state, metrics


def make_train_step(
    loss_fn: LossFn,
    tx: optax.GradientTransformation,
    plan: Plan,
    *,
    precision: Precision = FP32,
    microbatches: int = 1,
    donate: bool = True,
    fetched_by_model: bool = False,
):
    """The compiled train step of a plan: ``step(state, batch) -> (state, metrics)``.

    A step whose gradient is not finite applies nothing: parameters and optimizer state stay
    bit-identical, ``skipped`` counts it and a dynamic loss scale halves.

    Args:
      loss_fn: ``loss_fn(params, batch)`` returns the scalar mean loss over its batch; it receives
        the parameters cast to ``precision.compute_dtype`` when that is set (gradients come back in
        the parameters' own dtype).
      tx: the optimizer.
      plan: the shardings (:func:`jzero.sharding.plan.make_plan`).
      precision: the dtype policy.
      microbatches: M > 1 splits the global batch into M equal slices run one after another. Where
        the stage partitions gradients, each slice's gradient is reduce-scattered into a buffer of
        the stage's (1/N_d) gradient spec; otherwise each batch group accumulates its own unreduced
        gradient and one all-reduce follows the last slice. Either way the result is the whole
        batch's gradient.
      donate: donate the input state's buffers to the output.
      fetched_by_model: with ``plan.zero.offload_params``, the model moves its scanned layers' parameters
        (those with a ``layers`` dimension) to the device inside its loop (:func:`jzero.memory.offload.fetching`);
        the step moves the others before the forward. Otherwise the step moves them all.

    With ``plan.zero.offload_optimizer`` the optimizer state streams from pinned host memory to the device
    for the update and back. With ``plan.zero.offload_params`` the update's parameter shards do the same.

    Returns:
      The jitted step. Its metrics: ``loss``, ``grad_norm`` (the global L2 norm of the unscaled,
      reduced gradient, before any clipping), ``skipped`` and, with loss scaling, ``loss_scale``.

    Raises:
      PlanError: ``precision`` is not the one the plan's abstract state was made with
        (:func:`jzero.sharding.placement.check_precision`).
    """

    placement.check_precision(plan, precision)
    compute_loss = _loss_in_f32(loss_fn, plan, precision)
    in_loop = _fetched_in_loop(plan, fetched_by_model)

    trained = plan.trainable_view()

    def step(state: TrainState, batch: Any) -> tuple[TrainState, dict[str, jax.Array]]:
        scale = state.loss_scale.scale if state.loss_scale is not None else None
        with activation_rules(plan):
            params = _params_for_forward(plan, in_loop, state.params)
            loss_of, params = _differentiated(compute_loss, plan, params)
            loss, grads = _grads_and_loss(loss_of, trained, precision, microbatches, params, batch, scale)
            resting = _trained_part(plan, state.params)
            new_params, opt_state, grad_norm, finite = _guarded_update(
                tx, trained, precision, resting, state.opt_state, grads, scale
            )
        new_params = merged(new_params, state.params) if plan.trainable is not None else new_params
        return _step_outputs(state, new_params, opt_state, loss, grad_norm, finite, precision, scale)

    return jax.jit(
        step,
        in_shardings=(plan.state, plan.batch),
        out_shardings=(plan.state, NamedSharding(plan.mesh, P())),
        donate_argnums=(0,) if donate else (),
        compiler_options=unit_options(list(plan.mesh.devices.flat)) if plan.units else None,
    )


def make_eval_step(loss_fn: LossFn, plan: Plan, *, precision: Precision = FP32, fetched_by_model: bool = False):
    """The compiled loss of a batch at the resting parameters: ``eval_step(params, batch) -> loss``.

    The forward is the train step's: the same shardings, the same compute dtype, and at stage 3
    the same gathers (a scanned model's layer by layer, a model with units unit by unit), so it
    never holds the whole model gathered. Nothing is donated.

    Args:
      loss_fn: as for :func:`make_train_step`.
      plan: the shardings (:func:`jzero.sharding.plan.make_plan`).
      precision: the dtype policy.
      fetched_by_model: as for :func:`make_train_step`.

    Returns:
      The jitted step; its loss is a replicated float32 scalar.
    """
    compute_loss = _loss_in_f32(loss_fn, plan, precision)
    in_loop = _fetched_in_loop(plan, fetched_by_model)

    def eval_step(params: Any, batch: Any) -> jax.Array:
        with activation_rules(plan):
            return compute_loss(_params_for_forward(plan, in_loop, params), batch)

    return jax.jit(
        eval_step,
        in_shardings=(plan.params, plan.batch),
        out_shardings=NamedSharding(plan.mesh, P()),
        compiler_options=unit_options(list(plan.mesh.devices.flat)) if plan.units else None,
    )
