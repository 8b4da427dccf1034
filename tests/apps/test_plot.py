"""``jzero report RUN_DIR --out FILE.png``: the run's metrics drawn as a PNG, read back from the
figure; bad input in one line with exit status 2 and nothing written; no JAX imported."""

import errno
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from support.configs import TINY

from jzero.apps.plot import draw, read_metrics
from jzero.cli.main import main

ROOT = Path(__file__).resolve().parents[2]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _rows(mfu=True, tokens=True):
    """Five logged steps; eval at 20 and 40; throughput where asked."""
    rows = []
    for step in (10, 20, 30, 40, 50):
        row = {"step": step, "loss": 5.0 - step / 20, "grad_norm": 1.0}
        if tokens:
            row["tokens_per_sec"] = 1000.0 + step
        if mfu:
            row["mfu"] = step / 1000
        if step in (20, 40):
            row["eval_loss"] = 5.1 - step / 20
        rows.append(row)
    return rows


def _run(tmp_path, rows, name="my-run"):
    run = tmp_path / name
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return run


def _lines(fig):
    """Each drawn line by its label: (x, y) as lists."""
    found = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            found[line.get_label()] = ([float(x) for x in line.get_xdata()], [float(y) for y in line.get_ydata()])
    return found


def _png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", data[:16]
    return struct.unpack(">II", data[16:24])


def _one_line_error(capsys, argv):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("jzero: error: ")
    return err


def test_the_figure_holds_the_metrics_and_the_png_is_written(tmp_path, capsys):
    rows = _rows()
    run = _run(tmp_path, rows)
    fig = draw(read_metrics(run))
    lines = _lines(fig)
    assert set(lines) == {"train loss", "eval loss", "tokens/s", "MFU"}
    assert lines["train loss"] == ([10, 20, 30, 40, 50], [r["loss"] for r in rows])
    assert lines["eval loss"] == ([20, 40], [rows[1]["eval_loss"], rows[3]["eval_loss"]])  # only the eval steps
    assert lines["tokens/s"] == ([10, 20, 30, 40, 50], [r["tokens_per_sec"] for r in rows])
    # In percent: one multiply each, so the floor is 1 ulp (2e-16); rel=1e-12 leaves a margin of 1e4.
    assert lines["MFU"] == ([10, 20, 30, 40, 50], pytest.approx([100 * r["mfu"] for r in rows], rel=1e-12))
    assert fig.get_suptitle() == "my-run"
    assert "loss 4.5 at step 10 → 2.5 at step 50; eval 3.1 at step 40" in fig.axes[0].get_title()

    out = tmp_path / "loss.png"
    assert main(["report", str(run), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out} (800 x 600)"
    assert _png_size(out) == (800, 600)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loss.png", "my-run"]  # no temporary left


def test_throughput_is_drawn_only_where_logged(tmp_path):
    """No MFU on a CPU run: no MFU line; no rate and no MFU: one panel, the loss."""
    cpu = draw(read_metrics(_run(tmp_path, _rows(mfu=False), "cpu")))
    assert set(_lines(cpu)) == {"train loss", "eval loss", "tokens/s"}
    assert "MFU" not in cpu.axes[1].get_title() and "tokens/s" in cpu.axes[1].get_title()
    bare = draw(read_metrics(_run(tmp_path, _rows(mfu=False, tokens=False), "bare")))
    assert set(_lines(bare)) == {"train loss", "eval loss"} and len(bare.axes) == 1
    no_eval = [{k: v for k, v in row.items() if k != "eval_loss"} for row in _rows()]
    assert "eval loss" not in _lines(draw(read_metrics(_run(tmp_path, no_eval, "no-eval"))))


def test_an_existing_png_is_replaced_and_a_torn_last_line_skipped(tmp_path):
    """A plot is redrawn over the old one; a run being written (or killed mid-line) still draws."""
    run = _run(tmp_path, _rows())
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 60, "lo')  # no newline: the writer is mid-line
    assert read_metrics(run).loss.steps == (10, 20, 30, 40, 50)
    out = tmp_path / "loss.png"
    out.write_bytes(b"an old plot")
    assert main(["report", str(run), "--out", str(out)]) == 0
    assert _png_size(out) == (800, 600)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loss.png", "my-run"]  # no temporary left


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing", "{run}: is not a run folder: no such folder"),
        ("a-file", "{run}: is a file, not a run folder"),
        ("dangling", "{run}: is not a run folder: it is a symbolic link to {tmp}/gone, which does not exist"),
        ("no-metrics", "{run}: is not a run folder: it holds no metrics.jsonl (jzero train writes one)"),
        ("no-loss", "{run}/metrics.jsonl: holds no record with a loss: nothing to draw"),
        ("empty", "{run}/metrics.jsonl: holds no record with a loss: nothing to draw"),
        ("corrupt", "{run}/metrics.jsonl: line 2 is not a record (a JSON object with a step): '{{\"step\": 20, \"loss\": }}'"),
        ("no-step", "{run}/metrics.jsonl: line 2 is not a record (a JSON object with a step): '[1, 2]'"),
        ("text-loss", "{run}/metrics.jsonl: line 2 is not a record (a JSON object with a step):"),
        ("jpg", "--out: {out_jpg} must be a .png file"),
        ("no-folder", "--out: {out_deep}: its folder {out_deep_parent} does not exist"),
        ("out-folder", "--out: {out_dir} is a folder"),
    ],
)
def test_bad_input_is_one_line_naming_the_path_and_writes_nothing(tmp_path, capsys, case, expected):
    run, out = tmp_path / "run", tmp_path / "loss.png"
    good = json.dumps({"step": 10, "loss": 4.0}) + "\n"
    lines = {
        "no-loss": good.replace('"loss"', '"grad_norm"'),
        "empty": "",
        "corrupt": good + '{"step": 20, "loss": }\n' + good,
        "no-step": good + "[1, 2]\n",
        "text-loss": good + json.dumps({"step": 20, "loss": "4.0"}) + "\n",
    }
    if case == "a-file":
        run.write_text("")
    elif case == "dangling":
        run.symlink_to(tmp_path / "gone")
    elif case != "missing":
        run.mkdir()
        if case != "no-metrics":
            (run / "metrics.jsonl").write_text(lines.get(case, good))
    paths = {"out_jpg": tmp_path / "loss.jpg", "out_deep": tmp_path / "nope" / "loss.png", "out_dir": tmp_path / "d.png"}
    paths["out_dir"].mkdir()
    target = {"jpg": "out_jpg", "no-folder": "out_deep", "out-folder": "out_dir"}.get(case)
    out = paths[target] if target else out
    before = sorted(p.name for p in tmp_path.rglob("*"))
    err = _one_line_error(capsys, ["report", str(run), "--out", str(out)])
    fields = {"run": run, **paths, "out_deep_parent": tmp_path / "nope", "tmp": tmp_path}
    assert err.startswith("jzero: error: " + expected.format(**fields)), err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_a_failed_write_is_one_line_and_keeps_the_old_png(tmp_path, capsys, monkeypatch):
    """A full disk mid-write: the old plot stays as it was, and no temporary is left."""
    from matplotlib.figure import Figure

    def full(self, fname, **kwargs):
        Path(fname).write_bytes(b"half a png")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)
    run, out = _run(tmp_path, _rows()), tmp_path / "loss.png"
    out.write_bytes(b"the old plot")
    assert main(["report", str(run), "--out", str(out)]) == 1  # the machine's fault, not the input's
    assert capsys.readouterr().err.strip() == f"jzero: --out: cannot write {out}: No space left on device"
    assert out.read_bytes() == b"the old plot" and sorted(p.name for p in tmp_path.iterdir()) == ["loss.png", "my-run"]


def test_without_matplotlib_one_line_names_the_extra(tmp_path, capsys, monkeypatch):
    for name in ("matplotlib", "matplotlib.figure"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    out = tmp_path / "loss.png"
    err = _one_line_error(capsys, ["report", str(_run(tmp_path, _rows())), "--out", str(out)])
    assert err == (
        "jzero: error: jzero report draws with matplotlib, which is not installed: "
        "pip install 'jzero[plot]' (in a clone: pip install -e '.[plot]')"
    )
    assert not out.exists()


def test_a_real_run_drawn_by_the_command_without_jax(tmp_path, capsys):
    """A 2-step train with eval at step 2, then ``jzero report`` in a fresh process that imports no JAX."""
    run, text = tmp_path / "tiny", tmp_path / "text.txt"
    text.write_text("def add(x, y):\n    return x + y\n" * 2000)  # eval on the standard library's packages takes 10 s more
    sets = [*TINY, "train.steps=2", "run.log_every=1", "train.eval_every=2", "train.eval_batches=1", f"data.path={text}"]
    sets.append(f"run.dir={run}")
    assert main(["train", str(ROOT / "configs/gpt-tiny.yaml"), *[a for s in sets for a in ("--set", s)], "--quiet"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    lines = _lines(draw(read_metrics(run)))
    assert lines["train loss"] == ([1, 2], [r["loss"] for r in rows])
    assert lines["eval loss"] == ([2], [rows[1]["eval_loss"]])
    assert lines["tokens/s"][1] == [r["tokens_per_sec"] for r in rows] and "MFU" not in lines  # a CPU has no peak

    out = tmp_path / "loss.png"
    code = (
        "import sys; from jzero.cli.main import main; status = main(sys.argv[1:]); "
        "print([m for m in ('jax', 'flax', 'optax', 'orbax') if m in sys.modules]); sys.exit(status)"
    )
    proc = subprocess.run([sys.executable, "-c", code, "report", str(run), "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"wrote {out} (800 x 600)", "[]"]
    assert _png_size(out) == (800, 600)
