"""ZeRO on `data` composed with a `model` axis, unannotated and NNX models, and the `replica` axis."""

import json
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P
from support.configs import LR, STEPS, tiny_config
from support.lm import lm_parts
from support.reference import reference_with_floor, train_sharded

from jzero.cli.main import main
from jzero.config.loading import ConfigError, load_config
from jzero.errors import PlanError
from jzero.ledger import hlo as ledger
from jzero.sharding.mesh import make_mesh
from jzero.sharding.placement import abstract_state, sharded_init
from jzero.sharding.plan import make_plan
from jzero.sharding.stages import paper_bytes_per_device
from jzero.step import make_train_step
from jzero.training.job import build_job

ROOT = Path(__file__).resolve().parents[2]
GPT_TINY = ROOT / "configs/gpt-tiny.yaml"
DP4_MP2 = ["mesh.axes.data=4", "mesh.axes.model=2"]


def _fp32_adam_formula(psi, stage, n_d, n_m=1):
    """The paper's per-device model states for fp32 Adam (4Ψ + 4Ψ + 8Ψ), over N_m."""
    return paper_bytes_per_device(psi, stage, n_d, k=8, param_bytes=4, grad_bytes=4, n_m=n_m)


# ---------------------------------------------------------------------------------------------
# dp4-mp2 on gpt-tiny


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_dp4_mp2_live_bytes_follow_formula_over_n_m(devices, stage):
    cfg = load_config(GPT_TINY, [f"zero.stage={stage}", *DP4_MP2])
    assert cfg.mesh.axes == {"data": 4, "model": 2}
    s = build_job(cfg)
    state = jax.eval_shape(lambda: sharded_init(s.init_fn, s.tx, s.plan, s.rng))
    live = sum(
        np.prod(sh.shard_shape(x.shape)) * x.dtype.itemsize
        for x, sh in zip(jax.tree.leaves(state), jax.tree.leaves(s.plan.state), strict=True)
    )
    want = _fp32_adam_formula(s.plan.num_params, stage, 4, 2)
    grads = s.plan.per_device_bytes().grads
    assert live + grads == pytest.approx(want, rel=0.02)
    assert s.plan.per_device_bytes().total == pytest.approx(want, rel=0.02)


def test_dp4_mp2_mesh_file_and_plan_json(devices, tmp_path, capsys):
    config = tmp_path / "hybrid.yaml"
    config.write_text(f"mesh: {ROOT / 'configs/mesh/dp4-mp2.yaml'}\nzero:\n  stage: 3\n")
    assert main(["plan", str(config), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["mesh"] == {"data": 4, "model": 2}
    want = _fp32_adam_formula(report["num_params"], 3, 4, 2)
    assert report["per_device_bytes"]["total"] == pytest.approx(want, rel=0.02)
    # Stage 3 shards each large tensor over both axes.
    big = [t for t in report["tensors"] if np.prod(t["shape"]) >= 128 * 128]
    assert big and all("data" in t["param_spec"] and "model" in t["param_spec"] for t in big)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_dp4_mp2_matches_reference(devices, data, reference, stage):
    s = build_job(tiny_config(f"zero.stage={stage}", LR, *DP4_MP2))
    specs = {t.path: t.replicated_spec for t in s.plan.tensors}
    assert specs["blocks/mlp_in/kernel"] == P(None, None, "model")  # Megatron: MLP hidden on model
    assert specs["embed/embedding"] == P("model", None)  # vocabulary on model
    state = train_sharded(s, data.device_batch)
    reference.check(params=state.params, opt_state=state.opt_state)


# ---------------------------------------------------------------------------------------------
# Unannotated Flax model


class PlainLM(nn.Module):
    """A third-party-style model: no logical names anywhere."""

    @nn.compact
    def __call__(self, tokens):
        x = nn.Embed(256, 32)(tokens)
        x = nn.LayerNorm()(x)
        x = x + nn.Dense(32)(nn.gelu(nn.Dense(64)(x)))
        head = nn.Dense(256)(x)
        # A tensor no dimension of which 8 divides. (Scaling, not shifting: a shift of all logits
        # has exactly zero gradient, which Adam would turn from rounding noise into updates.)
        return head * (1.0 + self.param("odd", nn.initializers.zeros, (3,)).sum())


def _plain_parts():
    model = PlainLM()
    # eps 1e-6, not 1e-8: this model's sparse embedding rows get gradients of ~1e-8 that are sums
    # with heavy cancellation, and with eps 1e-8 Adam turned their reassociation noise into a 5e-6
    # gap (one element in 8192) against one device. That is data-parallel summation order, not ZeRO.
    tx = optax.adamw(1e-3, eps=1e-6)
    return *lm_parts(model), tx


def test_unannotated_model_at_stage3_on_dp8(devices, data):
    init_fn, loss_fn, tx = _plain_parts()
    rng = jax.random.key(0)
    mesh = make_mesh({"data": 8})
    plan = make_plan(abstract_state(init_fn, tx, rng), mesh, 3)
    assert [t.path for t in plan.replicated] == ["odd"]  # 3 divides by nothing: reported
    state = sharded_init(init_fn, tx, plan, rng)
    step = make_train_step(loss_fn, tx, plan)
    for k in range(STEPS):
        state, _ = step(state, data.device_batch(k, plan.batch))

    psi = plan.num_params
    kept_whole = sum(t.nbytes for t in plan.replicated)  # params; its grads and 2 moments likewise
    live = ledger.live_bytes_per_device(state.params) + plan.per_device_bytes().grads
    live += ledger.live_bytes_per_device(state.opt_state)
    allowance = 4 * kept_whole * (1 - 1 / 8)
    assert live == pytest.approx(_fp32_adam_formula(psi, 3, 8) + allowance, rel=0.02)

    # The reference: the same optax transformation (the user's, not jzero's) on one device.
    reference = reference_with_floor(init_fn, loss_fn, tx, rng, lambda k: jnp.asarray(data.global_batch(k)))
    reference.check(params=state.params, opt_state=state.opt_state)


def test_path_rules_place_an_unannotated_model_on_model(devices):
    init_fn, _, tx = _plain_parts()
    abstract = abstract_state(init_fn, tx, jax.random.key(0))
    mesh = make_mesh({"data": 4, "model": 2})
    plain = make_plan(abstract, mesh, 0)
    assert len(plain.not_on_model) == len(plain.tensors)  # jzero plan lists them all
    rules = [[r"Dense_0/kernel$", [None, "model"]], [r"Dense_1/kernel$", ["model", None]]]
    placed = make_plan(abstract, mesh, 0, path_rules=rules)
    specs = {t.path: t.replicated_spec for t in placed.tensors}
    assert specs["Dense_0/kernel"] == P(None, "model") and specs["Dense_1/kernel"] == P("model", None)
    assert "Dense_0/kernel" not in {t.path for t in placed.not_on_model}
    with pytest.raises(PlanError, match=r"Dense_0/kernel \[64, 32\]: path rule .* gives 1 dims, not 2"):
        make_plan(abstract, mesh, 0, path_rules=[[r"Dense_0/kernel$", ["model"]]])
    with pytest.raises(PlanError, match=r"odd \[3\]: dimension 0 \(3\) is not divisible by mesh axis 'model' \(2\)"):
        make_plan(abstract, mesh, 0, path_rules=[[r"^odd$", ["model"]]])


def test_path_rules_from_config(devices):
    cfg = tiny_config(*DP4_MP2, "partitioning.path_rules=[['blocks/ln_.*/scale', [null, model]]]")
    s = build_job(cfg)
    specs = {t.path: t.replicated_spec for t in s.plan.tensors}
    assert specs["blocks/ln_attn/scale"] == P(None, "model")
    with pytest.raises(ConfigError, match=r"partitioning.path_rules\[0\]: names mesh axis 'pipe'"):
        tiny_config("partitioning.path_rules=[['x', [pipe]]]")
    with pytest.raises(ConfigError, match=r"partitioning.path_rules\[0\]: bad regex"):
        tiny_config("partitioning.path_rules=[['(', [null]]]")


# ---------------------------------------------------------------------------------------------
# Flax NNX


class NNXMlp(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        init = nnx.initializers.lecun_normal()
        self.embed = nnx.Embed(256, 32, rngs=rngs)
        self.up = nnx.Linear(32, 64, kernel_init=nnx.with_partitioning(init, ("embed", "mlp")), rngs=rngs)
        self.down = nnx.Linear(64, 256, kernel_init=nnx.with_partitioning(init, ("mlp", None)), rngs=rngs)

    def __call__(self, tokens):
        return self.down(nnx.gelu(self.up(self.embed(tokens))))


def _nnx_parts():
    # Logical names, not mesh axes: NNX must not try to shard on them eagerly (jzero maps them).
    with nnx.use_eager_sharding(False):
        graphdef = nnx.graphdef(nnx.eval_shape(lambda: NNXMlp(nnx.Rngs(0))))
    tx = optax.adam(1e-3)

    def init_fn(key):
        return nnx.state(NNXMlp(nnx.Rngs(key)), nnx.Param)

    def loss_fn(params, batch):
        logits = nnx.merge(graphdef, params)(batch[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    return init_fn, loss_fn, tx


@pytest.fixture(scope="module")
def nnx_run(data):
    """``(init_fn, loss_fn, tx, rng, reference)``: the NNX model's parts and its one-device reference
    (the same optax transformation, the user's, not jzero's, with its reordering floor), made once
    for both meshes below: the reference depends on neither."""
    init_fn, loss_fn, tx = _nnx_parts()
    rng = jax.random.key(1)
    reference = reference_with_floor(init_fn, loss_fn, tx, rng, lambda k: jnp.asarray(data.global_batch(k)))
    return init_fn, loss_fn, tx, rng, reference


@pytest.mark.parametrize("axes", [{"data": 8}, {"data": 4, "model": 2}])
def test_nnx_model_trains_sharded_and_matches_reference(devices, data, nnx_run, axes):
    init_fn, loss_fn, tx, rng, reference = nnx_run
    plan = make_plan(abstract_state(init_fn, tx, rng), make_mesh(axes), 3)
    specs = {t.path: t.param_spec for t in plan.tensors}
    if "model" in axes:
        assert specs["up/kernel"] == P("data", "model")  # NNX sharding metadata -> model axis
        assert specs["down/kernel"] == P("model", "data")
    else:
        assert specs["up/kernel"] == P(None, "data")
    state = sharded_init(init_fn, tx, plan, rng)
    assert ledger.live_bytes_per_device(state.params) == pytest.approx(4 * plan.num_params / 8, rel=0.02)
    step = make_train_step(loss_fn, tx, plan)
    for k in range(STEPS):
        state, _ = step(state, data.device_batch(k, plan.batch))
    # The reference: the same optax transformation (the user's, not jzero's) on one device.
    reference.check(params=state.params, opt_state=state.opt_state)


# ---------------------------------------------------------------------------------------------
# Hierarchical partitioning: replica x data


def test_replica2_data4(devices, data, reference):
    cfg = tiny_config("zero.stage=3", LR, "mesh.axes={replica: 2, data: 4}")
    assert list(cfg.mesh.axes) == ["replica", "data", "model"]
    s = build_job(cfg)
    assert s.plan.batch.spec == P(("replica", "data"))
    psi = s.plan.num_params
    assert s.plan.per_device_bytes().total == pytest.approx(_fp32_adam_formula(psi, 3, 4), rel=0.02)

    _, compiled = s.compile_step()
    ops = ledger.parse_collectives(compiled.as_text())
    gathers = [o for o in ops if o.kind == "all-gather"]
    assert gathers and all(o.group_size == 4 for o in gathers), {o.group_size for o in gathers}
    # Only the gradient reduction crosses replica groups.
    assert any(o.kind in ("all-reduce", "reduce-scatter") and o.group_size in (2, 8) for o in ops)

    state = train_sharded(s, data.device_batch)
    live = ledger.live_bytes_per_device(state.params) + ledger.live_bytes_per_device(state.opt_state)
    assert live == pytest.approx(12 * psi / 4, rel=0.02)
    reference.check(params=state.params, opt_state=state.opt_state)


def test_replica_mesh_file_and_dcn(devices, tmp_path):
    config = tmp_path / "hpz.yaml"
    config.write_text(f"mesh: {ROOT / 'configs/mesh/replica2-data4.yaml'}\n")
    cfg = load_config(config)
    assert cfg.mesh.dcn == {"replica": 2}
    s = build_job(cfg)  # one process: dcn validates and every device is local
    assert dict(s.mesh.shape) == {"replica": 2, "data": 4, "model": 1}
    with pytest.raises(ConfigError, match=r"mesh.dcn.data: 3 does not divide the axis size 4"):
        load_config(ROOT / "configs/gpt-tiny.yaml", ["mesh.axes={replica: 2, data: 4}", "mesh.dcn={data: 3}"])
    with pytest.raises(ConfigError, match=r"mesh.dcn.pipe: is not a mesh axis"):
        load_config(ROOT / "configs/gpt-tiny.yaml", ["mesh.dcn={pipe: 2}"])
