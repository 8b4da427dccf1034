"""What the layer loops save for the backward, by kind (jzero/ledger/saved.py), against the GPT's
formula for each remat policy (jzero/models/sizes.py): the compiled program's bytes, exactly."""

import functools

import pytest
from support.configs import tiny_config
from support.llama import llama_job

from jzero.ledger.hlo import forward_loop_writes
from jzero.ledger.render import _saved_kind_lines
from jzero.ledger.saved import Activations, SavedKind
from jzero.memory.remat import REMAT_POLICIES
from jzero.models.sizes import SAVED_BY_POLICY, gpt_saved_per_layer
from jzero.training.job import build_job
from jzero.training.report import plan_report

COMPUTE_BF16 = ("precision.compute_dtype=bfloat16",)


@functools.cache
def _activations(*sets):
    """The saved activations of the tiny GPT's stage-3 step with ``sets`` on the 8 CPU devices, and
    its program's text; once per test process for each ``sets``."""
    return _saved(build_job(tiny_config("zero.stage=3", *sets)))


def _saved(job):
    _, compiled = job.compile_step()
    return plan_report(job, compiled).activations, compiled.as_text()


@pytest.fixture(scope="module")
def tiny_on_h100x8(h100x8):
    """The tiny GPT's job on h100x8 for some config overrides, built once a module: a job compiles its
    step once (``Job.compile_step``), so the tests that read the same program share its compile."""
    return functools.cache(lambda *sets: build_job(tiny_config(*sets), h100x8))


def _roles(a) -> set[str]:
    return {row.role for row in a.by_kind}


@pytest.mark.parametrize("policy", REMAT_POLICIES)
def test_each_policy_saves_its_formula_exactly_on_cpu(policy):
    a, _ = _activations(f"model.remat={policy}")
    # XLA attention on CPU: its scores in float32 are kept by none and dots_saveable only.
    assert a.device + a.host == a.formula > 0
    assert _roles(a) == set(a.formula_by_kind) and a.over_formula == []


def test_none_keeps_what_a_layer_needs_not_every_intermediate():
    # JAX's own linearization (no checkpoint) kept a tanh GELU's 6 intermediates and the norms'
    # float32 copies: 86 s b h bytes per layer on the MPT-7B row, against 20 now (docs/offload.md).
    a, _ = _activations("model.remat=none", "model.mlp_ratio=4")
    assert set(a.formula_by_kind) == set(SAVED_BY_POLICY["none"])
    mlp = [row for row in a.by_kind if row.role == "mlp_in"]
    assert len(mlp) == 1  # the MLP's hidden activations once: GELU is recomputed from them


@pytest.mark.parametrize("mesh", ["mesh.axes.data=8", "mesh.axes.model=2"], ids=["dp8", "dp4-mp2"])
def test_none_on_gpus_saves_the_formula_and_runs_attention_once(mesh, tiny_on_h100x8):
    sets = ("zero.stage=3", "model.remat=none", *COMPUTE_BF16, mesh) + (("mesh.axes.data=4",) if "model" in mesh else ())
    a, text = _saved(tiny_on_h100x8(*sets))  # dp8's job is the one-microbatch step below
    assert a.device == a.formula and a.over_formula == []
    assert _roles(a) == set(SAVED_BY_POLICY["none"])  # cuDNN's output and statistics are attention's
    # The forward's attention kernel is kept, not run again in the backward: as many forward kernels
    # in the program as backward ones (XLA's pipeliner peels a layer out of each loop: 2 and 2 here;
    # dots_saveable, which recomputes attention, has 4 and 2).
    fwd, bwd = (text.count(f'custom_call_target="__cudnn$fmhaSoftmax{k}"') for k in ("", "Backward"))
    assert fwd == bwd > 0


def test_the_formula_in_figures():
    # MPT-7B's row (benchmarks/calibration.py): 6 rows of 2048 tokens, d 4096, 32 heads, bf16, cuDNN.
    sbh = 6 * 2048 * 4096
    none = gpt_saved_per_layer("none", 6, 2048, 4096, 32, 4, dtype_bytes=2, attention="cudnn")
    assert sum(none.values()) == 20 * sbh + 4 * 6 * 32 * 2048  # (6 + r) s b h, 2 bytes, + float32 statistics
    assert gpt_saved_per_layer("full", 6, 2048, 4096, 32, 4, dtype_bytes=2, attention="cudnn") == {"input": 2 * sbh}
    split = gpt_saved_per_layer(
        "none", 6, 2048, 4096, 32, 4, dtype_bytes=2, attention="cudnn", model_parallel=2, partitioned=True
    )
    assert (
        sum(split.values()) == sum(none.values()) // 2
    )  # everything splits over model, the input and attn_out along the sequence
    xla = gpt_saved_per_layer("dots_saveable", 1, 8, 4, 2, 4, dtype_bytes=4, attention="xla")
    assert xla["attention"] == 2 * 8 * 8 * 4 + 8 * 4 * 4  # float32 scores [heads, T, T] and the weighted values


def test_the_plan_flags_a_kind_over_its_formula():
    a = Activations(
        device=300, host=0, remat="none", formula=200, korthikanti_none=1000,
        formula_by_kind={"input": 100, "mlp_in": 100}, over_formula=["mlp_in"],
        partitioned=False, host_from="compiled", saved_by="layer loops",
        by_kind=[
            SavedKind(kind="input", role="input", dtype="bf16", shape=[1, 2], layers=1, bytes_per_layer=100),
            SavedKind(kind="mlp_in/dot_general", role="mlp_in", dtype="f32", shape=[1, 4], layers=1, bytes_per_layer=200),
        ],
    )  # fmt: skip
    lines = _saved_kind_lines(a)
    assert "saved 1.500 of it" in lines[0]
    flagged = [line for line in lines if "over the formula" in line]
    assert len(flagged) == 1 and "mlp_in" in flagged[0] and "f32[1, 4]" in flagged[0]


def test_an_unrolled_model_with_units_saves_each_projection_once_per_layer(devices):
    """A Llama-style model of yours, unscanned, gathered by units: its units' checkpoints keep every
    projection's output (matmuls without batch dimensions) once per layer, and no attention scores;
    the ledger names each kind within its unit, and the bytes add up to the saved total."""

    from jzero.communication.gather import UNIT_REMAT

    s = llama_job("zero.stage=3")
    _, compiled = s.compile_step()
    a = plan_report(s, compiled).activations
    assert (a.saved_by, a.remat) == ("gathering units", UNIT_REMAT)
    rows, seq = 16 // 8, 16  # the batch rows per device, the positions
    widths = {"q_proj": 32, "k_proj": 16, "v_proj": 16, "o_proj": 32, "gate_proj": 128, "up_proj": 128}  # d, 2 KV heads of 8, MLP
    for name, width in widths.items():
        (row,) = [r for r in a.by_kind if r.kind.startswith(name + "/")]
        assert (row.layers, row.bytes_per_layer, row.in_units) == (3, rows * seq * width * 4, True), row
    assert a.device == sum(r.bytes_per_layer * r.layers for r in a.by_kind)
    scores = [r for r in a.by_kind if r.shape == [rows, 4, seq, seq]]  # [rows, heads, positions, positions]
    assert not scores, "attention's scores are redone, not kept"
    assert "in each of 3 units" in "\n".join(_saved_kind_lines(a))


def test_a_loop_is_read_as_before_when_units_are_off(devices):
    a, _ = _activations("model.remat=full")  # the default remat (units are off by default): [full]'s step above
    assert a.saved_by == "layer loops" and all(r.in_units is None for r in a.by_kind)


def test_microbatches_save_one_microbatchs_values_once_and_never_more_than_the_peak(tiny_on_h100x8):
    """Under accumulation XLA peels the step's first and last microbatch out of the microbatch loop
    on GPUs: three copies of the forward layer loop, never live together. The plan counts one
    microbatch's stacks once, as a step of that microbatch's rows alone saves, within the compiled
    device peak, and lists each kind once (MPT-3B at seq 8192 listed q, k and v three times and
    reported 121 GB saved against a 96.3 GB peak)."""
    base = ("zero.stage=3", "model.remat=none", *COMPUTE_BF16, "mesh.axes.data=8")  # the dp8 step above
    four = ("train.microbatches=4", "train.global_batch_size=64")
    job = tiny_on_h100x8(*base, *four)
    _, compiled = job.compile_step()
    accumulated = plan_report(job, compiled)
    alone_job = tiny_on_h100x8(*base)  # one microbatch's rows: the tiny config's batch of 16, 64 / 4
    assert alone_job.config.train.global_batch_size == 16
    alone = plan_report(alone_job, alone_job.compile_step()[1])
    text = compiled.as_text()
    assert len(forward_loop_writes(text)) == 3  # the peeled first and last microbatch, and the loop's
    a = accumulated.activations
    assert a.device == alone.activations.device == a.formula > 0
    assert a.device <= accumulated.device_peak
    assert len(a.by_kind) == len(alone.activations.by_kind)
