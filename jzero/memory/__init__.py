"""Where memory goes: the precision of parameters, master copy and optimizer state
(:mod:`jzero.memory.precision`), offload to host memory (:mod:`jzero.memory.offload`) and what
the backward pass saves or recomputes (:mod:`jzero.memory.remat`)."""

__all__ = []
