"""The step from a compiled program to its predicted step time (jzero/ledger/prediction.py), on a
handwritten program whose every term is worked out here by hand: a synchronous all-gather of a
weight over 8 GPUs, one matmul with it, then one elementwise op on its result."""

import pytest
from support.configs import tiny_config

from jzero.ledger.flops import ModelFlops
from jzero.ledger.hlo import parse_collectives
from jzero.ledger.memory import CompiledHost
from jzero.ledger.prediction import StepParts, predicted
from jzero.ledger.saved import Activations
from jzero.ledger.targets import device_hardware
from jzero.ledger.timing import EFFICIENCY
from jzero.training.job import build_job
from jzero.training.report import report_inputs

M, K, N = 4096, 1024, 1024
PROGRAM = f"""\
HloModule m

ENTRY %main (w: bf16[{K // 8},{N}], x: bf16[{M},{K}]) -> bf16[{M},{N}] {{
  %w = bf16[{K // 8},{N}]{{1,0}} parameter(0)
  %x = bf16[{M},{K}]{{1,0}} parameter(1)
  %ag = bf16[{K},{N}]{{1,0}} all-gather(%w), channel_id=1, replica_groups=[1,8]<=[8], dimensions={{0}}, use_global_device_ids=true
  %y = bf16[{M},{N}]{{1,0}} dot(%x, %ag), lhs_contracting_dims={{1}}, rhs_contracting_dims={{0}}
  ROOT %z = bf16[{M},{N}]{{1,0}} multiply(%y, %y)
}}
"""


@pytest.fixture(scope="module")
def job(h100x8):
    """The job whose config and devices the prediction reads (its batch, seq_len and GPUs), built once:
    nothing here compiles it."""
    return build_job(tiny_config("zero.stage=3", "precision.compute_dtype=bfloat16"), h100x8)


def test_a_handwritten_programs_predicted_step_worked_by_hand(job, h100x8):
    flops = 2 * M * N * K  # the one matmul
    parts = StepParts(
        ModelFlops(per_token=0.0, per_step=flops, per_device_per_step=flops, peak_flops=None, peak_floor_s=None),
        CompiledHost(argument=0, output=0),
        Activations(device=0, host=0, remat="none", partitioned=False, host_from="compiled", saved_by="layer loops", by_kind=[]),
    )
    p = predicted(report_inputs(job), parts, PROGRAM, parse_collectives(PROGRAM))
    hw = device_hardware(h100x8[0])
    compute = flops / (hw.peak_flops * EFFICIENCY)
    gather = K * N * 2 * 7 / 8 / hw.within_host_bytes_per_s  # the whole bf16 weight, 7 of 8 shards received, NVLink
    memory = 3 * M * N * 2 / hw.hbm_bytes_per_s  # the multiply reads y twice and writes z, in bf16
    # No sum over a batch here, so no reordering floor: the same few float64 operations in another
    # order differ by a few ulps (~1e-15 relative); rel=1e-12 leaves a margin of about 1e3, and a
    # missing term (the gather is 0.3% of this step) is 1e9 times over it.
    assert p.compute_s == pytest.approx(compute, rel=1e-12)
    assert p.communication_s == pytest.approx(gather, rel=1e-12)
    assert p.exposed_communication_s == pytest.approx(gather, rel=1e-12)  # synchronous: nothing under it
    assert p.memory_s == pytest.approx(memory, rel=1e-12)
    assert p.step_time_s == pytest.approx(compute + gather + memory, rel=1e-12)
    tokens = job.config.train.global_batch_size * job.config.model.seq_len
    assert p.tokens_per_sec == pytest.approx(tokens / (compute + gather + memory), rel=1e-12)
    assert p.executed_over_model_flops == 1.0 and p.error is None


def test_a_step_the_flop_counter_cannot_explain_gets_the_reason_and_no_step_time(job):
    """The same program claimed to need 10x its matmul's FLOPs: the counter finds 0.10x the model's,
    below what causal attention explains, so the prediction says so and gives no step time, tokens/s,
    MFU or bound; its terms stay, as the compiled program's."""
    flops = 2 * M * N * K
    parts = StepParts(
        ModelFlops(per_token=0.0, per_step=10 * flops, per_device_per_step=10 * flops, peak_flops=None, peak_floor_s=None),
        CompiledHost(argument=0, output=0),
        Activations(device=0, host=0, remat="none", partitioned=False, host_from="compiled", saved_by="layer loops", by_kind=[]),
    )
    p = predicted(report_inputs(job), parts, PROGRAM, parse_collectives(PROGRAM))
    assert p.error.startswith("the FLOP counter found only 0.10x the model's FLOPs"), p.error
    assert (p.step_time_s, p.tokens_per_sec, p.mfu, p.bound) == (None, None, None, None)
    # One float64 quotient, x / (10 x): its floor is one rounding (~1e-16 relative); rel=1e-12, as above.
    assert p.compute_s > 0 and p.executed_over_model_flops == pytest.approx(0.1, rel=1e-12)
