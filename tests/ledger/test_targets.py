"""Compiling for an NVIDIA GPU target on this CPU host (deviceless AOT): what the GPU program shows.

These need the ``gpu-target`` extra (JAX's CUDA plugin, no GPU): the README's test command and CI
install it. Each compile for an 8-GPU target takes seconds; nothing is allocated.
"""

import functools
import json

import pytest
from support.cli import keyed_error
from support.configs import BF16, TINY, tiny_config
from support.runs import compiled_step
from support.xla import own_devices_env

from jzero.cli.main import main
from jzero.compiler.options import GPU_COMPILER_OPTIONS, SLOP_FACTOR, compiler_options
from jzero.config.loading import load_config
from jzero.errors import ConfigError
from jzero.ledger import hlo as ledger
from jzero.ledger.targets import GPUS, Target, parse_target, scheduler_slop_factor, target_devices
from jzero.training.job import build_job


@pytest.fixture(scope="module")
def tiny_on_h100x8(h100x8):
    """The tiny GPT's job on h100x8 for some config overrides, built once a module: a job compiles its
    step once (``Job.compile_step``), so the tests that read the same program share its compile."""
    return functools.cache(lambda *sets: build_job(tiny_config(*sets), h100x8))


def _program(job):
    """The job's compiled train step."""
    return job.compile_step()[1]


def test_target_names_parse_to_hosts_and_gpus():
    assert parse_target("h100x8") == Target("h100", 1, 8)
    assert parse_target("H100x4") == Target("h100", 1, 4)
    assert parse_target("h100x64") == Target("h100", 8, 8)
    assert parse_target("a100x16", gpus_per_host=4) == Target("a100", 4, 4)
    assert parse_target("h200", hosts=2) == Target("h200", 2, 8)
    assert parse_target("h100x64").name == "h100x64" and parse_target("h200x8").memory_bytes == 141 * 10**9
    for bad, flag in [
        (("x100x8",), "--target"),
        (("h100x0",), "--target"),
        (("h100x12",), "--target"),  # not whole hosts of 8
        (("h100x16", 3), "--hosts"),
        (("h100x16", None, 3), "--gpus-per-host"),
        (("h100x8", 0), "--hosts"),
    ]:
        with pytest.raises(ConfigError) as err:
            parse_target(*bad)
        assert err.value.key == flag, (bad, str(err.value))


def test_target_devices_are_the_gpus(h100x8):
    assert len(h100x8) == 8 and {d.device_kind for d in h100x8} == {"NVIDIA H100 80GB HBM3"}
    assert {d.platform for d in h100x8} == {"gpu"}
    hosts = target_devices("h100x16")
    assert sorted({d.process_index for d in hosts}) == [0, 1]


def test_reduce_scatter_at_stages_2_and_3_and_none_at_0(tiny_on_h100x8):
    """The GPU pipeline reduce-scatters the gradients (the CPU's lowers to all-reduce + slice)."""
    for stage, wanted in [(0, False), (2, True), (3, True)]:
        compiled = _program(tiny_on_h100x8(f"zero.stage={stage}", *BF16))
        kinds = {op.kind for op in ledger.parse_collectives(compiled.as_text())}
        assert ("reduce-scatter" in kinds) is wanted, (stage, kinds)


def test_bf16_parameters_are_gathered_in_bf16(tiny_on_h100x8):
    for stage in (2, 3):
        compiled = _program(tiny_on_h100x8(f"zero.stage={stage}", *BF16))
        gathers = [op for op in ledger.parse_collectives(compiled.as_text()) if op.kind == "all-gather"]
        assert gathers and {op.dtype for op in gathers} == {"bf16"}, [(op.name, op.dtype) for op in gathers]


@pytest.mark.parametrize(
    "config, stage",
    [("configs/gpt-tiny.yaml", 2), ("configs/gpt-tiny.yaml", 3), ("configs/gpt2-small.yaml", 3)],
)
def test_communication_at_the_papers_volume(h100x8, config, stage):
    """Bytes sent per device per step, from the GPU program, over the paper's 2Ψ or 3Ψ (bf16)."""
    from jzero.training.report import plan_report

    s, compiled = compiled_step(load_config(config, [f"zero.stage={stage}", "mesh.axes.data=8", *BF16]), h100x8)
    report = plan_report(s, compiled)
    # Bytes counted from the compiled HLO's op shapes: exact integers, no summation order to float.
    # The band is the acceptance range around the paper's volume.
    assert 0.95 <= report.communication.ratio <= 1.05, report.communication
    assert report.backend == "gpu" and report.device_kind == "NVIDIA H100 80GB HBM3"


def test_traffic_by_level_on_two_hosts(tiny_on_h100x8):
    """Two hosts of 4 GPUs. ZeRO-3 over all 8: every gather and reduction spans both hosts, so all of
    it is cross-host. With ``replica`` across the hosts (HSDP) the ``data`` collectives stay within a
    host and only the gradient's all-reduce over ``replica`` crosses. On one host of 8 (the tiny
    config's mesh, ``data`` over all 8) nothing crosses."""
    from jzero.training.report import plan_report

    two_hosts = target_devices("h100", hosts=2, gpus_per_host=4)
    job = tiny_on_h100x8("zero.stage=3", *BF16)
    assert dict(job.mesh.shape) == {"data": 8, "model": 1}
    one = plan_report(job, _program(job)).communication
    assert one.hosts == 1 and one.cross_host_bytes == 0 and one.within_host_bytes == one.total
    zero3 = tiny_config("zero.stage=3", "mesh.axes.data=8", "mesh.dcn.data=2", *BF16)
    comm = plan_report(*compiled_step(zero3, two_hosts)).communication
    assert comm.hosts == 2 and comm.within_host_bytes == 0 and comm.cross_host_bytes == comm.total
    assert comm.zeropp_cross_host_bytes == 0.25 * comm.paper
    hsdp = tiny_config("zero.stage=3", "mesh.axes={data: 4, replica: 2}", "mesh.dcn.replica=2", *BF16)
    comm = plan_report(*compiled_step(hsdp, two_hosts)).communication
    reduced = comm.bytes_per_step["all-reduce"]
    assert 0 < comm.cross_host_bytes <= reduced < comm.total and comm.within_host_bytes >= comm.total - reduced


def test_async_ops_report_overlap_and_the_options_apply(tiny_on_h100x8):
    """Stage 3's layer all-gathers are async, and compute is scheduled under them."""
    compiled = _program(tiny_on_h100x8("zero.stage=3", *BF16))
    ops = ledger.parse_collectives(compiled.as_text())
    gathers = [op for op in ops if op.kind == "all-gather" and op.in_loop]
    assert gathers and all(op.is_async and op.overlapped for op in gathers)
    assert GPU_COMPILER_OPTIONS["xla_gpu_enable_latency_hiding_scheduler"] is True


def test_plan_cli_for_a_target(capsys, h100x8):
    sets = [a for kv in TINY for a in ("--set", kv)]
    assert main(["plan", "configs/gpt-tiny.yaml", "--target", "h100x8", "--json", *sets]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["backend"] == "gpu" and report["device_kind"] == "NVIDIA H100 80GB HBM3" and report["devices"] == 8
    assert report["flops_per_device"] is None  # a deviceless compile has no cost analysis: never 0
    # ...but the FLOPs the model needs come from its shape: 6 N + 12 L T d per token, x the batch's tokens.
    config = tiny_config()
    m, tokens = config.model, config.train.global_batch_size * config.model.seq_len
    per_token = 6 * (m.n_layers * 12 * m.d_model**2 + m.vocab_size * m.d_model) + 12 * m.n_layers * m.seq_len * m.d_model
    flops = report["model_flops"]
    assert flops["per_token"] == per_token and flops["per_step"] == per_token * tokens
    assert flops["peak_floor_s"] == pytest.approx(per_token * tokens / 8 / 989e12)  # the same division: rounding only
    assert report["memory_per_device"] == 80e9 and report["fits"] is True
    assert report["collectives"]["reduce-scatter"]["dtypes"]
    assert all(isinstance(op["overlapped"], bool | None) for op in report["async_collectives"])
    assert main(["plan", "configs/gpt-tiny.yaml", "--target", "h100x8", *sets]) == 0
    text = capsys.readouterr().out
    assert "8 NVIDIA H100 80GB HBM3 (gpu) devices" in text and "FLOPs not available" in text
    assert "model FLOPs per step" in text and "at the dense bf16 peak (989 TFLOP/s) no less than" in text


def test_bad_targets_are_one_line(capsys, h100x8):
    plan = ["plan", "configs/gpt-tiny.yaml"]
    assert "unknown GPU target 'b999x8'" in keyed_error(capsys, [*plan, "--target", "b999x8"], "--target")
    err = keyed_error(capsys, [*plan, "--target", "h100x16"], "--target")
    assert "h100x16 has 16 GPUs but mesh.axes data=8 x model=1 uses 8" in err
    assert "only with --target" in keyed_error(capsys, [*plan, "--hosts", "2"], "--hosts")
    # Without the plugin: test_fresh_install.py, in a process whose import path hides it.


def test_the_7b_config_on_64_h100s():
    """LLaMA-7B's shape at stage 3 on 8 hosts of 8 H100s: the paper's 3Ψ, and it fits 80 GB."""
    import subprocess
    import sys

    env = own_devices_env()  # the config's 64 devices
    argv = [sys.executable, "-m", "jzero.cli", "plan", "configs/gpt-7b.yaml", "--target", "h100x64", "--json"]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["devices"] == 64 and report["hosts"] == 8 and report["num_params"] == 6_706_176_000
    assert 0.95 <= report["communication"]["ratio"] <= 1.05
    assert report["fits"] is True and report["memory_per_device"] == 80e9
    assert {op["dtype"] for op in report["async_collectives"] if op["kind"] == "all-gather"} == {"bf16"}


def test_every_gpu_compile_gets_the_options(h100x8, devices, tiny_on_h100x8):
    """``Job.compile`` passes jzero's options for GPU devices and nothing for the CPU: with the
    combining thresholds at 0 (the config's), the same step compiles to many more (uncombined)
    all-gathers."""
    slop = {SLOP_FACTOR: scheduler_slop_factor(GPUS["h100"], 0)}
    assert compiler_options(devices) is None and compiler_options(h100x8) == GPU_COMPILER_OPTIONS
    assert compiler_options(h100x8, slop_factor=slop[SLOP_FACTOR]) == {**GPU_COMPILER_OPTIONS, **slop}

    def gathers(*sets):
        ops = ledger.parse_collectives(_program(tiny_on_h100x8("zero.stage=3", *BF16, *sets)).as_text())
        return sum(op.kind == "all-gather" for op in ops)

    combined = gathers()
    no_combining = [f"compiler.xla_options.{k}=0" for k in GPU_COMPILER_OPTIONS if k.endswith("threshold_bytes")]
    assert gathers(*no_combining) > 2 * combined, combined


def test_offload_on_the_gpu_target_is_host_memory_in_the_compiled_program(h100x8):
    """The GPU compiler places what the CPU one ignores: offloaded state as host-memory arguments
    (its memory analysis counts them apart) and offload_dots' saved matmul outputs in host memory."""
    from jzero.training.report import plan_report

    sets = ("zero.stage=3", "zero.offload_optimizer=true", "zero.offload_params=true", "model.remat=offload_dots")
    s, compiled = compiled_step(tiny_config(*sets), h100x8)
    report = plan_report(s, compiled)
    mem = compiled.memory_analysis()
    # Model states in host memory: the step's host arguments, as the GPU compiler's own analysis counts them.
    assert report.compiled_host.argument == int(mem.host_argument_size_in_bytes) == report.host_bytes.total
    assert report.compiled.argument < report.compiled_host.argument  # only scalars and the batch stay on the device
    assert report.device_peak == report.compiled.peak  # the GPU's own figures already leave host memory out
    a = report.activations
    assert a.host_from == "compiled" and a.host > 0 and "S(5)" in compiled.as_text()


def test_the_gpu_schedulers_memory_limit_is_the_fits_verdicts(tiny_on_h100x8):
    """XLA's scheduler holds a step to (80% of the device's memory - its live arguments) x slop / 100;
    jzero's slop factor puts that at the GPU's nominal memory less the arguments, the verdict's room."""
    total = 84942979072  # jzero/ledger/gpu_targets/h100.txtpb's device_memory_size
    io = 10 * 10**9
    slop = scheduler_slop_factor(GPUS["h100"], io)
    assert slop == 120  # floor(100 x (80e9 - 10e9) / (0.8 x 84.94e9 - 10e9)) = floor(120.78)
    assert (0.8 * total - io) * slop / 100 <= 80 * 10**9 - io < (0.8 * total - io) * (slop + 1) / 100
    assert scheduler_slop_factor(GPUS["h100"], 70 * 10**9) == 95  # no room under XLA's base: its default stays
    job = tiny_on_h100x8("zero.stage=3", *BF16)
    states = job.plan.per_device_bytes()
    given = job.xla_options()["xla_gpu_memory_limit_slop_factor"]
    assert given == {"value": scheduler_slop_factor(GPUS["h100"], states.params + states.optimizer), "from": "jzero"}


def test_a_gpu_plan_compiles_no_one_group_reference(tiny_on_h100x8):
    """The one-group reference (a CPU check that GSPMD divides the work) is the whole model on one
    GPU for a target: XLA warned it could not fit (gpt-7b on h100x64: "Can't reduce memory use below
    87.44GiB"), and a deviceless program has no FLOPs to scale. A GPU plan skips it."""
    from jzero.training.report import one_group_reference

    assert one_group_reference(tiny_on_h100x8("zero.stage=3", *BF16)) == {"flops": None, "temp": None}
