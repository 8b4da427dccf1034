"""Config files, dotted overrides and their one-line errors (no JAX needed)."""

import dataclasses
import typing
from pathlib import Path

import numpy as np
import pytest
import yaml

from jzero.checks import float32
from jzero.config import schema
from jzero.config.loading import ConfigError, _Loader, dump_config, from_dict, load_config

ROOT = Path(__file__).resolve().parents[2]


def test_default_config_reads_its_mesh_file():
    cfg = load_config(ROOT / "configs/gpt-tiny.yaml")
    assert cfg.mesh.axes == {"data": 8, "model": 1}
    assert cfg.zero.stage == 3
    hybrid = load_config(ROOT / "configs/gpt-tiny.yaml", ["mesh.axes.data=4", "mesh.axes.model=2"])
    assert list(hybrid.mesh.axes.items()) == [("data", 4), ("model", 2)]


def test_contract_override_keys():
    keys = {
        "zero.stage": 2,
        "train.steps": 7,
        "train.global_batch_size": 16,
        "run.dir": "/tmp/x",
        "mesh.axes.data": 4,
        "mesh.axes.model": 2,
        "seed": 3,
        "runtime.cpu_devices": 4,
        "model.d_model": 64,
        "model.n_layers": 3,
        "model.n_heads": 4,
        "model.seq_len": 32,
        "model.vocab_size": 512,
        "optimizer.learning_rate": 0.01,
    }
    cfg = load_config(ROOT / "configs/gpt-tiny.yaml", [f"{k}={v}" for k, v in keys.items()]).to_dict()
    for key, value in keys.items():
        node = cfg
        for part in key.split("."):
            node = node[part]
        assert node == value, key


def test_inline_mesh_and_round_trip(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("mesh:\n  axes: {model: 2, data: -1}\noptimizer:\n  learning_rate: 3e-4\n")
    cfg = load_config(path)
    assert list(cfg.mesh.axes) == ["model", "data"]
    assert cfg.optimizer.learning_rate == 3e-4  # a number, though YAML 1.1 reads "3e-4" as text
    again = tmp_path / "again.yaml"
    again.write_text(dump_config(cfg))
    assert load_config(again) == cfg


@pytest.mark.parametrize(
    "overrides, key, message",
    [
        (["model.depth=3"], "model.depth", "unknown key"),
        (["bogus=1"], "bogus", "unknown key"),
        (["zero.stage=4"], "zero.stage", "must be 0, 1, 2 or 3"),
        (["train.steps=abc"], "train.steps", "must be an integer"),
        (["optimizer.learning_rate=fast"], "optimizer.learning_rate", "must be a number"),
        (["mesh.axes.data=-1", "mesh.axes.model=-1"], "mesh.axes", "only one axis size may be -1"),
        (["mesh.axes.pipe=2"], "mesh.axes.pipe", "unknown axis"),
        (["mesh.axes.data=0"], "mesh.axes.data", "size must be positive"),
        (["train.global_batch_size=12"], "train.global_batch_size", "not divisible by the data axis (8)"),
        (["model.n_heads=5"], "model.n_heads", "does not divide model.d_model"),
        (["model.remat=maybe"], "model.remat", "must be one of none, full, dots_saveable"),
        (["model.remat=[full]"], "model.remat", "must be a string"),
        (["model.partition_activations=sometimes"], "model.partition_activations", "must be true or false"),
        (["zero.stage=2", "zero.offload_params=true"], "zero.offload_params", "needs zero.stage 3"),
        (["zero.stage=0", "zero.offload_optimizer=true"], "zero.offload_optimizer", "needs zero.stage 1, 2 or 3"),
        (["zero.stage=1", "zero.offload_optimizer=yes please"], "zero.offload_optimizer", "must be true or false"),
        (["train=5"], "train", "must be a section"),
        (["model.d_model.x=1"], "model.d_model", "is a value, not a section"),
        (["partitioning.rules=[[mlp, pipe]]"], "partitioning.rules[0]", "names mesh axis 'pipe'"),
        (["nokey"], "--set", "expected KEY=VALUE"),
    ],
)
def test_bad_values_name_the_key(overrides, key, message):
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs/gpt-tiny.yaml", overrides)
    assert err.value.key == key
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_files(tmp_path):
    with pytest.raises(ConfigError, match="config: file not found"):
        load_config(tmp_path / "nope.yaml")
    path = tmp_path / "c.yaml"
    path.write_text("mesh: mesh/none.yaml\n")
    with pytest.raises(ConfigError, match="mesh: file not found: .*mesh/none.yaml"):
        load_config(path)
    path.write_text("model: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_yaml_is_loaded_safely(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_shipped_configs_load():
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        load_config(path)
    for path in sorted((ROOT / "configs/mesh").glob("*.yaml")):
        assert "axes" in yaml.safe_load(path.read_text())


def test_set_mesh_names_a_mesh_file_relative_to_the_config():
    """As ``mesh: mesh/dp8.yaml`` does in the file; later ``mesh.axes`` overrides apply inside it."""
    config = ROOT / "configs/gpt-tiny.yaml"
    assert load_config(config, ["mesh=mesh/dp4-mp2.yaml"]).mesh.axes == {"data": 4, "model": 2}
    assert load_config(config, ["mesh=mesh/dp4-mp2.yaml", "mesh.axes.data=2"]).mesh.axes == {"data": 2, "model": 2}
    assert load_config(config, ["mesh.axes.data=2", "mesh=mesh/dp4-mp2.yaml"]).mesh.axes == {"data": 4, "model": 2}
    assert load_config(config, [f"mesh={ROOT / 'configs/mesh/dp4-mp2.yaml'}"]).mesh.axes == {"data": 4, "model": 2}
    with pytest.raises(ConfigError, match=f"mesh: {ROOT / 'configs/mesh'} is a directory, not a YAML file"):
        load_config(config, ["mesh=mesh"])


def test_directories_and_special_files_are_named_as_such(tmp_path):
    with pytest.raises(ConfigError, match=f"config: {tmp_path} is a directory, not a YAML file"):
        load_config(tmp_path)
    with pytest.raises(ConfigError, match="config: /dev/null is not a regular file"):
        load_config("/dev/null")
    big = tmp_path / "big.yaml"
    big.write_text("# padding\n" * 200_000)
    with pytest.raises(ConfigError, match=f"config: {big} is over 1 MiB"):
        load_config(big)


def test_values_in_messages_are_bounded():
    long = "x" * 100_000
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"optimizer.name={long}"])
    assert len(str(err.value)) < 200 and "'xxxx" in str(err.value) and "..." in str(err.value)
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"model.{long}=1"])
    known = ", ".join(sorted(f.name for f in dataclasses.fields(schema.ModelConfig)))  # the message lists them all
    assert known in str(err.value) and len(str(err.value)) - len(known) < 200 and err.value.key.startswith("model.xxx")


# ---------------------------------------------------------------------------------------------
# A strict config: keys once, numbers of their type and float32 range, paths without NUL


def refused(overrides: list[str]) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert "\n" not in str(err.value)
    return err.value


def test_yaml_is_read_as_safe_load_reads_it():
    """The loader builds exactly what safe_load builds: plain data, no Python objects."""
    assert _Loader.yaml_constructors == yaml.SafeLoader.yaml_constructors
    assert _Loader.yaml_multi_constructors == yaml.SafeLoader.yaml_multi_constructors


@pytest.mark.parametrize(
    "text, message",
    [
        ("train:\n  steps: 2\nseed: 1\ntrain:\n  steps: 3\n", "line 4: 'train' is given twice (first at line 1)"),
        ("train:\n  steps: 2\n  global_batch_size: 8\n  steps: 3\n", "line 4: 'steps' is given twice (first at line 2)"),
        ("model: {d_model: 64, 'd_model': 32}\n", "line 1: 'd_model' is given twice (first at line 1)"),
        ("model: {<<: {d_model: 64, d_model: 32}}\n", "line 1: 'd_model' is given twice (first at line 1)"),
    ],
)
def test_a_key_given_twice_names_its_lines(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"config: {path} {message}"


def test_a_merge_key_may_be_overridden_and_anchors_reused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: {<<: &shape {d_model: 64, n_heads: 4}, d_model: 32}\nmesh: {axes: {data: 8}, dcn: {<<: *shape}}\n")
    with pytest.raises(ConfigError, match="^mesh.dcn.d_model: is not a mesh axis"):
        load_config(path)  # the anchor's mapping reused whole
    path.write_text("model: {<<: {d_model: 64, n_heads: 4}, d_model: 32}\n")
    assert (load_config(path).model.d_model, load_config(path).model.n_heads) == (32, 4)


def test_empty_files_are_refused_and_none_means_the_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    for text in ["", "# nothing\n", "---\n", "~\n"]:
        path.write_text(text)
        with pytest.raises(ConfigError, match=f"^config: {path} holds no settings; start from a copy of configs/gpt-tiny.yaml$"):
            load_config(path)
    path.write_text("{}\n")  # an explicit empty mapping: the defaults, as asked
    assert load_config(path) == load_config(None) == from_dict({})


def test_scientific_notation_is_a_number_in_files_and_in_set(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optimizer:\n  learning_rate: 1e-3\n  eps: 1E-8\ntrain:\n  steps: 1e3\n")
    cfg = load_config(path, ["optimizer.weight_decay=.5e-1", "precision.loss_scale=+2e4"])
    assert (cfg.optimizer.learning_rate, cfg.optimizer.eps, cfg.optimizer.weight_decay) == (1e-3, 1e-8, 0.05)
    assert cfg.precision.loss_scale == 2e4 and cfg.train.steps == 1000 and type(cfg.train.steps) is int


@pytest.mark.parametrize(
    "text, key, message",
    [
        ("train: {steps: '2'}", "train.steps", "must be an integer, got '2' (a string: write it without quotes)"),
        ("optimizer: {eps: '3e-4'}", "optimizer.eps", "must be a number, got '3e-4' (a string: write it without quotes)"),
        ("optimizer: {learning_rate: fast}", "optimizer.learning_rate", "must be a number, got 'fast'"),
        ("train: {steps: 2.5}", "train.steps", "must be an integer, got 2.5"),
        ("train: {steps: true}", "train.steps", "must be an integer, got True"),
        ("optimizer: {b1: yes}", "optimizer.b1", "must be a number, got True"),
        ("optimizer: {name: 5}", "optimizer.name", "must be a string, got 5"),
        ("run: {dir: 5}", "run.dir", "must be a string, got 5"),
        ("run: {dir: 1e3}", "run.dir", "must be a string, got 1000.0"),
        ('run: {dir: "runs/a\\0b"}', "run.dir", "a path must not contain a NUL byte, got 'runs/a\\x00b'"),
    ],
)
def test_values_must_be_of_the_keys_type(tmp_path, text, key, message):
    path = tmp_path / "c.yaml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{key}: {message}"


def keys_typed(wanted: object) -> set[str]:
    """The dotted keys of every section whose type is ``wanted`` or a union holding it."""
    keys = set()
    for section, cls in typing.get_type_hints(schema.Config).items():
        if dataclasses.is_dataclass(cls):
            hints = typing.get_type_hints(cls, include_extras=True).items()
            keys |= {f"{section}.{name}" for name, hint in hints if wanted in (hint, *typing.get_args(hint))}
    return keys


FLOAT_KEYS = {
    *(f"optimizer.{k}" for k in ("learning_rate", "weight_decay", "b1", "b2", "eps", "min_lr_ratio", "clip_norm")),
    "precision.loss_scale",
    "model.rope_theta",
    "model.rms_norm_eps",
    *(f"model.{k}" for k in ("attn_scalar", "attn_softcap", "final_softcap", "rope_local_theta")),
    "lora.alpha",
}
PATH_KEYS = {
    *("run.dir", "model.entry", "train.init_from", "runtime.compilation_cache"),
    *(f"data.{k}" for k in ("path", "tokens", "eval_path")),
}


def test_the_keys_each_rule_covers():
    assert keys_typed(float) == FLOAT_KEYS
    assert keys_typed(schema.PathText) == PATH_KEYS


@pytest.mark.parametrize("key", sorted(FLOAT_KEYS))
def test_every_float_stays_finite_and_nonzero_in_float32(key):
    """Each float key reaches the step as a float32: past its largest is infinity, below its
    smallest normal number XLA computes 0."""
    assert refused([f"{key}=-3.5e38"]).key == key
    assert "must be at most 3.40282e+38 in size (float32's largest" in str(refused([f"{key}=1e39"]))
    assert "must be 0 or at least 1.17549e-38 in size (float32's smallest normal" in str(refused([f"{key}=1e-40"]))


def test_the_float32_edges():
    values = [3.4028235e38, 3.40282357e38, -1e39, 1e-45, 1e-46, 0.99999999, 0.1]
    with np.errstate(over="ignore"):
        assert [float32(x) for x in values] == np.array(values).astype(np.float32).tolist()
    assert load_config(None, ["precision.loss_scale=3.4028235e38"]).precision.loss_scale == 3.4028235e38
    assert load_config(None, ["optimizer.eps=1.2e-38", "optimizer.weight_decay=0"]).optimizer.eps == 1.2e-38
    assert load_config(None, ["optimizer.b2=0.9999999"]).optimizer.b2 == 0.9999999  # below 1 as a float32 too
    message = "optimizer.b1: is 1 as a float32, which the optimizer uses; at most 0.9999999403953552, got 0.99999999"
    assert str(refused(["optimizer.b1=0.99999999"])) == message


@pytest.mark.parametrize("key", sorted(PATH_KEYS))
def test_paths_are_strings_without_nul(key):
    assert str(refused([f"{key}=5"])) == f"{key}: must be a string, got 5"
    assert str(refused([f"{key}=a\x00b"])) == f"{key}: a path must not contain a NUL byte, got 'a\\x00b'"
    assert str(refused([f"{key}=''"])) == f"{key}: a path must not be empty"


def test_a_mesh_file_name_is_a_path_too(tmp_path):
    assert str(refused(["mesh=a\x00b"])) == "mesh: a path must not contain a NUL byte, got 'a\\x00b'"
    (tmp_path / "m.yaml").write_text("axes: {data: 4, data: 2}\n")
    with pytest.raises(ConfigError, match=f"^mesh: {tmp_path / 'm.yaml'} line 1: 'data' is given twice"):
        load_config(None, [f"mesh={tmp_path / 'm.yaml'}"])


def test_dumps_load_back_as_they_were(tmp_path):
    """Text that now reads as a number is written quoted; 1e-08 is written 1.0e-08."""
    cfg = from_dict({"run": {"dir": "1e3"}, "data": {"path": "2E-5"}, "optimizer": {"eps": 1e-8, "learning_rate": 3e-38}})
    path = tmp_path / "config.yaml"
    path.write_text(dump_config(cfg))
    assert "dir: '1e3'" in path.read_text() and "eps: 1.0e-08" in path.read_text()
    assert load_config(path) == cfg
