"""Config files, dotted overrides and their one-line errors (no JAX needed)."""

from pathlib import Path

import pytest
import yaml

from jzero.config.loading import ConfigError, dump_config, load_config

ROOT = Path(__file__).resolve().parents[1]


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
    assert cfg.optimizer.learning_rate == pytest.approx(3e-4)  # YAML 1.1 reads "3e-4" as text
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
    assert len(str(err.value)) < 400 and err.value.key.startswith("model.xxx")
