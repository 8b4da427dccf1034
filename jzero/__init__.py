"""jzero: ZeRO stages 0-3 for Flax training loops, as JAX sharding specs.

The Python API, for your own loop::

    mesh = jzero.make_mesh({"data": -1})
    plan = jzero.make_plan(jzero.abstract_state(init_fn, tx, key), mesh, stage=3)
    state = jzero.sharded_init(init_fn, tx, plan, key)
    train_step = jzero.make_train_step(loss_fn, tx, plan)
    state, metrics = train_step(state, jax.device_put(batch, plan.batch))

Or jzero's own loop, with its checkpoints, ledger, metrics and your hooks::

    job = jzero.build_job(jzero.load_config("configs/gpt-tiny.yaml"), init_fn=init_fn, loss_fn=loss_fn)
    result = jzero.train(job.config, job=job, hooks=[MyHook()])

Checkpoints (Orbax; restore onto any mesh or stage)::

    checkpoints = jzero.RunCheckpoints("runs/mine")
    checkpoints.save(step, state)
    restored = checkpoints.restore_latest(jzero.sharded_abstract(abstract, plan))

Every public name is in the table below, once, with the module that defines it; each loads on first
use (:mod:`jzero.lazy`). The ledger's diagnostics are under :mod:`jzero.ledger`.
"""

from typing import TYPE_CHECKING

from jzero.compiler.platforms import select_platforms
from jzero.lazy import lazy_names, moved_modules

select_platforms()  # a CUDA plugin on a host with no NVIDIA driver: JAX starts on the CPU, quietly

_API = {
    # A plan over a mesh, and the step that follows it
    "make_mesh": "jzero.sharding.mesh",
    "STAGES": "jzero.sharding.stages",
    "StageRule": "jzero.sharding.stages",
    "ZeroOptions": "jzero.sharding.stages",
    "paper_bytes_per_device": "jzero.sharding.stages",
    "Plan": "jzero.sharding.plan",
    "default_rules": "jzero.sharding.rules",
    "make_plan": "jzero.sharding.plan",
    "Precision": "jzero.memory.precision",
    "TrainState": "jzero.sharding.state",
    "abstract_state": "jzero.sharding.placement",
    "make_eval_step": "jzero.step",
    "make_train_step": "jzero.step",
    "sharded_abstract": "jzero.sharding.placement",
    "sharded_init": "jzero.sharding.placement",
    "state_from_params": "jzero.sharding.placement",
    "unit_call": "jzero.communication.gather",
    "remat": "jzero.memory.remat",
    "fetching": "jzero.memory.offload",
    "target_devices": "jzero.ledger.targets",
    # Configs
    "Config": "jzero.config.schema",
    "CheckpointConfig": "jzero.config.schema",
    "load_config": "jzero.config.loading",
    # Checkpoints
    "RunCheckpoints": "jzero.checkpoint.runs",
    # jzero's training job
    "Job": "jzero.training.job",
    "build_job": "jzero.training.job",
    "Hook": "jzero.training.hooks",
    "train": "jzero.training.loop",
    "TrainResult": "jzero.training.loop",
    # Errors
    "JzeroError": "jzero.errors",
    "ConfigError": "jzero.errors",
    "PlanError": "jzero.errors",
    "CheckpointError": "jzero.errors",
    "DamagedCheckpoint": "jzero.errors",
    "RunError": "jzero.errors",
    "TrainingHalted": "jzero.errors",
    "Diverged": "jzero.errors",
    "TooManySkipped": "jzero.errors",
    "EndedNonFinite": "jzero.errors",
    "CheckpointWriteError": "jzero.errors",
    "OutputWriteError": "jzero.errors",
}
# Modules that moved when the core was grouped by concern; the old names still import, with a warning.
_MOVED = {
    "xla_flags": "compiler.xla_flags",
    "compile_cache": "compiler.cache",
    "platforms": "compiler.platforms",
    "precision": "memory.precision",
    "offload": "memory.offload",
    "remat_policies": "memory.remat",
    "quantize": "communication.quantize",
    "collectives": "communication.collectives",
    "units": "communication.units",
    "gather": "communication.gather",
    "axes": "sharding.axes",
    "mesh": "sharding.mesh",
    "stages": "sharding.stages",
    "plan": "sharding.plan",
    "sharded_state": "sharding.placement",
    "state": "sharding.state",
    "training.sample": "apps.sample",  # the command bodies out of training/ (issue 52)
    "training.plot": "apps.plot",
    "training.hf_import": "apps.hf_import",
    "training.prediction": "ledger.prediction",  # the report builder in ledger/ (issue 52)
}
moved_modules({f"jzero.{old}": f"jzero.{new}" for old, new in _MOVED.items()})
if TYPE_CHECKING:  # the table above, for type checkers and IDEs (tests/test_api.py keeps the two equal)
    from jzero.checkpoint.runs import RunCheckpoints
    from jzero.communication.gather import unit_call
    from jzero.config.loading import load_config
    from jzero.config.schema import CheckpointConfig, Config
    from jzero.errors import (
        CheckpointError,
        CheckpointWriteError,
        ConfigError,
        DamagedCheckpoint,
        Diverged,
        EndedNonFinite,
        JzeroError,
        OutputWriteError,
        PlanError,
        RunError,
        TooManySkipped,
        TrainingHalted,
    )
    from jzero.ledger.targets import target_devices
    from jzero.memory.offload import fetching
    from jzero.memory.precision import Precision
    from jzero.memory.remat import remat
    from jzero.sharding.mesh import make_mesh
    from jzero.sharding.placement import abstract_state, sharded_abstract, sharded_init, state_from_params
    from jzero.sharding.plan import Plan, make_plan
    from jzero.sharding.rules import default_rules
    from jzero.sharding.stages import STAGES, StageRule, ZeroOptions, paper_bytes_per_device
    from jzero.sharding.state import TrainState
    from jzero.step import make_eval_step, make_train_step
    from jzero.training.hooks import Hook
    from jzero.training.job import Job, build_job
    from jzero.training.loop import TrainResult, train
__all__ = sorted(_API)
__getattr__, __dir__ = lazy_names(__name__, _API)
