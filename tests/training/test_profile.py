"""What a GPU trace says of the collectives' overlap with compute (jzero.training.profile.collective_overlap),
on a handwritten trace in the layout jax.profiler writes, and on a real CPU trace (no GPU kernels)."""

import gzip
import json

import jax
import jax.numpy as jnp
import pytest

from jzero.training.profile import collective_overlap


def _meta(pid, name, tid=None):
    kind = "process_name" if tid is None else "thread_name"
    return {"ph": "M", "pid": pid, **({} if tid is None else {"tid": tid}), "name": kind, "args": {"name": name}}


def _kernel(pid, tid, name, start, end):
    return {"ph": "X", "pid": pid, "tid": tid, "ts": start, "dur": end - start, "name": name}


def _trace(path):
    events = [
        _meta(1, "/device:GPU:0"),
        _meta(1, "Stream #13(Compute)", 10),
        _meta(1, "Stream #20(Nccl)", 11),
        _meta(1, "XLA Ops", 12),
        _meta(2, "/device:GPU:1"),
        _meta(2, "Stream #13(Compute)", 10),
        _meta(3, "/host:CPU"),
        _meta(3, "python", 1),
        _kernel(1, 10, "gemm_fusion_dot.1", 0, 100),
        _kernel(1, 10, "loop_add_fusion", 150, 300),
        _kernel(1, 11, "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 50, 120),
        _kernel(1, 11, "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", 200, 260),
        _kernel(1, 11, "ncclDevKernel_AllGather_RING_LL", 310, 330),
        _kernel(1, 10, "MemcpyD2D", 100, 130),  # a copy is not compute
        _kernel(1, 12, "fusion.3", 100, 150),  # an XLA op's span, not a kernel on a stream
        _kernel(2, 10, "ncclDevKernel_AllReduce", 0, 10),
        _kernel(3, 1, "ncclAllReduce launch", 0, 1000),  # the host's side
    ]
    with gzip.open(path, "wt") as f:
        json.dump({"displayTimeUnit": "ns", "traceEvents": events}, f)
    return path


def test_nccl_time_under_compute_and_alone_per_gpu(tmp_path):
    """GPU 0: NCCL runs 70 + 60 + 20 us, of which 50 + 60 under a compute kernel; GPU 1: 10 us alone."""
    found = collective_overlap(_trace(tmp_path / "perfetto_trace.json.gz"))
    # Whole microseconds scaled by 1e-6 in float64: rounding only (~1e-16 relative), far inside
    # approx's default 1e-6; a kernel counted wrongly moves a figure by 10 us of 150, 7%.
    gpu0, gpu1 = found["devices"]["/device:GPU:0"], found["devices"]["/device:GPU:1"]
    assert gpu0["communication_s"] == pytest.approx(150e-6) and gpu0["hidden_s"] == pytest.approx(110e-6)
    assert gpu0["exposed_s"] == pytest.approx(40e-6) and gpu0["hidden_share"] == pytest.approx(110 / 150)
    assert (gpu1["communication_s"], gpu1["hidden_s"]) == (pytest.approx(10e-6), 0.0)
    assert set(found["devices"]) == {"/device:GPU:0", "/device:GPU:1"}  # the host's NCCL launch is not a kernel
    assert found["total"]["communication_s"] == pytest.approx(160e-6)
    assert found["total"]["hidden_share"] == pytest.approx(110 / 160)


def test_a_cpu_trace_has_no_collective_kernels(tmp_path):
    f = jax.jit(lambda x: (x @ x).sum())
    x = jnp.ones((64, 64))
    f(x).block_until_ready()
    with jax.profiler.trace(str(tmp_path), create_perfetto_trace=True):
        f(x).block_until_ready()
    (trace,) = tmp_path.rglob("perfetto_trace.json.gz")
    assert collective_overlap(trace) == {"devices": {}, "total": None}
