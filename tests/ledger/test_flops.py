"""The matmul FLOPs read from compiled HLO (jzero.ledger.flops): dots wherever they sit, loops by
their trip counts, cuDNN's attention from its shapes, and the compute between an async
collective's start and done."""

import jax
import jax.numpy as jnp

from jzero.ledger.flops import flops_between, matmul_flops, program_flops
from jzero.ledger.hlo import parse_collectives

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


CUBLAS = """\
HloModule m

ENTRY %main (a: bf16[64,128], b: bf16[32,128], c: f32[8,16,24], d: f32[8,24,40]) -> bf16[64,32] {
  %a = bf16[64,128]{1,0} parameter(0)
  %b = bf16[32,128]{1,0} parameter(1)
  %c = f32[8,16,24]{2,1,0} parameter(2)
  %d = f32[8,24,40]{2,1,0} parameter(3)
  %g = (bf16[64,32]{1,0}, s8[4194304]{0}) custom-call(%a, %b), custom_call_target="__cublas$gemm", \
backend_config={"gemm_backend_config":{"alpha_real":1,"beta":0,"dot_dimension_numbers":{"lhs_contracting_dimensions":["1"],\
"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":[],"rhs_batch_dimensions":[]},"epilogue":"DEFAULT"}}
  %lt = (f32[8,16,40]{2,1,0}, s8[4194304]{0}) custom-call(%c, %d), custom_call_target="__cublas$lt$matmul", \
backend_config={"gemm_backend_config":{"dot_dimension_numbers":{"lhs_contracting_dimensions":["2"],\
"rhs_contracting_dimensions":["1"],"lhs_batch_dimensions":["0"],"rhs_batch_dimensions":["0"]}}}
  %x = f32[64,32]{1,0} custom-call(%a, %b), custom_call_target="__someone$gemm"
  ROOT %r = bf16[64,32]{1,0} get-tuple-element(%g), index=0
}
"""


def test_cublas_gemm_custom_calls_count_like_dots():
    # With Triton GEMMs off XLA lowers every matmul to cuBLAS: these counted 0 (MFU 484% for gpt-7b).
    counted = matmul_flops(CUBLAS)
    assert counted.executed == 2 * 64 * 32 * 128 + 2 * (8 * 16 * 40) * 24
    assert counted.uncounted == ("__someone$gemm",)  # a GEMM-like op jzero skips is named, for the plan to say


def _without_trip_count(text: str, bound: str, first: int = 0) -> str:
    """HANDWRITTEN with XLA's known_trip_count gone and the condition comparing the counter to ``bound``."""
    text = text.replace(', backend_config={"known_trip_count":{"n":"4"}}', "")
    compare = f"""%cmp (p: s32[], q: s32[]) -> pred[] {{
  %p = s32[] parameter(0)
  %q = s32[] parameter(1)
  %four = s32[] constant(4)
  ROOT %lt = pred[] compare(%p, {bound}), direction=LT
}}

"""
    cond = """  %i = s32[] get-tuple-element(%s), index=0
  ROOT %c = pred[] fusion(%i, %i), kind=kLoop, calls=%cmp"""
    # The loop starts its counter from a constant, as XLA's pipelined loops do (copied in).
    start = f"""  %zero = s32[] constant({first})
  %first = s32[] copy(%zero)
  %xa = bf16[64,128]{{1,0}} get-tuple-element(%x), index=1
  %xb = bf16[128,32]{{1,0}} get-tuple-element(%x), index=2
  %init = (s32[], bf16[64,128]{{1,0}}, bf16[128,32]{{1,0}}) tuple(%first, %xa, %xb)
  ROOT %w = (s32[], bf16[64,128]{{1,0}}, bf16[128,32]{{1,0}}) while(%init),"""
    assert "known_trip_count" not in text
    text = text.replace("  ROOT %w = (s32[], bf16[64,128]{1,0}, bf16[128,32]{1,0}) while(%x),", start)
    return text.replace("HloModule m\n\n", "HloModule m\n\n" + compare).replace("  ROOT %c = pred[] constant(true)", cond)


def test_a_loop_without_known_trip_count_takes_it_from_its_condition():
    text = _without_trip_count(HANDWRITTEN, "%four")
    recovered = matmul_flops(text)
    assert recovered.executed == 4 * (DOT + ATTENTION) and recovered.unknown_loops == ()
    assert [op.executions for op in parse_collectives(text)] == [4]  # the collectives' bytes count it too


def test_a_pipelined_loop_counts_from_its_counters_first_value():
    # XLA's collective pipeliner peeled a microbatch loop of 3: its counter ran from 1 while below 2.
    text = _without_trip_count(HANDWRITTEN, "%four", first=3)
    assert matmul_flops(text).executed == DOT + ATTENTION
    assert [op.executions for op in parse_collectives(text)] == [1]


def test_a_loop_whose_trip_count_cannot_be_recovered_is_named_not_silently_once():
    lost = matmul_flops(_without_trip_count(HANDWRITTEN, "%q"))  # a bound that is not a constant
    assert lost.unknown_loops == ("w",) and lost.executed == DOT + ATTENTION


OVERLAPPING = """\
HloModule m

ENTRY %main (a: bf16[64,128], b: bf16[128,32]) -> bf16[64,32] {
  %a = bf16[64,128]{1,0} parameter(0)
  %b = bf16[128,32]{1,0} parameter(1)
  %ag1 = (bf16[16,32]{1,0}, bf16[128,32]{1,0}) all-gather-start(%b), replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %ag2 = (bf16[16,32]{1,0}, bf16[128,32]{1,0}) all-gather-start(%b), replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %d1 = bf16[64,32]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ag1d = bf16[128,32]{1,0} all-gather-done(%ag1)
  %d2 = bf16[64,32]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  %ag2d = bf16[128,32]{1,0} all-gather-done(%ag2)
  %ag3 = (bf16[16,32]{1,0}, bf16[128,32]{1,0}) all-gather-start(%b), replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %d3 = bf16[64,32]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %ag3d = bf16[128,32]{1,0} all-gather-done(%ag3)
}
"""


def test_overlapping_collectives_share_one_window_of_compute():
    counted = matmul_flops(OVERLAPPING)
    assert counted.between == {"ag1": DOT, "ag2": 2 * DOT, "ag3": DOT}  # each alone would claim d1
    shared = ("main/ag1", 2 * DOT)  # d1 and d2 once, for ag1 and ag2 together
    assert counted.windows == {"ag1": shared, "ag2": shared, "ag3": ("main/ag3", DOT)}
