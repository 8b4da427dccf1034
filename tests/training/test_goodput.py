"""Where a run's wall time went (:mod:`jzero.training.goodput`), on blocks timed here."""

import time

import pytest

from jzero.ledger.startup import GoodputReport
from jzero.training.goodput import KINDS, Goodput, format_goodput


def test_a_compile_inside_the_start_up_is_charged_to_the_compile_alone():
    goodput = Goodput()
    outer = time.perf_counter()
    with goodput.timed("startup"):
        time.sleep(0.05)
        with goodput.timed("compile"):
            time.sleep(0.10)
    outer = time.perf_counter() - outer  # the start-up block's wall time, the compile in it
    time.sleep(0.05)  # a step
    report = goodput.report()
    seconds = report.seconds
    # Bounds from below and from the blocks' own wall time, not from the sleeps: a loaded host
    # sleeps longer. rel=1e-6 (approx's default): float sums of a few seconds, no reduction order.
    assert seconds["compile"] >= 0.10 and seconds["startup"] >= 0.05
    assert seconds["startup"] + seconds["compile"] <= outer  # the compile inside is not charged twice
    assert seconds["steps"] >= 0.05
    assert seconds["steps"] == pytest.approx(report.wall_s - sum(seconds[k] for k in KINDS))
    assert report.goodput == pytest.approx(seconds["steps"] / report.wall_s)
    assert sum(seconds.values()) == pytest.approx(report.wall_s)


def test_the_line_gives_each_share_of_the_wall_time():
    report = GoodputReport(wall_s=10.0, goodput=0.5, seconds={"steps": 5.0, "startup": 1.0, "compile": 4.0})
    assert format_goodput(report) == "goodput 0.50 of 10.0 s: steps 50.0%, start-up 10.0%, compile 40.0%"
