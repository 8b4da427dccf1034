"""The planner: ``jzero plan --search`` finds the fastest configuration that fits a GPU target,
certified by the compiled device peak and ranked by the step-time model's prediction."""

__all__ = []
