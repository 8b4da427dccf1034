"""The HBM bytes of a program's non-matmul work (jzero.ledger.traffic.hbm_bytes), on a handwritten
layer loop whose every byte is counted here by hand."""

from jzero.ledger.traffic import hbm_bytes

L, D, T = 4, 256, 512  # layers in the loop, width, tokens
W = D * D * 2  # one layer's bf16 weight, bytes
X = T * D * 2  # one bf16 activation, bytes
CARRY = f"(s32[], bf16[{L},{D},{D}], bf16[{T},{D}], bf16[{L},{T},{D}])"  # the loop's counter, weights, activation, saved stack
TRIPS = '{"known_trip_count":{"n":"' + str(L) + '"}}'

# A scan over L layers: each iteration slices its layer's weight out of the stack (a fusion that
# reads one layer, not L), multiplies (a cuBLAS GEMM: the compute term's, not here), applies an
# elementwise GELU-like fusion (reads X, writes X), all-gathers nothing of note (a collective: the
# communication term's), and writes its output into the saved stack in place (writes X, not L X).
PROGRAM = f"""\
HloModule m

%slice_layer (p0: bf16[{L},{D},{D}], p1: s32[]) -> bf16[1,{D},{D}] {{
  %p0 = bf16[{L},{D},{D}]{{2,1,0}} parameter(0)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  ROOT %ds = bf16[1,{D},{D}]{{2,1,0}} dynamic-slice(%p0, %p1, %z, %z), dynamic_slice_sizes={{1,{D},{D}}}
}}

%act (a: bf16[{T},{D}]) -> bf16[{T},{D}] {{
  %a = bf16[{T},{D}]{{1,0}} parameter(0)
  ROOT %m = bf16[{T},{D}]{{1,0}} multiply(%a, %a)
}}

%save (s: bf16[{L},{T},{D}], u: bf16[1,{T},{D}], i: s32[]) -> bf16[{L},{T},{D}] {{
  %s = bf16[{L},{T},{D}]{{2,1,0}} parameter(0)
  %u = bf16[1,{T},{D}]{{2,1,0}} parameter(1)
  %i = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %dus = bf16[{L},{T},{D}]{{2,1,0}} dynamic-update-slice(%s, %u, %i, %z, %z)
}}

%body (c: {CARRY}) -> {CARRY} {{
  %c = {CARRY} parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %ws = bf16[{L},{D},{D}]{{2,1,0}} get-tuple-element(%c), index=1
  %x = bf16[{T},{D}]{{1,0}} get-tuple-element(%c), index=2
  %saved = bf16[{L},{T},{D}]{{2,1,0}} get-tuple-element(%c), index=3
  %w = bf16[1,{D},{D}]{{2,1,0}} fusion(%ws, %i), kind=kLoop, calls=%slice_layer
  %wb = bf16[{D},{D}]{{1,0}} bitcast(%w)
  %g = (bf16[{T},{D}]{{1,0}}, s8[1024]{{0}}) custom-call(%x, %wb), custom_call_target="__cublas$gemm"
  %y = bf16[{T},{D}]{{1,0}} get-tuple-element(%g), index=0
  %ag = bf16[{T},{D}]{{1,0}} all-reduce(%y), replica_groups={{}}, to_apply=%act
  %h = bf16[{T},{D}]{{1,0}} fusion(%ag), kind=kLoop, calls=%act
  %hb = bf16[1,{T},{D}]{{2,1,0}} bitcast(%h)
  %new = bf16[{L},{T},{D}]{{2,1,0}} fusion(%saved, %hb, %i), kind=kLoop, calls=%save
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = {CARRY} tuple(%next, %ws, %h, %new)
}}

%cond (c: {CARRY}) -> pred[] {{
  %c = {CARRY} parameter(0)
  %i = s32[] get-tuple-element(%c), index=0
  %n = s32[] constant({L})
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}}

ENTRY %main (ws: bf16[{L},{D},{D}], x: bf16[{T},{D}], saved: bf16[{L},{T},{D}]) -> bf16[{T},{D}] {{
  %ws = bf16[{L},{D},{D}]{{2,1,0}} parameter(0)
  %x = bf16[{T},{D}]{{1,0}} parameter(1)
  %saved = bf16[{L},{T},{D}]{{2,1,0}} parameter(2)
  %zero = s32[] constant(0)
  %init = {CARRY} tuple(%zero, %ws, %x, %saved)
  %loop = {CARRY} while(%init), condition=%cond, body=%body, backend_config={TRIPS}
  %out = bf16[{T},{D}]{{1,0}} get-tuple-element(%loop), index=2
  ROOT %copy = bf16[{T},{D}]{{1,0}} copy(%out)
}}
"""


def test_a_layer_loops_hbm_bytes_counted_by_hand():
    # Per iteration: the slice reads one layer's weight (W) and writes it (W); the 4-byte index is
    # read too. The elementwise fusion reads X and writes X. The in-place save reads its update
    # (X) and the index, and writes only the update (X). The GEMM and the all-reduce move nothing
    # here; the counter's add reads two and writes one s32 (12 bytes).
    per_layer = (W + 4 + W) + (X + X) + (X + 4 + X) + 12
    entry = X + X  # the final copy reads and writes one activation
    assert hbm_bytes(PROGRAM) == L * per_layer + entry


def test_a_gemm_fusion_and_a_dot_are_the_compute_terms_not_memory():
    program = f"""\
HloModule g

%gemm (a: bf16[{T},{D}], b: bf16[{D},{D}]) -> bf16[{T},{D}] {{
  %a = bf16[{T},{D}]{{1,0}} parameter(0)
  %b = bf16[{D},{D}]{{1,0}} parameter(1)
  ROOT %d = bf16[{T},{D}]{{1,0}} dot(%a, %b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}

ENTRY %main (a: bf16[{T},{D}], b: bf16[{D},{D}]) -> bf16[{T},{D}] {{
  %a = bf16[{T},{D}]{{1,0}} parameter(0)
  %b = bf16[{D},{D}]{{1,0}} parameter(1)
  %f = bf16[{T},{D}]{{1,0}} fusion(%a, %b), kind=kCustom, calls=%gemm
  ROOT %d = bf16[{T},{D}]{{1,0}} dot(%f, %b), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
}}
"""
    assert hbm_bytes(program) == 0
