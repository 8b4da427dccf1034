"""Activation rematerialisation by policy name: jzero's GPT and your own layers use the same names.

A policy says which intermediate values of a layer the forward keeps for the backward; the rest is
recomputed (``jax.checkpoint``). The names are :data:`REMAT_POLICIES`:

- ``none``: no matmul is recomputed. Every matmul's output and the fused attention kernel's outputs
  are kept; the elementwise work between them (norms, GELU, rotary) is recomputed from those. This
  is what a layer needs, as in PyTorch without activation checkpointing: JAX's own linearization
  would keep every intermediate (a tanh GELU's, the norms' float32 copies; ``docs/design.md``,
  "The GPU target", "JAX's linearization keeps every intermediate").
- ``full``: only the layer's inputs are kept; the whole layer is recomputed in the backward.
- ``dots_saveable``: matrix-multiply outputs are kept, the cheap elementwise work is recomputed.
- ``dots_with_no_batch_dims_saveable``: the same, but only matmuls without batch dimensions (the
  projections, not attention's batched score and value products).
- ``offload_dots``: the previous policy's saved values go to pinned host memory in the forward and
  come back for the backward.

Remat only saves memory where XLA cannot see the forward and backward as one computation: under a
loop (``nn.scan``, ``jax.lax.scan``). Around an unrolled layer XLA may schedule the recomputation
away (``docs/design.md``, "The CPU backend", "Remat saves memory only under a loop, unless a pass
is turned off").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["FLOAT8_OUTPUT", "REMAT_POLICIES", "checkpoint_policy", "offloads", "policy_name", "remat"]

Wrapped = TypeVar("Wrapped")

# Each policy's jax.checkpoint policy, from ``jax.checkpoint_policies`` (None: save only the inputs).
# JAX is imported where a policy is built: config validation reads the names here without it.
_POLICIES: dict[str, Callable[[Any], Any]] = {
    "none": lambda policies: _no_matmul_recomputed,
    "full": lambda policies: None,
    "dots_saveable": lambda policies: policies.dots_saveable,
    "dots_with_no_batch_dims_saveable": lambda policies: policies.dots_with_no_batch_dims_saveable,
    "offload_dots": lambda policies: policies.offload_dot_with_no_batch_dims(*_memory_kinds()),
}
REMAT_POLICIES = tuple(_POLICIES)
# A float8 matmul's output (jzero.memory.float8) is a custom_vjp's, which the policies' matmul tests
# do not see: named, every policy but full keeps it as it keeps a matmul's (offload_dots sends it).
FLOAT8_OUTPUT = "jzero_float8_matmul"
_OFFLOADING = frozenset({"offload_dots"})  # the policies that send saved values to host memory
# The primitives whose outputs ``none`` keeps: matmuls, and cuDNN's attention forward (its result and
# softmax statistics; a checkpoint policy sees the kernel, not the matmuls inside it).
_NOT_RECOMPUTED = frozenset({"dot_general", "dot_product_attention_fwd", "dot_product_attention_fwd_wrapper"})


def _no_matmul_recomputed(prim: Any, *_: Any, **__: Any) -> bool:
    return prim.name in _NOT_RECOMPUTED


def _memory_kinds() -> tuple[str, str]:
    from jzero.memory.offload import DEVICE, HOST

    return DEVICE, HOST


def policy_name(value: str | bool) -> str:
    """A policy's name; ``True`` and ``False`` (the old ``model.remat`` values) read as full and none."""
    if isinstance(value, bool):
        return "full" if value else "none"
    if value not in REMAT_POLICIES:
        raise ValueError(f"remat policy must be one of {', '.join(REMAT_POLICIES)}, got {value!r}")
    return value


def offloads(name: str | bool) -> bool:
    """Whether a policy sends saved values to host memory (``offload_dots``)."""
    return policy_name(name) in _OFFLOADING


def checkpoint_policy(name: str | bool, also_save: tuple[str, ...] = ()) -> Callable[..., Any] | None:
    """The ``jax.checkpoint`` policy of a name (None for ``full``: save nothing but the inputs).

    Args:
      name: one of :data:`REMAT_POLICIES`.
      also_save: ``checkpoint_name`` names whose values are saved too (hpZ's secondary copy).

    Raises:
      ValueError: an unknown name.
    """
    import jax

    policies = jax.checkpoint_policies
    policy = _POLICIES[policy_name(name)](policies)
    if policy is not None:
        policy = _keeping_float8(policy, offloads(name))
    if not also_save:
        return policy
    named = policies.save_only_these_names(*also_save)
    return named if policy is None else policies.save_from_both_policies(policy, named)


def _keeping_float8(policy: Callable[..., Any], offload: bool) -> Callable[..., Any]:
    """``policy``, which also keeps (or with ``offload`` sends to host memory) the values named
    :data:`FLOAT8_OUTPUT`: it answers for them as for a projection's matmul."""
    import jax

    policies = jax.checkpoint_policies
    kept = policies.save_only_these_names(FLOAT8_OUTPUT)
    if offload:
        src, dst = _memory_kinds()
        kept = policies.save_and_offload_only_these_names(
            names_which_can_be_saved=[], names_which_can_be_offloaded=[FLOAT8_OUTPUT], offload_src=src, offload_dst=dst
        )

    def with_float8(prim: Any, *args: Any, **params: Any) -> Any:
        return (kept if params.get("name") == FLOAT8_OUTPUT else policy)(prim, *args, **params)

    return with_float8


def remat(target: Wrapped, policy: str | bool = "full", *, prevent_cse: bool = True, also_save: tuple[str, ...] = ()) -> Wrapped:
    """Rematerialise a layer function or a Flax linen module class with a named policy.

    Args:
      target: a function (wrapped with ``jax.checkpoint``) or an ``nn.Module`` subclass (wrapped
        with ``nn.remat``).
      policy: one of :data:`REMAT_POLICIES`, or ``True``/``False`` for ``full``/``none``.
      prevent_cse: pass False for a layer that runs under a scan, where XLA cannot merge the
        forward and the recomputation anyway (JAX's own advice; it saves work).
      also_save: names whose values are saved too (:func:`checkpoint_policy`).

    Returns:
      The wrapped function or module class.

    Example::

        Block = jzero.remat(MyBlock, "dots_saveable", prevent_cse=False)
        Stack = nn.scan(Block, variable_axes={"params": 0}, split_rngs={"params": True}, length=12)
    """
    import flax.linen as nn
    import jax

    name = policy_name(policy)
    if isinstance(target, type) and issubclass(target, nn.Module):
        return nn.remat(target, prevent_cse=prevent_cse, policy=checkpoint_policy(name, also_save))
    return jax.checkpoint(target, prevent_cse=prevent_cse, policy=checkpoint_policy(name, also_save))
