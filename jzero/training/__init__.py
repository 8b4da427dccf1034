"""The training job: built from a config, measured (its ledger), and run (the loop, its hooks, the
data, progress and preemption)."""

__all__ = []
