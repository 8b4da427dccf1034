"""The matmul FLOPs read from compiled HLO (jzero.ledger.flops): dots wherever they sit, loops by
their trip counts, cuDNN's attention from its shapes, and the compute between an async
collective's start and done."""

import jax
import jax.numpy as jnp

from jzero.ledger.flops import flops_between, program_flops

HANDWRITTEN = """\
HloModule m

%fused_dot (p0: bf16[64,128], p1: bf16[128,32]) -> bf16[64,32] {
  %p0 = bf16[64,128]{1,0} parameter(0)
  %p1 = bf16[128,32]{1,0} parameter(1)
  ROOT %dot.1 = bf16[64,32]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (s: (s32[], bf16[64,128], bf16[128,32])) -> (s32[], bf16[64,128], bf16[128,32]) {
  %s = (s32[], bf16[64,128]{1,0}, bf16[128,32]{1,0}) parameter(0)
  %a = bf16[64,128]{1,0} get-tuple-element(%s), index=1
  %b = bf16[128,32]{1,0} get-tuple-element(%s), index=2
  %ag = (bf16[16,32]{1,0}, bf16[128,32]{1,0}) all-gather-start(%b), replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %f = bf16[64,32]{1,0} fusion(%a, %b), kind=kCustom, calls=%fused_dot
  %agd = bf16[128,32]{1,0} all-gather-done(%ag)
  %q = bf16[2,256,4,64]{3,2,1,0} parameter(1)
  %att = (bf16[2,256,4,64]{3,2,1,0}, u8[0]{0}) custom-call(%q, %q, %q), custom_call_target="__cudnn$fmhaSoftmax", \
backend_config={"mask_type":"CAUSAL"}
  ROOT %t = (s32[], bf16[64,128]{1,0}, bf16[128,32]{1,0}) tuple(%a, %a, %agd)
}

%cond (s: (s32[], bf16[64,128], bf16[128,32])) -> pred[] {
  %s = (s32[], bf16[64,128]{1,0}, bf16[128,32]{1,0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (x: (s32[], bf16[64,128], bf16[128,32])) -> (s32[], bf16[64,128], bf16[128,32]) {
  %x = (s32[], bf16[64,128]{1,0}, bf16[128,32]{1,0}) parameter(0)
  ROOT %w = (s32[], bf16[64,128]{1,0}, bf16[128,32]{1,0}) while(%x), condition=%cond, body=%body, \
backend_config={"known_trip_count":{"n":"4"}}
}
"""
DOT = 2 * 64 * 32 * 128
ATTENTION = 2 * (2 * 2 * 4 * 256 * 256 * 64) // 2  # two matmuls of 2 B N T S H, half of them under a causal mask


def test_handwritten_program_counts_each_dot_and_attention_per_loop_iteration():
    assert program_flops(HANDWRITTEN) == 4 * (DOT + ATTENTION)


def test_the_compute_between_a_start_and_its_done_hides_it():
    assert flops_between(HANDWRITTEN) == {"ag": DOT}


def test_a_compiled_scan_of_matmuls_counts_every_iteration():
    def f(x, ws):
        return jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)[0]

    x, ws = jnp.ones((32, 64)), jnp.ones((5, 64, 64))
    text = jax.jit(f).lower(x, ws).compile().as_text()
    assert program_flops(text) == 5 * 2 * 32 * 64 * 64
