"""The step-time model's constants against the recorded calibration runs that fit them
(``benchmarks/calibration.py``; rerunning it takes minutes, so the suite reads its results): a
constant changed without its fit, or a fit rerun without its constant, fails here."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from jzero.ledger.timing import EFFICIENCY, FLOAT8_EFFICIENCY

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RESULTS = BENCHMARKS / "results"


def _read(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _calibration():
    """benchmarks/calibration.py as a module (its dataclasses need it in ``sys.modules``)."""
    name = "benchmarks_calibration"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, BENCHMARKS / "calibration.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def test_each_efficiency_is_its_fits_balanced_value():
    """Each constant is its fit's minimax (the geometric mean of its lowest and highest matching
    values, rounded to two places); the float8 fit was run at the constant the code has, and a pair
    counts exactly where the model predicts its bf16 run within the bf16 table's worst error."""
    table, fit = _read("calibration.json"), _read("calibration_float8_fit.json")
    assert round(table["minimax_efficiency"], 2) == EFFICIENCY
    assert round(fit["minimax_float8_efficiency"], 2) == FLOAT8_EFFICIENCY == fit["float8_efficiency"]
    assert fit["bf16_error_bound"] == table["worst_error"]
    for pair in fit["pairs"]:
        holds = abs(pair["bf16"]["error"]) <= table["worst_error"] and pair["matching_float8_efficiency"] is not None
        assert pair["in_fit"] == holds, pair["name"]
    counted = [p["matching_float8_efficiency"] for p in fit["pairs"] if p["in_fit"]]
    assert len(counted) >= 2 and (min(counted) * max(counted)) ** 0.5 == fit["minimax_float8_efficiency"]


def test_the_float8_rows_are_predicted_within_15_percent_at_the_constants():
    """Issue 54's acceptance: the peers' published float8 rows, none of them a run of either fit,
    predicted within ±15% by the model at the constants it ships with."""
    rows = _read("calibration_float8.json")
    assert (rows["efficiency"], rows["float8_efficiency"]) == (EFFICIENCY, FLOAT8_EFFICIENCY)
    fitted = [p[k] for p in _read("calibration_float8_fit.json")["pairs"] for k in ("float8", "bf16")]
    fitted += _read("calibration.json")["runs"]
    runs = {(r["target"], frozenset(r["sets"])) for r in fitted}
    assert len([r for r in rows["runs"] if r["float8_share_of_flops"] > 0]) >= 2
    assert not runs & {(r["target"], frozenset(r["sets"])) for r in rows["runs"]}
    assert all(abs(r["error"]) <= 0.15 for r in rows["runs"]), [(r["name"], r["error"]) for r in rows["runs"]]


@pytest.mark.parametrize("published", [0.3, 2.0, 5.0, 0.01, 10.0])
def test_the_matching_efficiency_is_where_the_rate_meets_the_published_figure(published):
    """The bisection on a rising rate (2 x efficiency, up to 2 at 1.0): its root within 1e-12, and
    None where no efficiency in (0.01, 1] reaches the figure."""
    solve = _calibration()._solve
    got = solve(lambda e: 2 * e, published)
    if 0.02 <= published <= 2.0:
        # 60 halvings of (0.01, 1] leave an interval 1e-18 wide: 1e-12 is float64's rounding room
        assert got == pytest.approx(published / 2, abs=1e-12)
    else:
        assert got is None
