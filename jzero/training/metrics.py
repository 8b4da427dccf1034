"""What a run logs at each logged step: loss, gradient norm, learning rate, tokens/s against the
wall clock less what was not training, model FLOPs/s per device and MFU."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax
import optax

from jzero.errors import TrainingHalted
from jzero.ledger import targets
from jzero.training.goodput import NOT_TRAINING, Goodput
from jzero.training.job import Job

__all__ = ["MetricsLog", "Throughput"]


@dataclasses.dataclass(frozen=True)
class Throughput:
    """What turns tokens/s into model FLOPs/s per device and MFU.

    Attributes:
      tokens_per_step: tokens in one global batch.
      flops_per_token: the model's training FLOPs per token (:attr:`jzero.training.job.Job.flops_per_token`).
      devices: the devices the step runs on.
      peak_flops: one device's dense bf16 peak, or None where it is not known (then no ``mfu``).
    """

    tokens_per_step: int
    flops_per_token: float
    devices: int
    peak_flops: float | None

    @classmethod
    def of(cls, job: Job) -> Throughput:
        devices = list(job.mesh.devices.flat)
        peak = targets.device_peak_flops(devices[0])
        tokens = job.config.train.global_batch_size * job.config.model.seq_len
        return cls(tokens, job.flops_per_token, len(devices), peak)

    def figures(self, tokens_per_sec: float) -> dict[str, float]:
        """``model_flops_per_sec`` (per device) and, where the peak is known, ``mfu``."""
        flops = self.flops_per_token * tokens_per_sec / self.devices
        return {"model_flops_per_sec": flops, **({"mfu": flops / self.peak_flops} if self.peak_flops else {})}


class MetricsLog:
    """Collects each step's metrics on device and, at logged steps, makes one host-side record of
    them (one host sync per logged step). In ``halt`` mode it raises at the first step whose
    gradient was not finite.

    Args:
      throughput: the tokens per step and what gives ``model_flops_per_sec`` and ``mfu``.
      start: the step the run starts from.
      skipped: steps skipped before ``start``.
      halt: raise :class:`TrainingHalted` at a non-finite step.
      schedule: the learning-rate schedule, for ``learning_rate``.
      goodput: the run's; ``tokens_per_sec`` leaves out the checkpoint, eval and profiler time it was charged.
    """

    def __init__(
        self, throughput: Throughput, start: int, skipped: int, halt: bool, schedule: optax.Schedule, goodput: Goodput
    ):
        self.throughput, self.halt, self.schedule, self.goodput = throughput, halt, schedule, goodput
        self.pending: list[dict[str, jax.Array]] = []
        self.skipped = skipped
        self.mark, self.mark_step = self._clock(), start
        self.history: list[dict[str, Any]] = []

    def _clock(self) -> float:
        """Wall time less what was not training (checkpoints, eval, the profiler's start and stop)."""
        return time.perf_counter() - sum(self.goodput.seconds[k] for k in NOT_TRAINING)

    def add(self, metrics: dict[str, jax.Array]) -> None:
        self.pending.append(metrics)

    def record(self, step: int, extra: dict[str, float] | None = None) -> dict[str, Any]:
        """The record of the steps since the last one, ending at ``step``, with ``extra`` (eval) figures."""
        interval, self.pending = jax.device_get(self.pending), []
        if self.halt:
            for offset, m in enumerate(interval):
                if int(m["skipped"]) > self.skipped:
                    raise TrainingHalted(self.mark_step + offset + 1)
        last = interval[-1]
        self.skipped = int(last["skipped"])
        now = self._clock()
        tokens_per_sec = self.throughput.tokens_per_step * (step - self.mark_step) / (now - self.mark)
        record = {
            "step": step,
            "loss": float(last["loss"]),
            "grad_norm": float(last["grad_norm"]),
            # optax counts applied updates: the rate of the last update applied
            "learning_rate": float(self.schedule(max(step - self.skipped - 1, 0))),
            "tokens_per_sec": tokens_per_sec,
            **self.throughput.figures(tokens_per_sec),
            "skipped_steps": self.skipped,
        }
        if "loss_scale" in last:
            record["loss_scale"] = float(last["loss_scale"])
        record.update(extra or {})
        self.mark, self.mark_step = now, step
        self.history.append(record)
        return record
