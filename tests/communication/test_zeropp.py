"""ZeRO++'s qwZ: block-quantized parameter gathers (jzero/communication/quantize.py, jzero.communication.gather)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from support.cli import one_line_error, sets
from support.configs import BF16, HPZ, LR, QWZ, tiny_config
from support.reference import optax_tx, reference_with_floor, straight_through_loss, train_sharded
from support.runs import compiled_step

from jzero.checkpoint.runs import RunCheckpoints
from jzero.communication.gather import UnitSpec, gather
from jzero.communication.quantize import Layout, dequantize, from_blocks, layout, quantize, to_blocks
from jzero.dtypes import hlo_bytes
from jzero.ledger import hlo as ledger
from jzero.training.data import text_batches
from jzero.training.job import build_job
from jzero.training.report import plan_report

CASES = [  # shape, resting spec, gathered spec, on data=4 x model=2
    ((64, 32), P("data", None), P(None, None)),
    ((64, 32), P("model", "data"), P("model", None)),
    ((64, 32), P(None, ("model", "data")), P(None, "model")),
    ((8, 64, 32), P(None, "data", "model"), P(None, None, "model")),
    ((64, 32), P(("data", "model"), None), P(None, None)),
]


@pytest.fixture(scope="module")
def mesh(devices):
    return Mesh(np.array(devices).reshape(4, 2), ("data", "model"))


def _reference(whole: np.ndarray, lay: Layout, dtype) -> np.ndarray:
    """Gather first, then quantize: the whole tensor on one device, cut into the same blocks."""
    one = jax.devices()[0]
    blocks = to_blocks(jax.device_put(whole, one), lay)
    return np.asarray(from_blocks(dequantize(*quantize(blocks), dtype), lay))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("shape, spec, whole", CASES)
def test_quantize_then_gather_is_gather_then_quantize(mesh, shape, spec, whole, dtype):
    lay = layout(shape, spec, mesh, 64)
    spread = jnp.exp(jax.random.uniform(jax.random.key(1), shape[-1:]) * 8)  # blocks of very different scales
    x = (jax.random.normal(jax.random.key(0), shape) * spread).astype(dtype)
    sharded = jax.device_put(x, NamedSharding(mesh, spec))
    got = jax.jit(lambda a: gather(a, UnitSpec(mesh, spec, whole, layout=lay)))(sharded)
    assert got.sharding.is_equivalent_to(NamedSharding(mesh, whole), len(shape))
    want = _reference(np.asarray(x), lay, dtype)
    assert got.dtype == want.dtype and np.array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8))


def test_dequantized_values_are_within_half_a_step_per_block():
    """|x - q s| <= s/2 per block, plus the two float32 roundings (x / s, then q * s), each at most
    127 s 2^-24: an exact bound, not a tolerance."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 256)) * np.exp(rng.uniform(-20, 20, (64, 1)))).astype(np.float32)
    x[0] = 0.0  # an all-zero block: scale 0, values exact
    x[1, 3] = 1e30  # one huge value in a block
    values, scales = quantize(jnp.asarray(x))
    back = np.asarray(dequantize(values, scales, jnp.float32), np.float64)
    step = np.asarray(scales, np.float64)[:, None]
    assert values.dtype == jnp.int8 and int(jnp.max(jnp.abs(values))) == 127
    assert np.all(np.abs(back - x) <= step * (0.5 + 254 * 2.0**-24)) and np.all(back[0] == 0)


def test_layouts_split_by_mesh_axis_and_leave_1d_whole(mesh):
    assert layout((128,), P("data"), mesh, 8) == "1-D"
    lay = layout((8, 64, 32), P(None, "data", "model"), mesh, 64)
    assert lay.axes == ("data", "model") and lay.parts == ((8,), (4, 16), (2, 16)) and lay.local_size == 2048


def test_a_block_that_does_not_divide_the_shard_is_padded(mesh):
    """136 elements per device in blocks of 16: nine blocks, the last half zeros; still exact. A
    shard under eight blocks is not padded, and one under a block is not quantized."""
    too_few = "24 elements per device, not a multiple of the block (16) and too few to pad"
    assert layout((8, 12), P("data", None), mesh, 16) == too_few
    assert layout((8, 12), P("data", None), mesh, 32) == "24 elements per device, fewer than a block (32)"
    lay = layout((8, 68), P("data", None), mesh, 16)
    assert lay.blocks == 9 and to_blocks(jnp.ones((8, 68)), lay).shape == (4, 9, 16)
    x = jax.random.normal(jax.random.key(2), (8, 68))
    sharded = jax.device_put(x, NamedSharding(mesh, P("data")))
    got = jax.jit(lambda a: gather(a, UnitSpec(mesh, P("data", None), P(), layout=lay)))(sharded)
    assert np.array_equal(np.asarray(got), _reference(np.asarray(x), lay, jnp.float32))


def _gathered_arrays(compiled, sizes, dtypes):
    """Bytes per step of the all-gather arrays of ``dtypes`` with an element count in ``sizes``."""
    total = 0
    for op in ledger.parse_collectives(compiled.as_text()):
        if op.kind == "all-gather":
            for dtype, dims in op.arrays:
                if dtype in dtypes and int(np.prod(dims)) in sizes:
                    total += int(np.prod(dims) * hlo_bytes(dtype)) * op.executions
    return total


def _assert_int8_gathers(plain, quantized) -> None:
    """Each bf16 parameter gather of the plain program became an s8 gather of the same elements,
    and the ledger finds no parameter-sized gather left in another type."""
    (job, compiled), (_, plain_compiled) = quantized, plain
    report = plan_report(job, compiled).quantization
    assert report.quantized > 0 and report.gathers.mismatched == [], report
    layouts = job.plan.weight_layouts()
    sizes = set()
    for t in job.plan.tensors:
        if isinstance(layouts.get(t.path), Layout):
            shape, _, target = job.plan.parameter_gather(t)
            sizes.add(int(np.prod(NamedSharding(job.mesh, target).shard_shape(shape))))
    bf16 = _gathered_arrays(plain_compiled, sizes, {"bf16"})
    assert bf16 > 0 and _gathered_arrays(compiled, sizes, {"s8"}) * 2 == bf16
    assert _gathered_arrays(compiled, sizes, {"bf16"}) == 0
    assert report.gathers.quantized_bytes == bf16 // 2


@pytest.mark.parametrize("stage", [2, 3])
def test_every_quantized_gather_is_int8_on_the_gpu_target(h100x8, stage):  # noqa: F811
    """jzero's GPT: at stage 3 the layer loop's gathers, at stage 2 the updated parameters'."""
    plain = compiled_step(tiny_config(f"zero.stage={stage}", *BF16), h100x8)
    _assert_int8_gathers(plain, compiled_step(tiny_config(f"zero.stage={stage}", *BF16, *QWZ), h100x8))


def test_gathering_units_quantize_too(h100x8):  # noqa: F811
    """An unscanned model (a Llama of your own) gathered unit by unit: its units' gathers are s8."""
    from support.llama import llama_parts

    init_fn, loss_fn = llama_parts(16, d=32, layers=3, heads=4, kv_heads=2)

    def compiled(*sets):
        cfg = tiny_config("zero.stage=3", *BF16, *sets)
        job = build_job(cfg, h100x8, init_fn=init_fn, loss_fn=loss_fn)
        assert job.plan.units
        return job, job.compile_step()[1]

    _assert_int8_gathers(compiled(), compiled(*QWZ))


def _qdq_reference_loss(job, loss_fn):
    """The loss on parameters quantized and dequantized as the plan's gathers do (a scanned leaf one
    layer at a time), with the gradient passed straight through: what qwZ computes, on one device."""
    layouts = job.plan.weight_layouts()

    def one_layer(t):
        lay = layouts.get(t.path)
        if not isinstance(lay, Layout):
            return None
        return lambda v: from_blocks(dequantize(*quantize(to_blocks(v, lay)), v.dtype), lay)

    return straight_through_loss(job, loss_fn, one_layer)


def test_qwz_training_equals_one_device_training_on_quantized_weights(devices):
    """fp32, stage 3, 8 steps: with qwZ over data=8, and with qwZ and hpZ over replica x data, the
    parameters equal one-device optax (:func:`optax_tx`) whose loss reads each matrix (6 per block,
    the embedding and the head) quantized as the plan's gathers do, within its reordering floor. Both
    meshes cut the same blocks (replica x data in mesh order is data=8's order), so one reference
    serves both."""
    data = text_batches(None, 200_000, 16, 16, 0)
    runs = [build_job(tiny_config(LR, "zero.stage=3", *QWZ)), build_job(tiny_config(LR, "zero.stage=3", *HPZ, *QWZ))]

    def blocks(s):
        return sorted(lay.blocks for lay in s.plan.weight_layouts().values() if isinstance(lay, Layout))

    assert len(blocks(runs[0])) == 8 and blocks(runs[1]) == blocks(runs[0])
    one = build_job(tiny_config(LR, "mesh.axes.data=1"), devices=jax.devices()[:1])
    loss = _qdq_reference_loss(runs[0], one.loss_fn)
    s = runs[0]
    reference = reference_with_floor(s.init_fn, loss, optax_tx(s.config), s.rng, lambda k: jnp.asarray(data.global_batch(k)), 8)
    for s in runs:
        state = train_sharded(s, lambda k, sharding: data.device_batch(k, sharding), 8)
        reference.check(params=nn.unbox(state.params))


# qgZ under hpZ partitions data-major: its checkpoint restores onto the other order.
SAVED_WITH = {"qwz": QWZ, "qgz hpz": [*HPZ, "zero.quantized_gradients=int8", "zero.quantization_block=64"]}


@pytest.mark.parametrize("knobs", list(SAVED_WITH))
def test_a_checkpoint_saved_with_zeropp_restores_without_it_bit_identical(devices, tmp_path, knobs):
    data = text_batches(None, 200_000, 16, 16, 0)
    s = build_job(tiny_config(LR, "zero.stage=3", *BF16, *SAVED_WITH[knobs]))
    state = train_sharded(s, lambda k, sharding: data.device_batch(k, sharding), 2)
    want = jax.device_get(state)
    ckpts = RunCheckpoints(tmp_path)
    assert ckpts.save(2, state, data.state(2), {"mesh": {"data": 8}, "stage": 3})
    ckpts.wait()
    plain = build_job(tiny_config(LR, "zero.stage=3", *BF16, *(HPZ if "hpz" in knobs else [])))
    if "hpz" in knobs:  # the same devices, the other order of replica x data
        assert plain.plan.params != s.plan.params
    restored = jax.device_get(ckpts.restore(2, plain.abstract_state()).state)
    for got, expected in zip(jax.tree.leaves(restored), jax.tree.leaves(want), strict=True):
        assert got.dtype == expected.dtype and np.array_equal(got, expected)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["zero.stage=0", "zero.quantized_weights=int8"], "zero.quantized_weights: needs zero.stage 1, 2 or 3"),
        (["zero.stage=3", "zero.quantized_weights=int4"], "zero.quantized_weights: must be none or int8, got 'int4'"),
        (["zero.stage=3", *QWZ[:1], "zero.quantization_block=100"], "zero.quantization_block: must be a power of two, got 100"),
        (["zero.stage=1", *QWZ[:1]], "zero.quantized_weights: at stage 1 the gathered parameters are the ones updated"),
    ],
)
def test_bad_quantization_settings_are_one_line(capsys, overrides, fragment):
    one_line_error(capsys, ["plan", "configs/gpt-tiny.yaml", *sets(*overrides)], fragment)


@pytest.fixture(scope="module")
def hpz_on_two_hosts(two_hosts):
    """The tiny GPT, bf16, stage 3 with hpZ over two hosts of 4: one job for the module, so the
    test of its secondary copy and the gpt case of its backward's gathers compile its step once."""
    return build_job(tiny_config("zero.stage=3", *BF16, *HPZ, "mesh.dcn.replica=2"), two_hosts)


def test_hpz_states_are_zero3_over_all_devices_plus_a_secondary_copy_per_host(devices, hpz_on_two_hosts):
    """Live model states: ZeRO-3's formula over all 8 devices. The secondary copy: the parameters
    (bf16) over the 4 devices of a host, and the compiled layer loop saves it for every scanned kernel."""
    from jzero.ledger.hlo import forward_loop_writes, live_bytes_per_device
    from jzero.ledger.zeropp import hierarchical

    s = build_job(tiny_config("zero.stage=3", *BF16, *HPZ))
    flat = build_job(tiny_config("zero.stage=3", *BF16, "mesh.axes.data=8"))
    assert s.plan.per_device_bytes() == flat.plan.per_device_bytes()
    assert s.plan.per_device_bytes().total <= s.plan.ideal_per_device_bytes().total + 64  # whole-row rounding
    state, planned = s.init_state(), s.plan.per_device_bytes()
    assert live_bytes_per_device(state.params) == planned.params
    assert 0 <= live_bytes_per_device(state.opt_state) - planned.optimizer <= 8  # the optimizer's step counts
    job = hpz_on_two_hosts
    _, compiled = job.compile_step()
    h = hierarchical(job.plan, job.precision, compiled.as_text())
    assert plan_report(job, compiled).hierarchical == h
    whole = sum(int(np.prod(t.shape)) * 2 for t in job.plan.tensors)  # bf16
    assert h.secondary_bytes == h.formula_bytes == whole / 4
    written = [dims for loop in forward_loop_writes(compiled.as_text()) for dtype, dims, _, _ in loop if dtype == "bf16"]
    for t in job.plan.tensors:
        if t.path.startswith("blocks/") and t.path.endswith("kernel"):
            assert NamedSharding(job.mesh, job.plan.secondary_spec(t.param_spec)).shard_shape(t.shape) in written, t.path
    # All of it but a bias the backward never reads (the value projection's): not saved.
    assert 0.95 * h.scanned_bytes <= h.saved_by_loops_bytes <= h.scanned_bytes


@pytest.mark.parametrize("model", ["gpt", "llama units"])
def test_hpz_keeps_the_backwards_gathers_within_the_host(request, two_hosts, model):
    """Two hosts of 4: flat ZeRO-3 gathers across hosts in the forward and again in the backward;
    with hpZ only the forward's gather crosses, and the backward's stays within a host: in jzero's
    scanned GPT and in an unscanned model's gathering units."""
    from support.llama import llama_parts

    from jzero.ledger.levels import bytes_by_level

    parts = {}
    if model != "gpt":
        parts["init_fn"], parts["loss_fn"] = llama_parts(16, d=32, layers=3, heads=4, kv_heads=2)

    def build(*sets):
        return build_job(tiny_config("zero.stage=3", *BF16, *sets), two_hosts, **parts)

    def gathers(job):
        assert bool(job.plan.units) == (model != "gpt")
        ops = [op for op in ledger.parse_collectives(job.compile_step()[1].as_text()) if op.kind == "all-gather"]
        return bytes_by_level(ops, [d.process_index for d in job.mesh.devices.flat])

    flat = gathers(build("mesh.axes.data=8", "mesh.dcn.data=2"))
    # The gpt's hpZ job is the secondary copy's test's (the same config: build(*HPZ, "mesh.dcn.replica=2")).
    hpz = gathers(request.getfixturevalue("hpz_on_two_hosts") if model == "gpt" else build(*HPZ, "mesh.dcn.replica=2"))
    assert flat["within_host"] == 0 and hpz["cross_host"] < flat["cross_host"]
    # The backward's gathers (flat's cross-host bytes that hpZ's no longer has) went within the
    # host, beside the forward's second, within-host gather: at most flat's bytes in all.
    assert flat["cross_host"] - hpz["cross_host"] <= hpz["within_host"] <= flat["cross_host"], (flat, hpz)


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (["zero.stage=3", "zero.hierarchical=hpz"], "zero.hierarchical: hpz needs a replica axis (mesh.axes.replica > 1"),
        (["zero.stage=2", *HPZ], "zero.hierarchical: hpz keeps a secondary copy of parameter shards: needs zero.stage 3, got 2"),
        (["zero.stage=3", "zero.hierarchical=mics"], "zero.hierarchical: must be none or hpz, got 'mics'"),
    ],
)
def test_bad_hierarchical_settings_are_one_line(capsys, overrides, fragment):
    one_line_error(capsys, ["plan", "configs/gpt-tiny.yaml", *sets(*overrides)], fragment)
