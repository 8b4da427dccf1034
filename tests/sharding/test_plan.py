"""The stage rule table and the spec rules, on abstract states (nothing compiled or allocated)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import pytest
from jax.sharding import PartitionSpec as P

from jzero.errors import PlanError
from jzero.sharding.mesh import make_mesh
from jzero.sharding.partition import data_partition
from jzero.sharding.placement import abstract_state
from jzero.sharding.plan import make_plan
from jzero.sharding.rules import default_rules, logical_names, logical_to_mesh
from jzero.sharding.stages import STAGES


class Odd(nn.Module):
    """Unannotated: one tensor 8 divides only on its smaller dim, one nothing divides."""

    @nn.compact
    def __call__(self, x):
        a = self.param("a", nn.initializers.normal(), (24, 5))
        b = self.param("b", nn.initializers.normal(), (3, 7))
        c = self.param("c", nn.initializers.normal(), (6, 16))
        return x * (a.sum() + b.sum() + c.sum())


def _abstract(module=None, tx=None):
    module = module or Odd()
    tx = tx or optax.adamw(1e-3)

    def init_fn(key):
        return module.init(key, jnp.ones(()))["params"]

    return abstract_state(init_fn, tx, jax.random.key(0))


def test_stage_table_is_the_paper():
    assert [(r.params, r.grads, r.optimizer) for r in STAGES.values()] == [
        (False, False, False),
        (False, False, True),
        (False, True, True),
        (True, True, True),
    ]


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_specs_follow_the_stage(devices, stage):
    plan = make_plan(_abstract(), make_mesh({"data": 8}), stage)
    by_path = {t.path: t for t in plan.tensors}
    a = by_path["a"]
    assert a.sharded_spec == P("data", None)  # 24 is the only dim 8 divides
    assert by_path["c"].sharded_spec == P(None, "data")  # the larger divisible dim
    rule = STAGES[stage]
    assert a.param_spec == (P("data", None) if rule.params else P(None, None))
    assert a.grad_spec == (P("data", None) if rule.grads else P(None, None))
    assert plan.params["a"].spec == a.param_spec
    assert plan.grads["a"].spec == a.grad_spec
    assert plan.optimizer["a"].spec == (a.sharded_spec if rule.optimizer else a.replicated_spec)


def test_undividable_tensor_is_replicated_and_reported(devices):
    plan = make_plan(_abstract(), make_mesh({"data": 8}), 3)
    assert [(t.path, t.shape, t.nbytes) for t in plan.replicated] == [("b", (3, 7), 84)]
    assert plan.params["b"].spec == P(None, None)


def test_optimizer_state_follows_its_parameter(devices):
    plan = make_plan(_abstract(), make_mesh({"data": 8}), 1)
    specs = {path: spec for path, _, _, spec in plan.opt_leaves}
    mu = [p for p in specs if p.endswith("mu/a")]
    assert mu and all(specs[p] == P("data", None) for p in mu)
    assert all(specs[p] == P(None, "data") for p in specs if p.endswith("/c"))
    scalars = [p for p, shape, _, _ in plan.opt_leaves if shape == ()]
    assert scalars and all(specs[p] == P() for p in scalars)  # step counts stay replicated


def test_optimizer_leaves_unlike_any_parameter_get_their_own_partition(devices):
    # adafactor's factored second moments have shapes no parameter has.
    abstract = _abstract(tx=optax.adafactor(1e-3, min_dim_size_to_factor=4))
    plan = make_plan(abstract, make_mesh({"data": 8}), 3)
    for path, shape, _, spec in plan.opt_leaves:
        if shape and shape not in {t.shape for t in plan.tensors}:
            want, _ = data_partition(shape, P(), plan.mesh)
            assert spec == want, path
    assert plan.per_device_bytes().optimizer < sum(
        jnp.dtype(d).itemsize * max(1, int(jnp.prod(jnp.array(s)))) for _, s, d, _ in plan.opt_leaves
    )


def test_data_partition_avoids_the_scan_axis():
    mesh = make_mesh({"data": 8}, jax.devices())
    spec, dim = data_partition((8, 4, 16), P(None, None, None), mesh, ("layers", None, None))
    assert (spec, dim) == (P(None, None, "data"), 2)
    # Only the scan axis divides: use it rather than replicate.
    spec, dim = data_partition((8, 3), P(None, None), mesh, ("layers", None))
    assert (spec, dim) == (P("data", None), 0)


def test_data_joins_a_model_sharded_dim_only_when_needed(devices):
    mesh = make_mesh({"data": 4, "model": 2})
    spec, _ = data_partition((6, 16), P(None, "model"), mesh)
    assert spec == P(None, ("model", "data"))
    spec, _ = data_partition((8, 16), P(None, "model"), mesh)
    assert spec == P("data", "model")


class Annotated(nn.Module):
    features: int = 12

    @nn.compact
    def __call__(self, x):
        w = self.param("w", nn.with_logical_partitioning(nn.initializers.normal(), ("embed", "mlp")), (8, self.features))
        return x * w.sum()


def test_the_default_rules_put_heads_mlp_and_vocabulary_on_model_and_the_batch_on_the_batch_axes():
    rules = default_rules(("data", "model"))
    assert [logical_to_mesh(name, rules) for name in ("heads", "kv_heads", "mlp", "vocab")] == ["model"] * 4
    assert [logical_to_mesh(name, rules) for name in ("embed", "kv", "layers", None)] == [None] * 4
    assert logical_to_mesh("batch", rules) == "data"
    assert tuple(logical_to_mesh("batch", default_rules(("replica", "data", "model")))) == ("replica", "data")
    params = jax.eval_shape(lambda: Annotated().init(jax.random.key(0), jnp.ones(8)))["params"]
    assert logical_names(params) == {"w": ("embed", "mlp")}


def test_logical_names_map_to_the_model_axis(devices):
    plan = make_plan(_abstract(Annotated(features=16)), make_mesh({"data": 4, "model": 2}), 3)
    (w,) = plan.tensors
    assert w.replicated_spec == P(None, "model")
    assert w.param_spec == P("data", "model")


@pytest.mark.parametrize(
    "rules, message",
    [
        ([["embed", "pipe"], ["mlp", None]], "mesh axis 'pipe' does not exist"),
        ([["embed", "model"], ["mlp", "model"]], "mesh axis 'model' used twice"),
    ],
)
def test_bad_rules_name_the_tensor(devices, rules, message):
    with pytest.raises(PlanError, match=message) as err:
        make_plan(_abstract(Annotated()), make_mesh({"data": 4, "model": 2}), 0, rules)
    assert "w [8, 12]" in str(err.value)


def test_model_axis_must_divide(devices):
    with pytest.raises(PlanError, match=r"w \[8, 12\]: dimension 1 \(12\) is not divisible by mesh axis 'model' \(8\)"):
        make_plan(_abstract(Annotated()), make_mesh({"data": 1, "model": 8}), 0)


def test_plan_bytes_per_stage_follow_formula(devices):
    mesh = make_mesh({"data": 8})
    for stage in STAGES:
        plan = make_plan(_abstract(), mesh, stage)
        ideal = plan.ideal_per_device_bytes()
        got = plan.per_device_bytes()
        # Only `b` (84 bytes, replicated) keeps these apart.
        assert got.total >= ideal.total
        assert got.total - ideal.total <= 4 * 84


def test_tied_embeddings_drop_the_lm_head(devices):
    from support.configs import tiny_config

    from jzero.training.job import build_job

    untied = build_job(tiny_config()).plan
    tied = build_job(tiny_config("model.tie_embeddings=true")).plan
    assert "lm_head/kernel" in {t.path for t in untied.tensors}
    assert "lm_head/kernel" not in {t.path for t in tied.tensors}
    assert untied.num_params - tied.num_params == 256 * 32


def test_gpt2_small_config_has_124m_parameters(devices):
    """GPT-2 small's 124.4M less its 1024 x 768 learned positions (rotary here)."""
    from pathlib import Path

    from jzero.config.loading import load_config
    from jzero.training.job import build_job

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs/gpt2-small.yaml", ["mesh.axes.data=8"])
    assert build_job(cfg).plan.num_params == 124_466_688 - 1024 * 768
