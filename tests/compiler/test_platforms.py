"""Quiet imports: on a host without a GPU, nothing about CUDA is printed by ``import jzero``, by a
script that imports JAX first, or by a command (tests/cli/test_cli.py), with or without the
``gpu-target`` extra (the test venv has it). JAX's own platform option does it (:mod:`jzero.compiler.platforms`)."""

import os
import subprocess
import sys

import pytest

from jzero.compiler.platforms import cuda_driver_present, gpu_compiler_available, platforms_for

NO_GPU = not cuda_driver_present()


def _fresh(code: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a new Python with none of the tests' device or platform settings."""
    base = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES")}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("imports", ["import jax, jzero", "import jzero, jax"])
def test_a_script_prints_nothing_about_cuda(imports):
    done = _fresh(f"{imports}; print(jax.devices()[0].platform, jax.device_count())")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    if NO_GPU:
        assert done.stdout == "cpu 1\n"


def test_the_cpu_is_chosen_only_where_cuda_cannot_run():
    """``import jzero`` sets JAX's documented ``JAX_PLATFORMS`` only with a CUDA plugin and no
    driver, and never over the user's own choice."""
    code = "import os, jzero; print(os.environ.get('JAX_PLATFORMS'))"
    assert _fresh(code).stdout.split() == ["cpu" if NO_GPU and gpu_compiler_available() else "None"]
    assert _fresh(code, JAX_PLATFORMS="cuda,cpu").stdout.split() == ["cuda,cpu"]
    assert platforms_for(target=True) == "cpu"
