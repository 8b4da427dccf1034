"""Equality with one device: plain optax on one device, and the floor its sums' reordering sets.

The references never run the code under test's optimizer (:mod:`jzero.optimizers`): :func:`optax_tx`
builds each from the config's ``optimizer:`` section with optax's own functions, and fp16's loss
scaling is done here by hand (:func:`reference_run`'s ``loss_scale``), not through :mod:`jzero.step`."""

import dataclasses
import json
import os
from typing import Any

import jax
import numpy as np

from support.configs import STEPS

# Equality with one device, against a floor measured in the same run
#
# A sharded run and one device differ only in the order of floating-point sums, and that order
# differs between CPUs too (matmul blocking). Adam moves each element by about lr * g / (|g| + eps),
# so where |g| is near eps a reordering of g shows up as a visible fraction of lr, at elements that
# depend on the machine. A fixed tolerance therefore holds on one machine and fails on the next.
# Instead each comparison measures its own floor: the same one-device optax run with the gradient
# summed in other orders (the batch in 2, 4, 8 and 16 chunks, as data parallelism and microbatches
# sum it), and the largest gap, per leaf, between those runs and the whole-batch one. A sharded
# result must lie within MARGIN times that floor, plus ULPS float32 ulps of the leaf's largest
# magnitude (for leaves where reordering happened to change nothing).
#
# Measured here with `JZERO_FLOOR_LOG=floors.jsonl bash .ci/run` on a fresh clone of 6233b0b, the
# chunks summed by a scan (2,581 leaf comparisons, leaving out the two checks that must fail):
# parameter floors up to 9.2e-7 after 20 AdamW steps of the tiny GPT (lr 1e-3, eps 1e-8), 3.7e-6
# after one step from zero moments, 3.6e-5 for test_units.py's Llama-style model; every gap within
# 4.2x its leaf's floor, so at most 0.37 of the tolerance. A 0.1% learning-rate error exceeds the
# tolerance 273x (test_stages.py checks that it is refused). (Unrolled chunks, 1,802 comparisons
# earlier: gaps within 2.7x, 0.25 of the tolerance, 204x for the 0.1% error.) One scan over every
# chunk since c2ff8f7: within 4.25x, 0.368 of the tolerance (docs/design.md).
MARGIN = 10
ULPS = 4
CHUNKINGS = (2, 4, 8, 16)


def optax_tx(config):
    """The optimizer a config's ``optimizer:`` section names (:class:`jzero.optimizers.OptimizerConfig`),
    built from optax alone: its learning-rate schedule over ``train.steps`` (constant, linear warmup
    from 0, or warmup then cosine decay to ``min_lr_ratio`` x the rate), the optimizer, and
    ``clip_by_global_norm`` before it when ``clip_norm`` is set. Never :mod:`jzero.optimizers`."""
    import optax

    o, steps = config.optimizer, config.train.steps
    peak = o.learning_rate
    if o.schedule == "cosine":  # optax needs the decay to end after the warmup
        lr = optax.warmup_cosine_decay_schedule(0.0, peak, o.warmup_steps, max(steps, o.warmup_steps + 1), peak * o.min_lr_ratio)
    elif o.warmup_steps:
        lr = optax.warmup_constant_schedule(0.0, peak, o.warmup_steps)
    else:
        lr = optax.constant_schedule(peak)
    optimizers = {
        "adamw": lambda: optax.adamw(lr, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay),
        "adam": lambda: optax.adam(lr, b1=o.b1, b2=o.b2, eps=o.eps),
        "adafactor": lambda: optax.adafactor(lr, weight_decay_rate=o.weight_decay or None),
        "lion": lambda: optax.lion(lr, b1=o.b1, b2=o.b2, weight_decay=o.weight_decay),
        "sgd": lambda: optax.sgd(lr, momentum=o.b1),
    }
    tx = optimizers[o.name]()
    return tx if o.clip_norm is None else optax.chain(optax.clip_by_global_norm(o.clip_norm), tx)


@dataclasses.dataclass
class Run:
    """What a one-device optax run ends with, and what it saw on the way (with ``loss_scale``: the
    fp32 master as ``params``, and the dynamic scale after each step)."""

    params: Any
    opt_state: Any
    losses: list[float]
    grad_norms: list[float]
    loss_scales: list[float] = dataclasses.field(default_factory=list)


def _chunked(loss_fn, chunks: int):
    """The mean loss over ``chunks`` equal slices of the batch, summed one slice at a time: the
    same arithmetic as ``loss_fn`` on the whole batch, in another order."""
    if chunks == 1:
        return loss_fn

    def loss(params, batch):
        # A scan traces and compiles the model once, not ``chunks`` times (the unrolled sum of 2 + 4
        # + 8 + 16 copies made the reference runs a tenth of the suite); its backward accumulates
        # the gradient chunk by chunk.
        sliced = jax.tree.map(lambda x: x.reshape(chunks, x.shape[0] // chunks, *x.shape[1:]), batch)
        _, losses = jax.lax.scan(lambda carry, part: (carry, loss_fn(params, part)), None, sliced)
        return losses.sum() / chunks

    return loss


def loss_with_floor(loss_fn, params, batches) -> tuple[float, float]:
    """The mean of ``loss_fn`` over ``batches`` on one device, and its floor: the largest gap to the
    same mean with each batch summed in ``CHUNKINGS`` chunks (for :func:`assert_within_floor`)."""
    params = jax.device_put(jax.device_get(params), jax.devices()[0])

    def mean(chunks):
        loss = jax.jit(_chunked(loss_fn, chunks))
        return float(np.mean([np.float64(loss(params, b)) for b in batches]))

    whole = mean(1)
    return whole, max(abs(mean(c) - whole) for c in CHUNKINGS)


def reference_run(init_fn, loss_fn, tx, rng, batches, steps=STEPS, *, chunks=1, start=None, loss_scale=None) -> Run:
    """Plain optax on one device: the answer every stage and mesh must reproduce. ``start``:
    ``(params, opt_state)`` to continue from instead of ``init_fn(rng)``. ``loss_scale``:
    ``(initial scale, window)`` for fp16 (:func:`_scaled_run`)."""
    import optax

    if start is None:
        params, opt_state = _init(init_fn, tx, rng)
    else:
        params, opt_state = jax.device_put(jax.device_get(start), jax.devices()[0])
    if loss_scale is not None:
        return _scaled_run(loss_fn, tx, params, opt_state, batches, steps, chunks, *loss_scale)

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(_chunked(loss_fn, chunks))(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss, optax.tree.norm(grads)

    losses, norms = [], []
    for k in range(steps):
        params, opt_state, loss, norm = step(params, opt_state, batches(k))
        losses.append(float(loss))
        norms.append(float(norm))
    return Run(params, opt_state, losses, norms)


def _scaled_run(loss_fn, tx, master, opt_state, batches, steps, chunks, initial, window) -> Run:
    """fp16 with a dynamic loss scale, by hand: the fp32 master cast to float16 for the loss, the
    loss times the scale differentiated (float16 gradients), the gradient cast to float32 and divided
    by the scale, and optax's update on the master only where its norm is finite. The scale halves
    (not below 1) after a non-finite step and doubles after ``window`` finite ones in a row."""
    import jax.numpy as jnp
    import optax

    @jax.jit
    def step(master, opt_state, scale, good, batch):
        working = jax.tree.map(lambda m: m.astype(jnp.float16), master)

        def scaled(p):
            loss = _chunked(loss_fn, chunks)(p, batch).astype(jnp.float32)
            return loss * scale, loss

        (_, loss), grads = jax.value_and_grad(scaled, has_aux=True)(working)
        grads = jax.tree.map(lambda g: g.astype(jnp.float32) / scale, grads)
        norm = optax.tree.norm(grads)
        finite = jnp.isfinite(norm)
        updates, new_state = tx.update(grads, opt_state, master)
        keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)  # noqa: E731
        master, opt_state = keep(optax.apply_updates(master, updates), master), keep(new_state, opt_state)
        grow = finite & (good + 1 >= window)
        scale = jnp.where(finite, jnp.where(grow, 2 * scale, scale), jnp.maximum(scale / 2, 1.0))
        return master, opt_state, scale, jnp.where(finite & ~grow, good + 1, 0), loss, norm

    scale, good = jnp.float32(initial), jnp.int32(0)
    losses, norms, scales = [], [], []
    for k in range(steps):
        master, opt_state, scale, good, loss, norm = step(master, opt_state, scale, good, batches(k))
        losses.append(float(loss))
        norms.append(float(norm))
        scales.append(float(scale))
    return Run(master, opt_state, losses, norms, scales)


def _init(init_fn, tx, rng):
    """``(params, opt_state)`` as ``init_fn`` and ``tx`` start them, on one device."""
    import flax.linen as nn
    from flax import nnx

    with nnx.use_eager_sharding(False):
        params = jax.jit(lambda k: nn.unbox(init_fn(k)))(rng)  # no mesh: one device
    return params, tx.init(params)


def _gap(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


@dataclasses.dataclass
class Reference:
    """A one-device run and its reordering floor (a :class:`Run` of per-leaf gaps)."""

    run: Run
    floor: Run

    def check(self, *, params=None, opt_state=None, losses=None, grad_norms=None, loss_scales=None) -> None:
        """Each given result equals the reference's within ``MARGIN`` x floor + ``ULPS`` ulps; the
        loss scales (powers of 2, changed only by a step's finiteness) exactly."""
        for name, got in (("params", params), ("opt_state", opt_state), ("losses", losses), ("grad_norms", grad_norms)):
            if got is not None:
                assert_within_floor(got, getattr(self.run, name), getattr(self.floor, name), name)
        if loss_scales is not None:
            assert list(loss_scales) == self.run.loss_scales, (list(loss_scales), self.run.loss_scales)


def reference_with_floor(
    init_fn, loss_fn, tx, rng, batches, steps=STEPS, *, start=None, loss_scale=None, chunkings=CHUNKINGS
) -> Reference:
    """:func:`reference_run`, and its floor from the same run with the batch summed in each of
    ``chunkings`` numbers of chunks."""
    if start is None:  # once for the five runs, not five times: the same program and result
        start = _init(init_fn, tx, rng)
    whole = reference_run(init_fn, loss_fn, tx, rng, batches, steps, start=start, loss_scale=loss_scale)
    others = [reference_run(init_fn, loss_fn, tx, rng, batches, steps, chunks=c, start=start, loss_scale=loss_scale)
              for c in chunkings]  # fmt: skip

    def floor(part):
        return jax.tree.map(lambda w, *o: max(_gap(w, x) for x in o), getattr(whole, part), *(getattr(x, part) for x in others))

    gaps = {part: floor(part) for part in ("params", "opt_state")}
    # Losses and norms: one floor for the whole sequence (each step's value has the same scale).
    scalars = {part: max(_gap(getattr(whole, part), getattr(x, part)) for x in others) for part in ("losses", "grad_norms")}
    return Reference(whole, Run(**gaps, **scalars))


def assert_within_floor(got, want, floor, what: str = "") -> None:
    """Per leaf: ``max |got - want| <= MARGIN * floor + ULPS * eps32 * max |want|``; ``floor`` is a
    tree of per-leaf floors like ``want``, or one float for a sequence of scalars."""
    if isinstance(floor, float):
        _assert_leaf(got, want, floor, what)
        return
    flat = jax.tree_util.tree_flatten_with_path(want)[0]
    for (path, w), g, f in zip(flat, jax.tree.leaves(got), jax.tree.leaves(floor), strict=True):
        _assert_leaf(g, w, f, what + jax.tree_util.keystr(path))


def _assert_leaf(got, want, floor: float, what: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    if not np.issubdtype(want.dtype, np.inexact):  # step counts: exact
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    tol = MARGIN * floor + ULPS * float(np.finfo(np.float32).eps) * scale
    gap = _gap(got, want)
    if os.environ.get("JZERO_FLOOR_LOG"):  # to measure the margins on another machine
        with open(os.environ["JZERO_FLOOR_LOG"], "a") as log:
            record = {"test": os.environ.get("PYTEST_CURRENT_TEST"), "what": what, "gap": gap, "floor": floor, "tol": tol}
            log.write(json.dumps(record) + "\n")
    assert gap <= tol, f"{what}: max gap {gap:.3g} > {tol:.3g} ({MARGIN} x floor {floor:.3g} + {ULPS} ulps of {scale:.3g})"



def frozen_tx(job):
    """One device's optax for a job with frozen parameters (``train.trainable``, LoRA): the config's
    optimizer (:func:`optax_tx`) on those that train, zero updates on the rest (``optax.multi_transform``)."""
    import optax

    labels = jax.tree.map(lambda train: "train" if train else "frozen", job.plan.trainable_mask())
    return optax.multi_transform({"train": optax_tx(job.config), "frozen": optax.set_to_zero()}, labels)


def train_sharded(s, batches, steps=STEPS):
    """Sharded init and ``steps`` compiled steps of a :class:`jzero.training.job.Job`; returns the final state."""
    state = s.init_state()
    step = s.make_step()
    for k in range(steps):
        state, _ = step(state, batches(k, s.plan.batch))
    return state


def straight_through_loss(job, loss_fn, one_layer):
    """The loss on the parameters as a quantizing gather delivers them, on one device: each leaf for
    which ``one_layer(tensor_plan)`` gives a function has it applied (a scanned leaf one layer at a
    time), with the gradient passed straight through; the other leaves as they are."""

    def through(x, fn, scanned):
        @jax.custom_vjp
        def straight(v):
            return jax.vmap(fn)(v) if scanned else fn(v)

        straight.defvjp(lambda v: (straight(v), None), lambda _, ct: (ct,))
        return straight(x)

    def loss(params, batch):
        leaves = []
        for t, x in zip(job.plan.tensors, jax.tree.leaves(params), strict=True):
            fn = one_layer(t)
            leaves.append(x if fn is None else through(x, fn, x.ndim > len(job.plan.parameter_gather(t)[0])))
        return loss_fn(jax.tree.unflatten(jax.tree.structure(params), leaves), batch)

    return loss
