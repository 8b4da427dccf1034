"""The first command on a fresh machine.

Every command works without JAX's CUDA plugin (the ``gpu-target`` extra), tried in subprocesses
whose import path hides the plugin, not by patching jzero's check; and ``.ci/run`` runs the
README's two commands as written.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from support.xla import compile_flags

ROOT = Path(__file__).resolve().parents[1]
HIDDEN = ("jax_plugins", "jax_cuda")  # the site-packages entries of the plugin and its metadata


def _site_view(site: Path, view: Path) -> None:
    view.mkdir()
    for entry in site.iterdir():
        if not entry.name.startswith(HIDDEN):
            (view / entry.name).symlink_to(entry)


@pytest.fixture(scope="module")
def no_plugin(tmp_path_factory):
    """An environment whose Python (and every process it starts) sees site-packages without the plugin.

    A ``sitecustomize`` on ``PYTHONPATH`` swaps the real site-packages for a view of it that leaves
    out the plugin's files; children inherit it, so ``jzero launch``'s processes see the same.
    """
    tmp = tmp_path_factory.mktemp("no_plugin")
    site = Path(jax.__file__).resolve().parents[1]
    _site_view(site, tmp / "site")
    (tmp / "hook").mkdir()
    (tmp / "hook" / "sitecustomize.py").write_text(
        f"import sys\nsys.path[:] = [p for p in sys.path if p != {str(site)!r}] + [{str(tmp / 'site')!r}]\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}  # as a new user has it
    # but for the suite's fast compile (support/xla.py): jzero must still simulate its own 8 devices
    env["XLA_FLAGS"] = compile_flags()
    env["PYTHONPATH"] = str(tmp / "hook")
    hidden = subprocess.run([sys.executable, "-c", "import jax_plugins"], env=env, capture_output=True, text=True)
    assert "No module named 'jax_plugins'" in hidden.stderr, "the view must hide the plugin"
    return env


def _python(env, code):
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc.stdout


def _jzero(env, *argv, status=0):
    proc = subprocess.run([sys.executable, "-m", "jzero.cli", *argv], env=env, capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == status and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def test_plugin_check_without_jax_plugins(no_plugin):
    """``importlib.util.find_spec("jax_plugins.xla_cuda12")`` raised here: its parent was missing."""
    code = "from jzero.ledger.targets import gpu_compiler_available as a, jax_plugin_modules as m; print(a(), m())"
    assert _python(no_plugin, code).split() == ["False", "[]"]


def test_a_plugin_advertised_only_by_an_entry_point_counts(no_plugin, tmp_path):
    """Another layout JAX accepts: no ``jax_plugins`` package, only an entry point (a CUDA 13 name)."""
    dist = tmp_path / "fake_cuda13-0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-cuda13\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[jax_plugins]\nxla_cuda13 = fake_xla_cuda13\n")
    (tmp_path / "fake_xla_cuda13.py").write_text("def initialize():\n    pass\n")
    env = {**no_plugin, "PYTHONPATH": f"{no_plugin['PYTHONPATH']}{os.pathsep}{tmp_path}"}
    code = "from jzero.ledger.targets import gpu_compiler_available as a, jax_plugin_modules as m; print(a(), m())"
    assert _python(env, code).split() == ["True", "['fake_xla_cuda13']"]


def test_the_commands_without_the_plugin_say_so(no_plugin):
    """Without the plugin, ``--version`` says so and ``--target`` is one line naming the extra.
    The other commands run without it in ``.ci/run``'s first command, in a real venv that never had
    the extra (train, launch, report, plan, estimate, checkpoint info and export, sample, data)."""
    assert "CUDA plugin: none" in _jzero(no_plugin, "--version").stdout
    _jzero(no_plugin, "estimate", "--params", "7.5B", "--devices", "64")
    err = _jzero(no_plugin, "plan", "configs/gpt-tiny.yaml", "--target", "h100x8", status=2).stderr
    assert err.splitlines() == [err.strip()] and err.startswith("jzero: error: --target: ") and "[gpu-target]" in err


def test_ci_runs_every_command_in_a_venv_without_the_extra():
    """``.ci/run``'s first command, in its plain venv, runs each command the suite no longer runs without the plugin."""
    first = (ROOT / ".ci" / "run").read_text().split("first_command() {")[1].split("\n}\n")[0]
    for command in ("jzero train ", "jzero launch -n 2 ", "jzero plan ", "jzero estimate ", "jzero checkpoint info ",
                    "jzero checkpoint export ", "jzero sample ", "jzero data prepare "):  # fmt: skip
        assert f"\n{command}" in first, command


def _readme_commands() -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)[:2]]


def test_ci_runs_the_readme_commands_as_written():
    """``.ci/run`` runs each README command as its own line: the first with only ``--set train.steps=N`` added."""
    install_and_train, tests = _readme_commands()
    assert "pip install -e '.[plot]' &&" in install_and_train and "jzero train configs/" in install_and_train
    assert "pytest" in tests
    ran = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python3 -m venv")]
    assert len(ran) == 2, ran
    assert re.fullmatch(re.escape(install_and_train) + r" --set train\.steps=\d+", ran[0]), (ran[0], install_and_train)
    assert ran[1] == tests
