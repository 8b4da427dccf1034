"""From a :class:`~jzero.config.Config` to a plan report or a training run.

This is the glue the CLI uses; Python users can call the same pieces (mesh, plan, sharded init,
step) on their own model, as ``examples/`` shows.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding

from jzero import ledger
from jzero.checkpoint import CHECKPOINTS, RunCheckpoints, changes, run_meta
from jzero.config import Config, ConfigError, ModelConfig, OptimizerConfig, PrecisionConfig, check_batch_divides, dump_config
from jzero.data import TextBatches, text_batches
from jzero.export import load_params, match_params
from jzero.mesh import make_mesh, mesh_shape
from jzero.models.gpt import GPT, lm_loss
from jzero.plan import Plan, make_plan, shard_bytes
from jzero.precision import Precision
from jzero.preemption import Preemption
from jzero.progress import TrainProgress
from jzero.report import format_ledger_summary
from jzero.state import TrainState
from jzero.step import abstract_state, make_train_step, sharded_abstract, sharded_init, state_from_params


def build_precision(cfg: PrecisionConfig) -> Precision:
    return Precision.from_names(
        cfg.param_dtype,
        cfg.compute_dtype,
        cfg.master_dtype,
        cfg.grad_reduce_dtype,
        loss_scale=cfg.loss_scale,
        loss_scale_window=cfg.loss_scale_window,
    )


def build_model(cfg: ModelConfig, precision: Precision) -> GPT:
    return GPT(
        vocab_size=cfg.vocab_size,
        d_model=cfg.d_model,
        n_layers=cfg.n_layers,
        n_heads=cfg.n_heads,
        mlp_ratio=cfg.mlp_ratio,
        seq_len=cfg.seq_len,
        remat=cfg.remat,
        tie_embeddings=cfg.tie_embeddings,
        dtype=precision.compute_dtype,
    )


def build_schedule(cfg: OptimizerConfig, total_steps: int) -> optax.Schedule:
    """Linear warmup from 0, then constant or cosine decay to ``min_lr_ratio`` at ``total_steps``."""
    peak = cfg.learning_rate
    if cfg.schedule == "cosine":
        return optax.warmup_cosine_decay_schedule(
            0.0, peak, cfg.warmup_steps, max(total_steps, cfg.warmup_steps + 1), end_value=peak * cfg.min_lr_ratio
        )
    if cfg.warmup_steps:
        warmup = optax.linear_schedule(0.0, peak, cfg.warmup_steps)
        return optax.join_schedules([warmup, optax.constant_schedule(peak)], [cfg.warmup_steps])
    return optax.constant_schedule(peak)


def build_optimizer(cfg: OptimizerConfig, total_steps: int) -> optax.GradientTransformation:
    lr = build_schedule(cfg, total_steps)
    optimizers = {
        "adamw": lambda: optax.adamw(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay),
        "adam": lambda: optax.adam(lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps),
        "adafactor": lambda: optax.adafactor(lr, weight_decay_rate=cfg.weight_decay or None),
        "lion": lambda: optax.lion(lr, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay),
        "sgd": lambda: optax.sgd(lr, momentum=cfg.b1),
    }
    tx = optimizers[cfg.name]()
    if cfg.clip_norm is not None:
        # The norm is the global gradient's: GSPMD reduces over the logical arrays, whatever the sharding.
        tx = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), tx)
    return tx


@dataclasses.dataclass
class Setup:
    """Everything a run needs, built from a config; nothing allocated on devices yet."""

    config: Config
    model: GPT
    tx: optax.GradientTransformation
    mesh: Mesh
    plan: Plan
    rng: jax.Array
    init_fn: Callable[[jax.Array], Any]
    loss_fn: Callable[[Any, jax.Array], jax.Array]
    precision: Precision
    abstract: TrainState  # shapes only, params still boxed with their logical names

    @property
    def batch_shape(self) -> tuple[int, int]:
        return (self.config.train.global_batch_size, self.config.model.seq_len + 1)

    def abstract_state(self) -> TrainState:
        """The train state as sharded ``ShapeDtypeStruct`` leaves."""
        return sharded_abstract(self.abstract, self.plan)

    def compile_step(self):
        """Lower and compile the train step from shapes alone."""
        batch = jax.ShapeDtypeStruct(self.batch_shape, jnp.int32, sharding=self.plan.batch)
        step = self.make_step()
        return step, step.lower(self.abstract_state(), batch).compile()

    def init_state(self) -> TrainState:
        return sharded_init(self.init_fn, self.tx, self.plan, self.rng, self.precision)

    def make_step(self):
        return make_train_step(
            self.loss_fn, self.tx, self.plan, precision=self.precision, microbatches=self.config.train.microbatches
        )


def setup(config: Config, devices: list[jax.Device] | None = None) -> Setup:
    """Resolve the mesh on the available devices and plan the stage."""
    mesh = make_mesh(config.mesh.axes, devices, config.mesh.dcn)
    check_batch_divides(config.train.global_batch_size, mesh_shape(mesh), config.train.microbatches)
    precision = build_precision(config.precision)
    model = build_model(config.model, precision)
    tx = build_optimizer(config.optimizer, config.train.steps)
    sample = jnp.zeros((1, config.model.seq_len), jnp.int32)

    def init_fn(key):
        return model.init(key, sample)["params"]

    rng = jax.random.key(config.seed)
    abstract = abstract_state(init_fn, tx, rng, precision)
    plan = make_plan(abstract, mesh, config.zero.stage, config.partitioning.rules, config.partitioning.path_rules)
    return Setup(config, model, tx, mesh, plan, rng, init_fn, partial(lm_loss, model), precision, abstract)


def lowering_notes(stage: int, collectives: dict[str, dict[str, int]], hlo_text: str) -> list[str]:
    """Say what the HLO shows about the gradient reduction, and nothing more."""
    notes = []
    if stage >= 2:
        if "reduce-scatter" in collectives:
            notes.append("gradients are reduced with reduce-scatter")
        elif "all-reduce" in collectives and "dynamic-slice" in hlo_text:
            notes.append(
                f"{jax.default_backend()} backend: no reduce-scatter op in the HLO; gradients are all-reduced "
                "and each device keeps its slice (dynamic-slice)"
            )
    return notes


def plan_report(s: Setup, compiled: Any = None) -> dict[str, Any]:
    """The ``jzero plan --json`` object: specs, bytes, formula, compiled memory and collectives.
    ``compiled`` is the compiled step when the caller has it already."""
    if compiled is None:
        _, compiled = s.compile_step()
    hlo = compiled.as_text()
    ops = ledger.parse_collectives(hlo)
    table = paper_table(s.plan)
    collectives = ledger.summarize_collectives(ops)
    plan = s.plan
    mem = ledger.compiled_memory(compiled)
    return {
        "devices": int(s.mesh.size),
        "mesh": mesh_shape(s.mesh),
        "stage": plan.stage,
        "num_params": plan.num_params,
        "per_device_bytes": plan.per_device_bytes(),
        "ideal_per_device_bytes": plan.ideal_per_device_bytes(),
        "compiled": {k: mem[k] for k in ("argument", "output", "temp", "peak")},
        "flops_per_device": ledger.flops_per_device(compiled),
        "collectives": {k: {"count": v["count"], "bytes": v["bytes"]} for k, v in collectives.items()},
        "collectives_in_loop": {k: v["in_loop"] for k, v in collectives.items()},
        "collective_groups": {k: sorted({o.group_size for o in ops if o.kind == k and o.group_size}) for k in collectives},
        "backend": jax.default_backend(),
        "notes": lowering_notes(plan.stage, collectives, hlo),
        "tensors": [
            {
                "path": t.path,
                "shape": list(t.shape),
                "dtype": str(t.dtype),
                "param_spec": str(t.param_spec),
                "grad_spec": str(t.grad_spec),
                "optimizer_spec": str(t.update_spec),
                "param_bytes_per_device": shard_bytes(t.shape, t.dtype, t.param_spec, plan.mesh),
            }
            for t in plan.tensors
        ],
        "replicated": [{"path": t.path, "shape": list(t.shape), "bytes": t.nbytes} for t in plan.replicated],
        "largest": [
            {"path": t.path, "shape": list(t.shape), "bytes": t.nbytes}
            for t in sorted(plan.tensors, key=lambda t: t.nbytes, reverse=True)[:5]
        ],
        "not_on_model": [{"path": t.path, "shape": list(t.shape), "bytes": t.nbytes} for t in plan.not_on_model],
        "paper_table": table,
        "communication": communication(plan, ops, table),
    }


def one_group_reference(config: Config) -> dict[str, float | None]:
    """The same model and global batch compiled for one batch group (``data`` = ``replica`` = 1,
    stage 0): what each device's work and temporaries should be divided by N_d."""
    ref = copy.deepcopy(config)
    ref.mesh.axes = {k: (1 if k in ("data", "replica") else v) for k, v in ref.mesh.axes.items()}
    ref.mesh.dcn = {}
    ref.zero.stage = 0
    s = setup(ref, devices=jax.devices()[: math.prod(v for v in ref.mesh.axes.values() if v > 0)])
    _, compiled = s.compile_step()
    return {"flops": ledger.flops_per_device(compiled), "temp": ledger.compiled_memory(compiled)["temp"]}


def with_scaling(report: dict[str, Any], reference: dict[str, float | None]) -> dict[str, Any]:
    """Add ``scaling``: per-device FLOPs and temporaries against one batch group's over N_d, and
    ``flags`` when either fails to shrink (GSPMD replicating work is as costly as a no-op stage)."""
    groups = report["mesh"].get("data", 1) * report["mesh"].get("replica", 1)
    flops, temp = report.get("flops_per_device"), report["compiled"]["temp"]
    flops_ratio = flops / (reference["flops"] / groups) if flops and reference["flops"] else None
    temp_ratio = temp / reference["temp"] if reference["temp"] else None
    flags = []
    if groups > 1 and flops_ratio is not None and flops_ratio > 1.2:  # clean programs measure 1.00-1.01
        flags.append(f"per-device FLOPs are {flops_ratio:.1f}x one batch group's / {groups}: work is replicated across data")
    if groups > 1 and temp_ratio is not None and temp_ratio >= 1:
        flags.append(f"temporaries do not shrink with the data axis ({temp_ratio:.2f}x one batch group's)")
    report["scaling"] = {
        "batch_groups": groups,
        "flops_one_group": reference["flops"],
        "flops_ratio_to_predicted": flops_ratio,
        "temp_one_group": reference["temp"],
        "temp_ratio": temp_ratio,
        "flags": flags,
    }
    return report


def with_verdict(report: dict[str, Any], memory_per_device: float | None) -> dict[str, Any]:
    """Add ``memory_per_device`` and ``fits``: the compiled step's peak per device within it."""
    report["memory_per_device"] = memory_per_device
    report["fits"] = None if memory_per_device is None else report["compiled"]["peak"] <= memory_per_device
    return report


def startup_ledger(s: Setup, compiled: Any, state: TrainState) -> dict[str, Any]:
    """The plan report of the step this run compiled, with the bytes its live state really holds."""
    report = plan_report(s, compiled)
    params = ledger.live_bytes_per_device(state.params)
    optimizer = ledger.live_bytes_per_device(state.opt_state)
    report["live_bytes_per_device"] = {"params": params, "optimizer": optimizer, "total": params + optimizer}
    return report


def communication(plan: Plan, ops: list[ledger.Collective], table: dict[str, Any]) -> dict[str, Any]:
    """Bytes per device per step from the compiled HLO (loops times their trip counts), against
    the paper's 2Ψ (stages 0-2) or 3Ψ (stage 3), sized from ``table`` (:func:`paper_table`).
    Tensor-parallel all-reduces count too."""
    measured = ledger.communication_bytes(ops)
    paper = ledger.paper_communication_bytes(plan.num_params, plan.stage, table["param_bytes"], table["n_m"])
    total = sum(measured.values())
    return {
        "bytes_per_step": measured,
        "total": total,
        "paper": paper,
        "paper_model": "3Ψ" if plan.rule.params else "2Ψ",
        "ratio": total / paper if paper else None,
    }


PARTITIONED = {0: "nothing", 1: "optimizer state", 2: "+ gradients", 3: "+ parameters"}


def paper_table(plan: Plan) -> dict[str, Any]:
    """The paper's per-stage model-state bytes for this model and mesh (its Figure 1 / Table 1 style):
    (p + g + K)Ψ with the stage's parts over N_d, then over N_m, where p and g are the parameter and
    gradient bytes and K the optimizer-state bytes per parameter."""
    psi = plan.num_params
    param_bytes = sum(t.nbytes for t in plan.tensors) / psi
    k = sum(math.prod(shape) * dtype.itemsize for _, shape, dtype, _ in plan.opt_leaves) / psi
    n_d = plan.data_size
    n_m = math.prod(int(v) for a, v in plan.mesh.shape.items() if a not in ("data", "replica"))
    sizes = {"k": k, "param_bytes": param_bytes, "grad_bytes": param_bytes, "n_m": n_m}
    rows = [
        {"stage": stage, "partitioned": PARTITIONED[stage], "bytes": ledger.paper_bytes_per_device(psi, stage, n_d, **sizes)}
        for stage in range(4)
    ]
    return {"psi": psi, "k": round(k, 3), "param_bytes": param_bytes, "n_d": n_d, "n_m": n_m, "rows": rows}


# ---------------------------------------------------------------------------------------------
# Training


class TrainingHalted(RuntimeError):
    """``train.nonfinite: halt`` met a step with a NaN or Inf gradient (its update was not applied)."""

    def __init__(self, step: int):
        self.step = step
        super().__init__(f"train.nonfinite=halt: step {step} had a non-finite gradient; its update was not applied")


def check_run_dir(path: str, resume: bool) -> tuple[Path, bool]:
    """``run.dir`` and whether it already holds a run, writing nothing. Without ``resume`` a folder
    that holds a run is refused, so nothing is overwritten; a path that cannot be a folder is refused."""
    run_dir = Path(path)
    for folder in (run_dir, *run_dir.parents):  # the nearest existing ancestor must be a folder
        if folder.exists():
            if not folder.is_dir():
                raise ConfigError("run.dir", f"{folder} is a file, not a folder")
            break
    existing = [name for name in ("metrics.jsonl", "config.yaml", CHECKPOINTS) if (run_dir / name).exists()]
    if existing and not resume:
        raise ConfigError("--no-resume", f"{run_dir} already holds a run ({', '.join(existing)}); choose another run.dir")
    return run_dir, bool(existing)


def create_run_dir(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ConfigError("run.dir", f"cannot create {run_dir}: {err.strerror or err}") from None


def trim_metrics(path: Path, last_step: int) -> int:
    """Drop the records past ``last_step`` (and a torn last line) from ``metrics.jsonl``, atomically,
    so a resumed run logs each step once. Returns how many were dropped."""
    if not path.exists():
        return 0
    lines = path.read_text(errors="replace").splitlines()
    kept = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= last_step:
            kept.append(line)
    if len(kept) == len(lines):
        return 0
    tmp = path.with_name(f".{path.name}.trim-{os.getpid()}")
    tmp.write_text("".join(line + "\n" for line in kept))
    os.replace(tmp, path)
    return len(lines) - len(kept)


@dataclasses.dataclass
class RunResult:
    """What :func:`train` did: its logged records, where it started and stopped, what it saved."""

    history: list[dict[str, Any]]
    start_step: int  # 0, or the checkpoint step it resumed from
    final_step: int
    saved: list[int]  # checkpoint steps written by this run
    preempted: str | None = None  # the signal that stopped it early


def initial_state(
    s: Setup, checkpoints: RunCheckpoints | None, data: TextBatches, note: Callable[[str], None]
) -> tuple[TrainState, int]:
    """The latest committed checkpoint (onto this run's mesh and stage), else ``train.init_from``,
    else a fresh init. Returns the state and the step it is at."""
    restored = checkpoints.restore_latest(s.abstract_state(), warn=note) if checkpoints is not None else None
    if restored is not None:
        start = data.check_state(restored.data)
        changed = changes(restored.meta, mesh_shape(s.mesh), s.plan.stage)
        note(f"resumed from {checkpoints.step_dir(restored.step)}" + (f" ({changed})" if changed else ""))
        return restored.state, start
    if s.config.train.init_from:
        loaded = load_params(s.config.train.init_from)
        match_params(loaded, {t.path: t.shape for t in s.plan.tensors}, s.config.train.init_from)
        arrays = [
            jax.device_put(np.asarray(loaded[t.path], np.float32), NamedSharding(s.mesh, t.param_spec)) for t in s.plan.tensors
        ]
        params = jax.tree.unflatten(jax.tree.structure(s.plan.params), arrays)
        note(f"parameters from {s.config.train.init_from}")
        return state_from_params(params, s.tx, s.plan, s.precision), 0
    return s.init_state(), 0


class MetricsLog:
    """Collects each step's metrics on device and, at logged steps, writes one JSON line to
    ``metrics.jsonl`` (one host sync per logged step). In ``halt`` mode it raises at the first
    step whose gradient was not finite."""

    def __init__(self, file: Any, tokens_per_step: int, start: int, skipped: int, halt: bool):
        self.file, self.tokens_per_step, self.halt = file, tokens_per_step, halt
        self.pending: list[dict[str, jax.Array]] = []
        self.skipped = skipped
        self.mark, self.mark_step = time.perf_counter(), start
        self.history: list[dict[str, Any]] = []

    def add(self, metrics: dict[str, jax.Array]) -> None:
        self.pending.append(metrics)

    def write(self, step: int) -> dict[str, Any]:
        interval, self.pending = jax.device_get(self.pending), []
        if self.halt:
            for offset, m in enumerate(interval):
                if int(m["skipped"]) > self.skipped:
                    raise TrainingHalted(self.mark_step + offset + 1)
        last = interval[-1]
        self.skipped = int(last["skipped"])
        now = time.perf_counter()
        record = {
            "step": step,
            "loss": float(last["loss"]),
            "grad_norm": float(last["grad_norm"]),
            "tokens_per_sec": self.tokens_per_step * (step - self.mark_step) / (now - self.mark),
            "skipped_steps": self.skipped,
        }
        if "loss_scale" in last:
            record["loss_scale"] = float(last["loss_scale"])
        self.mark, self.mark_step = now, step
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        self.history.append(record)
        return record


def train(config: Config, *, progress: bool = True, data: TextBatches | None = None, resume: bool = True) -> RunResult:
    """Train per ``config`` under ``run.dir``: ``config.yaml``, ``metrics.jsonl`` and Orbax
    checkpoints in ``checkpoints/``. Resumes from the latest committed checkpoint unless
    ``resume`` is False, which refuses a folder that holds a run. SIGTERM/SIGINT save and stop."""
    s = setup(config)
    if data is None:
        m, t = config.model, config.train
        data = text_batches(config.data.path, config.data.max_bytes, m.seq_len, t.global_batch_size, config.seed)
    # Everything that can refuse the run does so here, before anything is written or drawn.
    run_dir, existing = check_run_dir(config.run.dir, resume)
    notes: list[str] = []
    checkpoints = RunCheckpoints(run_dir, config.checkpoint) if (run_dir / CHECKPOINTS).is_dir() else None
    try:
        state, start = initial_state(s, checkpoints, data, notes.append)
    except BaseException:
        for line in notes:  # checkpoints set aside on the way
            print(line, file=sys.stderr)
        if checkpoints is not None:
            checkpoints.close()
        raise
    create_run_dir(run_dir)
    checkpoints = checkpoints or RunCheckpoints(run_dir, config.checkpoint)
    if not existing:
        (run_dir / "config.yaml").write_text(dump_config(config))
    dropped = trim_metrics(run_dir / "metrics.jsonl", start)
    if dropped:
        notes.append(f"dropped {dropped} metrics.jsonl records past step {start}, which this run logs again")
    meta = run_meta(config.to_dict(), mesh_shape(s.mesh), s.plan.stage, s.plan.num_params, s.rng)
    steps = config.train.steps

    with TrainProgress(steps, enabled=progress) as bar, Preemption() as preemption:
        for line in notes:
            bar.announce(line)
        result = RunResult([], start, start, [])
        if start >= steps:
            bar.announce(f"step {start} already reached train.steps={steps}; nothing to do")
            checkpoints.close()
            return result
        if existing and start > 0 and (run_dir / "config.yaml").read_text() != dump_config(config):
            (run_dir / f"config.step-{start}.yaml").write_text(dump_config(config))  # the resumed run's own config
        t0 = time.perf_counter()
        compiled = s.make_step().lower(state, data.device_batch(start, s.plan.batch)).compile()
        bar.note(
            f"mesh {mesh_shape(s.mesh)}  stage {s.plan.stage}  params {s.plan.num_params:,}  "
            f"compile {time.perf_counter() - t0:.1f}s  from step {start}"
        )
        report = startup_ledger(s, compiled, state)
        name = "ledger.json" if not (run_dir / "ledger.json").exists() else f"ledger.step-{start}.json"
        (run_dir / name).write_text(json.dumps(report, indent=1))
        bar.note(format_ledger_summary(report) + f"\n  written to {run_dir / name}")
        bar.advance(start)

        def save(step: int) -> None:
            if checkpoints.save(step, state, data.state(step), meta):
                result.saved.append(step)
            else:
                bar.announce(f"jzero: warning: step {step}: the state is not finite; not checkpointed")

        try:
            with open(run_dir / "metrics.jsonl", "a") as file:
                tokens = config.train.global_batch_size * config.model.seq_len
                log = MetricsLog(file, tokens, start, int(state.skipped), config.train.nonfinite == "halt")
                for step, batch in data.iterate(s.plan.batch, start):
                    if step >= steps or preemption.requested():
                        break
                    state, metrics = compiled(state, batch)
                    log.add(metrics)
                    done = result.final_step = step + 1
                    checkpoints.check()
                    if checkpoints.due(done) or done == steps:
                        save(done)
                    if done % config.run.log_every == 0 or done == steps:
                        bar.update(done, log.write(done))
                    else:
                        bar.advance(done)
                if log.pending:  # stopped early: the steps since the last record get one too
                    log.write(result.final_step)
                result.history = log.history
            if preemption.signal is not None:
                result.preempted = preemption.signal
                if result.final_step not in result.saved and result.final_step > start:
                    save(result.final_step)
        except KeyboardInterrupt:  # a second SIGINT: abort now, leave any write uncommitted
            raise
        except BaseException:
            checkpoints.close()
            raise
        checkpoints.close()
    return result
