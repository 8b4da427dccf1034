"""HLO collective parsing, on text in each of XLA's spellings, and the paper's formula."""

import pytest

from jzero.ledger import group_size, paper_bytes_per_device, parse_collectives, summarize_collectives

HLO = """\
HloModule jit_step, entry_computation_layout={()->()}

%body.1 (p: (s32[], f32[2,64])) -> (s32[], f32[2,64]) {
  %all-gather.1 = f32[64,64]{1,0} all-gather(f32[8,64]{1,0} %x), channel_id=1, replica_groups=mesh['axis_0'=8,'axis_1'=1] {'axis_0'}, dimensions={0}
  %fusion = f32[4]{0} fusion(%y), kind=kLoop, calls=%fused_inner
}

%fused_inner (a: f32[4]) -> f32[4] {
  %all-reduce.9 = f32[4]{0} all-reduce(f32[4]{0} %a), replica_groups={{0,1,2,3},{4,5,6,7}}, to_apply=%add
}

%cond.1 (p: (s32[], f32[2,64])) -> pred[] {
  ROOT %lt = pred[] compare(%a, %b), direction=LT
}

ENTRY %main.5 (a: f32[8,64]) -> f32[64,64] {
  %while.1 = (s32[], f32[2,64]) while(%t), condition=%cond.1, body=%body.1
  %all-reduce.2 = (f32[16]{0}, bf16[8,8]{1,0}) all-reduce(%p, %q), replica_groups=[2,4]<=[8], to_apply=%add
  %all-gather-start.3 = (f32[8]{0}, f32[64]{0}) all-gather-start(f32[8]{0} %z), replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %all-gather-done.3 = f32[64]{0} all-gather-done(%all-gather-start.3)
  %reduce-scatter.4 = f32[8]{0} reduce-scatter(f32[64]{0} %g), replica_groups=[1,8]<=[8], dimensions={0}
}
"""


def test_parse_collectives_kinds_bytes_groups_and_loops():
    ops = parse_collectives(HLO)
    got = [(o.kind, o.bytes, o.group_size, o.in_loop) for o in ops]
    assert got == [
        ("all-gather", 64 * 64 * 4, 8, True),
        ("all-reduce", 16, 4, True),  # inside a fusion called from the loop body
        ("all-reduce", 16 * 4 + 64 * 2, 4, False),
        ("all-gather", 64 * 4, 8, False),  # async start: the result, not the operand
        ("reduce-scatter", 32, 8, False),
    ]
    summary = summarize_collectives(ops)
    assert summary["all-gather"] == {"count": 2, "bytes": 64 * 64 * 4 + 256, "in_loop": 1}
    assert summary["all-reduce"]["count"] == 2


def test_group_size_spellings():
    assert group_size("mesh['axis_0'=4,'axis_1'=2] {'axis_1'}") == 2
    assert group_size("mesh['axis_0'=4,'axis_1'=2] {'axis_0','axis_1'}") == 8
    assert group_size("{{0,1},{2,3}}") == 2
    assert group_size("[4,2]<=[8]") == 2


def test_paper_table_row_for_7_5b_at_64():
    """The paper's Figure 1 example: Ψ = 7.5B, N_d = 64, mixed-precision Adam (K = 12)."""
    psi = 7.5e9
    rows = [paper_bytes_per_device(psi, stage, 64) / 1e9 for stage in range(4)]
    assert [round(r, 1) for r in rows[:3]] == [120.0, 31.4, 16.6]
    assert round(rows[3], 2) == 1.88
    assert paper_bytes_per_device(psi, 3, 64, n_m=2) == pytest.approx(rows[3] * 1e9 / 2)
