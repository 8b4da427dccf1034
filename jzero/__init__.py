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

from jzero.lazy import lazy_names
from jzero.platforms import select_platforms

select_platforms()  # a CUDA plugin on a host with no NVIDIA driver: JAX starts on the CPU, quietly

_API = {
    # A plan over a mesh, and the step that follows it
    "make_mesh": "jzero.mesh",
    "STAGES": "jzero.stages",
    "StageRule": "jzero.stages",
    "ZeroOptions": "jzero.stages",
    "paper_bytes_per_device": "jzero.stages",
    "Plan": "jzero.plan",
    "default_rules": "jzero.plan",
    "make_plan": "jzero.plan",
    "Precision": "jzero.precision",
    "TrainState": "jzero.state",
    "abstract_state": "jzero.sharded_state",
    "make_eval_step": "jzero.step",
    "make_train_step": "jzero.step",
    "sharded_abstract": "jzero.sharded_state",
    "sharded_init": "jzero.sharded_state",
    "state_from_params": "jzero.sharded_state",
    "unit_call": "jzero.gather",
    "remat": "jzero.remat_policies",
    "fetching": "jzero.offload",
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
    "TooManySkipped": "jzero.errors",
    "CheckpointWriteError": "jzero.errors",
    "OutputWriteError": "jzero.errors",
}
__all__ = sorted(_API)
__getattr__, __dir__ = lazy_names(__name__, _API)
