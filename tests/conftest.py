"""Tests run on 8 simulated CPU devices, fixed before JAX starts its backend."""

import atexit
import dataclasses
import json
import os
import shutil
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

# LLVM optimisation level 0 cuts compile time by about a third on these tiny models; the HLO (its
# sharding, collectives and memory analysis) is what the tests check, and it is unaffected.
FLAGS = "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FLAGS).strip()
os.environ["JZERO_SUITE_XLA_FLAGS"] = FLAGS  # the suite's, not a user's: what jzero plan prints leaves them out
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# JAX's persistent compilation cache (on by default, jzero.compile_cache) in a folder of this test
# process's own, which its subprocesses share, rather than the user's ~/.cache.
_CACHE = tempfile.mkdtemp(prefix="jzero-tests-jax-cache-")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
# Every program, not only those that took over JAX's 1 s: many tests build the same tiny step again
# (a new Job, a new closure, the same program). tests/test_stages.py and tests/test_hybrid.py, -n 2:
# 90.0 and 93.4 s with 0 s, 102.8 and 105.7 s with 1 s (two runs each, alternated); the whole
# suite's test time, one run each, 2,005 s with 1 s and 1,989 s with 0 s: within the host's noise.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

from jzero.distributed.process import import_jax  # noqa: E402

import_jax()  # the CUDA plugin (the gpu-target extra) prints no-GPU notices on import; dropped

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from jzero.config.loading import Config, load_config  # noqa: E402
from jzero.ledger.targets import gpu_compiler_available, target_devices  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

TINY = [
    "model.d_model=32",
    "model.n_layers=2",
    "model.n_heads=2",
    "model.seq_len=16",
    "train.global_batch_size=16",
    "data.max_bytes=200000",
    "train.eval_every=0",  # configs/gpt-tiny.yaml evaluates; tests/test_eval.py tests that, the others need not compile it
]


STDLIB_GLOB = str(Path(sysconfig.get_paths()["stdlib"]) / "*.py")  # the default data's files, as a data.path


def tiny_config(*overrides: str) -> Config:
    """A model small enough to compile in seconds on 2 cores."""
    return load_config(None, [*TINY, *overrides])


@pytest.fixture(scope="session")
def devices():
    assert jax.device_count() == 8, "tests expect 8 simulated CPU devices"
    return jax.devices()


STEPS = 20
LR = "optimizer.learning_rate=1e-3"


@pytest.fixture(scope="session")
def h100x8():
    """Eight H100s to compile for, deviceless (the gpu-target extra; tests/test_targets.py)."""
    if not gpu_compiler_available():
        pytest.fail("the gpu-target extra is not installed: pip install -e '.[test,gpu-target]'")
    return target_devices("h100x8")


@pytest.fixture(scope="session")
def data():
    from jzero.training.data import text_batches

    cfg = tiny_config()
    return text_batches(None, cfg.data.max_bytes, cfg.model.seq_len, cfg.train.global_batch_size, cfg.seed)


# ---------------------------------------------------------------------------------------------
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
# earlier: gaps within 2.7x, 0.25 of the tolerance, 204x for the 0.1% error.)
MARGIN = 10
ULPS = 4
CHUNKINGS = (2, 4, 8, 16)


@dataclasses.dataclass
class Run:
    """What a one-device optax run ends with, and what it saw on the way."""

    params: Any
    opt_state: Any
    losses: list[float]
    grad_norms: list[float]


def _chunked(loss_fn, chunks: int):
    """The mean loss over ``chunks`` equal slices of the batch, summed one slice at a time: the
    same arithmetic as ``loss_fn`` on the whole batch, in another order."""
    if chunks == 1:
        return loss_fn

    def loss(params, batch):
        # A scan compiles the model once, not ``chunks`` times (the unrolled sum of 2 + 4 + 8 + 16
        # copies made the reference runs a tenth of the suite); the sums run in the same order.
        sliced = jax.tree.map(lambda x: x.reshape(chunks, x.shape[0] // chunks, *x.shape[1:]), batch)
        first = loss_fn(params, jax.tree.map(lambda x: x[0], sliced))
        total, _ = jax.lax.scan(lambda t, part: (t + loss_fn(params, part), None), first, jax.tree.map(lambda x: x[1:], sliced))
        return total / chunks

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


def reference_run(init_fn, loss_fn, tx, rng, batches, steps=STEPS, *, chunks=1, start=None) -> Run:
    """Plain optax on one device: the answer every stage and mesh must reproduce. ``start``:
    ``(params, opt_state)`` to continue from instead of ``init_fn(rng)``."""
    import flax.linen as nn
    import optax
    from flax import nnx

    if start is None:
        with nnx.use_eager_sharding(False):
            params = jax.jit(lambda k: nn.unbox(init_fn(k)))(rng)  # no mesh: one device
        opt_state = tx.init(params)
    else:
        params, opt_state = jax.device_put(jax.device_get(start), jax.devices()[0])

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


def _gap(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b))) if a.size else 0.0


@dataclasses.dataclass
class Reference:
    """A one-device run and its reordering floor (a :class:`Run` of per-leaf gaps)."""

    run: Run
    floor: Run

    def check(self, *, params=None, opt_state=None, losses=None, grad_norms=None) -> None:
        """Each given result equals the reference's within ``MARGIN`` x floor + ``ULPS`` ulps."""
        for name, got in (("params", params), ("opt_state", opt_state), ("losses", losses), ("grad_norms", grad_norms)):
            if got is not None:
                assert_within_floor(got, getattr(self.run, name), getattr(self.floor, name), name)


def reference_with_floor(init_fn, loss_fn, tx, rng, batches, steps=STEPS, *, start=None) -> Reference:
    """:func:`reference_run`, and its floor from the same run with the batch summed in
    ``CHUNKINGS`` chunks."""
    whole = reference_run(init_fn, loss_fn, tx, rng, batches, steps, start=start)
    others = [reference_run(init_fn, loss_fn, tx, rng, batches, steps, chunks=c, start=start) for c in CHUNKINGS]

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


@pytest.fixture(scope="session")
def reference(data):
    """The tiny GPT trained 20 steps on one device, with its reordering floor."""
    import jax.numpy as jnp

    from jzero.training.job import build_job

    s = build_job(tiny_config(LR, "mesh.axes.data=1"), devices=jax.devices()[:1])
    return reference_with_floor(s.init_fn, s.loss_fn, s.tx, s.rng, lambda k: jnp.asarray(data.global_batch(k)))


def snapshot(folder) -> dict[str, bytes]:
    """Every file under ``folder`` (hidden ones too) with its bytes: what "nothing was changed" is
    checked against."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def train_sharded(s, batches, steps=STEPS):
    """Sharded init and ``steps`` compiled steps of a :class:`jzero.training.job.Job`; returns the final state."""
    state = s.init_state()
    step = s.make_step()
    for k in range(steps):
        state, _ = step(state, batches(k, s.plan.batch))
    return state
