"""The validation loss: the same eval batches every time, through one compiled eval step with the
train step's shardings (:func:`jzero.step.make_eval_step`)."""

from __future__ import annotations

import math
from typing import Any

import jax
import numpy as np

from jzero.training.job import Job

__all__ = ["Evaluator"]


class Evaluator:
    """``train.eval_every``'s evaluation: at every multiple of it and at the last step, the mean loss
    over the eval batches at the current parameters.

    Args:
      job: the built job (its plan gives the shardings).
      data: the eval batches (``len(data)`` global batches, ``data.device_batch(i, sharding)``).
      every: ``train.eval_every`` (> 0).
      last_step: ``train.steps``.
    """

    def __init__(self, job: Job, data: Any, every: int, last_step: int):
        self.job, self.data, self.every, self.last_step = job, data, every, last_step
        self.compiled: Any = None
        self.batches: list[jax.Array] = []

    def compile(self, params: Any) -> None:
        """Compile the eval step once, for these parameters' shardings; the eval batches go to the
        devices here, once."""
        sharding = self.job.plan.batch
        self.batches = [self.data.device_batch(i, sharding) for i in range(len(self.data))]
        self.compiled = self.job.compile(self.job.make_eval_step().lower(params, self.batches[0]))

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.last_step

    def evaluate(self, params: Any) -> dict[str, float]:
        """``{"eval_loss", "eval_perplexity"}`` at ``params``: the batches' mean loss (each batch has
        the same number of tokens, so the mean of the means is the mean over every token)."""
        losses = jax.device_get([self.compiled(params, batch) for batch in self.batches])
        loss = float(np.mean(np.asarray(losses, np.float64)))
        return {"eval_loss": loss, "eval_perplexity": math.exp(min(loss, 700.0))}  # exp overflows past ~709
