"""Bad input of every kind gets ONE line naming the key or path, exit status 2, no traceback, and
nothing already written is lost or overwritten: configs, overrides, checkpoints to export onto a
full disk (exit status 1: the machine's fault) or beside a user's own files, files to start from,
and Ctrl-C while JAX imports."""

import _thread
import errno
import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support.cli import jzero_env, one_line_error, one_line_failure, sets
from support.configs import CONFIG, ROOT, TINY
from support.files import snapshot

import jzero.checkpoint.export
from jzero.checkpoint.export import read_safetensors
from jzero.cli.interrupts import interrupt_raises, on_sigint
from jzero.cli.main import main
from jzero.config.loading import ConfigError, load_config
from jzero.config.run_folder import CHECKPOINTS

# ---------------------------------------------------------------------------------------------
# Config files


def test_a_config_that_is_not_utf8_is_one_line(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    before = b"seed: 1\nrun:\n  dir: caf\xe9\n"  # Latin-1
    path.write_bytes(before)
    one_line_error(capsys, ["plan", str(path)], f"config: {path} is not UTF-8 text (byte 0xe9 at offset {before.index(0xE9)})")
    assert path.read_bytes() == before


def test_a_directory_as_the_config_is_named_as_one(tmp_path, capsys):
    one_line_error(capsys, ["plan", str(tmp_path)], f"config: {tmp_path} is a directory, not a YAML file")


def test_a_config_path_that_is_a_folder_or_holds_nul_is_one_plain_line(tmp_path, capsys):
    line = one_line_error(capsys, ["plan", str(tmp_path)], "")
    assert line == f"jzero: error: config: {tmp_path} is a directory, not a YAML file"
    line = one_line_error(capsys, ["train", "c\x00.yaml"], "")
    assert line == "jzero: error: config: a path must not contain a NUL byte, got 'c\\x00.yaml'"


@pytest.mark.parametrize("text", ["", "# only a comment\n\n", "---\n"])
def test_an_empty_config_points_to_the_tiny_one(tmp_path, capsys, text):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    one_line_error(capsys, ["train", str(path)], f"config: {path} holds no settings; start from a copy of configs/gpt-tiny.yaml")
    assert list(tmp_path.iterdir()) == [path]


def test_a_section_or_key_given_twice_names_the_lines(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  steps: 2\nseed: 1\ntrain:\n  steps: 3\n")
    one_line_error(capsys, ["plan", str(path)], f"config: {path} line 4: 'train' is given twice (first at line 1)")
    (tmp_path / "m.yaml").write_text("axes:\n  data: 4\n  model: 2\n  data: 8\n")
    path.write_text("mesh: m.yaml\n")
    one_line_error(capsys, ["plan", str(path)], f"mesh: {tmp_path / 'm.yaml'} line 4: 'data' is given twice (first at line 2)")
    one_line_error(capsys, ["plan", CONFIG, *sets("model={d_model: 64, d_model: 32}")], "model: the value gives 'd_model' twice")


def test_deep_nesting_is_one_line_in_a_file_and_in_set(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("seed: " + "[" * 100_000 + "\n")
    one_line_error(capsys, ["plan", str(path)], f"config: {path} is nested too deeply to read")
    one_line_error(capsys, ["plan", CONFIG, *sets("seed=" + "[" * 100_000)], "seed: value is nested too deeply to read")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("seed: !!python/object/apply:os.system ['true']\n", "is not valid YAML (line 1: could not determine a constructor"),
        ("seed: 2001-13-01\n", "is not valid YAML (month must be in 1..12)"),
        ("seed: " + "9" * 5000 + "\n", "is not valid YAML (Exceeds the limit"),
        ("seed: 1\x00\n", "is not valid YAML (unacceptable character #x0000"),
        ("model: [unclosed\n", "is not valid YAML (line 2:"),
    ],
)
def test_yaml_python_cannot_build_is_one_line(tmp_path, capsys, text, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    one_line_error(capsys, ["plan", str(path)], f"config: {path} {fragment}")


def test_an_unreadable_config_is_one_line(tmp_path, capsys, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 1\n")

    def denied(*args, **kwargs):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr("jzero.config.loading.open", denied, raising=False)  # root reads any file; this cannot
    one_line_error(capsys, ["plan", str(path)], f"config: cannot read {path}: Permission denied")


# Root reads any file through these capabilities; without them it is refused as a normal user is.
NO_DAC = "-dac_override,-dac_read_search"


def test_a_config_without_read_permission_is_one_line(tmp_path, capsys):
    """A real chmod 0 and the real open's EACCES: as root, the command runs without the capabilities
    that let root read any file (util-linux's setpriv), so this runs in CI, which is root."""
    path = tmp_path / "c.yaml"
    path.write_text("seed: 1\n")
    path.chmod(0)
    message = f"config: cannot read {path}: Permission denied"
    if not os.access(path, os.R_OK):  # a normal user
        one_line_error(capsys, ["plan", str(path)], message)
        return
    argv = ["setpriv", f"--bounding-set={NO_DAC}", f"--inh-caps={NO_DAC}", sys.executable, "-m", "jzero.cli", "plan", str(path)]
    done = subprocess.run(argv, capture_output=True, text=True, env=jzero_env())
    assert (done.returncode, done.stdout, done.stderr) == (2, "", f"jzero: error: {message}\n")


def test_a_fifo_as_the_config_does_not_block(tmp_path, capsys):
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    one_line_error(capsys, ["plan", str(fifo)], f"config: {fifo} is not a regular file")


def alias_bomb(levels: int = 7) -> str:
    """A few hundred bytes of YAML: a list nested ``levels + 1`` deep, 9 wide at each level, built
    from aliases (9**8 leaves for 7 levels; its full repr would be hundreds of MB)."""
    value = "[x, x, x, x, x, x, x, x, x]"
    for k in range(levels):
        value = f"[&l{k} {value}" + f", *l{k}" * 8 + "]"
    return value


@pytest.mark.parametrize(
    "yaml_text, key",
    [
        (f"seed: {alias_bomb()}\n", "seed: must be an integer, got [[[[...], [...], "),
        (f"model: {alias_bomb()}\n", "model: must be a section (mapping), got [[[[...], [...], "),
        (f"mesh: {{axes: {alias_bomb()}}}\n", "mesh.axes: must be a mapping, got [[[[...], [...], "),
        (f"partitioning: {{rules: {alias_bomb()}}}\n", "partitioning.rules[0][0][0]: must be a string"),
    ],
)
def test_a_yaml_alias_bomb_makes_a_short_message_fast(tmp_path, capsys, yaml_text, key):
    """The message quotes a bounded prefix of the value, built without walking all of it."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text)
    assert len(yaml_text) < 500
    start = time.perf_counter()
    line = one_line_error(capsys, ["plan", str(path)], key)
    assert len(line) < 300 and time.perf_counter() - start < 5, len(line)


def test_an_alias_bomb_in_set_makes_a_short_message(capsys):
    line = one_line_error(capsys, ["plan", CONFIG, *sets(f"seed={alias_bomb()}")], "seed: must be an integer, got [[[[")
    assert len(line) < 300


# ---------------------------------------------------------------------------------------------
# Values: range and finiteness, the whole class


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("optimizer.learning_rate=.nan", "optimizer.learning_rate: must be a finite number, got nan"),
        ("optimizer.learning_rate=nan", "optimizer.learning_rate: must be a number, got 'nan'"),  # text: YAML's NaN is .nan
        ("optimizer.learning_rate=.inf", "optimizer.learning_rate: must be a finite number, got inf"),
        ("optimizer.learning_rate=inf", "optimizer.learning_rate: must be a number, got 'inf'"),
        ("optimizer.learning_rate=" + "9" * 400, "optimizer.learning_rate: must be a finite number"),
        ("optimizer.learning_rate=0", "optimizer.learning_rate: must be positive, got 0"),
        ("optimizer.clip_norm=.nan", "optimizer.clip_norm: must be a finite number, got nan"),
        ("optimizer.clip_norm=0", "optimizer.clip_norm: must be positive, got 0"),
        ("optimizer.b1=1.5", "optimizer.b1: must be in [0, 1), got 1.5"),
        ("optimizer.b1=1", "optimizer.b1: must be in [0, 1), got 1"),
        ("optimizer.b2=-0.1", "optimizer.b2: must be in [0, 1), got -0.1"),
        ("optimizer.eps=0", "optimizer.eps: must be positive, got 0"),
        ("optimizer.eps=-.inf", "optimizer.eps: must be a finite number"),
        ("optimizer.weight_decay=-1", "optimizer.weight_decay: must be >= 0, got -1"),
        ("optimizer.min_lr_ratio=1.5", "optimizer.min_lr_ratio: must be in [0, 1], got 1.5"),
        ("optimizer.warmup_steps=-1", "optimizer.warmup_steps: must be in [0, 2147483647], got -1"),
        ("precision.loss_scale=.nan", "precision.loss_scale: must be a finite number, got nan"),
        ("precision.loss_scale=1e39", "precision.loss_scale: must be at most 3.40282e+38 in size (float32's largest"),
        ("precision.loss_scale_window=3000000000", "precision.loss_scale_window: must be positive and at most 2147483647"),
        ("seed=-1", "seed: must be in [0, 4294967295], got -1"),
        ("seed=4294967296", "seed: must be in [0, 4294967295], got 4294967296"),
        ("seed=" + "9" * 30, "seed: is out of range (more than 64 bits)"),
        ("seed=" + "9" * 5000, "seed: is out of range (more than 64 bits)"),
        ("seed=3.5", "seed: must be an integer, got 3.5"),
        ("model.d_model=1000000000000", "model.d_model: must be positive and at most 2147483647, got 1000000000000"),
        ("model.mlp_ratio=100000000", "model.mlp_ratio: the MLP width mlp_ratio x d_model = 3200000000 is over 2147483647"),
        ("model.d_model=1048576 model.n_layers=1048576", "model: d_model=1048576, n_layers=1048576, mlp_ratio=4, vocab_"),
        ("train.steps=1e20", "train.steps: is out of range (more than 64 bits), got 1e+20"),
        ("train.steps=3000000000", "train.steps: must be positive and at most 2147483647, got 3000000000"),
        ("runtime.cpu_devices=100000", "runtime.cpu_devices: must be positive and at most 4096, got 100000"),
        ("data.max_bytes=1e30", "data.max_bytes: is out of range (more than 64 bits)"),
        ("mesh.axes.data=3000000000", "mesh.axes.data: size must be positive (at most 2147483647) or -1"),
        ("seed=2001-13-01", "seed: must be an integer, got '2001-13-01'"),
        # Numbers of the key's type, finite and nonzero as the float32 the step uses them in
        ("train.steps='2'", "train.steps: must be an integer, got '2' (a string: write it without quotes)"),
        ("optimizer.learning_rate='1e-3'", "optimizer.learning_rate: must be a number, got '1e-3' (a string: write"),
        ("optimizer.learning_rate=1e300", "optimizer.learning_rate: must be at most 3.40282e+38 in size (float32's largest"),
        ("optimizer.eps=1e-40", "optimizer.eps: must be 0 or at least 1.17549e-38 in size (float32's smallest normal"),
        ("optimizer.b2=0.99999999", "optimizer.b2: is 1 as a float32, which the optimizer uses; at most 0.9999999403953552"),
        # Paths are strings without NUL bytes
        ("run.dir=5", "run.dir: must be a string, got 5"),
        ("data.tokens=a\x00b", "data.tokens: a path must not contain a NUL byte, got 'a\\x00b'"),
        ("train.init_from=''", "train.init_from: a path must not be empty"),
        # The batch splits over the devices, then each device's rows over the microbatches (16 rows, 8 devices: 2 each)
        ("mesh.axes.data=8 train.microbatches=4", "train.microbatches: 4 microbatches of the 16-row batch do not split evenly"),
    ],
)
def test_meaningless_values_are_refused(tmp_path, capsys, override, fragment):
    run_dir = tmp_path / "run"
    overrides = [*TINY, f"run.dir={run_dir}", *override.split(" ")]
    with pytest.raises(ConfigError):  # first, so that a value wrongly accepted never starts a run
        load_config(CONFIG, overrides)
    one_line_error(capsys, ["train", CONFIG, *sets(*overrides)], fragment)
    assert not run_dir.exists()


def test_the_largest_seed_works_end_to_end():
    """2**32 - 1 is accepted because grain's shuffle and jax.random.key both take it."""
    import jax

    from jzero.training.data import TextBatches

    config = load_config(CONFIG, ["seed=4294967295"])
    assert config.seed == 2**32 - 1
    batches = TextBatches(np.arange(1000, dtype=np.uint8), 8, 4, config.seed)
    assert batches.global_batch(0).shape == (4, 9)
    assert jax.random.key(config.seed).shape == ()


def test_jax_keeps_only_32_bits_of_a_seed():
    """Why ``seed`` stops at 2**32 - 1: past it, jax.random.key would give another seed's key."""
    import jax

    def data(seed):
        return jax.random.key_data(jax.random.key(seed)).tolist()

    assert data(2**32) == data(0) and data(2**40 + 5) == data(5)


# ---------------------------------------------------------------------------------------------
# A mesh file from --set


def test_set_mesh_names_a_mesh_file_as_yaml_does(capsys):
    assert load_config(CONFIG, ["mesh=mesh/dp4-mp2.yaml"]).mesh.axes == {"data": 4, "model": 2}
    missing = ROOT / "configs/mesh/none.yaml"  # relative to the config's folder, as in the file
    one_line_error(capsys, ["plan", CONFIG, *sets("mesh=mesh/none.yaml")], f"mesh: file not found: {missing}")


# ---------------------------------------------------------------------------------------------
# Export: never a user's file, and a write error names --out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, devices):
    from jzero.training.loop import train

    run = tmp_path_factory.mktemp("run")
    overrides = [*TINY, "mesh.axes.data=8", "train.steps=2", "checkpoint.every=2", f"run.dir={run}"]
    train(load_config(CONFIG, overrides), progress=False)
    assert (run / CHECKPOINTS / "2").is_dir()
    return run


def test_export_keeps_a_users_partial_file(run_dir, tmp_path, capsys):
    out = tmp_path / "model.safetensors"
    mine = tmp_path / "model.safetensors.partial"
    mine.write_bytes(b"my own bytes\x00\xff")
    assert main(["checkpoint", "export", str(run_dir), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("exported step 2 (params): ") and printed.strip().endswith(f"to {out}")
    assert mine.read_bytes() == b"my own bytes\x00\xff"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors", "model.safetensors.partial"]
    assert f"{len(read_safetensors(out))} tensors" in printed  # and the export reads back whole


def full_disk(out, tensors, produce, metadata):
    """``write_safetensors`` on a disk that fills after the first bytes."""
    Path(out).write_bytes(b"\x00" * 64)
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out))


def unreadable(*args, **kwargs):
    raise ValueError("DATA_LOSS: Error reading chunk")


@pytest.mark.parametrize("failure", ["full-disk", "unreadable-checkpoint"])
def test_a_failed_export_keeps_a_users_partial_file(run_dir, tmp_path, capsys, monkeypatch, failure):
    out = tmp_path / "model.safetensors"
    (tmp_path / "model.safetensors.partial").write_bytes(b"my own bytes")
    before = snapshot(tmp_path)
    argv = ["checkpoint", "export", str(run_dir), "--out", str(out)]
    if failure == "full-disk":  # the machine's fault: exit 1
        monkeypatch.setattr(jzero.checkpoint.export, "write_safetensors", full_disk)
        one_line_failure(capsys, argv, f"jzero: --out: cannot write {out}: No space left on device")
    else:
        monkeypatch.setattr(jzero.checkpoint.export, "restore_numpy", unreadable)
        fragment = f"jzero: error: {run_dir / CHECKPOINTS / '2'}: is unreadable (ValueError: DATA_LOSS"
        assert one_line_error(capsys, argv, fragment).startswith(fragment)
    assert snapshot(tmp_path) == before  # no temporary file left, the user's one untouched


def test_export_under_a_file_is_one_line_and_exit_2(run_dir, tmp_path, capsys):
    (tmp_path / "file").write_text("a file, not a folder")
    before = snapshot(tmp_path)
    out = tmp_path / "file" / "model.safetensors"
    argv = ["checkpoint", "export", str(run_dir), "--out", str(out)]
    one_line_error(capsys, argv, f"--out: cannot write {out}: Not a directory")
    assert snapshot(tmp_path) == before


def test_an_interrupted_export_leaves_nothing(run_dir, tmp_path, capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    (tmp_path / "model.safetensors.partial").write_bytes(b"my own bytes")
    before = snapshot(tmp_path)
    monkeypatch.setattr(jzero.checkpoint.export, "restore_numpy", interrupted)  # Ctrl-C while reading a tensor
    assert main(["checkpoint", "export", str(run_dir), "--out", str(tmp_path / "model.safetensors")]) == 130
    assert capsys.readouterr().err.splitlines() == ["jzero: interrupted"]
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("where", ["finalizer", "unraisable-hook"])
def test_ctrl_c_that_lands_in_a_finalizer_is_raised_again_in_the_command(where):
    """Ctrl-C during an export can land in a garbage-collector callback (JAX's), where Python prints
    the KeyboardInterrupt and runs on: the export then exited 0 with a traceback (a suite run of
    tests/training/test_faults.py). Within ``interrupt_raises`` it is raised again in the command,
    also when it lands while Python reports another finalizer's error (``sys.unraisablehook``)."""

    class RaisesWhenCollected:
        def __del__(self):  # as Ctrl-C's handler does when the signal lands in here
            raise KeyboardInterrupt if where == "finalizer" else ValueError("a finalizer's own error")

    def ctrl_c_while_reporting(info):
        _thread.interrupt_main(signal.SIGINT)

    previous, hook = signal.signal(signal.SIGINT, on_sigint), sys.unraisablehook
    if where == "unraisable-hook":
        sys.unraisablehook = ctrl_c_while_reporting
    deadline = time.monotonic() + 10
    try:
        with pytest.raises(KeyboardInterrupt), interrupt_raises():
            RaisesWhenCollected()  # collected at once: what it raises can only be reported
            while time.monotonic() < deadline:  # the command's own work, where it must be raised
                pass
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = hook
    assert time.monotonic() < deadline


@pytest.mark.parametrize("disk, reason", [("full", "No space left on device"), ("read-only", "Read-only file system")])
def test_export_onto_a_real_full_or_read_only_disk(run_dir, tmp_path, capsys, disk, reason):
    """A 64 KiB tmpfs, which the tiny model's parameters (170 KB) do not fit, or one remounted
    read-only (which stops root too)."""
    folder = tmp_path / "disk"
    folder.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)]).returncode:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        (folder / "model.safetensors.partial").write_bytes(b"my own bytes")
        before = snapshot(folder)
        if disk == "read-only":
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        out = folder / "model.safetensors"
        argv = ["checkpoint", "export", str(run_dir), "--out", str(out)]
        one_line_failure(capsys, argv, f"jzero: --out: cannot write {out}: {reason}")  # the machine's fault: exit 1
        assert snapshot(folder) == before
    finally:
        subprocess.run(["umount", "-l", str(folder)])


# ---------------------------------------------------------------------------------------------
# train.init_from: the file's format is checked before use


def safetensors_bytes(header: dict, data: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + data


def one_tensor(dtype: str, shape: list, offsets: list, data: bytes) -> bytes:
    return safetensors_bytes({"w": {"dtype": dtype, "shape": shape, "data_offsets": offsets}}, data)


BAD_SAFETENSORS = {
    "text": (b"just some notes, not tensors\n", "its header length 7885648055778899306 exceeds the 21 bytes after it"),
    "empty": (b"", "0 bytes, less than the 8-byte header length"),
    "header-not-utf8": (struct.pack("<Q", 5) + b"\xff\xfe{}}", "the header is not UTF-8 JSON"),
    "header-a-list": (struct.pack("<Q", 2) + b"[]", "the header is not a JSON object"),
    "header-past-the-end": (struct.pack("<Q", 200_000_000) + b" " * 16, "header length 200000000 exceeds the 16 bytes after it"),
    "data-cut-short": (one_tensor("F32", [4], [0, 16], b"\0" * 8), "the header describes 16 bytes of data, the file holds 8"),
    "size-not-shape": (one_tensor("F32", [4], [0, 8], b"\0" * 8), "tensor w: 8 bytes for shape [4] of F32 (16 bytes)"),
    "negative-shape": (one_tensor("F32", [-4], [0, 0], b""), "tensor w has shape [-4]"),
    "gap": (one_tensor("F32", [2], [8, 16], b"\0" * 16), "tensor w starts at byte 8 of the data, not at 0"),
    "dtype": (one_tensor("BOOL", [1], [0, 1], b"\0"), "tensor w has dtype 'BOOL'"),
    "entry-not-a-tensor": (safetensors_bytes({"w": [1, 2]}, b""), "tensor w: expected dtype, shape and data_offsets"),
}


@pytest.mark.parametrize("content, fragment", BAD_SAFETENSORS.values(), ids=BAD_SAFETENSORS)
def test_init_from_a_file_that_is_not_safetensors_is_one_line(tmp_path, capsys, content, fragment):
    source = tmp_path / "x.safetensors"
    source.write_bytes(content)
    run = tmp_path / "run"
    line = one_line_error(capsys, ["train", CONFIG, *sets(*TINY, f"run.dir={run}", f"train.init_from={source}")],
                          f"train.init_from: {source} is not a readable safetensors file: ")  # fmt: skip
    assert fragment in line
    assert source.read_bytes() == content and not run.exists()


def test_init_from_a_truncated_export(tmp_path, capsys):
    from safetensors.numpy import save_file

    source = tmp_path / "p.safetensors"
    save_file({"a": np.ones((3, 5), np.float32), "b": np.arange(7, dtype=np.int32)}, source)
    loaded = read_safetensors(source)  # the reference writer's file reads back whole
    assert np.array_equal(loaded["a"], np.ones((3, 5))) and np.array_equal(loaded["b"], np.arange(7))
    os.truncate(source, source.stat().st_size - 3)
    one_line_error(capsys, ["train", CONFIG, *sets(*TINY, f"run.dir={tmp_path / 'run'}", f"train.init_from={source}")],
                   f"train.init_from: {source} is not a readable safetensors file: the header describes 88 bytes")  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Ctrl-C from the first moment


@pytest.mark.parametrize("delay", [0.3, 1.0, 2.0])
def test_ctrl_c_while_starting_is_one_line(delay):
    proc = subprocess.Popen(
        [sys.executable, "-m", "jzero.cli", "plan", CONFIG],
        cwd=ROOT, env=jzero_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"still running 30 s after SIGINT at {delay} s")
    assert time.monotonic() - sent < 30
    assert proc.returncode == 130, (proc.returncode, err[-3000:])
    assert "Traceback" not in err and err.splitlines() == ["jzero: interrupted"], err[-3000:]
