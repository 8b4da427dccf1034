"""``precision.fp8`` in the compiled program (``jzero plan``'s ``fp8``), in the time model, and the
settings it refuses."""

import json

import pytest
from support.cli import keyed_error, sets
from support.configs import BF16, TINY, tiny_config
from support.runs import compiled_step

from jzero.cli.main import main
from jzero.ledger.float8 import HEAD
from jzero.ledger.flops import program_flops
from jzero.ledger.render import format_plan
from jzero.ledger.targets import GPUS
from jzero.ledger.timing import EFFICIENCY, FLOAT8_EFFICIENCY, Hardware, StepCost, predict
from jzero.training.report import plan_report

LLAMA = ["model.name=llama", "model.n_kv_heads=1", "model.mlp_hidden=96"]


def _report(devices, *overrides):
    job, compiled = compiled_step(tiny_config(*BF16, *overrides), devices)
    return plan_report(job, compiled)


def test_rowwise_projections_are_float8_on_h100_and_a_plan_without_fp8_has_no_record(h100x8, devices):
    """The tiny GPT's six projections under rowwise scales: each of their GEMMs (forward, recomputed
    forward, the two of the backward) reads float8 in the GPU program, and only the head's stay bf16."""
    report = _report(h100x8, "precision.fp8=rowwise")
    f = report.fp8
    assert (f.recipe, f.requested, f.covered) == ("rowwise", 6, 6), f
    assert f.gemms >= 3 * 6 and [k.name for k in f.kept_bf16] == ["GPT._head/lm_head"], f
    # The text says so, and at which efficiency each kind of GEMM is priced.
    text = format_plan(report)
    assert f"float8 (rowwise): 6 of 6 layer projections have every GEMM in float8 (forward and backward); {f.gemms}" in text
    assert "  not float8: GPT._head/lm_head: the output layer" in text
    assert f"matmuls at {EFFICIENCY:.0%} of the peak, float8 GEMMs at {FLOAT8_EFFICIENCY:.0%} of theirs" in text
    assert _report(devices).fp8 is None


@pytest.mark.parametrize("remat", ["none", "offload_dots"])  # the dots policies answer as none's
def test_the_remat_policies_keep_a_float8_matmul_as_a_matmul(devices, remat):
    """A float8 projection's output comes from a custom_vjp, which the policies' matmul test does not
    see: named, it is kept (or sent to host memory) as a bf16 matmul's is, so the float8 program
    saves the same bytes and recomputes the same FLOPs."""
    job, compiled = compiled_step(tiny_config(*BF16, f"model.remat={remat}"), devices)
    job8, compiled8 = compiled_step(tiny_config(*BF16, f"model.remat={remat}", "precision.fp8=tensorwise"), devices)
    assert program_flops(compiled8.as_text()) == program_flops(compiled.as_text())
    saved, saved8 = plan_report(job, compiled).activations, plan_report(job8, compiled8).activations
    assert (saved8.device, saved8.host) == (saved.device, saved.host) and saved.device + saved.host > 0


def test_a_projection_float8_cannot_take_keeps_bf16_and_says_why(h100x8):
    """A Llama whose MLP is 40 wide: its three MLP projections (not multiples of 16) stay bf16, named
    with their shapes; the attention's four are float8."""
    f = _report(h100x8, *LLAMA[:2], "model.mlp_hidden=40", "precision.fp8=tensorwise").fp8
    kept = {k.name: k.why for k in f.kept_bf16}
    assert (f.requested, f.covered) == (7, 4), f
    for name in ("layers/gate_proj", "layers/up_proj", "layers/down_proj"):
        assert "is not a multiple of 16" in kept[name] and "40" in kept[name], kept


def test_plan_json_carries_the_fp8_contract_and_prices_float8_at_its_peak(capsys, h100x8):
    """``fp8``'s keys; the prediction's compute term prices the float8 GEMMs' FLOPs at 1,979 TFLOP/s
    at float8's own efficiency, and the rest at 989 at the table's."""
    argv = ["plan", "configs/gpt-tiny.yaml", "--target", "h100x8", "--json", *sets(*TINY, *BF16, "precision.fp8=tensorwise")]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    fp8, p = report["fp8"], report["predicted"]
    assert fp8["gemms"] >= 18 and fp8["requested"] == 6 and fp8["covered"] == 6 and fp8["other_gemms"] > 0
    assert fp8["kept_bf16"] == [{"name": "GPT._head/lm_head", "why": HEAD}]
    executed, float8 = p["executed_flops_per_device"], p["float8_flops_per_device"]
    assert 0.5 * executed < float8 < executed
    bf16_s, float8_s = (executed - float8) / (989e12 * p["efficiency"]), float8 / (1979e12 * p["float8_efficiency"])
    # The same float64 formula, through JSON's 17 digits: no reduction order in it (1e-9 is rounding room)
    assert p["compute_s"] == pytest.approx(bf16_s + float8_s, rel=1e-9)
    assert p["float8_efficiency"] < p["efficiency"]  # float8 GEMMs reach less of their peak (docs/float8.md)


def test_float8_flops_run_at_the_float8_peak():
    """Half of 1 PFLOP in float8 on a GPU with twice the peak there: 0.75 of the time all-bf16 takes
    at one efficiency, 0.5 + 0.25 x 0.5 / 0.4 at 0.4 for float8; without float8 tensor cores, the
    same time as all-bf16 whatever float8's efficiency."""
    hw, no_fp8 = Hardware(1e15, 1e12, 1e11, 1e10, 1e10, float8_flops=2e15), Hardware(1e15, 1e12, 1e11, 1e10, 1e10)
    plain = StepCost(flops=1e15, model_flops=1e15, tokens=1)
    half = StepCost(flops=1e15, model_flops=1e15, tokens=1, float8_flops=5e14)
    all_bf16 = predict(plain, hw, 0.5).compute_s  # each check below: two float64 quotients, no sums to reorder
    assert predict(half, hw, 0.5, 0.5).compute_s == pytest.approx(0.75 * all_bf16, rel=1e-12)
    assert predict(half, hw, 0.5, 0.4).compute_s == pytest.approx((0.5 + 0.25 * 0.5 / 0.4) * all_bf16, rel=1e-12)
    assert predict(half, hw, 0.5, 0.4).float8_efficiency == 0.4 and predict(plain, hw, 0.5).float8_efficiency is None
    assert predict(half, no_fp8, 0.5, 0.4).compute_s == pytest.approx(all_bf16, rel=1e-12)
    assert predict(half, no_fp8, 0.5, 0.4).float8_efficiency is None
    assert GPUS["h100"].float8_dense_flops == 1979e12 and GPUS["a100"].float8_dense_flops is None


@pytest.mark.parametrize(
    "overrides, key, fragment",
    [
        (["precision.fp8=blockwise"], "precision.fp8", "unknown float8 recipe 'blockwise' (known: none, tensorwise, rowwise)"),
        (["precision.param_dtype=float16", "precision.fp8=tensorwise"], "precision.fp8", "not float16"),
        (["zero.stage=2", "zero.fp8_gather=true"], "zero.fp8_gather", "needs zero.stage 3"),
        (["zero.fp8_gather=true", "zero.quantized_weights=int8"], "zero.fp8_gather", "use one of the two"),
        (["zero.fp8_gather=3"], "zero.fp8_gather", "must be true or false"),
    ],
)
def test_bad_float8_settings_are_one_line(capsys, overrides, key, fragment):
    assert fragment in keyed_error(capsys, ["plan", "configs/gpt-tiny.yaml", *sets(*overrides)], key)


@pytest.mark.parametrize("setting", ["precision.fp8=tensorwise", "zero.fp8_gather=true"])
def test_float8_on_an_a100_target_is_refused(capsys, h100x8, setting):
    argv = ["plan", "configs/gpt-tiny.yaml", "--target", "a100x8", *sets(*BF16, setting)]
    err = keyed_error(capsys, argv, setting.split("=")[0])
    assert "NVIDIA A100-SXM4-80GB has no float8 tensor cores" in err
