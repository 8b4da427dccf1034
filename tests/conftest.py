"""Tests run on 8 simulated CPU devices, fixed before JAX starts its backend. Fixtures only: the
helpers the tests share are in ``tests/support/``."""

import atexit
import compileall
import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

from support.xla import suite_flags  # noqa: E402  # imports nothing: JAX has not started

FLAGS = suite_flags()  # 8 CPU devices and a fast compile (support/xla.py says why)
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FLAGS).strip()
os.environ["JZERO_SUITE_XLA_FLAGS"] = FLAGS  # the suite's, not a user's: what jzero plan prints leaves them out
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# JAX's persistent compilation cache (on by default, jzero.compiler.cache) in a folder of this test
# process's own, which its subprocesses share, rather than the user's ~/.cache.
_CACHE = tempfile.mkdtemp(prefix="jzero-tests-jax-cache-")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
# Every program, not only those that took over JAX's 1 s: many tests build the same tiny step again
# (a new Job, a new closure, the same program), and a hit costs less than a compile (docs/design.md,
# "The test suite's time", "Where a test process's time goes").
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# No Python frames in the programs' locations: they are debug information only, left out of the
# cache key, and a GPU target's compile annotates its kernels with them (docs/design.md, "The test
# suite's time", "Python frames in the programs' locations").
os.environ.setdefault("JAX_TRACEBACK_IN_LOCATIONS_LIMIT", "0")

# The suite starts many Python processes that import jzero. Where PYTHONDONTWRITEBYTECODE is set,
# each would compile jzero's sources afresh (docs/design.md, "The test suite's time", "jzero's byte
# code").
if sys.dont_write_bytecode:
    compileall.compile_dir(Path(__file__).resolve().parents[1] / "jzero", quiet=1)

# Python's collector walks the whole heap at each full collection, and a test process's heap grows
# with each program it traces and keeps: collect less often (docs/design.md, "The test suite's
# time", "Python's garbage collector in a test process").
gc.set_threshold(20_000, 50, 1_000)

from jzero.distributed.process import import_jax  # noqa: E402

import_jax()  # the CUDA plugin (the gpu-target extra) prints no-GPU notices on import; dropped

import jax  # noqa: E402
import pytest  # noqa: E402
from support.configs import LR, tiny_config  # noqa: E402
from support.reference import reference_with_floor  # noqa: E402
from support.tokens import FRACTION, VOCAB, write_corpus  # noqa: E402

from jzero.data.prepare import prepare  # noqa: E402
from jzero.ledger.targets import gpu_compiler_available, target_devices  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)


@pytest.fixture(scope="session")
def devices():
    assert jax.device_count() == 8, "tests expect 8 simulated CPU devices"
    return jax.devices()


@pytest.fixture(scope="session")
def h100x8():
    """Eight H100s to compile for, deviceless (the gpu-target extra; tests/ledger/test_targets.py)."""
    if not gpu_compiler_available():
        pytest.fail("the gpu-target extra is not installed: pip install -e '.[test,gpu-target]'")
    return target_devices("h100x8")


@pytest.fixture(scope="session")
def data():
    from jzero.training.data import text_batches

    cfg = tiny_config()
    return text_batches(None, cfg.data.max_bytes, cfg.model.seq_len, cfg.train.global_batch_size, cfg.seed)


@pytest.fixture(scope="session")
def reference(data):
    """The tiny GPT trained 20 steps on one device by plain optax AdamW (:func:`support.reference.optax_tx`),
    with its reordering floor."""
    import jax.numpy as jnp
    from support.reference import optax_tx

    from jzero.training.job import build_job

    s = build_job(tiny_config(LR, "mesh.axes.data=1"), devices=jax.devices()[:1])
    return reference_with_floor(s.init_fn, s.loss_fn, optax_tx(s.config), s.rng, lambda k: jnp.asarray(data.global_batch(k)))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A token folder prepared from :func:`support.tokens.write_corpus`'s sources: ``(sources, folder)``."""
    root = tmp_path_factory.mktemp("corpus")
    sources = write_corpus(root)
    out = root / "prepared"
    prepare(sources, out, vocab_size=VOCAB, eval_fraction=FRACTION, progress=False)
    return sources, out


@pytest.fixture(scope="module")
def two_hosts(h100x8):
    """Two hosts of four H100s (the gpu-target extra is there: h100x8)."""
    return target_devices("h100", hosts=2, gpus_per_host=4)


@pytest.fixture(scope="session")
def user_cache(tmp_path_factory):
    """``XDG_CACHE_HOME`` for the commands the tests run as a user (:mod:`support.commands`): one for
    the whole run, every worker's, so a program one of them compiled is in the user's JAX
    compilation cache for the next, as on a user's machine after the first command."""
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "user-cache"


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory, devices):
    """A run of :func:`support.runs.run_config` trained 2 steps (one checkpoint, step 2), once a
    module; a test copies it (:func:`support.runs.copy_run`) rather than trains its own."""
    from support.runs import trained_run

    return trained_run(tmp_path_factory.mktemp("trained"), "train.steps=2")


@pytest.fixture(scope="module")
def four_steps(tmp_path_factory, devices):
    """The same trained 4 steps: checkpoints at steps 2 and 4."""
    from support.runs import trained_run

    return trained_run(tmp_path_factory.mktemp("trained"), "train.steps=4")
