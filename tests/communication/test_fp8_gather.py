"""``zero.fp8_gather``: stage 3 casts each parameter of two or more dimensions to float8 (e4m3, one
scale from the whole tensor's largest magnitude) before its all-gather, and back after."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from support.configs import BF16, HPZ, LR, tiny_config
from support.reference import optax_tx, reference_with_floor, straight_through_loss, train_sharded
from support.runs import compiled_step

from jzero.communication.gather import UnitSpec, gather
from jzero.ledger import hlo as ledger
from jzero.ledger.float8 import parameter_gather_bytes
from jzero.training.data import text_batches
from jzero.training.job import build_job
from jzero.training.report import plan_report

FP8 = "zero.fp8_gather=true"
QGZ = ["zero.quantized_gradients=int8", "zero.quantization_block=64"]


def _rounded(x: np.ndarray) -> np.ndarray:
    """``x`` as a float8 gather delivers it, computed apart from jzero: e4m3 (ml_dtypes) with the
    scale that maps the whole array's largest magnitude onto 448, in float32 as jzero computes it."""
    scale = np.float32(np.max(np.abs(x)) / np.float32(448.0))
    return (np.asarray(x / scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * scale).astype(np.float32)


@pytest.mark.parametrize("how", ["gspmd", "hpz", "manual", "manual hpz"])
def test_a_float8_gather_is_the_whole_tensor_rounded_once(devices, how):
    """Every path (GSPMD's constraint, hpZ's secondary copy, qgZ's explicit collectives, both)
    delivers the whole tensor rounded to e4m3 with one scale, its largest magnitude over all shards;
    rows of very different sizes, so a shard's own scale would differ; the gradient goes straight
    through to the shards."""
    mesh = Mesh(np.array(devices).reshape(2, 4), ("replica", "data"))
    resting = P(("data", "replica") if how == "manual hpz" else ("replica", "data"), None)  # qgZ's hpZ: data major
    sizes = np.geomspace(1e-3, 10, 32, dtype=np.float32)[:, None]
    x = np.asarray(jax.random.normal(jax.random.key(0), (32, 24)), np.float32) * sizes
    kw = {"secondary": P("data", None)} if "hpz" in how else {}
    manual = ("replica", "data") if "manual" in how else ()
    spec = UnitSpec(mesh, resting, P(None, None), manual=manual, fp8=True, **kw)
    cotangent = jnp.asarray(np.arange(x.size, dtype=np.float32).reshape(x.shape))

    def f(w):
        return gather(w, spec)

    if manual:
        f = jax.shard_map(f, mesh=mesh, in_specs=resting, out_specs=P(None, None), check_vma=False)
    got, back = jax.jit(lambda w: jax.vjp(f, w))(jax.device_put(x, NamedSharding(mesh, resting)))
    # The same float8 values; the scale within float32's rounding of its division (XLA may multiply by
    # the reciprocal): a few ulps, where a shard's own scale or no rounding is off by up to 1/16.
    np.testing.assert_allclose(np.asarray(got), _rounded(x), rtol=4 * 2.0**-24, atol=0)
    if not manual:  # under shard_map the backward sums each device's copy of the cotangent: qgz's tests
        assert np.array_equal(np.asarray(back(cotangent)[0]), np.asarray(cotangent))


@pytest.mark.parametrize("knobs", [HPZ, QGZ], ids=["hpz", "qgz"])  # hpZ's first gather is the plain one
def test_float8_parameter_gathers_send_at_most_0_51_of_the_bf16_bytes(h100x8, knobs):
    """bf16 compute at stage 3 on the GPU target (the CPU backend widens bf16 and float8 collectives):
    the parameter all-gathers (the ledger's, :func:`parameter_gather_bytes`) send at most 0.51x the
    plain program's, the matrices as f8e4m3fn; only norms and biases go in bf16. The report
    says so (``fp8_gather``)."""
    wide = ["model.d_model=64", "zero.stage=3", *BF16, *knobs]
    plain_job, plain = compiled_step(tiny_config(*wide), h100x8)
    job, compiled = compiled_step(tiny_config(*wide, FP8), h100x8)
    before = parameter_gather_bytes(ledger.parse_collectives(plain.as_text()), plain_job.plan)
    after = parameter_gather_bytes(ledger.parse_collectives(compiled.as_text()), job.plan)
    sent, bf16 = sum(b for b, _ in after.values()), sum(b for b, _ in before.values())
    assert "f8e4m3fn" not in before and after["f8e4m3fn"][0] > 0.95 * sent, after
    assert sent <= 0.51 * bf16, (after, before)
    report = plan_report(job, compiled).fp8_gather
    assert report.float8_bytes == after["f8e4m3fn"][0] and report.ratio <= 0.51, report


def _float8_weights_loss(job, loss_fn):
    """The loss on the parameters as the float8 gathers deliver them, on one device: each tensor of
    two or more dimensions (a scanned stack's, one layer at a time) rounded to e4m3 with the scale of
    its own largest magnitude, the gradient passed straight through."""

    def rounded(x):
        amax = jnp.max(jnp.abs(x))
        scale = jnp.where(amax > 0, amax / 448.0, 1.0)  # e4m3's largest finite value
        return (x / scale).astype(jnp.float8_e4m3fn).astype(x.dtype) * scale

    def one_layer(t):
        gathered = job.plan.parameter_gather(t)
        return rounded if gathered and len(gathered[0]) >= 2 else None

    return straight_through_loss(job, loss_fn, one_layer)


def test_float8_gather_training_equals_one_device_training_on_float8_weights(devices):
    """fp32, stage 3, 8 steps over replica x data with hpZ (whose first gather is the plain one, and
    whose backward regathers from the secondary copy): the parameters equal one-device optax whose
    loss reads each matrix rounded to e4m3 as the gathers send it, within the reference's floor."""
    data = text_batches(None, 200_000, 16, 16, 0)
    s = build_job(tiny_config(LR, "zero.stage=3", *HPZ, FP8))
    one = build_job(tiny_config(LR, "mesh.axes.data=1"), devices=jax.devices()[:1])
    loss = _float8_weights_loss(s, one.loss_fn)
    reference = reference_with_floor(s.init_fn, loss, optax_tx(s.config), s.rng, lambda k: jnp.asarray(data.global_batch(k)), 8)
    state = train_sharded(s, lambda k, sharding: data.device_batch(k, sharding), 8)
    reference.check(params=nn.unbox(state.params))
