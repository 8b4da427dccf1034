"""Token folders: ``jzero data prepare`` on files, folders, globs and JSONL; the folder it writes; reading
it back through a memory map for training and validation; and bad input, one line and nothing written."""

import json

import grain
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from support.cli import one_line_error, sets
from support.configs import CONFIG, STDLIB_GLOB, TINY
from support.files import snapshot
from support.tokens import FRACTION, VOCAB, copy_folder

from jzero.cli.main import main
from jzero.config.loading import ConfigError, load_config
from jzero.data.prepare import is_eval_document, prepare
from jzero.data.sources import Documents
from jzero.data.tokenizer import EOS, BpeTokenizer
from jzero.data.tokens import HEADER_FILE, TOKENIZER_FILE, open_split, read_header, release_pages, token_dtype
from jzero.sharding.mesh import make_mesh
from jzero.training.data import TextBatches, eval_data, run_tokenizer_path, train_data


def split_documents(ids: np.ndarray, eos: int) -> list[np.ndarray]:
    assert len(ids) and ids[-1] == eos
    cuts = np.flatnonzero(ids == eos)
    return np.split(ids, cuts + 1)[:-1]


def test_prepare_writes_the_four_files_with_a_consistent_header(corpus):
    sources, out = corpus
    assert sorted(p.name for p in out.iterdir()) == ["eval.bin", "tokenizer.json", "tokens.bin", "tokens.json"]
    assert not list(out.parent.glob(".prepared.partial-*"))
    header = read_header(out)
    tok = BpeTokenizer(out / TOKENIZER_FILE)
    assert header.dtype == "uint16" and header.vocab_size == tok.vocab_size == VOCAB
    assert header.tokenizer_hash == tok.digest and header.eos_id == tok.eos_id == 0
    texts = list(Documents(sources))
    assert len(texts) == 12
    assert header.splits["train"].documents + header.splits["eval"].documents == 12
    for split in ("train", "eval"):
        ids = open_split(out, split)
        assert isinstance(ids, np.memmap) and not ids.flags.writeable
        assert len(ids) == header.splits[split].tokens == (out / header.splits[split].file).stat().st_size // 2
        assert int((ids == header.eos_id).sum()) == header.splits[split].documents  # the EOS text in a document stays text
        assert int(ids.max()) < header.vocab_size


def test_the_splits_decode_to_the_documents_and_are_disjoint(corpus):
    sources, out = corpus
    texts = list(Documents(sources))
    tok = BpeTokenizer(out / TOKENIZER_FILE)
    documents = {s: split_documents(np.asarray(open_split(out, s)), tok.eos_id) for s in ("train", "eval")}
    decoded = {s: [tok.decode(d[:-1].tolist()) for d in docs] for s, docs in documents.items()}
    held = [i for i in range(len(texts)) if is_eval_document(i, FRACTION)]
    assert held == [3, 7, 11]
    assert decoded["eval"] == [texts[i] for i in held]
    assert decoded["train"] == [t for i, t in enumerate(texts) if i not in held]
    assert any("caf\ufffd" in t for t in decoded["train"])  # not UTF-8: read with replacement
    assert any(EOS in t for t in decoded["train"] + decoded["eval"])


def test_a_given_tokenizer_gives_the_same_tokens(corpus, tmp_path):
    sources, out = corpus
    again = tmp_path / "again"
    prepare(sources, again, tokenizer=out / TOKENIZER_FILE, eval_fraction=FRACTION, progress=False)
    for name in ("tokens.bin", "eval.bin", "tokenizer.json", "tokens.json"):
        assert (again / name).read_bytes() == (out / name).read_bytes(), name


def test_the_dtype_fits_the_vocabulary():
    assert token_dtype(4096).name == token_dtype(65536).name == "uint16"
    assert token_dtype(65537).name == token_dtype(2**31 - 1).name == "uint32"
    assert token_dtype(65537).byteorder in "<="  # little-endian files


def test_the_validation_split_is_even_and_never_empty(tmp_path):
    assert sum(is_eval_document(i, 0.02) for i in range(1000)) == 20
    assert [i for i in range(10) if is_eval_document(i, 0.3)] == [3, 6, 9]
    (tmp_path / "a.txt").write_text("first document")
    (tmp_path / "b.txt").write_text("second document")
    header = prepare([str(tmp_path / "*.txt")], tmp_path / "out", vocab_size=VOCAB, progress=False)
    assert (header.splits["train"].documents, header.splits["eval"].documents) == (1, 1)  # the last one


def test_the_command_prints_one_summary_line(corpus, tmp_path, capsys):
    sources, out = corpus
    given = ["--tokenizer", str(out / TOKENIZER_FILE)]
    assert main(["data", "prepare", *sources, "--out", str(tmp_path / "x"), *given, "--quiet"]) == 0
    stdout, stderr = capsys.readouterr()
    assert stderr == "" and len(stdout.splitlines()) == 1
    assert stdout.startswith("12 documents, ") and "vocabulary 300, uint16" in stdout and str(tmp_path / "x") in stdout


# ---------------------------------------------------------------------------------------------
# Bad input to prepare: one line, exit 2, nothing written


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("", "is an empty JSONL file"),
        ("\n\n", "is an empty JSONL file"),
        ('{"text": "ok"}\n{"body": "no text"}\n', "line 2 is not a JSON object with a text string"),
        ('{"text": 3}\n', "line 1 is not a JSON object with a text string"),
        ('{"text": "ok"}\nnot json\n', "line 2 is not JSON: not json"),
    ],
)
def test_bad_jsonl_is_one_line_and_writes_nothing(tmp_path, capsys, content, fragment):
    (tmp_path / "docs.jsonl").write_text(content)
    out = tmp_path / "new" / "deeper" / "out"
    one_line_error(capsys, ["data", "prepare", str(tmp_path / "docs.jsonl"), "--out", str(out), "--vocab-size", "300"], fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl"]  # no partial folder, no parents left


def test_bad_jsonl_with_a_given_tokenizer_writes_nothing(corpus, tmp_path):
    (tmp_path / "docs.jsonl").write_text('{"text": "ok"}\n{"txt": "typo"}\n')
    with pytest.raises(ConfigError, match="docs.jsonl: line 2 is not a JSON object"):
        prepare([str(tmp_path / "docs.jsonl")], tmp_path / "out", tokenizer=corpus[1] / TOKENIZER_FILE, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["docs.jsonl"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--vocab-size", "100"], "--vocab-size: must be at least 258"),
        (["--vocab-size", str(2**31)], "--vocab-size: must be at least 258"),
        (["--vocab-size", "300", "--eval-fraction", "0"], "--eval-fraction: must be above 0 and below 1, got 0.0"),
        (["--vocab-size", "300", "--eval-fraction", "1"], "--eval-fraction: must be above 0 and below 1"),
        (["--tokenizer", "missing.json"], "--tokenizer: cannot read missing.json"),
    ],
)
def test_bad_options_are_one_line(tmp_path, capsys, args, fragment):
    (tmp_path / "a.txt").write_text("text")
    one_line_error(capsys, ["data", "prepare", str(tmp_path / "a.txt"), "--out", str(tmp_path / "out"), *args], fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_no_files_at_a_source_is_one_line(tmp_path, capsys):
    one_line_error(capsys, ["data", "prepare", str(tmp_path / "*.txt"), "--out", str(tmp_path / "out"), "--vocab-size", "300"],
                   f"SOURCES: no files found at {tmp_path / '*.txt'}")  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_a_tokenizer_without_eos_is_refused(tmp_path):
    from tokenizers import Tokenizer, models

    Tokenizer(models.BPE()).save(str(tmp_path / "plain.json"))
    (tmp_path / "a.txt").write_text("text")
    with pytest.raises(ConfigError, match="--tokenizer: .*plain.json has none of the end-of-document tokens <|endoftext|>, "):
        prepare([str(tmp_path / "a.txt")], tmp_path / "out", tokenizer=tmp_path / "plain.json", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_hugging_face_folders_tokenizer_ends_documents_with_its_own_token(tmp_path):
    """``--tokenizer HF_DIR``: the folder's ``tokenizer.json``, whose end of document is Llama 2's ``</s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer, hf.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"], initial_alphabet=alphabet)
    docs = ["def f(x):\n    return x\n", "class A:\n    pass\n"] * 20
    hf.train_from_iterator(docs, trainer=trainer)
    folder = tmp_path / "Llama-2"
    folder.mkdir()
    hf.save(str(folder / TOKENIZER_FILE))
    for i, doc in enumerate(docs):
        (tmp_path / f"{i:02d}.txt").write_text(doc)
    header = prepare([str(tmp_path / "*.txt")], tmp_path / "out", tokenizer=folder, eval_fraction=0.1, progress=False)
    assert header.eos_id == hf.token_to_id("</s>") == 1
    ids = np.fromfile(tmp_path / "out" / "tokens.bin", np.dtype(header.dtype))
    assert ids[-1] == 1 and (ids == 1).sum() == header.splits["train"].documents
    assert (tmp_path / "out" / TOKENIZER_FILE).read_bytes() == (folder / TOKENIZER_FILE).read_bytes()
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="--tokenizer: .*empty is a folder without a tokenizer.json"):
        prepare([str(tmp_path / "*.txt")], tmp_path / "out2", tokenizer=tmp_path / "empty", progress=False)
    assert not (tmp_path / "out2").exists()


def test_an_out_that_holds_something_is_kept(corpus, tmp_path, capsys):
    sources, _ = corpus
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("keep me")
    before = snapshot(tmp_path)
    one_line_error(capsys, ["data", "prepare", *sources, "--out", str(tmp_path / "out"), "--vocab-size", "300"], "--out: ")
    assert snapshot(tmp_path) == before
    (tmp_path / "file").write_text("a file")
    with pytest.raises(ConfigError, match="--out: .* exists and is not a folder"):
        prepare(sources, tmp_path / "file", vocab_size=VOCAB, progress=False)
    (tmp_path / "empty").mkdir()  # an empty folder is written into
    prepare(sources, tmp_path / "empty", vocab_size=VOCAB, progress=False)
    assert (tmp_path / "empty" / HEADER_FILE).is_file()


# ---------------------------------------------------------------------------------------------
# Reading a token folder for training and validation


def token_config(folder, *overrides: str):
    return load_config(None, [*TINY, f"data.tokens={folder}", "model.vocab_size=512", *overrides])


def test_train_data_windows_are_slices_of_the_memory_map(corpus):
    _, out = corpus
    config = token_config(out, "model.seq_len=8", "train.global_batch_size=4")
    data = train_data(config)
    ids = open_split(out, "train")
    assert isinstance(data.tokens, np.memmap) and data.num_windows == (len(ids) - 1) // 8
    assert run_tokenizer_path(config) == out / TOKENIZER_FILE
    order = grain.MapDataset.range(data.num_windows).shuffle(seed=config.seed).repeat()  # the window of each example
    for step in (0, 3, data.num_windows // 4 + 1):  # the last one is in the second epoch
        windows = [order[step * 4 + r] for r in range(4)]
        expected = np.stack([ids[w * 8 : w * 8 + 9] for w in windows]).astype(np.int32)
        np.testing.assert_array_equal(data.global_batch(step), expected)
        assert data.global_batch(step).dtype == np.int32


@pytest.mark.parametrize("axes", [{"data": 8}, {"data": 4, "model": 2}, {"data": 1}])
def test_the_token_order_is_the_same_on_any_mesh_and_resumes(devices, corpus, axes):
    _, out = corpus
    data = train_data(token_config(out, "model.seq_len=8", "train.global_batch_size=8"))
    batch = data.device_batch(5, NamedSharding(make_mesh(axes), P("data")))
    np.testing.assert_array_equal(np.asarray(batch), data.global_batch(5))
    shard = batch.addressable_shards[0]
    np.testing.assert_array_equal(np.asarray(shard.data), data.global_batch(5)[shard.index])
    # A new reader (a resumed run) continues the same order from the saved state.
    again = train_data(token_config(out, "model.seq_len=8", "train.global_batch_size=8"))
    start = again.check_state(data.state(5))
    np.testing.assert_array_equal(again.global_batch(start), data.global_batch(5))
    with pytest.raises(ConfigError, match="data.tokens: the checkpoint's sample order has windows in the data"):
        again.check_state({**data.state(5), "num_windows": data.num_windows + 1})


def test_eval_data_is_the_held_out_split_unshuffled(devices, corpus):
    _, out = corpus
    assert eval_data(token_config(out)) is None  # train.eval_every = 0
    config = token_config(out, "model.seq_len=4", "train.global_batch_size=2", "train.eval_every=5", "train.eval_batches=3")
    evals = eval_data(config)
    ids = open_split(out, "eval")
    assert len(evals) == 3
    for i in range(3):
        expected = np.stack([ids[(2 * i + r) * 4 : (2 * i + r) * 4 + 5] for r in range(2)]).astype(np.int32)
        np.testing.assert_array_equal(evals.global_batch(i), expected)
    batch = evals.device_batch(2, NamedSharding(make_mesh({"data": 2}), P("data")))
    np.testing.assert_array_equal(np.asarray(batch), evals.global_batch(2))


def test_bytes_hold_out_their_last_windows_for_validation():
    base = ["model.seq_len=16", "train.global_batch_size=4", "data.max_bytes=20000", f"data.path={STDLIB_GLOB}"]
    off = train_data(load_config(None, base))
    config = load_config(None, [*base, "train.eval_every=10", "train.eval_batches=2"])
    data, evals = train_data(config), eval_data(config)
    held = 2 * 4 * 16 + 1
    assert len(off.tokens) == 20000 and len(data.tokens) == 20000 - held
    np.testing.assert_array_equal(evals.tokens, off.tokens[20000 - held :])  # the tail, none of it in training windows
    np.testing.assert_array_equal(evals.global_batch(1)[-1], off.tokens[-17:].astype(np.int32))


def test_eval_path_as_bytes(tmp_path):
    (tmp_path / "val.txt").write_text("validation text. " * 100)
    config = load_config(None, ["model.seq_len=16", "train.global_batch_size=4", "train.eval_every=10",
                                f"data.eval_path={tmp_path / 'val.txt'}", "data.max_bytes=20000"])  # fmt: skip
    assert len(train_data(config).tokens) == 20000  # nothing held out of data.path
    assert bytes(eval_data(config).global_batch(0)[0].astype(np.uint8)) == b"validation text. "  # 17 bytes: seq_len + 1


# ---------------------------------------------------------------------------------------------
# Bad token folders: one line through jzero train, exit 2, nothing written


def truncate_one_byte(folder):
    with open(folder / "tokens.bin", "r+b") as f:
        f.truncate((folder / "tokens.bin").stat().st_size - 1)


def header_says_more(folder):
    header = json.loads((folder / HEADER_FILE).read_text())
    header["splits"]["train"]["tokens"] += 1
    (folder / HEADER_FILE).write_text(json.dumps(header))


@pytest.mark.parametrize(
    ("damage", "overrides", "fragment"),
    [
        (truncate_one_byte, [], "data.tokens: {folder}/tokens.bin holds {n} bytes, not a multiple of its dtype uint16 (2 bytes)"),
        (header_says_more, [], "data.tokens: {folder}/tokens.bin holds {t} tokens, its header {folder}/tokens.json says {t1}"),
        (None, ["model.vocab_size=256"], "model.vocab_size: holds 256 ids, the tokenizer at {folder} has 300"),
        (None, ["train.eval_every=1", "train.eval_batches=1000"], "train.eval_batches: the validation split ({folder}/eval.bin)"),
    ],
)
def test_a_bad_token_folder_is_one_line_from_train(corpus, tmp_path, capsys, damage, overrides, fragment):
    folder = copy_folder(corpus, tmp_path)
    header = read_header(folder)
    if damage is not None:
        damage(folder)
    t = header.splits["train"].tokens
    run_dir = tmp_path / "run"
    before = snapshot(folder)
    overrides = [*TINY, f"data.tokens={folder}", "model.vocab_size=512", f"run.dir={run_dir}", *overrides]
    argv = ["train", CONFIG, *sets(*overrides), "--quiet"]
    one_line_error(capsys, argv, fragment.format(folder=folder, n=2 * t - 1, t=t, t1=t + 1))
    assert not run_dir.exists() and snapshot(folder) == before


HEAD = {"format": "jzero-tokens", "version": 1, "vocab_size": 300, "eos_id": 0}


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        (lambda f: (f / HEADER_FILE).unlink(), "has no tokens.json: not a token folder"),
        (lambda f: (f / HEADER_FILE).write_text("{not json"), "cannot read"),
        (lambda f: (f / HEADER_FILE).write_text(json.dumps({**HEAD, "dtype": "uint32"})),
         "is not a token folder's header: dtype 'uint32' for a vocabulary of 300"),
        (lambda f: (f / TOKENIZER_FILE).write_text("{}"), "tokenizer.json is not the tokenizer"),
        (lambda f: (f / "eval.bin").unlink(), "cannot read"),
    ],
)  # fmt: skip
def test_a_broken_folder_is_named(corpus, tmp_path, damage, fragment):
    folder = copy_folder(corpus, tmp_path)
    damage(folder)
    with pytest.raises(ConfigError, match="data.tokens: ") as err:
        open_split(folder, "eval")
    assert fragment in str(err.value)


def test_an_eval_path_folder_of_another_tokenizer_is_refused(corpus, tmp_path):
    sources, out = corpus
    other = tmp_path / "other"
    prepare(sources, other, vocab_size=VOCAB + 10, progress=False)
    with pytest.raises(ConfigError, match="data.eval_path: .* was tokenized by another tokenizer"):
        eval_data(token_config(out, f"data.eval_path={other}", "train.eval_every=10", "train.eval_batches=1"))
    same = eval_data(token_config(out, f"data.eval_path={out}", "train.eval_every=10", "train.eval_batches=1"))
    np.testing.assert_array_equal(same.global_batch(0)[0], np.asarray(open_split(out, "train")[:17], np.int32))


def test_text_batches_take_any_integer_array():
    ids = np.arange(1000, dtype=np.uint32) * 70_000
    data = TextBatches(ids, 8, 4, seed=0, key="data.tokens")
    assert data.global_batch(0).dtype == np.int32 and set(data.global_batch(0)[:, 0] // 70_000 % 8) == {0}
    release_pages(ids)  # a no-op for an array that is not a memory map
