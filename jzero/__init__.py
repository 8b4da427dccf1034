"""jzero: ZeRO stages 0-3 for Flax training loops, as JAX sharding specs.

The Python API, for your own loop::

    mesh = jzero.make_mesh({"data": -1})
    plan = jzero.make_plan(jzero.abstract_state(init_fn, tx, key), mesh, stage=3)
    state = jzero.sharded_init(init_fn, tx, plan, key)
    train_step = jzero.make_train_step(loss_fn, tx, plan)
    state, metrics = train_step(state, jax.device_put(batch, plan.batch))

Checkpoints (Orbax; restore onto any mesh or stage)::

    checkpoints = jzero.RunCheckpoints("runs/mine")
    checkpoints.save(step, state)
    restored = checkpoints.restore_latest(jzero.sharded_abstract(abstract, plan))
"""

from jzero.checkpoint import RunCheckpoints
from jzero.config import CheckpointConfig, Config, ConfigError, default_rules, load_config
from jzero.ledger import live_bytes_per_device, paper_bytes_per_device, parse_collectives
from jzero.mesh import make_mesh
from jzero.plan import STAGES, Plan, StageRule, make_plan
from jzero.precision import Precision
from jzero.state import TrainState
from jzero.step import abstract_state, make_train_step, sharded_abstract, sharded_init, state_from_params

__all__ = [
    "STAGES",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "Plan",
    "Precision",
    "RunCheckpoints",
    "StageRule",
    "TrainState",
    "abstract_state",
    "default_rules",
    "live_bytes_per_device",
    "load_config",
    "make_mesh",
    "make_plan",
    "make_train_step",
    "paper_bytes_per_device",
    "parse_collectives",
    "sharded_abstract",
    "sharded_init",
    "state_from_params",
]
