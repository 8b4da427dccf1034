"""ZeRO-3 gathering units for unscanned models: the choice, the bound on what is gathered at once,
the numbers, and bad input."""

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from support.configs import tiny_config
from support.llama import LLAMA, llama_job
from support.reference import optax_tx, reference_with_floor
from support.xla import USERS_EMITTERS

import jzero
from jzero.cli.main import main
from jzero.communication.units import choose_units
from jzero.config.loading import load_config
from jzero.errors import PlanError
from jzero.ledger import gathered
from jzero.ledger import hlo as ledger
from jzero.ledger.targets import gpu_compiler_available, target_devices
from jzero.sharding.gathers import unit_loss
from jzero.training.job import build_job
from jzero.training.report import plan_report


def _paths(s):
    return [t.path for t in s.plan.tensors], [t.nbytes for t in s.plan.tensors]


@functools.cache
def _llama(*overrides: str, layers: int = 3):
    """One :func:`llama_job` per config for the whole module. A job memoises its step and its
    compiled program, so the tests that plan, compile and train the same config (stage 3: the
    units' choice, the ledger's totals and the one-device equality; stage 0: the reference's model
    and its equality; layers=4 without units: both prefetch cases' comparison) trace it once. No
    test changes a job; each starts its own state from ``init_state``."""
    return llama_job(*overrides, layers=layers)


def test_auto_picks_the_repeated_layers_and_the_rest_alone(devices):
    s = _llama("zero.stage=3")
    units = s.plan.units
    layer_units = {units[p] for p in units if p.startswith("layers_1/")}
    assert len(layer_units) == 1, "a layer's parameters share one unit"
    assert {units["embed_tokens/embedding"], units["lm_head/kernel"], units["norm/scale"]}.isdisjoint(layer_units)
    assert len(set(units.values())) == 3 + 3  # 3 layers, then embedding, final norm and head alone
    assert units == choose_units(*_paths(s), [r"layers_\d+"])


def test_a_scanned_stack_keeps_the_loops_gather(devices):
    s = build_job(tiny_config("zero.stage=3", USERS_EMITTERS), devices)  # what is live at once: users' program
    assert s.plan.units == {}
    g = plan_report(s).gathered
    # One layer per loop step, beside what XLA gathers of the tensors outside the stack.
    outside = sum(t.nbytes for t in s.plan.tensors if "layers" not in (t.logical or ()))
    assert g.layer_bytes <= g.peak_bytes <= g.layer_bytes + outside


def test_units_only_at_stage_3_and_not_with_none(devices):
    assert llama_job("zero.stage=2").plan.units == {}
    assert llama_job("zero.stage=3", "zero.gather_units=none").plan.units == {}


def _bound(s, prefetch: int) -> int:
    """prefetch + 1 layers, and one tensor gathered alone (the head's gather overlaps the last layer)."""
    sizes = s.plan.unit_bytes()
    layer = max(sizes)
    return (prefetch + 1) * layer + max(b for b in sizes if b < layer)


@pytest.mark.parametrize("prefetch", [0, 1])
def test_stage_3_holds_at_most_prefetch_plus_one_layers_gathered(devices, prefetch):
    s = llama_job("zero.stage=3", f"zero.prefetch={prefetch}", layers=4)
    with_units = plan_report(s)
    without = plan_report(_llama("zero.stage=3", "zero.gather_units=none", layers=4))
    g = with_units.gathered
    assert g.peak_bytes <= _bound(s, prefetch), g
    held = without.gathered_peak_bytes / g.layer_bytes
    assert held > 2.5, f"without units XLA holds most layers at once ({held:.2f})"
    assert with_units.gathered_peak_bytes == g.peak_bytes > 0


def test_the_backward_gathers_again_and_the_totals_match_the_ledger(devices):
    s = _llama("zero.stage=3")
    _, compiled = s.compile_step()
    hlo = compiled.as_text()
    ops = ledger.parse_collectives(hlo)
    gathers = [o for o in ops if o.kind == "all-gather"]
    assert gathered.gathered_total(hlo) == sum(o.bytes for o in gathers)
    params = sum(t.nbytes for t in s.plan.tensors)
    forward = sum(o.bytes for o in gathers if "transpose" not in _op_name(hlo, o.name))
    assert forward == params  # every parameter gathered once in the forward
    # Once more in the backward, all but the embedding table (a lookup's gradient does not read it)
    # and at most one norm scale whose backward does not read it either (measured: 128 bytes).
    embedding = next(t.nbytes for t in s.plan.tensors if t.path == "embed_tokens/embedding")
    scale = max(t.nbytes for t in s.plan.tensors if len(t.shape) == 1)
    backward = sum(o.bytes for o in gathers) - forward
    assert params - embedding - scale <= backward <= params - embedding


def _op_name(hlo: str, name: str) -> str:
    line = next(line for line in hlo.splitlines() if f"%{name} = " in line)
    return line.split('op_name="', 1)[1].split('"', 1)[0]


BATCHES = 10


@pytest.fixture(scope="module")
def llama_reference():
    """One-device optax on the Llama-style model, 10 AdamW steps (:func:`optax_tx`), with its reordering floor."""
    s = _llama("zero.stage=0")
    batches = [jax.random.randint(jax.random.key(k), (16, 17), 0, 256) for k in range(BATCHES)]
    return batches, reference_with_floor(s.init_fn, s.loss_fn, optax_tx(s.config), s.rng, lambda k: batches[k], BATCHES)


@pytest.mark.parametrize(
    ("stage", "extra"),
    [(0, []), (1, []), (2, []), (3, []), (3, ["mesh.axes.data=4", "mesh.axes.model=2"]), (3, ["train.microbatches=2"])],
)
def test_params_equal_one_device_optax_with_units(devices, llama_reference, stage, extra):
    batches, ref = llama_reference
    s = _llama(f"zero.stage={stage}", *extra)
    state, step = s.init_state(), s.make_step()
    for k in range(BATCHES):
        state, _ = step(state, jax.device_put(batches[k], s.plan.batch))
    ref.check(params=jax.device_get(state.params))


def test_persistent_parameters_rest_whole_and_are_listed(devices):
    s = llama_job("zero.stage=3", "zero.persist_below_bytes=1024")
    small = {t.path for t in s.plan.tensors if t.nbytes < 1024}
    assert small and {t.path for t in s.plan.persistent} == small
    assert not small & set(s.plan.units)
    report = plan_report(s)
    assert {p.path for p in report.gathered.persistent} == small


def test_bad_unit_regexes_name_the_pattern():
    paths, nbytes = ["a/layers_0/w", "a/layers_1/w", "head/w"], [8, 8, 8]
    with pytest.raises(PlanError, match=r"zero.gather_units: 'blocks_\\\\d\+' matches no parameter"):
        choose_units(paths, nbytes, [r"blocks_\d+"])
    with pytest.raises(PlanError, match="units overlap"):
        choose_units(paths, nbytes, ["a", r"layers_\d+"])


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("[nothing_\\d+]", "matches no parameter path prefix"),
        ("[blocks, ln_attn]", "units overlap"),
        ("sometimes", "must be auto"),
    ],
)
def test_bad_units_exit_2_with_one_line(devices, capsys, value, says):
    config = str(Path(__file__).parents[2] / "configs" / "gpt-tiny.yaml")
    assert main(["plan", config, "--set", "zero.stage=3", "--set", f"zero.gather_units={value}", *_tiny_flags()]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "zero.gather_units" in err and says in err, err


def _tiny_flags():
    from support.configs import TINY

    return [arg for kv in TINY for arg in ("--set", kv)]


def test_h100x8_target_bounds_the_gathers_and_keeps_3_psi():
    if not gpu_compiler_available():
        pytest.fail("the gpu-target extra is not installed: pip install -e '.[test,gpu-target]'")
    devices = target_devices("h100x8")
    s = llama_job("zero.stage=3", devices=devices, layers=4)
    with_units = plan_report(s)
    stage_0 = plan_report(llama_job("zero.stage=0", devices=devices, layers=4))
    assert with_units.gathered.peak_bytes <= _bound(s, 1)
    assert 0.95 <= with_units.communication.ratio <= 1.05
    assert with_units.compiled.temp < stage_0.compiled.temp


def test_a_hugging_face_gpt2_gathers_layer_by_layer(devices):
    from transformers import FlaxGPT2LMHeadModel, GPT2Config

    model = FlaxGPT2LMHeadModel(GPT2Config(n_layer=12, n_embd=32, n_head=4, vocab_size=256, n_positions=32), _do_init=False)

    def init_fn(key):
        return model.init_weights(key, (1, 16))

    def loss_fn(params, batch):
        logits = model(batch[:, :-1], params=params).logits
        return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, batch[:, 1:, None], -1)[..., 0])

    cfg = load_config(None, [*LLAMA, "zero.stage=3"])
    s = build_job(cfg, devices, init_fn=init_fn, loss_fn=loss_fn)
    assert len({s.plan.units[p] for p in s.plan.units if "/h/" in p}) == 12
    g = plan_report(s).gathered
    assert g.peak_bytes <= _bound(s, 1), g


def test_an_nnx_model_with_a_list_of_layers_gets_units_and_the_same_numbers(devices):
    import optax
    from flax import nnx

    class Block(nnx.Module):
        def __init__(self, rngs):
            self.up, self.down = nnx.Linear(32, 128, rngs=rngs), nnx.Linear(128, 32, rngs=rngs)

        def __call__(self, x):
            return x + self.down(nnx.gelu(self.up(x)))

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.inp = nnx.Linear(16, 32, rngs=rngs)
            self.layers = nnx.List([Block(rngs) for _ in range(3)])
            self.out = nnx.Linear(32, 8, rngs=rngs)

        def __call__(self, x):
            x = self.inp(x)
            for layer in self.layers:
                x = layer(x)
            return self.out(x)

    graphdef = nnx.graphdef(nnx.eval_shape(lambda: Net(nnx.Rngs(0))))

    def init_fn(key):
        return nnx.state(Net(nnx.Rngs(key)), nnx.Param)

    def loss_fn(params, batch):
        return jnp.mean((nnx.merge(graphdef, params)(batch[:, :16]) - batch[:, 16:]) ** 2)

    tx, key = optax.adam(1e-3), jax.random.key(0)
    plan = jzero.make_plan(jzero.abstract_state(init_fn, tx, key), jzero.make_mesh({"data": 8}), 3)  # the README's loop
    assert len({plan.units[p] for p in plan.units if p.startswith("layers/1/")}) == 1
    batches = [jax.random.normal(jax.random.key(k), (32, 24)) for k in range(5)]
    ref = reference_with_floor(init_fn, loss_fn, tx, key, lambda k: batches[k], 5)
    state, step = jzero.sharded_init(init_fn, tx, plan, key), jzero.make_train_step(loss_fn, tx, plan)
    for k in range(5):
        state, _ = step(state, jax.device_put(batches[k], plan.batch))
    ref.check(params=jax.device_get(state.params))


def _nn_jit_llama(jitted: bool = True):
    """The Llama-style model, 6 layers, its ``__call__`` wrapped in ``nn.jit`` as a library does so
    that ``apply`` is fast in notebooks: the loss reads it as one ``jit`` equation."""
    import flax.linen as nn
    from support.llama import Llama
    from support.lm import lm_parts

    return lm_parts((nn.jit(Llama) if jitted else Llama)(d=32, layers=6, heads=4, kv_heads=2))


def _own(parts, *overrides):
    init_fn, loss_fn = parts
    return build_job(load_config(None, [*LLAMA, "zero.stage=3", *overrides]), jax.devices()[:8], init_fn=init_fn, loss_fn=loss_fn)


@functools.cache
def _nn_jit_job():
    """:func:`_own` of :func:`_nn_jit_llama`, one for the module: the test of its gathers compiles
    its step, the test of its numbers trains that same step (traced once)."""
    return _own(_nn_jit_llama())


def _held_and_sent(s):
    """The share of the parameters gathered at once, and the bytes all-gathered per device."""
    _, compiled = s.compile_step()
    return gathered.gathered_at_once(compiled, s.plan).share_of_params, gathered.gathered_total(compiled.as_text())


def test_units_take_effect_inside_an_nn_jit_model(devices):
    s = _nn_jit_job()
    assert len(set(s.plan.units.values())) == 6 + 3 and s.plan.merged_units == ()
    held, sent = _held_and_sent(s)
    assert held <= 0.40, f"the jit is opened and its layers gathered one at a time ({held:.2f} at once)"
    # The traffic of units (forward and backward, each unit once), not everything gathered twice.
    _, unwrapped = _held_and_sent(_own(_nn_jit_llama(jitted=False)))
    assert sent <= unwrapped


def _five_steps_equal_one_device_optax(s):
    """``s`` trained 5 steps on random batches equals the one-device optax reference (the config's
    optimizer from optax alone, :func:`optax_tx`), within its floor."""
    batches = [jax.random.randint(jax.random.key(k), (16, 17), 0, 256) for k in range(5)]
    ref = reference_with_floor(s.init_fn, s.loss_fn, optax_tx(s.config), s.rng, lambda k: batches[k], 5)
    state, step = s.init_state(), s.make_step()
    for k in range(5):
        state, _ = step(state, jax.device_put(batches[k], s.plan.batch))
    ref.check(params=jax.device_get(state.params))


def test_an_nn_jit_model_with_units_equals_one_device_optax(devices):
    _five_steps_equal_one_device_optax(_nn_jit_job())


BLOCKS = 6


def _blocks(blocks, x):
    for i in range(BLOCKS):
        x = x + jax.nn.gelu(x @ blocks[f"blocks_{i}"]["up"]) @ blocks[f"blocks_{i}"]["down"]
    return x


@jax.custom_vjp
def _fused(blocks, x):
    """Six blocks in one custom_vjp, as a fused kernel's wrapper runs them."""
    return _blocks(blocks, x)


def _fused_forward(blocks, x):
    return jax.vjp(_blocks, blocks, x)


def _fused_backward(back, ct):
    # Half the true gradient: a rule autodiff would not give, so that opening the call shows.
    return jax.tree.map(lambda g: 0.5 * g, back(ct))


_fused.defvjp(_fused_forward, _fused_backward)


def _fused_parts():
    import optax

    def init_fn(key):
        k = iter(jax.random.split(key, 2 * BLOCKS + 2))
        params = {"embed": 0.02 * jax.random.normal(next(k), (256, 32)), "head": 0.02 * jax.random.normal(next(k), (32, 256))}
        for i in range(BLOCKS):
            up, down = 0.05 * jax.random.normal(next(k), (32, 128)), 0.05 * jax.random.normal(next(k), (128, 32))
            params[f"blocks_{i}"] = {"up": up, "down": down}
        return params

    def loss_fn(params, batch):
        x = _fused({k: v for k, v in params.items() if k.startswith("blocks_")}, params["embed"][batch[:, :-1]])
        return optax.softmax_cross_entropy_with_integer_labels(x @ params["head"], batch[:, 1:]).mean()

    return init_fn, loss_fn


@functools.cache
def _fused_job():
    """:func:`_own` of :func:`_fused_parts`, one for the module: the test of its merged units
    compiles its step, the test of its custom_vjp's rule trains that same step (traced once)."""
    return _own(_fused_parts())


MERGED = (
    "units: blocks_0..blocks_5 (6 units) merged into one region (their parameters are read by one custom_vjp_call); "
    "XLA gathers them, as without units"
)


def test_units_one_custom_vjp_reads_are_left_to_xla_and_named_once(devices):
    from jzero.ledger.render import format_plan

    s = _fused_job()
    assert s.plan.merged_units == (MERGED,)
    assert sorted(s.plan.unit_tensors) == ["embed", "head"], "only the units in effect are counted"
    report = plan_report(s)
    assert report.gathered.units == 2 and format_plan(report).splitlines().count(MERGED) == 1
    held, sent = _held_and_sent(s)
    held_none, sent_none = _held_and_sent(_own(_fused_parts(), "zero.gather_units=none"))
    assert held <= held_none, "the merged units are gathered as without units, not all at once twice"
    head = next(t.nbytes for t in s.plan.tensors if t.path == "head")
    assert sent <= sent_none + head, "beyond what no units send, only the head's backward gather (the embedding needs none)"


def test_a_step_from_make_plan_warns_of_the_merged_units_once(devices):
    import optax

    init_fn, loss_fn = _fused_parts()
    tx, key = optax.adam(1e-3), jax.random.key(0)
    plan = jzero.make_plan(jzero.abstract_state(init_fn, tx, key), jzero.make_mesh({"data": 8}), 3)
    assert len(set(plan.units.values())) == BLOCKS + 2, "the plan has not traced the loss"
    params = jax.eval_shape(init_fn, key)
    with pytest.warns(UserWarning) as caught:
        jax.make_jaxpr(unit_loss(loss_fn, plan))(params, jax.ShapeDtypeStruct((16, 17), jnp.int32))
    assert [str(w.message) for w in caught if str(w.message).startswith("units:")] == [MERGED]


def test_a_custom_vjp_keeps_its_rule_under_units(devices):
    _five_steps_equal_one_device_optax(_fused_job())
