"""A training job's plan report: what the report builder (:mod:`jzero.ledger.plan_report`, which never
sees a job) reads of a :class:`~jzero.training.job.Job`, and one batch group's reference compile.

:func:`report_inputs` hands the builder the job's plan, precision, model config and compile options,
with the trace of the loss that only the job can make (the share of the saved residuals kept in host
memory). :func:`plan_report` and :func:`startup_ledger` are the builder's, given a job.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from jzero.dtypes import array_bytes
from jzero.lazy import moved_names
from jzero.ledger import hlo as ledger
from jzero.ledger import plan_report as builder
from jzero.ledger import startup
from jzero.ledger.inputs import ReportInputs
from jzero.ledger.report import PlanReport
from jzero.ledger.startup import StartupLedger
from jzero.ledger.timing import Hardware
from jzero.sharding.axes import BATCH_AXES
from jzero.sharding.mesh import make_mesh, mesh_shape
from jzero.sharding.placement import sharded_abstract
from jzero.sharding.state import TrainState
from jzero.step import activation_rules
from jzero.training.job import Job

__all__ = ["one_group_reference", "plan_report", "report_inputs", "startup_ledger"]

# The builder's own parts moved to jzero.ledger.plan_report (CHANGELOG.md); those that read a job
# now read its ReportInputs.
_BUILDER = ("communication", "device_description", "gathered_at_once", "lowering_notes", "model_flops", "paper_table",
            "saved_activations", "with_scaling", "with_verdict")  # fmt: skip
__getattr__ = moved_names(__name__, {
    **{name: f"jzero.ledger.plan_report.{name}" for name in _BUILDER},
    "process_figures": "jzero.ledger.startup.process_figures",
})  # fmt: skip


def report_inputs(job: Job) -> ReportInputs:
    """What the plan report reads of ``job`` besides its compiled step."""
    cfg = job.config
    return ReportInputs(
        plan=job.plan,
        precision=job.precision,
        model=cfg.model,
        global_batch_size=cfg.train.global_batch_size,
        microbatches=cfg.train.microbatches,
        flops_per_token=job.flops_per_token,
        attention=job.model.attention if job.model is not None else None,
        own_model=job.model is None,
        xla_options=job.xla_options(),
        host_residual_share=lambda: _host_residual_share(job),
    )


def plan_report(job: Job, compiled: Any = None, hardware: Hardware | None = None) -> PlanReport:
    """The ``jzero plan --json`` object of ``job``'s step (:func:`jzero.ledger.plan_report.plan_report`).

    Args:
      job: the built job.
      compiled: the compiled step when the caller has it already (default: compiled here).
      hardware: the GPUs and network the prediction is for (default: the devices').
    """
    if compiled is None:
        _, compiled = job.compile_step()
    return builder.plan_report(report_inputs(job), compiled, hardware)


def startup_ledger(job: Job, compiled: Any, state: TrainState) -> StartupLedger:
    """The plan report of the step this run compiled, with the bytes its live state really holds
    (:func:`jzero.ledger.startup.startup_ledger`)."""
    return startup.startup_ledger(report_inputs(job), compiled, state)


def _host_residual_share(job: Job) -> float:
    """The share of the layer loops' saved bytes (global shapes) that the program asks to keep in
    host memory; traced, not compiled."""
    params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), sharded_abstract(job.abstract, job.plan).params)
    batch = jax.ShapeDtypeStruct(job.batch_shape, jnp.int32)
    with activation_rules(job.plan):
        jaxpr = jax.make_jaxpr(lambda p, b: jax.vjp(lambda q: job.loss_fn(q, b), p)[1])(params, batch)
    host = total = 0
    for eqn in _all_eqns(jaxpr.jaxpr):
        if eqn.primitive.name == "scan":
            for var in eqn.outvars[eqn.params["num_carry"] :]:
                nbytes = array_bytes(var.aval.shape, var.aval.dtype)
                total += nbytes
                host += nbytes if "host" in str(getattr(var.aval, "memory_space", "")).lower() else 0
    return host / total if total else 0.0


def _all_eqns(jaxpr: Any):
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from _all_eqns(inner)


def one_group_reference(job: Job) -> dict[str, float | None]:
    """The same model and global batch compiled for one batch group (``data`` = ``replica`` = 1,
    stage 0): what each device's work and temporaries should be divided by N_d.

    Returns:
      ``{"flops", "temp"}`` per device of that program; both None on GPUs, where nothing is
      compiled: a GPU target's program has no FLOP count to scale, and one group's is the whole
      model's state on one GPU, which XLA warns cannot fit ("The byte size of input/output
      arguments (846652867956) exceeds the base limit" for Llama 3.1 70B on ``h100x128``).
    """
    if job.mesh.devices.flat[0].platform == "gpu":
        return {"flops": None, "temp": None}
    axes = {name: (1 if name in BATCH_AXES else size) for name, size in mesh_shape(job.mesh).items()}
    mesh = make_mesh(axes, list(job.mesh.devices.flat)[: math.prod(axes.values())])
    _, compiled = job.replan(stage=0, mesh=mesh).compile_step()
    return {"flops": ledger.flops_per_device(compiled), "temp": ledger.compiled_memory(compiled)["temp"]}
