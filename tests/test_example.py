"""The README's own-loop examples (plain Flax linen and NNX loops converted to ZeRO) run and learn."""

import importlib.util
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # Flax modules are dataclasses, which look themselves up here
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def linen_loop():
    return _load("zero3_loop")


@pytest.fixture(scope="module")
def nnx_loop():
    return _load("nnx_loop")


def _learned(losses):
    return sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


@pytest.mark.parametrize("stage", [0, 3])
def test_linen_loop_trains(devices, linen_loop, stage, capsys):
    assert _learned(linen_loop.main(steps=40, stage=stage))
    assert f"stage {stage} on 8 devices" in capsys.readouterr().out


def test_stages_agree_on_the_linen_loop(linen_loop):
    a, b = linen_loop.main(steps=10, stage=0), linen_loop.main(steps=10, stage=3)
    assert a == pytest.approx(b, rel=1e-5, abs=1e-6)


def test_nnx_loop_trains_on_dp4_mp2(devices, nnx_loop, capsys):
    assert _learned(nnx_loop.main(steps=60, stage=3))
    out = capsys.readouterr().out
    assert "P('data', 'model')" in out  # up/kernel: mlp on model, ZeRO on data
