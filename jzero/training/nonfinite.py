"""Non-finite steps: how many in a row a run may skip, and which states are fit to save.

A step whose gradient is NaN or Inf applies nothing and is counted (``state.skipped``); with fp16's
dynamic loss scale that is how the scale finds its level. :class:`NonFiniteSteps` keeps each step's
loss and count on the device and reads them only where the loop waits for the device anyway, at
its logged steps and its saves, which are the same steps on every process:

- past ``train.max_skipped_in_a_row`` skipped steps in a row (:func:`skip_limit`) it raises
  :class:`~jzero.errors.TooManySkipped` (``jzero train`` exits with status 4);
- a run whose last step was non-finite raises :class:`~jzero.errors.EndedNonFinite`
  (:meth:`NonFiniteSteps.finish`, status 4 too): it never ends as if it had trained;
- a save is refused when a loss since the previous save point was not finite
  (:meth:`NonFiniteSteps.save_point`), so the last good checkpoint stays, and ``checkpoint.keep``
  never rotates it out for one that is not.
"""

from __future__ import annotations

import jax
import numpy as np

from jzero.errors import EndedNonFinite, TooManySkipped

__all__ = ["NonFiniteSteps", "skip_limit"]

# train.max_skipped_in_a_row's default. fp16's dynamic loss scale halves once per skipped step (2**15
# to 1 is 15 in a row), so 32 lets it find its level from any start up to 2**32. Without a loss
# scale nothing but the batch changes from one skipped step to the next: a few in a row is a
# diverged run, not a bad batch.
WITH_LOSS_SCALE, WITHOUT = 32, 3


def skip_limit(configured: int | None, scales_loss: bool) -> int:
    """``train.max_skipped_in_a_row``, or its default for a run with or without a dynamic loss scale."""
    if configured is not None:
        return configured
    return WITH_LOSS_SCALE if scales_loss else WITHOUT


class NonFiniteSteps:
    """Watches the steps' losses and skipped-step counts.

    Args:
      limit: ``train.max_skipped_in_a_row`` (:func:`skip_limit`).
      skipped: the state's skipped-step count at the run's start.
      scales_loss: the run has a dynamic loss scale, which a skipped step with a finite loss only tunes.
    """

    def __init__(self, limit: int, skipped: int, scales_loss: bool = False):
        self.limit, self.skipped, self.scales_loss = limit, skipped, scales_loss
        self.pending: list[tuple[int, jax.Array, jax.Array]] = []  # step, loss, skipped: not read yet
        self.in_a_row = 0
        self.bad_loss: int | None = None  # the first step since the save point whose loss was not finite
        self.last: tuple[int, float] | None = None  # the last step read and its loss

    def add(self, step: int, metrics: dict[str, jax.Array]) -> None:
        """Step ``step``'s metrics (``loss``, ``skipped``), left on the device."""
        self.pending.append((step, metrics["loss"], metrics["skipped"]))

    def look(self) -> None:
        """Read the steps added since the last look (this waits for them).

        Raises:
          TooManySkipped: more than ``limit`` of them in a row were skipped.
        """
        pending, self.pending = self.pending, []
        values = jax.device_get([(loss, skipped) for _, loss, skipped in pending])
        for (step, _, _), (loss, skipped) in zip(pending, values, strict=True):
            self.last = (step, float(loss))
            self.in_a_row = self.in_a_row + 1 if int(skipped) > self.skipped else 0
            self.skipped = int(skipped)
            if not np.isfinite(loss) and self.bad_loss is None:
                self.bad_loss = step
            if self.in_a_row > self.limit:
                raise TooManySkipped(self.limit, step - self.in_a_row + 1, step, pending[-1][0])

    def save_point(self) -> int | None:
        """Look, then start the next interval: the first step since the previous save point whose
        loss was not finite (the state is not fit to save), or None."""
        self.look()
        bad, self.bad_loss = self.bad_loss, None
        return bad

    def finish(self) -> None:
        """Look at the last steps; the run must not end on a non-finite one.

        Raises:
          TooManySkipped: as :meth:`look`.
          EndedNonFinite: the last step's loss was not finite, or its gradient was and there is no
            loss scale that the skip tuned.
        """
        self.look()
        if self.last is None:
            return
        step, loss = self.last
        if not np.isfinite(loss) or (self.in_a_row and not self.scales_loss):
            raise EndedNonFinite(step, step - max(self.in_a_row, 1) + 1, loss)
