"""Each config section is one record beside what it builds, with its own ``check()`` and ``build()``:
a new key is a field, its rule and its use in that one module. Here a key is added to three sections
by subclassing them, and the loader, the validation, the dump and the job take it with no other change."""

import dataclasses

import jax.numpy as jnp
import optax
import pytest
import yaml

from jzero.checks import at_least_zero
from jzero.config.loading import dump_config, from_dict, load_config
from jzero.config.schema import Config, TrainConfig
from jzero.errors import ConfigError
from jzero.memory.config import PrecisionConfig
from jzero.optimizers import OptimizerConfig
from jzero.training.job import build_job


@dataclasses.dataclass(frozen=True)
class HalvedOptimizer(OptimizerConfig):
    """``optimizer:`` with a key of its own, as a new key is added: a field, its rule, its use."""

    halve_updates: int = 0  # times the updates are halved

    def check(self) -> None:
        super().check()
        at_least_zero(self.halve_updates, "optimizer.halve_updates")

    def build(self, total_steps: int) -> optax.GradientTransformation:
        return optax.chain(super().build(total_steps), optax.scale(0.5**self.halve_updates))


@dataclasses.dataclass(frozen=True)
class NoFloat16(PrecisionConfig):
    """``precision:`` with a rule of its own."""

    allow_float16: bool = True

    def check(self) -> None:
        super().check()
        if not self.allow_float16 and "float16" in (self.param_dtype, self.compute_dtype):
            raise ConfigError("precision.allow_float16", "is false, and a dtype is float16")


@dataclasses.dataclass(frozen=True)
class FirstEval(TrainConfig):
    """``train:``, whose record lives in :mod:`jzero.config.schema`, with a key of its own."""

    first_eval: int = 0

    def check(self, axes: dict[str, int]) -> None:
        super().check(axes)
        at_least_zero(self.first_eval, "train.first_eval")


@dataclasses.dataclass(frozen=True)
class Extended(Config):
    optimizer: HalvedOptimizer = dataclasses.field(default_factory=HalvedOptimizer)
    precision: NoFloat16 = dataclasses.field(default_factory=NoFloat16)
    train: FirstEval = dataclasses.field(default_factory=FirstEval)


TINY = {"model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "seq_len": 16}, "train": {"global_batch_size": 8}}


def test_a_new_key_is_read_typed_checked_and_dumped_by_its_section_alone():
    train = {**TINY["train"], "first_eval": 5}
    config = from_dict({**TINY, "optimizer": {"halve_updates": 2}, "precision": {"allow_float16": False}, "train": train},
                       Extended)  # fmt: skip
    assert config.optimizer.halve_updates == 2 and config.precision.allow_float16 is False and config.train.first_eval == 5
    assert from_dict(yaml.safe_load(dump_config(config)), Extended) == config
    with pytest.raises(ConfigError, match=r"^optimizer\.halve_updates: must be an integer"):
        from_dict({"optimizer": {"halve_updates": "twice"}}, Extended)
    with pytest.raises(ConfigError, match=r"^optimizer\.halve_updates: must be 0 or more"):
        from_dict({"optimizer": {"halve_updates": -1}}, Extended)
    with pytest.raises(ConfigError, match=r"^precision\.allow_float16: is false, and a dtype is float16$"):
        from_dict({"precision": {"allow_float16": False, "param_dtype": "float16"}}, Extended)
    with pytest.raises(ConfigError, match=r"^train\.first_eval: must be 0 or more"):
        from_dict({"train": {"first_eval": -1}}, Extended)
    with pytest.raises(ConfigError, match=r"^optimizer\.halve_updates: unknown key"):
        from_dict({"optimizer": {"halve_updates": 1}})  # the plain Config has no such key


def test_the_job_builds_what_the_section_builds():
    """``build_job`` takes the optimizer from the section's ``build()``: halved twice, Adam's update is a quarter."""
    plain, halved = (from_dict({**TINY, "optimizer": {"halve_updates": k}}, Extended) for k in (0, 2))
    params, grads = {"w": jnp.ones(4)}, {"w": jnp.full(4, 0.5)}

    def update(config):
        tx = build_job(config).tx
        return tx.update(grads, tx.init(params), params)[0]["w"]

    assert jnp.allclose(update(halved), update(plain) / 4)


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.n_kv_heads=3", "model.n_kv_heads: 3 does not divide model.n_heads=4 (grouped-query attention)"),
        ("model.n_kv_heads=0", "model.n_kv_heads: must be positive and at most 2147483647, got 0"),
        ("model.mlp_hidden=0", "model.mlp_hidden: must be positive and at most 2147483647, got 0"),
        ("model.mlp_hidden=3000000000", "model.mlp_hidden: must be positive and at most 2147483647, got 3000000000"),
        ("model.rope_theta=0", "model.rope_theta: must be positive, got 0"),
        ("model.rms_norm_eps=-1e-5", "model.rms_norm_eps: must be positive, got -1e-05"),
        ("model.rope_scaling.rope_type=yarn", "model.rope_scaling.rope_type: must be llama3 or linear, got 'yarn'"),
        ("model.rope_scaling.factor=0", "model.rope_scaling.factor: must be positive, got 0"),
        ("model.rope_scaling.original_max_position_embeddings=0", "model.rope_scaling.original_max_position_embeddings: must be"),
        ("model.rope_scaling.high_freq_factor=1", "model.rope_scaling.high_freq_factor: must be over low_freq_factor=1.0, got 1"),
        ("model.name=gpt", "model.n_kv_heads: jzero's gpt does not read it (model.name: gpt)"),
        ("model.name=own", "model.d_model: is jzero's models'; a model of your own (model.name: own) reads only seq_len"),
    ],
)
def test_the_llama_keys_are_checked_by_the_model_section(override, message):
    """What a Llama's keys must hold, and that a GPT or a model of yours reads none of them."""
    llama = {"name": "llama", "d_model": 64, "n_heads": 4, "n_kv_heads": 2}
    with pytest.raises(ConfigError) as refused:
        load_config(None, [f"model.{k}={v}" for k, v in llama.items()] + [override])
    assert str(refused.value).startswith(message) and refused.value.where == message.split(":")[0]
