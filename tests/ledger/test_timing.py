"""The step-time model (jzero.ledger.timing.predict) on handwritten figures: compute-bound,
communication-bound, overlapped and offload-bound steps, each term worked out by hand; its floor;
and the FLOP counts that are an error of the counter, not a prediction."""

import pytest

from jzero.ledger.flops import MatmulFlops
from jzero.ledger.prediction import counter_error
from jzero.ledger.targets import GPUS
from jzero.ledger.timing import Hardware, StepCost, Transfer, predict

# Round figures, so that every expected time below is arithmetic one can check by eye. rel=1e-12
# throughout: a handful of float64 products and quotients, no reduction whose order a CPU could change;
# their floor (the same factors in every order) is 1.9e-16 relative as measured for tests/ledger/test_network.py's
# figures, so the margin is about 5e3.
HW = Hardware(
    peak_flops=1e15, hbm_bytes_per_s=1e12, within_host_bytes_per_s=1e11, nic_bytes_per_s=1e10, host_bytes_per_s=1e10
)
RAILS = dict(hosts=64, per_host=1)  # one device on each of 64 hosts: each GPU's own NIC, 1e10 (tests/ledger/test_network.py)
EFF = 0.5  # the matmuls reach 5e14 FLOP/s


def test_compute_bound_step_is_its_flops_over_the_peak_times_efficiency():
    cost = StepCost(flops=1e15, model_flops=7.5e14, tokens=4096, hbm_bytes=2e9)
    p = predict(cost, HW, EFF)
    assert p.compute_s == pytest.approx(2.0, rel=1e-12)  # 1e15 / 5e14
    assert p.memory_s == pytest.approx(2e-3, rel=1e-12)  # 2e9 bytes read and written / 1e12
    assert p.step_time_s == pytest.approx(2.002, rel=1e-12)
    assert p.tokens_per_sec == pytest.approx(4096 / 2.002, rel=1e-12)
    assert p.mfu == pytest.approx(7.5e14 / (2.002 * 1e15), rel=1e-12)  # model FLOPs, not the recomputed ones
    assert p.bound == "compute"


def test_communication_bound_step_adds_each_collective_at_its_levels_bandwidth():
    within = Transfer(bytes=8e10, devices=8)  # 8e10 x 7/8 / 1e11 = 0.7 s
    across = Transfer(bytes=4e9, devices=64, **RAILS)  # 4e9 x 63/64 / 1e10 = 0.39375 s
    p = predict(StepCost(flops=5e13, model_flops=5e13, tokens=1, transfers=(within, across)), HW, EFF)
    assert p.compute_s == pytest.approx(0.1, rel=1e-12)
    assert p.communication_s == pytest.approx(0.7 + 0.39375, rel=1e-12)
    assert p.exposed_communication_s == pytest.approx(0.7 + 0.39375, rel=1e-12)
    assert p.step_time_s == pytest.approx(0.1 + 0.7 + 0.39375, rel=1e-12)
    assert p.bound == "communication"


def test_an_overlapped_collective_is_hidden_up_to_the_compute_between_its_start_and_done():
    comm = dict(bytes=8e10, devices=8)  # 0.7 s on the wire
    partly = Transfer(**comm, hiding_flops=1e14)  # 1e14 / 5e14 = 0.2 s of compute hides 0.2 s
    wholly = Transfer(**comm, hiding_flops=1e15)  # 2 s of compute hides all 0.7 s
    cost = StepCost(flops=1e15, model_flops=1e15, tokens=1, transfers=(partly, wholly))
    p = predict(cost, HW, EFF)
    assert p.communication_s == pytest.approx(1.4, rel=1e-12)
    assert p.exposed_communication_s == pytest.approx(0.5, rel=1e-12)
    assert p.step_time_s == pytest.approx(2.0 + 0.5, rel=1e-12)
    synchronous = predict(StepCost(flops=1e15, model_flops=1e15, tokens=1, transfers=(Transfer(**comm),)), HW, EFF)
    assert synchronous.exposed_communication_s == pytest.approx(0.7, rel=1e-12)  # None: nothing hides it


def test_offload_bound_step_adds_its_host_transfers_over_pcie():
    p = predict(StepCost(flops=5e13, model_flops=5e13, tokens=1, host_bytes=3e10), HW, EFF)
    assert p.host_transfer_s == pytest.approx(3.0, rel=1e-12)  # 3e10 / 1e10
    assert p.step_time_s == pytest.approx(3.1, rel=1e-12)
    assert p.bound == "host_transfer"


def test_the_h100s_figures_are_the_datasheets():
    hw = GPUS["h100"].hardware()
    assert (hw.peak_flops, hw.hbm_bytes_per_s) == (989e12, 3.35e12)
    # NCCL's ring busbw over NVLink 4 (nccl-tests#212), and what NCCL reaches on one 400 Gb/s NDR NIC (nccl-tests#267).
    assert (hw.within_host_bytes_per_s, hw.nic_bytes_per_s) == (370e9, pytest.approx(48e9, rel=1e-12))


def test_collectives_in_one_window_share_its_compute_on_one_stream():
    # Two 0.7 s gathers in flight over the same 1 s of compute: the stream runs them in turn, so 1 s
    # of the 1.4 s hides and 0.4 s is exposed (each crediting all of it would expose none).
    comm = dict(bytes=8e10, devices=8, hiding_flops=5e14, window="body/ag1")
    p = predict(StepCost(flops=1e15, model_flops=1e15, tokens=1, transfers=(Transfer(**comm), Transfer(**comm))), HW, EFF)
    assert p.exposed_communication_s == pytest.approx(0.4, rel=1e-12)
    assert p.exposed_within_host_s == pytest.approx(0.4, rel=1e-12) and p.exposed_across_hosts_s == 0
    assert p.hidden_communication_share == pytest.approx(1.0 / 1.4, rel=1e-12)


def test_the_prediction_is_never_below_its_floor():
    # Each gather claims the step's whole 0.2 s of compute as its own: hiding both would give a
    # 0.2 s step that moves 0.4 s of bytes on one level.
    comm = dict(bytes=8e9 * 8 / 7 * 2.5, devices=8, hiding_flops=1e14)  # 0.2 s each
    across = Transfer(bytes=1e9 * 64 / 63, devices=64, **RAILS, hiding_flops=1e14)  # 0.1 s
    cost = StepCost(flops=1e14, model_flops=1e14, tokens=1, transfers=(Transfer(**comm), Transfer(**comm), across))
    p = predict(cost, HW, EFF)
    # The 0.2 s of compute hides 0.2 s of the 0.5 s once: 0.2 + 0.3, above the 0.4 s floor.
    assert p.step_time_s == pytest.approx(0.5, rel=1e-12)
    assert p.floor_s == pytest.approx(max(0.2, 0.4, 0.1), rel=1e-12)  # compute, within a host, across hosts
    assert p.communication_within_host_s == pytest.approx(0.4, rel=1e-12)
    assert p.communication_across_hosts_s == pytest.approx(0.1, rel=1e-12)


def _counted(executed, unknown_loops=(), uncounted=()):
    return MatmulFlops(executed, 0, {}, {}, unknown_loops, uncounted)


def test_a_flop_count_that_cannot_be_right_is_an_error_not_a_prediction():
    gemm = counter_error(_counted(6e12, uncounted=("__cublas$gemm",)), 1e14, 0.075, mfu=4.841)
    assert gemm.startswith("the FLOP counter found only 0.06x the model's FLOPs") and "__cublas$gemm" in gemm
    # Causal attention (7.5% of gpt-7b's FLOPs, half of it skipped) explains 0.98x: no error.
    assert counter_error(_counted(0.98e14), 1e14, 0.075, mfu=0.51) is None
    assert counter_error(_counted(0.96e14), 1e14, 0.0, mfu=0.51) is None  # within the tolerance
    assert "0.94x" in counter_error(_counted(0.94e14), 1e14, 0.0, mfu=0.51)
    assert "above 100%" in counter_error(_counted(1e14), 1e14, 0.0, mfu=1.2)
    lost = counter_error(_counted(1e14, unknown_loops=("while.3",)), 1e14, 0.0, mfu=0.5)
    assert "loop while.3" in lost and "counted once" in lost
