"""The plan's tensors in the report: each one's specs and bytes, and the tensors named in a list
(the replicated, the largest, those off the ``model`` axis, those a technique leaves out)."""

from __future__ import annotations

from jzero.records import record
from jzero.sharding.partition import shard_bytes
from jzero.sharding.plan import Plan, TensorPlan

__all__ = ["FROZEN", "ExcludedTensor", "TensorEntry", "TensorRow", "excluded", "largest", "tensor_entry", "tensor_rows"]

FROZEN = "frozen"  # a frozen parameter's gradient and optimizer specs: it has neither (train.trainable)


@record
class TensorEntry:
    """A tensor named in a list.

    Attributes:
      path: its path in the parameter tree.
      shape: its global shape.
      bytes: its whole bytes.
    """

    path: str
    shape: list[int]
    bytes: int


@record
class ExcludedTensor(TensorEntry):
    """A tensor a ZeRO++ technique leaves out, and why.

    Attributes:
      why: the reason, in words.
    """

    why: str


@record
class TensorRow:
    """One tensor of the plan: its shape, dtype, three specs and parameter bytes per device.

    Attributes:
      path: its path in the parameter tree.
      shape: its global shape.
      dtype: the parameter's dtype.
      param_spec: the parameter's ``PartitionSpec``.
      grad_spec: the gradient's (``frozen`` for a parameter that does not train).
      optimizer_spec: the optimizer state's.
      param_bytes_per_device: the parameter's bytes on one device.
    """

    path: str
    shape: list[int]
    dtype: str
    param_spec: str
    grad_spec: str
    optimizer_spec: str
    param_bytes_per_device: int


def tensor_rows(plan: Plan) -> list[TensorRow]:
    """Each tensor of the plan: its shape, dtype, three specs and parameter bytes per device."""
    return [
        TensorRow(
            path=t.path,
            shape=list(t.shape),
            dtype=str(t.dtype),
            param_spec=str(t.param_spec),
            grad_spec=str(t.grad_spec) if t.trainable else FROZEN,
            optimizer_spec=str(t.optimizer_spec) if t.trainable else FROZEN,
            param_bytes_per_device=shard_bytes(t.shape, t.dtype, t.param_spec, plan.mesh),
        )
        for t in plan.tensors
    ]


def largest(plan: Plan, count: int = 5) -> list[TensorEntry]:
    """The plan's ``count`` largest tensors, largest first."""
    return [tensor_entry(t) for t in sorted(plan.tensors, key=lambda t: t.nbytes, reverse=True)[:count]]


def tensor_entry(t: TensorPlan) -> TensorEntry:
    """A tensor named in a list: its path, shape and bytes."""
    return TensorEntry(path=t.path, shape=list(t.shape), bytes=t.nbytes)


def excluded(t: TensorPlan, why: str) -> ExcludedTensor:
    """A tensor a ZeRO++ technique leaves out, and why."""
    return ExcludedTensor(path=t.path, shape=list(t.shape), bytes=t.nbytes, why=why)
