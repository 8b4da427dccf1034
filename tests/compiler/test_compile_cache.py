"""JAX's persistent compilation cache, on by default (:mod:`jzero.compiler.cache`), and what
``jzero train`` says around its compile: a labelled, timed compile line, a next-step hint, and no
stray progress bar when there is nothing to do."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.configs import TINY

from jzero.compiler.cache import cache_folder
from jzero.config.loading import load_config
from jzero.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def _train(tmp_path: Path, run: str, *sets: str) -> tuple[str, str]:
    """``jzero train`` of the tiny config in a new process whose cache is the default one under
    ``tmp_path`` (XDG_CACHE_HOME): its stdout and stderr."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # JAX caches only compiles over 1 s; the tiny one is quicker
    keys = [*TINY, "train.steps=2", f"run.dir={tmp_path / run}", *sets]
    argv = [sys.executable, "-m", "jzero.cli", "train", "configs/gpt-tiny.yaml", *[a for k in keys for a in ("--set", k)]]
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
    return done.stdout, done.stderr


def test_a_second_run_reads_its_step_from_the_cache_and_each_run_says_what_next(tmp_path):
    folder = tmp_path / "cache" / "jzero" / "jax"
    out, err = _train(tmp_path, "a")
    first = out + err
    assert "compiling the train step: stage 3 on data=8 x model=1, 41,792 parameters, from step 0\n" in first
    assert "compiled in " in first and "compilation cache" not in first
    assert any(p.name.startswith("jit_step-") for p in folder.iterdir())
    run = tmp_path / "a"
    assert out.rstrip().splitlines()[-1] == (
        f'next: jzero sample {run} --prompt "def " to continue a prompt, jzero report {run} --out {run}/loss.png '
        "to plot the loss, or the same command with --set train.steps=4 to train on"
    )

    second = "".join(_train(tmp_path, "b"))
    assert f", read from JAX's compilation cache in {folder}\n" in second

    again = "".join(_train(tmp_path, "a"))  # nothing to do: no compile, and no progress bar drawn
    assert "step 2 already reached train.steps=2; nothing to do" in again
    assert "compiling" not in again and "━" not in again and "0/2" not in again


def test_the_cache_setting():
    assert cache_folder("off") is None
    assert cache_folder("/some/folder") == Path("/some/folder")
    assert load_config(None, ["runtime.compilation_cache=off"]).runtime.compilation_cache == "off"  # YAML's false
    with pytest.raises(ConfigError, match=r"^runtime.compilation_cache: must be auto, off or a folder, got True$"):
        load_config(None, ["runtime.compilation_cache=true"])


@pytest.fixture
def cache_in(tmp_path):
    """JAX's cache folder setting pointed at ``tmp_path`` for the test (what jzero reads of it)."""
    import jax

    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    yield tmp_path
    jax.config.update("jax_compilation_cache_dir", before)


def _compile_gathered(devices):
    """A bf16 program that gathers a sharded array after a fusion, compiled for ``devices`` as a
    job's step is (:func:`jzero.training.job.compile_lowered`): kernels to cache, in a second of
    compile rather than the tiny GPT step's five."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from jzero.compiler.compiling import compile_lowered

    mesh = Mesh(np.array(devices), ("data",))
    x = jax.ShapeDtypeStruct((len(devices) * 64, 64), jnp.bfloat16, sharding=NamedSharding(mesh, PartitionSpec("data")))
    whole = jax.jit(lambda x: jnp.tanh(x) * 2, out_shardings=NamedSharding(mesh, PartitionSpec()))
    return compile_lowered(whole.lower(x), list(devices), None, {})


def test_a_gpu_targets_kernels_are_cached_per_gpu_kind_and_a_cpu_compile_has_none(cache_in, h100x8):
    """A deviceless GPU compile writes XLA's kernel cache (the PTX assembly it can skip next time) in
    the persistent cache's folder, one file per GPU kind, and leaves its lock; the CPU's programs
    are read back whole, so a CPU compile writes none."""
    import jax

    from jzero.compiler.cache import kernel_cache_file
    from jzero.ledger.targets import target_devices

    tmp_path = cache_in
    _compile_gathered(jax.devices())
    assert not list(tmp_path.glob("xla-gpu-kernels-*"))
    assert kernel_cache_file(jax.devices()) is None
    for devices in (h100x8, target_devices("a100x8")):
        _compile_gathered(devices)
    h100, a100 = kernel_cache_file(h100x8), kernel_cache_file(target_devices("a100x8"))
    assert h100.parent == a100.parent == tmp_path and h100 != a100
    assert h100.stat().st_size > 0 and a100.stat().st_size > 0
    assert sorted(p.name for p in tmp_path.glob("xla-gpu-kernels-*")) == sorted(
        [h100.name, a100.name, h100.with_suffix(".lock").name, a100.with_suffix(".lock").name]
    )


@pytest.mark.parametrize("blocked", ["xla-gpu-kernels-nvidia-h100-80gb-hbm3.pb", "xla-gpu-kernels-nvidia-h100-80gb-hbm3.lock"])
def test_a_kernel_cache_that_cannot_be_written_is_passed_over(cache_in, h100x8, blocked):
    """A folder where the kernel cache or its lock should be (as an unwritable path would be): the
    GPU target's program compiles all the same, without the cache."""
    (cache_in / blocked).mkdir()
    assert "all-gather" in _compile_gathered(h100x8).as_text()
    assert (cache_in / blocked).is_dir()
