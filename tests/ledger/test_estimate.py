"""``jzero estimate``: the paper's formulas, per part and stage, with a fits verdict; bad input is one line."""

import json

import jsonschema
import pytest

from jzero.cli.main import main
from jzero.ledger.estimate import Estimate, estimate, format_estimate, parse_count, parse_memory
from jzero.records import from_json, json_schema, to_json


def test_reproduces_the_papers_7_5b_row_at_64(capsys):
    """Figure 1: 7.5B parameters, N_d = 64, mixed-precision Adam: 120, 31.4, 16.6 and 1.88 GB; the
    command prints the record's table."""
    result = estimate(7.5e9, 64)
    assert [float(f"{result.stages[s].total / 1e9:.3g}") for s in "0123"] == [120, 31.4, 16.6, 1.88]
    assert main(["estimate", "--params", "7.5B", "--devices", "64"]) == 0
    assert capsys.readouterr().out == format_estimate(result) + "\n"

    assert main(["estimate", "--params", "7.5e9", "--devices", "64", "--json", "--memory-per-device", "32GB"]) == 0
    out = json.loads(capsys.readouterr().out)
    stages = out["stages"]
    assert set(stages) == {"0", "1", "2", "3"}
    assert stages["0"] == {"params": 15e9, "grads": 15e9, "optimizer": 90e9, "total": 120e9, "fits": False}
    assert stages["1"]["optimizer"] == pytest.approx(90e9 / 64) and stages["1"]["fits"] is True
    assert stages["2"]["grads"] == pytest.approx(15e9 / 64) and stages["2"]["params"] == 15e9
    assert stages["3"]["total"] == pytest.approx(120e9 / 64)
    for row in stages.values():
        assert row["total"] == pytest.approx(row["params"] + row["grads"] + row["optimizer"], abs=2)


def test_model_parallel_fp32_and_other_optimizers(capsys):
    assert main(["estimate", "--params", "1B", "--devices", "16", "--model-parallel", "2", "--precision", "fp32",
                 "--optimizer", "sgd", "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["data_parallel"] == 8 and out["bytes_per_param"] == {"params": 4, "grads": 4, "optimizer": 4}
    assert out["stages"]["0"]["total"] == pytest.approx(12e9 / 2)
    assert out["stages"]["3"]["total"] == pytest.approx(12e9 / 16)
    assert "fits" not in out["stages"]["0"]
    assert main(["estimate", "--params", "1B", "--devices", "8", "--optimizer", "adafactor", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["bytes_per_param"]["optimizer"] == 4  # the fp32 master only


def test_parsing():
    assert parse_count("7.5B") == 7.5e9 and parse_count("350M") == 350e6 and parse_count("124m") == 124e6
    assert parse_count("7.5e9") == 7.5e9 and parse_count("1000") == 1000
    assert parse_memory("80GB") == 80e9 and parse_memory("80GiB") == 80 * 2**30 and parse_memory("1e9") == 1e9


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--params", "lots", "--devices", "8"], "jzero: error: --params: expected a count like 7.5e9 or 7.5B, got 'lots'"),
        (["--params", "1B", "--devices", "8", "--model-parallel", "3"], "jzero: error: --model-parallel: 3 does not divide"),
        (["--params", "1B", "--devices", "8", "--memory-per-device", "big"], "jzero: error: --memory-per-device: expected"),
        (["--params", "1B", "--devices", "0"], "jzero: error: --devices: must be positive, got 0"),
    ],
)
def test_bad_input_is_one_line_exit_2(capsys, argv, message):
    assert main(["estimate", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(message)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--params", "1e400"], "jzero: error: --params: must be a finite number of at least 1 parameter, got '1e400'"),
        (["--params", "nan"], "jzero: error: --params: expected a count like 7.5e9 or 7.5B, got 'nan'"),
        (["--params", "inf"], "jzero: error: --params: expected a count like 7.5e9 or 7.5B, got 'inf'"),
        (["--params", "-5"], "jzero: error: --params: expected a count like 7.5e9 or 7.5B, got '-5'"),
        (["--params", "0.5"], "jzero: error: --params: must be a finite number of at least 1 parameter, got '0.5'"),
        (["--params", "1e17"], "jzero: error: --params: must be at most 9.01e+15 parameters, got '1e17'"),
        (["--params", "1B", "--memory-per-device", "1e400"], "jzero: error: --memory-per-device: must be a finite number of"),
        (["--params", "1B", "--memory-per-device", "1e400GB"], "jzero: error: --memory-per-device: must be a finite number of"),
        (["--params", "1B", "--devices", "99999999999"], "jzero: error: --devices: must be at most 2147483647"),
    ],
)
def test_numbers_out_of_range_are_one_line(capsys, argv, message):
    """1e400 reads as infinity: once it crashed the table (OverflowError), once it 'fit' every stage."""
    assert main(["estimate", "--devices", "8", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and err.startswith(message), err
    assert "Traceback" not in err


def test_the_python_api_refuses_non_finite_numbers():
    from jzero.config.loading import ConfigError
    from jzero.ledger.estimate import estimate

    nan, inf = float("nan"), float("inf")
    for params, memory, key in [(nan, None, "--params"), (inf, None, "--params"), (1e9, nan, "--memory-per-device")]:
        with pytest.raises(ConfigError, match=key):
            estimate(params, 8, memory_per_device=memory)


def test_offload_rows_move_the_offloaded_parts_to_host(capsys):
    # The rows are the paper's formulas in float64, rounded to whole bytes: approx (rel 1e-6) covers
    # that rounding only; no sum is reordered here, so no reordering floor applies.
    assert main(["estimate", "--params", "7.5B", "--devices", "64", "--offload", "optimizer", "--json"]) == 0
    stages = json.loads(capsys.readouterr().out)["stages"]
    assert stages["0"]["offloaded"] == [] and stages["0"]["host"] == {"total": 0}  # stage 0 has nothing partitioned to move
    for s in "123":
        assert stages[s]["optimizer"] == 0 and stages[s]["offloaded"] == ["optimizer"]
        assert stages[s]["host"]["optimizer"] == pytest.approx(90e9 / 64)
    assert stages["3"]["total"] == pytest.approx(30e9 / 64)  # parameters and gradients stay on the device

    both = ["--offload", "params", "--offload", "optimizer"]
    assert main(["estimate", "--params", "7.5B", "--devices", "64", *both, "--json"]) == 0
    stages = json.loads(capsys.readouterr().out)["stages"]
    assert stages["2"]["offloaded"] == ["optimizer"] and stages["2"]["params"] == 15e9  # parameters only at stage 3
    assert stages["3"]["offloaded"] == ["optimizer", "params"] and stages["3"]["total"] == pytest.approx(15e9 / 64)
    assert stages["3"]["host"]["total"] == pytest.approx(105e9 / 64)
    with pytest.raises(SystemExit) as exit_:
        main(["estimate", "--params", "7.5B", "--devices", "64", "--offload", "disk"])
    assert exit_.value.code == 2 and "--offload" in capsys.readouterr().err


def test_the_estimate_is_a_record_whose_json_is_its_schemas_and_reads_back():
    for kwargs in ({}, {"memory_per_device": 32e9}, {"offload": ("optimizer", "params"), "model_parallel": 2}):
        result = estimate(7.5e9, 64, **kwargs)
        data = json.loads(json.dumps(to_json(result)))
        jsonschema.Draft202012Validator(json_schema(Estimate)).validate(data)
        assert from_json(Estimate, data) == result
