"""The grain text pipeline: real text, a deterministic order, the same global batch on any mesh."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jzero.config.loading import ConfigError
from jzero.sharding.mesh import make_mesh
from jzero.training.data import TextBatches, load_bytes, resolve_files, stdlib_sources, text_batches


def test_default_text_is_the_stdlib_sources():
    files = stdlib_sources()
    assert any(f.name == "os.py" for f in files)
    tokens = load_bytes(files, 10_000)
    assert len(tokens) == 10_000 and tokens.dtype == np.uint8
    assert b"import" in tokens.tobytes()


def test_path_forms(tmp_path):
    (tmp_path / "a.txt").write_text("alpha " * 50)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("beta " * 50)
    assert resolve_files(str(tmp_path / "a.txt")) == [tmp_path / "a.txt"]
    assert resolve_files(str(tmp_path)) == [tmp_path / "a.txt", tmp_path / "sub" / "b.txt"]
    assert resolve_files(str(tmp_path / "**" / "b.txt")) == [tmp_path / "sub" / "b.txt"]
    with pytest.raises(ConfigError, match="data.path: no files found"):
        resolve_files(str(tmp_path / "*.md"))


def test_too_little_text_is_an_error():
    with pytest.raises(ConfigError, match="data.path: holds 10 bytes"):
        TextBatches(np.zeros(10, np.uint8), seq_len=16, global_batch_size=2, seed=0)


def test_order_is_a_function_of_the_seed():
    a = text_batches(None, 100_000, 16, 8, seed=0)
    b = text_batches(None, 100_000, 16, 8, seed=0)
    c = text_batches(None, 100_000, 16, 8, seed=1)
    np.testing.assert_array_equal(a.global_batch(3), b.global_batch(3))
    assert not np.array_equal(a.global_batch(3), c.global_batch(3))
    assert not np.array_equal(a.global_batch(3), a.global_batch(4))
    # Consecutive tokens: each row is a window of the text, targets shifted by one.
    row = a.global_batch(0)[0]
    assert row.shape == (17,)
    text = a.tokens.tobytes()
    assert bytes(row.astype(np.uint8)) in text


def test_epochs_cover_every_window_once():
    data = TextBatches(np.arange(8 * 16 + 1, dtype=np.uint8), seq_len=16, global_batch_size=4, seed=0)
    first_epoch = np.concatenate([data.global_batch(0), data.global_batch(1)])
    starts = sorted(int(r[0]) for r in first_epoch)
    assert starts == [16 * i for i in range(8)]


@pytest.mark.parametrize("axes", [{"data": 8}, {"data": 4, "model": 2}, {"data": 2}, {"data": 1}])
def test_global_batch_is_the_same_on_any_mesh(devices, axes):
    data = text_batches(None, 100_000, 16, 8, seed=0)
    mesh = make_mesh(axes)
    batch = data.device_batch(5, NamedSharding(mesh, P("data")))
    np.testing.assert_array_equal(np.asarray(batch), data.global_batch(5))
    # Each device holds just its rows.
    shard = batch.addressable_shards[0]
    assert shard.data.shape == (8 // axes["data"], 17)
    np.testing.assert_array_equal(np.asarray(shard.data), data.global_batch(5)[shard.index])
    assert jax.device_count() == 8
