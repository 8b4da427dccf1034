"""What a plan report reads of a step besides its compiled program: the record a training job hands
the report builder (:mod:`jzero.ledger.plan_report`) and the time model (:mod:`jzero.ledger.prediction`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from jzero.memory.precision import Precision
from jzero.models.config import ModelConfig
from jzero.sharding.plan import Plan

__all__ = ["ReportInputs"]


@dataclasses.dataclass(frozen=True)
class ReportInputs:
    """What a plan report reads besides the compiled program (:func:`jzero.training.report.report_inputs`).

    Attributes:
      plan: the sharding plan the step was compiled from.
      precision: its dtypes.
      model: the config's ``model:`` section.
      global_batch_size: rows per step.
      microbatches: the step's microbatches.
      flops_per_token: the model's FLOPs per token (6 N + attention's).
      attention: the attention the model runs, or None for a model of your own.
      own_model: a model of yours (``model.entry`` or your loss), not jzero's GPT or Llama.
      xla_options: the options the step compiles with, each with where it comes from.
      host_residual_share: the share of the layer loops' saved bytes the program keeps in host memory,
        traced when asked (only where the remat policy can offload).
    """

    plan: Plan
    precision: Precision
    model: ModelConfig
    global_batch_size: int
    microbatches: int
    flops_per_token: float
    attention: str | None
    own_model: bool
    xla_options: Mapping[str, Mapping[str, Any]]
    host_residual_share: Callable[[], float]

    @property
    def tokens(self) -> int:
        """Tokens per step: rows times the sequence length."""
        return self.global_batch_size * self.model.seq_len
