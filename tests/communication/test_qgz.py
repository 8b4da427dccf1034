"""ZeRO++'s qgZ: the gradient reduction as quantized all-to-alls under ``shard_map`` (jzero.communication.collectives)."""

import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from support.cli import one_line_error, sets
from support.configs import BF16, HPZ, QWZ, tiny_config

from jzero.communication.collectives import quantized_reduce_scatter
from jzero.communication.gather import UnitSpec, gather
from jzero.communication.quantize import from_wire, to_wire
from jzero.ledger import hlo as ledger
from jzero.models.gpt import lm_loss
from jzero.training.job import build_job

AXES = ("data", "replica")  # hpZ's primary partition under qgZ: data major
SPEC = P(AXES, None)
EPS = np.finfo(np.float32).eps


@pytest.fixture(scope="module")
def mesh(devices):
    return Mesh(np.array(devices).reshape(2, 4), ("replica", "data"))


def _partials(shape=(32, 48)) -> np.ndarray:
    """A different partial gradient per device, [replica, data, *shape], blocks of very different scales."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, *shape)) * np.exp(rng.uniform(-6, 6, (1, 1, shape[0], 1)))
    return x.astype(np.float32)


def _hop(parts: np.ndarray, width: str, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One hop's reference on one host: ``parts`` [senders, receivers, rows] -> per receiver the
    float32 sum of the senders' dequantized chunks, the bound on its summation order, and the bound
    on its quantization error (half a step per sender, plus the two float32 roundings)."""
    top = {"int8": 127, "int4": 7}[width]
    senders, receivers, size = parts.shape
    padded = np.zeros((senders, receivers, -(-size // block) * block), np.float32)
    padded[..., :size] = parts
    b = padded.reshape(senders, receivers, -1, block)
    scale = np.abs(b).max(-1, keepdims=True) / np.float32(top)
    steps = np.clip(np.round(b / np.where(scale > 0, scale, 1)), -top, top)
    deq = (steps.astype(np.float32) * scale).reshape(senders, receivers, -1)[..., :size]
    half = np.broadcast_to(scale * (0.5 + 2 * top * EPS), b.shape).reshape(senders, receivers, -1)[..., :size]
    return deq.sum(0, dtype=np.float32), (senders - 1) * EPS * np.abs(deq).sum(0), half.sum(0)


def _by_receiver(first: np.ndarray) -> np.ndarray:
    """[replica, data, rows/4 * cols] -> [data, sender r, receiver r', ...]: the second hop's chunks."""
    return first.reshape(2, 4, 2, -1).transpose(1, 0, 2, 3)


def _reference(x: np.ndarray, width: str, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """qgZ's two hops by hand: within each host over ``data`` (each device's chunk d of 4), then
    over ``replica`` (sub-chunk r of 2). Returns the shards [replica, data, rows/8 * cols], a bound
    on the float32 reordering of both sums, and a bound on both hops' quantization error."""
    rows = x.shape[2]
    chunks = x.reshape(2, 4, 4, rows // 4 * x.shape[3])  # [replica, sender d, receiver d', ...]
    first, order1, quant1 = (np.stack(a) for a in zip(*(_hop(chunks[r], width, block) for r in range(2)), strict=True))
    second = [_hop(_by_receiver(first)[d], width, block) for d in range(4)]
    out, order2, quant2 = (np.stack(a).transpose(1, 0, 2) for a in zip(*second, strict=True))

    def carried(bound):  # a first-hop error reaches the second sum through each of its 2 senders
        return _by_receiver(bound).sum(1).transpose(1, 0, 2)

    return out, order2 + carried(order1), quant2 + carried(quant1)


@pytest.mark.parametrize("width", ["int8", "int4"])
def test_two_hop_quantized_reduction_is_the_sum_of_each_hops_dequantized_chunks(mesh, width):
    """The all-to-all within the host, then across: each device ends with its 1/8 of the sum, as
    the hand-written hops give it, up to float32's reordering of the two sums; and within both hops'
    half steps of the exact sum (exact bounds, not tolerances)."""
    x = _partials()
    block = 16

    def local(p):
        return quantized_reduce_scatter(p[0, 0], SPEC, AXES, width, block)[None, None]

    run = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("replica", "data"), out_specs=P("replica", "data")))
    got = np.asarray(run(jax.device_put(x, NamedSharding(mesh, P("replica", "data"))))).reshape(2, 4, -1)
    want, order, quant = _reference(x, width, block)
    assert np.all(np.abs(got - want) <= order), np.max(np.abs(got - want) - order)
    # Device (r, d) holds chunk d * 2 + r of the exact sum (data major).
    exact = x.astype(np.float64).sum((0, 1)).reshape(4, 2, -1).transpose(1, 0, 2)
    assert np.all(np.abs(got - exact) <= quant + order + 8 * EPS * np.abs(x).sum((0, 1)).reshape(4, 2, -1).transpose(1, 0, 2))


def test_int4_goes_two_to_a_byte():
    values = jnp.arange(-7, 9, dtype=jnp.int8).clip(-7, 7).reshape(2, 8)
    wire = to_wire(values, "int4")
    assert wire.dtype == jnp.int8 and wire.shape == (2, 4)
    assert np.array_equal(np.asarray(from_wire(wire, "int4")), np.asarray(values))


@pytest.mark.parametrize("hpz", [False, True])
def test_the_manual_gather_and_its_full_precision_reduction_equal_gspmds(mesh, hpz):
    """Under shard_map, the gather's explicit collectives and its backward's reduce-scatter give
    the value and the gradient that GSPMD's gather gives: within float32's reordering."""
    shape = (32, 24)
    x = jax.random.normal(jax.random.key(0), shape)
    rows = jax.random.normal(jax.random.key(1), (8, 3, shape[0]))  # each device's own rows
    resting = SPEC if hpz else P(("replica", "data"), None)
    kw = {"secondary": P("data", None)} if hpz else {}

    def loss(w, r):
        return jnp.sum(jnp.tanh(r @ w) ** 2)

    def manual(w, r):
        spec = UnitSpec(mesh, resting, P(None, None), manual=("replica", "data"), **kw)
        return jax.lax.psum(loss(gather(w, spec), r[0]), ("replica", "data"))

    sharded = jax.device_put(x, NamedSharding(mesh, resting))
    by_rows = jax.device_put(rows, NamedSharding(mesh, P(("replica", "data"))))
    f = jax.shard_map(manual, mesh=mesh, in_specs=(resting, P(("replica", "data"))), out_specs=P())
    value, grad = jax.jit(jax.value_and_grad(f))(sharded, by_rows)
    each = [jax.value_and_grad(loss)(x, rows[i]) for i in range(8)]  # one device's rows at a time
    want, want_grad = sum(v for v, _ in each), sum(g for _, g in each)
    assert grad.sharding.is_equivalent_to(NamedSharding(mesh, resting), 2)
    # Eight partials summed in another order: within 8 eps of the sum of their magnitudes (and the
    # reference's own 8), an exact bound on float32's reordering.
    assert abs(float(value) - float(want)) <= 16 * EPS * sum(abs(float(v)) for v, _ in each)
    assert np.all(np.abs(np.asarray(grad) - np.asarray(want_grad)) <= 16 * EPS * sum(np.abs(np.asarray(g)) for _, g in each))


_PARTIALS: dict[str, list] = {}


def _one_device_partials(model, params, tokens: np.ndarray) -> list:
    """The gradient of :func:`lm_loss` on one device for each of the 8 devices' rows of ``tokens``
    (device k of the batch's axes holds chunk k), from ``params`` brought to that device. Kept per
    model, parameter values and tokens: the cases below share all three (one model, one seed's init
    and one batch, on whichever mesh), so the eight op-by-op gradients are computed once, and a case
    whose inputs differed in any bit would get its own."""
    host = jax.tree.map(np.asarray, params)
    digest = hashlib.sha256(repr(model).encode() + str(jax.tree.structure(host)).encode() + tokens.tobytes())
    for leaf in jax.tree.leaves(host):
        digest.update(str((leaf.dtype, leaf.shape)).encode() + leaf.tobytes())
    key = digest.hexdigest()
    if key not in _PARTIALS:
        one = jax.devices()[0]
        on_one = jax.device_put(host, one)
        rows = tokens.reshape(8, -1, tokens.shape[1])
        _PARTIALS[key] = [jax.grad(lambda p, r: lm_loss(model, p, r))(on_one, jax.device_put(r, one)) for r in rows]
    return _PARTIALS[key]


@pytest.mark.parametrize("width, extra", [("int8", ["mesh.axes.data=8"]), ("int4", ["mesh.axes.data=8"]), ("int8", HPZ)])
def test_a_qgz_gradient_is_within_its_half_steps_of_the_exact_one(devices, width, extra):
    """jzero's GPT under qgZ: the gradient of the step's loss against the sum of each device's
    partial, computed on one device from its rows. Each hop adds at most half a step per sender,
    a step being at most the largest partial's magnitude over the width's top value: an exact
    bound (loose, as it takes each leaf's largest value for every block's)."""
    job = build_job(tiny_config("zero.stage=3", "zero.quantization_block=16", f"zero.quantized_gradients={width}", *extra))
    params = job.init_state().params
    tokens = np.random.default_rng(0).integers(0, 256, job.batch_shape).astype(np.int32)
    got = jax.jit(jax.grad(job.loss_fn))(params, jax.device_put(tokens, job.plan.batch))
    partials = _one_device_partials(job.model, params, tokens)
    top = {"int8": 127, "int4": 7}[width]
    hops = len(job.plan.batch_axes)

    def check(path, g, *each):
        each = [np.asarray(e, np.float64) / 8 for e in each]  # the pmean's share of each partial
        exact = np.sum(each, axis=0)
        # (1 + 1 / top): a second hop quantizes the first hop's sums, errors included.
        bound = hops * (1 + 1 / top) * sum(np.abs(e).max() for e in each) / (2 * top) + 16 * EPS * np.sum(np.abs(each), axis=0)
        assert np.all(np.abs(np.asarray(g, np.float64) - exact) <= bound), jax.tree_util.keystr(path)

    jax.tree_util.tree_map_with_path(check, got, *partials)
    assert any(np.any(np.asarray(g) != 0) for g in jax.tree.leaves(got))


def _collectives(devices, *overrides):
    job = build_job(tiny_config("zero.stage=3", *BF16, "zero.quantization_block=64", *overrides), devices)
    return job, ledger.parse_collectives(job.compile_step()[1].as_text())


@pytest.mark.parametrize("extra", [["mesh.axes.data=8"], [*HPZ, *QWZ[:1]]])
def test_qgz_leaves_no_reduce_scatter_and_sends_int_all_to_alls_on_the_gpu_target(h100x8, extra):  # noqa: F811
    """Every gathered gradient goes back through all-to-alls of s8 values (int4: two to a byte, half
    the bytes) and their f32 scales; no reduce-scatter is left."""
    sent = {}
    for width in ("int8", "int4"):
        _, ops = _collectives(h100x8, *extra, f"zero.quantized_gradients={width}")
        assert not [op for op in ops if op.kind == "reduce-scatter"]
        a2a = [op for op in ops if op.kind == "all-to-all"]
        assert a2a and {op.dtype for op in a2a} == {"s8", "f32"}
        sent[width] = sum(op.bytes * op.executions for op in a2a if op.dtype == "s8")
    assert sent["int4"] * 2 == sent["int8"]


def test_hpz_qgz_hops_are_within_then_across_hosts(two_hosts):  # noqa: F811
    """Two hosts of 4: the first hop's all-to-alls stay within a host, the second's cross it, and
    the second sends a quarter of the first's values (the data chunk over the 2 hosts' lane)."""
    job, ops = _collectives(two_hosts, *HPZ, "mesh.dcn.replica=2", "zero.quantized_gradients=int8")
    a2a = [op for op in ops if op.kind == "all-to-all" and op.dtype == "s8"]
    sizes = {op.group_size for op in a2a}
    assert sizes == {4, 2}
    within = sum(op.bytes * op.executions for op in a2a if op.group_size == 4)
    across = sum(op.bytes * op.executions for op in a2a if op.group_size == 2)
    assert across * 4 == within


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["zero.stage=3", "zero.quantized_gradients=int2"], "zero.quantized_gradients: must be none, int8 or int4, got 'int2'"),
        (["zero.stage=2", "zero.quantized_gradients=int8"], "zero.quantized_gradients: reduces the gradients layer by layer"),
        (["zero.stage=3", "mesh.axes={data: 4, model: 2}", "zero.quantized_gradients=int8"], "needs mesh.axes.model 1"),
        (["zero.stage=3", "mesh.axes={replica: 2, data: 4}", "zero.quantized_gradients=int8"], "needs zero.hierarchical hpz"),
        (["zero.stage=3", "zero.offload_params=true", "zero.quantized_gradients=int8"], "not with zero.offload_params yet"),
    ],
)
def test_bad_qgz_settings_are_one_line(capsys, overrides, fragment):
    one_line_error(capsys, ["plan", "configs/gpt-tiny.yaml", *sets(*overrides)], fragment)
