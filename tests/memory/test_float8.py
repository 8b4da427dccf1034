"""Float8 matmuls (:mod:`jzero.memory.float8`) against an independent reference.

The reference never calls the code under test: it quantizes with numpy and ``ml_dtypes`` in float64
by the rule the module states (current scaling: a float32 scale maps the largest magnitude of the
tensor, or of each slice along the contracted dimension, onto the format's largest value; the value
divided by it, clipped, rounded to the nearest float8), multiplies in float64 and multiplies the
scales back.

Where a value divided by its scale lies within float32's rounding of a float8 rounding midpoint, the
code's float32 arithmetic may round it either way (XLA computes ``x / scale`` as ``x * (1 / scale)``
under jit, and a 16-bit input makes exact midpoints common: 448 * x / amax is then a ratio of short
integers). The reference accepts either neighbour there, and carries the difference through the
product as an allowance of its own (:func:`quantize`'s ``ambiguity``), exactly zero elsewhere.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jzero.memory import float8

E4M3, E5M2 = ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2
TOP = {E4M3: 448.0, E5M2: 57344.0}  # the formats' largest finite values
DIMS = (((1,), (0,)), ((), ()))  # what Dense passes for a [m, k] input: contract its last with the kernel's first
M, K, N = 64, 128, 96
# A value within this relative distance of a float8 rounding midpoint may round either way in float32
# arithmetic: the scale (amax / top, rounded to float32), its reciprocal and the product with it are
# each within 2**-24 of exact, so within 2**-22 together; 2**-20 leaves a margin of 4.
NEAR_TIE = 2.0**-20
U32 = 2.0**-24  # float32's unit roundoff
OUT_ROUNDING = {jnp.float32: U32, jnp.bfloat16: 2.0**-8}  # the output dtype's unit roundoff (8 significant bits: 2**-8)


def f64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


def quantize(a: np.ndarray, dtype, axis=None):
    """``a`` (float64) in the float8 ``dtype`` with a float32 scale per tensor (``axis`` None) or per
    slice along ``axis``, dequantized: ``(values, ambiguity, scale)``, all float64. ``ambiguity`` is
    the gap between the two float8 neighbours where the scaled value is within :data:`NEAR_TIE` of
    their midpoint (times the scale), 0 elsewhere."""
    top = TOP[dtype]
    amax = np.max(np.abs(a), axis=axis, keepdims=True)
    scale = np.where(amax > 0, f64(np.float32(amax / top)), 1.0)  # the module's scale is float32
    t = a / scale

    def rounded(v):
        return f64(np.clip(v, -top, top).astype(dtype))

    ambiguity = np.abs(rounded(t * (1 + NEAR_TIE)) - rounded(t * (1 - NEAR_TIE))) * scale
    return rounded(t) * scale, ambiguity, scale


def reference_gemm(a, b, a_type, b_type, rowwise):
    """``a [m, k] @ b [k, n]`` with ``a`` and ``b`` quantized along ``k`` (per row of ``a`` and column
    of ``b`` when ``rowwise``): ``(product, ambiguity)``, the second bounding what a midpoint's other
    neighbour changes."""
    qa, da, _ = quantize(a, a_type, 1 if rowwise else None)
    qb, db, _ = quantize(b, b_type, 0 if rowwise else None)
    return qa @ qb, da @ np.abs(qb) + np.abs(qa) @ db + da @ db


def tolerance(ref, ambiguity, absum, k, out_dtype):
    """What the code's GEMM may differ from the reference by, per element (a bound, derived):

    - ``ambiguity``: a midpoint's other neighbour (:func:`quantize`);
    - ``acc``: the float32 accumulation of ``k`` products, at most ``k`` float32 roundings of the
      running sum of magnitudes, ``absum`` (the inputs' sum |a||b|: the quantized operands' is at
      most (1 + 2**-4)**2 < 1.2 times it);
    - the output's roundings: to the output dtype after the GEMM and again after the scales multiply
      (2u + u**2 of the value, u the output dtype's unit roundoff), and 16 float32 ulps for the two
      multiplications by the scales and the scales themselves (XLA may compute amax / 448 as
      amax * (1 / 448), an ulp or two off the float32 quotient).
    """
    u = OUT_ROUNDING[out_dtype]
    acc = k * U32 * 1.2 * absum
    return ambiguity + acc + (2 * u + u * u + 16 * U32) * (np.abs(ref) + ambiguity + acc)


def inputs(dtype, seed=0, shapes=((M, K), (K, N), (M, N))):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s), dtype) for s in shapes]


def matmul(recipe):
    fn = float8.dot_general(recipe)
    return lambda x, w: fn(x, w, DIMS)


# -- scaled_cast ---------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("axis", [None, 0, 1], ids=["tensor", "column", "row"])
def test_scaled_cast_puts_the_largest_magnitude_on_the_formats_largest(dtype, axis):
    (x,) = inputs(jnp.float32, seed=1, shapes=((M, K),))
    x = x.at[3].set(0.0)  # an all-zero row: its own scale (per row) is 1
    values, scale = float8.scaled_cast(x, jnp.dtype(dtype), axis)
    assert values.dtype == jnp.dtype(dtype) and scale.dtype == jnp.float32
    want_shape = {None: (1, 1), 0: (1, K), 1: (M, 1)}[axis]
    assert scale.shape == want_shape
    v = f64(values)
    # the largest magnitude of each slice is the format's largest, exactly
    largest = np.max(np.abs(v), axis=axis, keepdims=True)
    if axis == 1:
        assert largest[3, 0] == 0 and f64(scale)[3, 0] == 1.0
        largest = np.delete(largest, 3, axis=0)
    np.testing.assert_array_equal(largest, TOP[dtype])
    # the scale is amax / top in float32: XLA may compute it as amax * (1 / top), two float32
    # roundings, within 2 U32 of the quotient (measured 1.97 U32 on the rows); 4 U32 for a margin
    amax = np.max(np.abs(f64(x)), axis=axis, keepdims=True)
    want = np.where(amax > 0, amax / TOP[dtype], 1.0)
    np.testing.assert_allclose(f64(scale), want, rtol=4 * U32, atol=0)
    # and every value is the reference's rounding (either neighbour at a midpoint)
    ref, ambiguity, _ = quantize(f64(x), dtype, axis)
    gap = np.abs(v * f64(scale) - ref)
    assert np.all(gap <= ambiguity + 4 * U32 * np.abs(ref)), np.max(gap - ambiguity)
    assert np.count_nonzero(ambiguity) < 0.001 * x.size  # float32 random inputs: midpoints are rare


@pytest.mark.parametrize("dtype", [E4M3, E5M2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("axis", [None, 1])
def test_scaled_cast_of_zeros_has_scale_one(dtype, axis):
    values, scale = float8.scaled_cast(jnp.zeros((16, 32), jnp.bfloat16), jnp.dtype(dtype), axis)
    np.testing.assert_array_equal(f64(scale), 1.0)
    np.testing.assert_array_equal(f64(values), 0.0)
    assert values.dtype == jnp.dtype(dtype)
    top = TOP[dtype]
    got = f64(float8.scale_for(jnp.asarray([0.0, top, 2 * top, top / 4]), jnp.dtype(dtype)))
    np.testing.assert_array_equal(got, [1.0, 1.0, 2.0, 0.25])


def test_cast_clips_to_the_formats_range():
    """e4m3fn has no infinity: a value past 448 would turn into NaN unless clipped."""
    got = f64(float8.cast(jnp.asarray([1000.0, -1000.0, 448.0, 3.0]), jnp.dtype(E4M3), jnp.float32(1.0)))
    np.testing.assert_array_equal(got, [448.0, -448.0, 448.0, 3.0])
    got = f64(float8.cast(jnp.asarray([1e6, -1e6]), jnp.dtype(E5M2), jnp.float32(1.0)))
    np.testing.assert_array_equal(got, [57344.0, -57344.0])


# -- the forward ---------------------------------------------------------------------------------
#
# Measured here (jax 0.10, XLA:CPU) on these inputs, the largest gap to the reference as a fraction
# of `tolerance`: float32 inputs 0.004 (tensorwise) and 0.009 (rowwise), the float32 accumulation;
# bfloat16 inputs 0.48 tensorwise (XLA folds the GEMM's bf16 output into the scaling's float32, so
# one bf16 rounding of the two allowed) and 0.97 rowwise (its row scales make exact midpoints common,
# and where the code took a midpoint's other neighbour the gap is that allowance itself). The other
# recipe's quantization, or e5m2 for an operand, is off by 0.028 x sum |x||w| somewhere: 1,100x to
# 3,800x the tolerance.


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_forward_equals_the_reference(recipe, dtype):
    x, w, _ = inputs(dtype)
    y = jax.jit(matmul(recipe))(x, w)
    assert y.dtype == dtype and y.shape == (M, N)
    x64, w64 = f64(x), f64(w)
    ref, ambiguity = reference_gemm(x64, w64, E4M3, E4M3, recipe == "rowwise")
    tol = tolerance(ref, ambiguity, np.abs(x64) @ np.abs(w64), K, dtype)
    gap = np.abs(f64(y) - ref)
    assert np.all(gap <= tol), f"largest gap {np.max(gap / tol):.3g} x the tolerance"


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_forward_is_within_float8_rounding_of_the_exact_product(recipe, dtype):
    """The bound, per output element, against the inputs' exact product (float64 of the inputs):

    e4m3 has 3 mantissa bits, so a normal value x / s rounds within u = 2**-4 of itself relative, a
    subnormal one (below 2**-6) within half its spacing 2**-9, so |x^ - x| <= u|x| + a s with
    a = 2**-10 and s the operand's scale (the tensor's, or the element's row's or column's). Then
    |x^ w^ - x w| <= |x||w^ - w| + |w||x^ - x| + |x^ - x||w^ - w|
                  <= ((1 + u)**2 - 1)|x||w| + (1 + u)(a s_w |x| + a s_x |w|) + a**2 s_x s_w,
    summed over k; plus the float32 accumulation and the output's roundings (:func:`tolerance`).
    Measured here: the largest error is 0.15 to 0.17 of that bound (the bound adds every element's
    error with the same sign; random errors mostly cancel), 0.019 to 0.022 of sum |x||w|, where a
    plain float32 product is 1e-7 off and a bf16 one 0.0015.
    """
    x, w, _ = inputs(dtype)
    y = f64(jax.jit(matmul(recipe))(x, w))
    x64, w64 = f64(x), f64(w)
    exact = x64 @ w64
    rowwise = recipe == "rowwise"
    _, _, sx = quantize(x64, E4M3, 1 if rowwise else None)
    _, _, sw = quantize(w64, E4M3, 0 if rowwise else None)
    u, a = 2.0**-4, 2.0**-10
    ax, aw = np.abs(x64), np.abs(w64)
    quant = ((1 + u) ** 2 - 1) * (ax @ aw) + (1 + u) * a * (ax @ (sw * np.ones_like(w64)) + (sx * np.ones_like(x64)) @ aw)
    quant += K * a * a * sx * sw
    u_out = OUT_ROUNDING[dtype]
    acc = K * U32 * 1.2 * (ax @ aw)
    bound = quant + acc + (2 * u_out + u_out**2 + 16 * U32) * (np.abs(exact) + quant + acc)
    err = np.abs(y - exact)
    assert np.all(err <= bound), f"largest error {np.max(err / bound):.3g} x the bound"
    # and float8 did happen: measured, float8 is off by 0.019 to 0.022 of sum |x||w| somewhere, a
    # plain float32 product by 1e-7, a plain bf16 one by 0.0015
    assert np.max(err / (ax @ aw)) > 0.005


@pytest.mark.parametrize("seed", [2, 8])
def test_rowwise_is_closer_than_tensorwise_when_rows_differ_in_magnitude(seed):
    """Every eighth row 1e3 (then 1e4) times larger: one scale for the whole tensor puts the other
    rows' values that much lower in e4m3's range, towards its subnormals (below 2**-6 of 448's
    scale, spacing 2**-9), where the relative error grows; each row's own scale keeps them on the
    format's 3 mantissa bits. e4m3's normal range spans 2**15, so at 1e3 only the small rows' tail
    is subnormal and the difference is small; at 1e4 most of it is.

    Measured here (seeds 2, 8, 9), the small rows' relative error (Frobenius) of the product: rowwise
    0.0357 to 0.0369 at both scales; tensorwise 0.0370 to 0.0381 at 1e3, 0.0485 to 0.0567 at 1e4."""
    x, w, _ = inputs(jnp.float32, seed=seed)
    small = np.ones(M, bool)
    small[::8] = False

    def small_rows_error(recipe, x):
        exact = f64(x) @ f64(w)
        y = f64(jax.jit(matmul(recipe))(x, w))
        return np.linalg.norm((y - exact)[small]) / np.linalg.norm(exact[small])

    for factor, ratio in ((1e3, 1.0), (1e4, 0.85)):
        scaled = x.at[~small].multiply(factor)
        rowwise, tensorwise = small_rows_error("rowwise", scaled), small_rows_error("tensorwise", scaled)
        assert rowwise < ratio * tensorwise, (factor, rowwise, tensorwise)


# -- the backward --------------------------------------------------------------------------------
#
# dx = g @ w.T and dw = x.T @ g, each GEMM quantized along its contracted dimension: tensorwise, g in
# e5m2 with one scale and x, w in e4m3 with one each; rowwise, all in e4m3, g per row (over n) and
# w.T per column (its rows, over n) for dx, x.T per row (x's columns, over m) and g per column (over
# m) for dw. Measured here as a fraction of `tolerance`: float32 up to 0.023, bfloat16 0.49
# (tensorwise) and 0.99 (rowwise: midpoints, as in the forward); e4m3 for tensorwise's gradient, or
# e5m2 for rowwise's, is off by 0.04 x sum |g||w| somewhere: 2,200x to 12,700x the tolerance, the
# other recipe's scaling 1,100x to 13,800x.


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_backward_equals_the_reference(recipe, dtype):
    x, w, g = inputs(dtype, seed=3)
    f = matmul(recipe)
    dx, dw = jax.jit(jax.grad(lambda x, w: jnp.sum(f(x, w) * g), argnums=(0, 1)))(x, w)
    assert dx.dtype == dtype and dw.dtype == dtype and dx.shape == (M, K) and dw.shape == (K, N)
    x64, w64, g64 = f64(x), f64(w), f64(g)
    rowwise = recipe == "rowwise"
    grad_type = E4M3 if rowwise else E5M2
    for got, (a, b, a_type, b_type), k in (
        (dx, (g64, w64.T, grad_type, E4M3), N),
        (dw, (x64.T, g64, E4M3, grad_type), M),
    ):
        ref, ambiguity = reference_gemm(a, b, a_type, b_type, rowwise)
        tol = tolerance(ref, ambiguity, np.abs(a) @ np.abs(b), k, dtype)
        gap = np.abs(f64(got) - ref)
        assert np.all(gap <= tol), f"largest gap {np.max(gap / tol):.3g} x the tolerance"


def test_backward_through_vjp_and_leading_dimensions():
    """Inputs [b, s, k] (what a layer passes): the rows are b * s, and the vjp's cotangent is taken as is."""
    x, w, g = inputs(jnp.float32, seed=4, shapes=((4, 16, K), (K, N), (4, 16, N)))
    fn = float8.dot_general("rowwise")
    y, vjp = jax.vjp(lambda x, w: fn(x, w, (((2,), (0,)), ((), ()))), x, w)
    dx, dw = vjp(g)
    x64, w64, g64 = f64(x).reshape(-1, K), f64(w), f64(g).reshape(-1, N)
    for got, (a, b), k in ((y, (x64, w64), K), (dx, (g64, w64.T), N), (dw, (x64.T, g64), 64)):
        ref, ambiguity = reference_gemm(a, b, E4M3, E4M3, True)
        tol = tolerance(ref, ambiguity, np.abs(a) @ np.abs(b), k, jnp.float32)
        gap = np.abs(f64(got).reshape(ref.shape) - ref)
        assert np.all(gap <= tol), f"largest gap {np.max(gap / tol):.3g} x the tolerance"


# -- what float8 cannot take, and what it refuses ------------------------------------------------


@pytest.mark.parametrize("shape", [(100, N), (K, 100)], ids=["k100", "n100"])
def test_a_kernel_not_a_multiple_of_16_keeps_a_plain_dot(shape):
    k, n = shape
    x, w, g = inputs(jnp.float32, seed=5, shapes=((M, k), (k, n), (M, n)))
    reason = float8.kept_reason(shape)
    assert str(shape) in reason and "16" in reason
    f = matmul("tensorwise")
    plain = jax.lax.dot_general(x, w, DIMS)
    jitted_plain = jax.jit(lambda x, w: jax.lax.dot_general(x, w, DIMS))(x, w)
    np.testing.assert_array_equal(np.asarray(jax.jit(f)(x, w)), np.asarray(jitted_plain))
    np.testing.assert_array_equal(np.asarray(f(x, w)), np.asarray(plain))
    dx, dw = jax.grad(lambda x, w: jnp.sum(f(x, w) * g), argnums=(0, 1))(x, w)
    # float32's own summation against float64's: the classic bound, contracted length x 2^-24 x
    # sum |a||b| (measured gaps 5e-6 to 1.3e-5, 0.02-0.05 of it): any summation order stays inside
    for got, a, b in ((dx, f64(g), f64(w).T), (dw, f64(x).T, f64(g))):
        assert np.all(np.abs(f64(got) - a @ b) <= a.shape[1] * 2.0**-24 * (np.abs(a) @ np.abs(b))), (a.shape, b.shape)


def test_kept_reason_is_empty_for_multiples_of_16():
    assert float8.kept_reason((K, N)) == ""
    assert float8.kept_reason((16, 4096)) == ""
    assert float8.kept_reason((48, 8)) != ""


@pytest.mark.parametrize("recipe", ["none", "float8", "", "TENSORWISE"])
def test_a_recipe_that_is_not_float8s_is_refused(recipe):
    with pytest.raises(ValueError, match="recipe"):
        float8.dot_general(recipe)


@pytest.mark.parametrize(
    "x_shape, w_shape, dims",
    [
        ((K, M), (K, N), (((0,), (0,)), ((), ()))),  # the input's first dimension contracted
        ((M, K), (N, K), (((1,), (1,)), ((), ()))),  # the kernel's last
        ((16, M, K), (16, K, N), (((2,), (1,)), ((0,), (0,)))),  # a batch dimension
    ],
    ids=["lhs-first", "rhs-last", "batched"],
)
def test_other_dimension_numbers_are_refused(x_shape, w_shape, dims):
    x, w = inputs(jnp.float32, seed=6, shapes=(x_shape, w_shape))
    with pytest.raises(ValueError, match="contract"):
        float8.dot_general("rowwise")(x, w, dims)


# -- the wiring into flax ------------------------------------------------------------------------


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_a_flax_dense_multiplies_in_float8(recipe):
    x, _, g = inputs(jnp.float32, seed=7, shapes=((2, 32, K), (1,), (2, 32, N)))
    dense = nn.Dense(N, use_bias=False, dot_general=float8.dot_general(recipe))
    params = dense.init(jax.random.key(0), x)
    kernel = params["params"]["kernel"]
    assert kernel.dtype == jnp.float32 and kernel.shape == (K, N)
    y = jax.jit(dense.apply)(params, x)
    direct = matmul(recipe)(x.reshape(-1, K), kernel).reshape(2, 32, N)
    # equal to float32's rounding (jit fuses the scaling differently from op-by-op; measured 7e-7 and 0
    # of values near 3.5, within rtol 1e-6 x 3.5 + 1e-6); the other recipe, or a plain Dense, is 1e-2 off
    np.testing.assert_allclose(np.asarray(y), np.asarray(direct), rtol=1e-6, atol=1e-6)
    plain = np.asarray(nn.Dense(N, use_bias=False).apply(params, x))
    assert not np.allclose(np.asarray(y), plain, rtol=1e-4, atol=1e-4)  # not the plain Dense
    # its kernel's gradient is float8's too
    grad = jax.jit(jax.grad(lambda p: jnp.sum(dense.apply(p, x) * g)))(params)["params"]["kernel"]
    want = jax.grad(lambda k: jnp.sum(matmul(recipe)(x.reshape(-1, K), k) * g.reshape(-1, N)))(kernel)
    assert grad.dtype == jnp.float32
    # Measured: 5.7e-6 (tensorwise) and 1.9e-6 (rowwise) where values reach about 3.5, float32's
    # reordering between jit and op-by-op (its floor); atol 6e-5 is 10x the larger, float8's own
    # error (1e-2) still 160x over it
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want), rtol=0, atol=6e-5)
