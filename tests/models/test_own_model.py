"""A model of your own: the config that says so (``model.name: own``, ``model.entry``), its units
by name, and each friction of issue 35's point 4 as one line: a path rule that places nothing, a
Precision missing from ``abstract_state``, an own-loop checkpoint's layout. The page's example
itself trains and resumes in tests/test_readme.py."""

from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from support.configs import tiny_config
from support.examples import load_example

import jzero
from jzero.checkpoint.catalog import describe
from jzero.checkpoint.meta import STAGE_1_OR_2, RunMeta, changes
from jzero.cli.main import main
from jzero.config.loading import dump_config, load_config
from jzero.errors import ConfigError, PlanError
from jzero.training.entry import own_model as load_own_model
from jzero.training.job import build_job

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "own-model.yaml"
SMALL = ["model.seq_len=16"]
UNITS = ["h/0", "h/1", "lm_head/kernel", "ln_f/bias", "ln_f/scale", "wpe/embedding", "wte/embedding"]


@pytest.fixture(scope="module")
def own_model():
    return load_example("own_model")


@pytest.fixture(scope="module")
def zero3_loop():
    return load_example("zero3_loop")


def test_the_config_names_the_model_and_its_units(devices, own_model, monkeypatch):
    """``jzero train`` and ``jzero plan`` build the job from ``model.entry`` (a file relative to the
    working directory), as Python does from the functions themselves; ``plan.unit_tensors`` maps
    each unit, by name, to its tensors."""
    monkeypatch.chdir(ROOT)
    config = load_config(CONFIG, SMALL)
    from_entry = build_job(config)
    from_python = build_job(config, init_fn=(parts := own_model.model_parts(config))[0], loss_fn=parts[1])
    assert [t.path for t in from_entry.plan.tensors] == [t.path for t in from_python.plan.tensors]
    units = from_entry.plan.unit_tensors
    assert list(units) == UNITS and units == from_python.plan.unit_tensors
    assert units["h/1"] == [p for p in from_entry.plan.units if p.startswith("h/1/")] and len(units["h/1"]) == 12
    assert units["wte/embedding"] == ["wte/embedding"]
    numbers = from_entry.plan.units
    assert {numbers[p] for p in units["h/0"]} == {0} and numbers["wte/embedding"] == len(UNITS) - 1
    assert build_job(tiny_config("zero.stage=3")).plan.unit_tensors == {}  # a scanned stack: no units


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["model.name=falcon"], "model.name: unknown model 'falcon' (known: gpt, llama, qwen2, qwen3, mistral, gemma2, gemma3, "
                                "own)"),
        (["model.entry=examples/own_model.py:model_parts"], "model.entry: names a model of your own: only with model.name: own"),
        (["model.name=own", "model.d_model=64"], "model.d_model: is jzero's models'; a model of your own (model.name: own)"),
        (["model.name=own", "model.entry=own_model.model_parts"], "model.entry: must be FILE.py:FUNCTION or MODULE:FUNCTION"),
    ],
)
def test_a_config_of_your_own_model_refuses_in_one_line(overrides, says):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert says in str(err.value) and len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        (None, "model.entry: model.name: own needs FILE.py:FUNCTION (or MODULE:FUNCTION) here, or init_fn and loss_fn"),
        ("examples/absent.py:parts", "model.entry: file not found: examples/absent.py"),
        ("examples/own_model.py:parts", "model.entry: examples/own_model.py has no function 'parts'"),
        ("examples/own_model.py:CausalLM", "model.entry: CausalLM(config) must return (init_fn, loss_fn), got CausalLM("),
        ("no_such_package.models:parts", "model.entry: no module 'no_such_package' (from 'no_such_package.models')"),
    ],
)
def test_an_entry_that_cannot_be_loaded_is_one_line(devices, monkeypatch, entry, says):
    monkeypatch.chdir(ROOT)
    config = load_config(None, [*SMALL, "model.name=own", f"model.entry={entry}" if entry else "model.entry=null"])
    for build in (load_own_model, build_job):  # the entry's loader, and the job that calls it
        with pytest.raises(ConfigError) as err:
            build(config)
        assert str(err.value).startswith(says) and len(str(err.value).splitlines()) == 1


def test_search_and_sample_are_for_the_gpt(devices, tmp_path, capsys):
    """``jzero plan --search`` and ``jzero sample`` refuse a model of yours in one line, exit 2."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(load_config(CONFIG)))
    assert main(["sample", str(run), "--prompt", "def "]) == 2
    assert main(["plan", str(CONFIG), "--search", "--target", "h100x8"]) == 2
    sample_err, search_err = capsys.readouterr().err.strip().splitlines()
    assert "model.name: " in sample_err and "jzero sample decodes jzero's own models" in sample_err
    own = "jzero's own models (jzero.models.architectures)"
    assert search_err.startswith(f"jzero: error: --search: prices the candidates of {own}")
    assert "plan it without --search" in search_err


# ---------------------------------------------------------------------------------------------
# A path rule that places nothing


def test_a_path_rule_that_places_nothing_is_one_line_naming_it(devices, own_model, monkeypatch, capsys):
    """docs/hybrid.md's Python form places the MLP on ``model``; a typo in a rule, or a rule that an
    earlier one shadows, would leave its tensors replicated, and is refused naming the rule."""
    config = load_config(CONFIG, SMALL)
    init_fn, _ = own_model.model_parts(config)
    tx, key = optax_adamw(), jax.random.key(0)
    abstract = jzero.abstract_state(init_fn, tx, key)
    mesh = jzero.make_mesh({"data": 4, "model": 2})
    megatron = [(r"mlp/c_fc/kernel$", [None, "model"]), (r"mlp/c_proj/kernel$", ["model", None])]
    specs = {t.path: t.replicated_spec for t in jzero.make_plan(abstract, mesh, 3, path_rules=megatron).tensors}
    assert specs["h/1/mlp/c_fc/kernel"] == jax.P(None, "model") and specs["h/0/mlp/c_proj/kernel"] == jax.P("model", None)

    typo = [megatron[0], (r"mlp/c_proj/kernal$", ["model", None])]
    with pytest.raises(PlanError) as err:
        jzero.make_plan(abstract, mesh, 3, path_rules=typo)
    hybrid = " ".join((ROOT / "docs" / "hybrid.md").read_text().split())
    assert str(err.value) in hybrid  # the line docs/hybrid.md quotes
    assert str(err.value) == (
        "partitioning.path_rules[1]: 'mlp/c_proj/kernal$' matches no parameter path (the nearest is 'h/1/mlp/c_proj/kernel')"
    )
    with pytest.raises(PlanError, match=r"^partitioning.path_rules\[1\]: 'h/0/mlp/c_fc/kernel' places nothing: an earlier"):
        jzero.make_plan(abstract, mesh, 3, path_rules=[megatron[0], ("h/0/mlp/c_fc/kernel", [None, "model"])])
    with pytest.raises(PlanError, match=r"^partitioning.path_rules\[0\]: bad regex '\('"):
        jzero.make_plan(abstract, mesh, 3, path_rules=[("(", [None])])

    monkeypatch.chdir(ROOT)  # from a config, through jzero plan: exit 2 before anything compiles
    rule = "partitioning.path_rules=[['mlp/c_fc/kernel$', [null, model]], ['mlp/c_prj/kernel$', [model, null]]]"
    sets = [SMALL[0], "mesh.axes.data=4", "mesh.axes.model=2", rule]
    assert main(["plan", str(CONFIG), *(f"--set={s}" for s in sets)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("jzero: error: partitioning.path_rules[1]: 'mlp/c_prj/kernel$' matches no parameter path")


def optax_adamw():
    import optax

    return optax.adamw(3e-3)


# ---------------------------------------------------------------------------------------------
# A Precision missing from abstract_state


def test_a_precision_missing_from_abstract_state_is_one_line(devices, zero3_loop):
    """Before: a pytree-structure error from inside pjit. Now: one line naming both and the fix,
    from ``sharded_init`` and ``make_train_step``, whichever comes first."""
    init_fn, loss_fn, tx, key = zero3_loop.training_parts()
    mesh = jzero.make_mesh({"data": -1})
    bf16 = jzero.Precision(param_dtype=jnp.bfloat16, compute_dtype=jnp.bfloat16)
    fp16 = jzero.Precision(param_dtype=jnp.float16, compute_dtype=jnp.float16)
    fp32_plan = jzero.make_plan(jzero.abstract_state(init_fn, tx, key), mesh, stage=3)
    fix = "pass the same jzero.Precision to abstract_state, sharded_init and make_train_step"
    gives = "this Precision gives bfloat16 parameters with an fp32 master copy"
    said = f"precision: the plan was made for float32 parameters, {gives}: {fix}"
    with pytest.raises(PlanError) as err:
        jzero.sharded_init(init_fn, tx, fp32_plan, key, bf16)
    assert str(err.value) == said
    with pytest.raises(PlanError) as err:
        jzero.make_train_step(loss_fn, tx, fp32_plan, precision=bf16)
    assert str(err.value) == said
    bf16_plan = jzero.make_plan(jzero.abstract_state(init_fn, tx, key, bf16), mesh, stage=3)
    with pytest.raises(PlanError, match="made for bfloat16 parameters with an fp32 master copy, this Precision gives float32"):
        jzero.sharded_init(init_fn, tx, bf16_plan, key)
    with pytest.raises(PlanError, match="this Precision gives float16 parameters with an fp32 master copy and a loss scale"):
        jzero.make_train_step(loss_fn, tx, bf16_plan, precision=fp16)
    jzero.make_train_step(loss_fn, tx, bf16_plan, precision=bf16)  # the same one: no complaint


# ---------------------------------------------------------------------------------------------
# An own-loop checkpoint says its layout


def test_an_own_loop_checkpoint_records_the_layout_its_shardings_show(devices, zero3_loop, tmp_path, capsys):
    """``RunCheckpoints.save(step, state)`` with no meta: ``jzero checkpoint info`` shows the mesh,
    devices, processes and the stage the shardings tell (before: ``?`` in every column)."""
    init_fn, _, tx, key = zero3_loop.training_parts()
    mesh = jzero.make_mesh({"data": -1})
    abstract = jzero.abstract_state(init_fn, tx, key)
    for stage in (3, 1):
        plan = jzero.make_plan(abstract, mesh, stage)
        checkpoints = jzero.RunCheckpoints(tmp_path / f"stage{stage}")
        checkpoints.save(5, jzero.sharded_init(init_fn, tx, plan, key))
        checkpoints.close()
    (three,), (one,) = describe(tmp_path / "stage3"), describe(tmp_path / "stage1")
    assert (three.stage, three.mesh, three.devices, three.processes) == (3, {"data": 8, "model": 1}, 8, 1)
    assert one.stage == STAGE_1_OR_2 == "1-2"  # stages 1 and 2 differ only in the gradients, not saved
    assert main(["checkpoint", "info", str(tmp_path / "stage3")]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[:6] == ["5", "yes", "yes", "3", "8", "1"] and "?" not in row
    saved = RunMeta(mesh=one.mesh, stage=one.stage, devices=one.devices)
    assert changes(saved, {"data": 8, "model": 1}, 2) is None  # resuming it at stage 1 or 2 changes nothing
    assert changes(saved, {"data": 8, "model": 1}, 3) == "stage 1-2 -> 3"
    assert jzero.checkpoint.__all__ == ["export_checkpoint"]  # the Python API of checkpoint export (run in test_readme)
