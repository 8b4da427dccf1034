"""Float8 matmuls with current scaling, as a ``dot_general`` for a Flax ``Dense``.

Each operand is cast to float8 with a scale from its own largest magnitude at this step ("current"
scaling, torchao's ``Float8Linear``): the whole tensor's (``tensorwise``) or each row's along the
contracted dimension (``rowwise``), so the largest value lands on the format's largest. The GEMM
takes the float8 operands (on Hopper, XLA's float8 GEMM) and the scales multiply its output.

- forward: ``x`` and the kernel in e4m3;
- backward: the output's gradient in e5m2 under ``tensorwise`` (torchao's default recipe), e4m3
  under ``rowwise`` (torchao's ``rowwise``); each GEMM re-scales its operands along the dimension it
  contracts.

The parameters and their gradients stay in their own dtypes: only the GEMMs' inputs are float8.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from jzero.dtypes import FP8_RECIPES
from jzero.memory.remat import FLOAT8_OUTPUT

__all__ = ["E4M3", "E5M2", "MULTIPLE", "cast", "dot_general", "kept_reason", "scale_for", "scaled_cast"]

E4M3, E5M2 = jnp.float8_e4m3fn, jnp.float8_e5m2
# cuBLASLt's float8 GEMMs need every dimension of both operands a multiple of 16.
MULTIPLE = 16


def scale_for(amax: jax.Array, dtype: Any) -> jax.Array:
    """The float32 scale that maps ``amax`` onto the float8 ``dtype``'s largest value (1 where it is 0)."""
    return jnp.where(amax > 0, amax / float(jnp.finfo(dtype).max), 1.0).astype(jnp.float32)


def cast(x: jax.Array, dtype: Any, scale: jax.Array) -> jax.Array:
    """``x / scale`` in the float8 ``dtype``, clipped to its range."""
    top = float(jnp.finfo(dtype).max)
    return jnp.clip(x.astype(jnp.float32) / scale, -top, top).astype(dtype)


def scaled_cast(x: jax.Array, dtype: Any, axis: int | None = None) -> tuple[jax.Array, jax.Array]:
    """``x`` in the float8 ``dtype``, divided by a float32 scale that maps its largest magnitude (the
    whole tensor's, or each slice's along ``axis``) onto the format's largest value.

    Returns:
      ``(values, scale)``: ``values * scale`` is ``x`` to float8's rounding; ``scale`` keeps ``x``'s
      rank (size 1 on the reduced dimensions). An all-zero slice has scale 1.
    """
    scale = scale_for(jnp.max(jnp.abs(x.astype(jnp.float32)), axis=axis, keepdims=True), dtype)
    return cast(x, dtype, scale), scale


def _gemm(a: jax.Array, b: jax.Array, a_type: Any, b_type: Any, rowwise: bool, out: Any) -> jax.Array:
    """``a [m, k] @ b [k, n]`` with both in float8, scaled along ``k`` (per row of ``a`` and column of
    ``b`` when ``rowwise``), the result in ``out``."""
    qa, sa = scaled_cast(a, a_type, 1 if rowwise else None)
    qb, sb = scaled_cast(b, b_type, 0 if rowwise else None)
    # The GEMM writes ``out`` and the scales follow: a second rounding (2^-8 at most in bf16, against
    # e4m3's 2^-4). A float32 output, rounded once, made XLA's GPU schedule hide less: Llama 3.1 8B on
    # h100x8 exposed 63 ms of collectives a step against 8 (docs/design.md, "Float8").
    y = jax.lax.dot_general(qa, qb, (((1,), (0,)), ((), ())), preferred_element_type=out)
    return (y.astype(jnp.float32) * sa * sb).astype(out)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _matmul(x: jax.Array, w: jax.Array, recipe: str) -> jax.Array:
    rows = x.reshape(-1, x.shape[-1])
    return _gemm(rows, w, E4M3, E4M3, recipe == "rowwise", x.dtype).reshape(*x.shape[:-1], w.shape[-1])


def _forward(x: jax.Array, w: jax.Array, recipe: str) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _matmul(x, w, recipe), (x, w)


def _backward(recipe: str, saved: tuple[jax.Array, jax.Array], g: jax.Array) -> tuple[jax.Array, jax.Array]:
    x, w = saved
    rowwise = recipe == "rowwise"
    grad = E4M3 if rowwise else E5M2
    rows, g2 = x.reshape(-1, x.shape[-1]), g.reshape(-1, g.shape[-1])
    dx = _gemm(g2, w.T, grad, E4M3, rowwise, x.dtype).reshape(x.shape)
    dw = _gemm(rows.T, g2, E4M3, grad, rowwise, w.dtype)
    return dx, dw


_matmul.defvjp(_forward, _backward)


def dot_general(recipe: str) -> Callable[..., jax.Array]:
    """A ``dot_general`` for ``flax.linen.Dense`` (its ``dot_general`` field) that multiplies in
    float8 by ``recipe`` (``tensorwise`` or ``rowwise``, :data:`jzero.dtypes.FP8_RECIPES`).

    It takes what Dense passes it: inputs ``[..., k]`` contracted on their last dimension with a
    kernel ``[k, n]``; ``precision`` is ignored (the GEMM is float8's). A kernel float8 cannot take
    (:func:`kept_reason`) keeps the inputs' dtype."""
    if recipe not in FP8_RECIPES[1:]:
        raise ValueError(f"a float8 recipe is one of {FP8_RECIPES[1:]}, got {recipe!r}")

    def float8_dot_general(x, w, dimension_numbers, precision=None, preferred_element_type=None):
        if kept_reason(w.shape):
            return jax.lax.dot_general(x, w, dimension_numbers, precision, preferred_element_type)
        (lhs, rhs), batch = dimension_numbers
        if tuple(lhs) != (x.ndim - 1,) or tuple(rhs) != (0,) or any(batch) or w.ndim != 2:
            raise ValueError(f"float8 matmuls contract inputs' last dimension with a 2-D kernel's first, got {dimension_numbers}")
        # Named outside the custom_vjp, where a checkpoint policy sees it (jzero.memory.remat).
        return checkpoint_name(_matmul(x, w, recipe), FLOAT8_OUTPUT)

    return float8_dot_general


def kept_reason(kernel_shape: Sequence[int]) -> str:
    """Why a kernel of ``kernel_shape`` ``[k, n]`` keeps a 16-bit GEMM, or '' when float8 can take it."""
    odd = [int(d) for d in kernel_shape if int(d) % MULTIPLE]
    if odd:
        return f"its shape {tuple(int(d) for d in kernel_shape)} is not a multiple of {MULTIPLE} (float8 GEMMs need that)"
    return ""
