"""The run folder before a run writes to it (:mod:`jzero.config.run_folder`), and its lock as
process 0 takes it (:func:`jzero.distributed.runtime.lock_run_dir`)."""

import pytest

from jzero.config.run_folder import check_run_dir, check_run_path, create_run_dir
from jzero.distributed.runtime import lock_run_dir
from jzero.errors import ConfigError


def test_a_path_under_a_file_is_refused_naming_the_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match=rf"^run\.dir: {tmp_path / 'f'} is a file, not a folder$"):
        check_run_path(tmp_path / "f" / "run" / "deeper")
    with pytest.raises(ConfigError, match="run.dir"):
        create_run_dir(tmp_path / "f" / "run")
    assert (tmp_path / "f").read_text() == "x"


def test_a_folder_holding_a_run_is_refused_unless_resumed(tmp_path):
    run = tmp_path / "run"
    assert check_run_dir(str(run), resume=False) == (run, False)  # nothing there yet: nothing made
    assert not run.exists()
    run.mkdir()
    (run / "config.yaml").write_text("{}\n")
    with pytest.raises(ConfigError, match=r"^--no-resume: .* already holds a run \(config\.yaml\); choose another run\.dir$"):
        check_run_dir(str(run), resume=False)
    assert check_run_dir(str(run), resume=True) == (run, True)


def test_a_second_lock_on_one_folder_is_refused_until_the_first_is_released(tmp_path):
    first = lock_run_dir(str(tmp_path / "run"))
    try:
        with pytest.raises(ConfigError, match="run.dir"):
            lock_run_dir(str(tmp_path / "run"))
    finally:
        first.release()
    lock_run_dir(str(tmp_path / "run")).release()
