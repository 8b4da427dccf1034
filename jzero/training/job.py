"""From a :class:`~jzero.config.schema.Config` to the job it describes, built: mesh, model, optimizer,
plan and the compiled step.

Nothing here allocates on devices, and the step compiles only when asked (:meth:`Job.compile_step`).
:func:`build_job` is what ``jzero train`` and ``jzero plan`` start from; it takes any
``init_fn``/``loss_fn`` pair, with jzero's GPT as the default (or its Llama, ``model.name: llama``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from jzero.communication.gather import unit_options
from jzero.compiler import cache
from jzero.compiler.compiling import check_options, compile_lowered
from jzero.compiler.options import compiler_options
from jzero.compiler.platforms import on_gpus
from jzero.config.schema import Config
from jzero.dtypes import FP8_RECIPES
from jzero.errors import ConfigError, PlanError
from jzero.lazy import moved_names
from jzero.ledger import targets
from jzero.memory.precision import Precision
from jzero.models.decoder import Decoder
from jzero.models.gpt import GPT, lm_loss
from jzero.models.lora import check_targets
from jzero.models.names import OWN
from jzero.sharding.axes import check_batch_divides, model_ways
from jzero.sharding.gathers import manual_loss, model_gather, units_in_effect
from jzero.sharding.mesh import make_mesh, mesh_shape, simulate_cpu_devices
from jzero.sharding.placement import abstract_state, sharded_abstract, sharded_init
from jzero.sharding.plan import Plan, make_plan
from jzero.sharding.state import TrainState
from jzero.step import LossFn, make_eval_step, make_train_step
from jzero.training.entry import own_model
from jzero.trees import tree_paths

__all__ = [
    "Job",
    "build_job",
    "model_loss",
]

InitFn = Callable[[jax.Array], Any]
Model = GPT | Decoder  # jzero's own models (a row of jzero.models.architectures)
# Moved (CHANGELOG.md). own_model, check_options, compile_lowered and compiler_options moved too, and are imported here,
# so they import from here without a warning.
__getattr__ = moved_names(__name__, {
    "gpt_loss": f"{__name__}.model_loss", "build_precision": "jzero.memory.config.PrecisionConfig.build",
    "build_model": "jzero.models.config.ModelConfig.build", "attention_for": "jzero.models.config.attention_for",
    "xla_options": "jzero.compiler.options.xla_options",
    "model_flops_per_token": "jzero.models.config.ModelConfig.flops_per_token",
    "trainable_patterns": "jzero.config.schema.Config.trainable_patterns",
})  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Job:
    """The job a config describes, built: mesh, model, optimizer, plan and the compiled step (compiled
    when asked, :meth:`compile_step`); nothing allocated on devices yet.

    Attributes:
      config: the config it was built from (its ``zero.stage`` is the plan's stage).
      tx: the optimizer.
      mesh: the device mesh.
      plan: the stage's shardings.
      rng: the run's key (the seed's).
      init_fn: ``init_fn(key)`` returns the fp32 parameters.
      loss_fn: ``loss_fn(params, batch)`` returns the mean loss of a ``[batch, seq_len + 1]`` batch.
      precision: the dtype policy.
      abstract: the train state's shapes, parameters still boxed with their logical names.
      fetches_layers: the model moves its scanned layers' parameters to the device itself, inside
        its loop (jzero's GPT with ``zero.offload_params``); otherwise the step moves them all first.
      model: jzero's GPT or Llama, whose loss the job builds for its plan (:func:`model_loss`); None for a
        model of yours.
      flops_per_token: the training FLOPs one token needs (:func:`jzero.models.sizes.flops_per_token`
        for jzero's models; what ``build_job`` was given, else 6 x the parameters, for a model of yours).
    """

    config: Config
    tx: optax.GradientTransformation
    mesh: Mesh
    plan: Plan
    rng: jax.Array
    init_fn: InitFn
    loss_fn: LossFn
    precision: Precision
    abstract: TrainState
    fetches_layers: bool = False
    flops_per_token: float = 0.0
    model: Model | None = None
    # The jitted steps and the compiled train step, made once a job: a job never changes, and
    # jit's trace cache is per function object, so a second make_step would trace the model again.
    _made: dict[str, Any] = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def batch_shape(self) -> tuple[int, int]:
        return self.config.batch_shape()

    def abstract_state(self) -> TrainState:
        """The train state as sharded ``ShapeDtypeStruct`` leaves."""
        return sharded_abstract(self.abstract, self.plan)

    def compile_step(self):
        """Lower and compile the train step from shapes alone; returns ``(step, compiled)``."""
        batch = jax.ShapeDtypeStruct(self.batch_shape, jnp.int32, sharding=self.plan.batch)
        compiled = self._once("compiled", lambda: self.compile(self.make_step().lower(self.abstract_state(), batch)))
        return self.make_step(), compiled

    def xla_options(self) -> dict[str, dict]:
        """The XLA options the step compiles with, and where each comes from (:meth:`CompilerConfig.build`)."""
        return self.config.compiler.build(list(self.mesh.devices.flat), **_option_inputs(self.plan, self.precision))

    def _compile_inputs(self) -> tuple[list, dict[str, Any] | None, Mapping[str, Any]]:
        """The devices, the options given to XLA, and the config's own (:func:`compile_lowered`)."""
        devices, mine = list(self.mesh.devices.flat), self.config.compiler.xla_options
        return devices, compiler_options(devices, options=mine, **_option_inputs(self.plan, self.precision)), mine

    def check_xla_options(self) -> None:
        """Refuse an XLA option the step's compile would refuse, before anything is compiled or
        written: a one-op program compiles with the step's options (XLA reads them all whatever
        the program).

        Raises:
          ConfigError: as :meth:`compile`, naming the option.
        """
        check_options(*self._compile_inputs())

    def compile(self, lowered):
        """Compile a lowered step for this mesh's devices (:func:`compiler_options`).

        Raises:
          ConfigError: XLA does not know an option, or cannot read its value, naming it.
        """
        return compile_lowered(lowered, *self._compile_inputs())

    def init_state(self) -> TrainState:
        """A fresh train state, initialised straight into the plan's shardings."""
        return sharded_init(self.init_fn, self.tx, self.plan, self.rng, self.precision)

    def make_step(self):
        """The jitted train step (:func:`jzero.step.make_train_step`) for this plan, made once."""
        options = {"microbatches": self.config.train.microbatches, "fetched_by_model": self.fetches_layers}
        return self._once("step", lambda: make_train_step(self.loss_fn, self.tx, self.plan, precision=self.precision, **options))

    def make_eval_step(self):
        """The jitted eval step (:func:`jzero.step.make_eval_step`) for this plan: ``(params, batch) -> loss``."""
        return self._once("eval", lambda: make_eval_step(
            self.loss_fn, self.plan, precision=self.precision, fetched_by_model=self.fetches_layers
        ))  # fmt: skip

    def _once(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self._made:
            self._made[key] = make()
        return self._made[key]

    def replan(self, stage: int | None = None, mesh: Mesh | None = None) -> Job:
        """The same model and optimizer planned for another stage or mesh; the abstract state is
        reused, so nothing is traced again.

        Args:
          stage: the ZeRO stage (default: this one).
          mesh: the mesh (default: this one).

        Returns:
          A new :class:`Job`; its config records the stage and the mesh's axes.
        """
        stage = self.plan.zero.stage if stage is None else stage
        mesh = self.mesh if mesh is None else mesh
        check_batch_divides(self.config.train.global_batch_size, mesh_shape(mesh), self.config.train.microbatches)
        cfg = self.config
        axes = {name: int(size) for name, size in mesh.shape.items()}
        # What the new stage or mesh cannot have is dropped (another stage of the same run, in a comparison).
        zero = cfg.zero.for_stage(stage, axes, master_copy=self.precision.uses_master)
        config = dataclasses.replace(
            cfg,
            zero=zero,
            mesh=cfg.mesh if mesh is self.mesh else dataclasses.replace(cfg.mesh, axes=axes, dcn={}),
        )
        rules, path_rules = cfg.partitioning.rules, cfg.partitioning.path_rules
        plan = make_plan(self.abstract, mesh, zero, rules, path_rules, trainable=self.plan.trainable)
        fetches_layers = self.fetches_layers and zero.offload_params
        if self.model is None:
            batch = jax.ShapeDtypeStruct(config.batch_shape(), jnp.int32)
            plan = units_in_effect(self.loss_fn, plan, self.abstract.params, batch, self.precision)
        loss_fn = self.loss_fn if self.model is None else model_loss(self.model, plan, self.precision)
        return dataclasses.replace(self, config=config, mesh=mesh, plan=plan, fetches_layers=fetches_layers, loss_fn=loss_fn)


def _option_inputs(plan: Plan, precision: Precision) -> dict[str, Any]:
    """What the step needs, one layer's gathered bytes, and on a known GPU the scheduler's memory
    limit from the model states live through the step: :func:`jzero.compiler.options.xla_options`'s inputs."""
    devices = list(plan.mesh.devices.flat)
    gpu = targets.gpu_of(devices[0].device_kind) if on_gpus(devices) else None
    states = plan.per_device_bytes()
    return {
        "needs": unit_options(devices) if plan.units else None,
        "layer_bytes": plan.layer_bytes(precision.compute_dtype),
        "slop_factor": targets.scheduler_slop_factor(gpu, states.params + states.optimizer) if gpu else None,
    }


def _check_float8(config: Config, devices: Sequence[jax.Device]) -> None:
    """Float8 asked of GPUs without float8 tensor cores: refused, naming the key that asks."""
    missing = targets.float8_missing(devices)
    asked = {"precision.fp8": config.precision.fp8 != FP8_RECIPES[0], "zero.fp8_gather": config.zero.fp8_gather}
    key = next((k for k, on in asked.items() if on), None)
    if missing and key:
        raise ConfigError(key, missing)


def build_job(
    config: Config,
    devices: Sequence[jax.Device] | None = None,
    *,
    init_fn: InitFn | None = None,
    loss_fn: LossFn | None = None,
    flops_per_token: float | None = None,
    abstract: TrainState | None = None,
) -> Job:
    """The job a config describes, built: mesh, model, optimizer, plan and the compiled step (compiled
    when asked). Resolves the mesh on the devices and plans the stage.

    Args:
      config: a validated config (:func:`jzero.config.loading.load_config`).
      devices: the devices to build the mesh on (default: all of them).
      init_fn: ``init_fn(key)`` returning fp32 parameters (boxed with logical names or not); with
        ``loss_fn``, any model instead of jzero's GPT. Both or neither; neither with
        ``model.name: own`` calls ``model.entry`` for them (:func:`own_model`).
      loss_fn: ``loss_fn(params, batch)`` returning the mean loss of a token batch
        ``[batch, model.seq_len + 1]``.
      flops_per_token: your model's training FLOPs per token, for ``model_flops_per_sec`` and
        ``mfu`` (default: 6 x its parameters, which leaves out attention's own term).
      abstract: the abstract state of a job built from a config with the same model shape,
        optimizer and precision (:attr:`Job.abstract`), reused rather than traced again: what
        ``jzero plan --search`` does for each candidate.

    Returns:
      The :class:`Job`; nothing is allocated on devices.

    Raises:
      TypeError: only one of ``init_fn`` and ``loss_fn`` was passed.
      ConfigError: the mesh does not fit the devices, or the batch does not divide over it;
        ``model.entry`` cannot be loaded (:func:`own_model`).
      PlanError: the stage cannot be planned on the mesh (:func:`jzero.sharding.plan.make_plan`).
    """
    if (init_fn is None) != (loss_fn is None):
        raise TypeError("build_job: pass both init_fn and loss_fn, or neither (jzero's GPT, or model.entry's)")
    if init_fn is None and config.model.name == OWN:
        init_fn, loss_fn = own_model(config)
    if devices is None:  # JAX's own devices (a target's are compile-only): simulated CPUs, the compile cache
        simulate_cpu_devices(config.runtime.cpu_devices)
        cache.enable_compilation_cache(config.runtime.compilation_cache)
    mesh = make_mesh(config.mesh.axes, devices, config.mesh.dcn)
    _check_float8(config, list(mesh.devices.flat))
    check_batch_divides(config.train.global_batch_size, mesh_shape(mesh), config.train.microbatches)
    precision = config.precision.build()
    tx = config.optimizer.build(config.train.steps)
    fetches_layers = init_fn is None and config.zero.offload_params
    model = None
    if init_fn is None:
        ways, on = model_ways(mesh.shape), list(mesh.devices.flat)
        lora = config.lora.build()
        model = config.model.build(precision, model_parallel=ways, fetch_params=fetches_layers, devices=on, lora=lora)
        sample = jnp.zeros((1, config.model.seq_len), jnp.int32)

        def init_fn(key):
            return model.init(key, sample)["params"]

    rng = jax.random.key(config.seed)
    trainable = config.trainable_patterns()
    if abstract is None:
        abstract = _abstract(init_fn, tx, rng, precision, trainable, model)
    rules, path_rules = config.partitioning.rules, config.partitioning.path_rules
    plan = make_plan(abstract, mesh, config.zero, rules, path_rules, trainable=trainable)
    if model is not None:
        loss_fn = model_loss(model, plan, precision)
    elif plan.qgz:  # a loss of yours runs under GSPMD, where no partial gradient can be quantized
        raise ConfigError("zero.quantized_gradients", "needs jzero's GPT or Llama, which gather their own layers under shard_map")
    else:
        batch = jax.ShapeDtypeStruct(config.batch_shape(), jnp.int32)
        plan = units_in_effect(loss_fn, plan, abstract.params, batch, precision)
    if flops_per_token is None:
        flops_per_token = config.model.flops_per_token(plan) if model is not None else 6 * plan.num_params
    return Job(config, tx, mesh, plan, rng, init_fn, loss_fn, precision, abstract, fetches_layers, flops_per_token, model)


def _abstract(init_fn: InitFn, tx: Any, rng: jax.Array, precision: Precision, trainable: Any, model: Model | None) -> TrainState:
    """The abstract state (:func:`jzero.sharding.placement.abstract_state`), with LoRA's targets
    checked: a target that adapts nothing names itself, before the adapters' absence would (when no
    target adapts anything, the adapters' patterns find no parameter)."""
    lora = model.lora if model is not None else None
    try:
        abstract, failed = abstract_state(init_fn, tx, rng, precision, trainable), None
    except PlanError as err:
        if lora is None:
            raise
        abstract, failed = None, err  # a target's own error first, below
    if lora is not None:
        shapes = abstract.params if failed is None else jax.eval_shape(init_fn, rng)
        check_targets(lora, list(tree_paths(nn.unbox(shapes))))
    if failed is not None:
        raise failed
    return abstract


def model_loss(model: Model, plan: Plan, precision: Precision) -> LossFn:
    """jzero's model's loss for ``plan``: the model gathers its own parameters where the plan needs it
    to (:func:`jzero.sharding.gathers.model_gather`, stage 3 with qwZ, hpZ or qgZ), under ``shard_map``
    with qgZ (:func:`jzero.sharding.gathers.manual_loss`)."""
    gather = model_gather(plan, precision)
    loss = partial(lm_loss, model if gather is None else model.clone(gather=gather))
    return manual_loss(loss, plan) if plan.qgz else loss
