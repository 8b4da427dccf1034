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

The names load on first use (PEP 562): ``import jzero`` and ``python -m jzero.cli`` import no JAX,
so the command line has its Ctrl-C handler in place before JAX's seconds of importing begin.
"""

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "RunCheckpoints": "jzero.checkpoint.runs",
    "CheckpointConfig": "jzero.config.schema",
    "Config": "jzero.config.schema",
    "ConfigError": "jzero.errors",
    "JzeroError": "jzero.errors",
    "PlanError": "jzero.errors",
    "CheckpointError": "jzero.errors",
    "default_rules": "jzero.plan",
    "load_config": "jzero.config.loading",
    "live_bytes_per_device": "jzero.ledger.hlo",
    "paper_bytes_per_device": "jzero.stages",
    "parse_collectives": "jzero.ledger.hlo",
    "make_mesh": "jzero.mesh",
    "STAGES": "jzero.stages",
    "Plan": "jzero.plan",
    "StageRule": "jzero.stages",
    "make_plan": "jzero.plan",
    "Precision": "jzero.precision",
    "TrainState": "jzero.state",
    "abstract_state": "jzero.step",
    "make_train_step": "jzero.step",
    "sharded_abstract": "jzero.step",
    "sharded_init": "jzero.step",
    "state_from_params": "jzero.step",
    "target_devices": "jzero.ledger.targets",
    "parse_target": "jzero.ledger.targets",
    "unit_call": "jzero.gather",
}
__all__ = [
    "STAGES",
    "CheckpointConfig",
    "CheckpointError",
    "Config",
    "ConfigError",
    "JzeroError",
    "Plan",
    "PlanError",
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
    "target_devices",
    "parse_target",
    "unit_call",
]

if TYPE_CHECKING:
    from jzero.checkpoint.runs import RunCheckpoints
    from jzero.config.loading import load_config
    from jzero.config.schema import CheckpointConfig, Config
    from jzero.errors import CheckpointError, ConfigError, JzeroError, PlanError
    from jzero.gather import unit_call
    from jzero.ledger.hlo import live_bytes_per_device, parse_collectives
    from jzero.ledger.targets import parse_target, target_devices
    from jzero.mesh import make_mesh
    from jzero.plan import Plan, default_rules, make_plan
    from jzero.precision import Precision
    from jzero.stages import STAGES, StageRule, paper_bytes_per_device
    from jzero.state import TrainState
    from jzero.step import abstract_state, make_train_step, sharded_abstract, sharded_init, state_from_params


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'jzero' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
