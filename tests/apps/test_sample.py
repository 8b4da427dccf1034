"""``jzero sample``: KV-cache decoding equals the model, a memorised text comes back, bad input is
one line and exit 2, and an output that cannot be written is one line and exit 1."""

import functools
import io
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from support.cli import jzero_env
from support.configs import ROOT, TINY
from support.files import snapshot
from support.reference import assert_within_floor

from jzero.apps.sample import _restore_params, placement, sample
from jzero.checkpoint.runs import RunCheckpoints
from jzero.cli.main import main
from jzero.config.loading import dump_config, load_config
from jzero.data.tokenizer import BYTES
from jzero.models.decode import decode_loop, decode_step, prefill
from jzero.models.decoder import Decoder
from jzero.models.gpt import GPT
from jzero.training.job import build_job
from jzero.training.loop import train
from jzero.trees import tree_paths

TEXT = "the quick brown fox jumps over the lazy dog. "
PROMPT, CONTINUATION = "the quick brown fox ", "jumps over t"  # 20 + 12 bytes: model.seq_len 32
# Greedy decoding reproduced the text after 60 steps for seeds 0-4 and failed after 40 for 2 of 3
# seeds (d_model 32, 2 layers, lr 1e-2); 100 leaves a margin.
STEPS = 100


SCALING = (("factor", 8.0), ("high_freq_factor", 4.0), ("low_freq_factor", 1.0), ("original_max_position_embeddings", 8),
           ("rope_type", "llama3"))  # fmt: skip
WINDOW = {"sliding_window": 4, "layer_types": (True, False, True)}
ROWS = {
    "qwen2": WINDOW,
    "qwen3": {"head_dim": 12},
    "mistral": {"sliding_window": 4, "layer_types": (True, True, True)},
    "gemma2": {**WINDOW, "head_dim": 12, "attn_scalar": 10.0, "attn_softcap": 1.0, "final_softcap": 2.0},
    "gemma3": {**WINDOW, "head_dim": 12, "rope_local_theta": 100.0, "rope_scaling": (("factor", 4.0), ("rope_type", "linear"))},
}
MODELS = {
    "lm_head": GPT(vocab_size=256, d_model=32, n_layers=2, n_heads=2, seq_len=16, remat="none"),
    "tied": GPT(vocab_size=256, d_model=32, n_layers=2, n_heads=2, seq_len=16, remat="none", tie_embeddings=True),
    # grouped-query attention (4 query heads, 2 key/value heads) and Llama 3's rope scaling
    "llama": Decoder(vocab_size=256, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, mlp_hidden=48, seq_len=16,
                   rope_scaling=SCALING, remat="none"),  # fmt: skip
    # every other row with what sets it apart, a window of 4 under the 16 tokens (layers 0 and 2 slide)
    **{arch: Decoder(arch=arch, vocab_size=256, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, mlp_hidden=48, seq_len=16,
                   remat="none", **shape) for arch, shape in ROWS.items()},  # fmt: skip
}


@pytest.mark.parametrize("name", list(MODELS))
def test_kv_cache_decoding_gives_the_models_logits(devices, name):
    """A prefill of 5 tokens, then one cached step per token, against ``apply`` on the whole prefix.

    The floor is the same model on the same tokens summed in other orders: the logits of a shorter
    prefix (causal, so the same values) and of one row alone. Measured with ``JZERO_FLOOR_LOG``:
    cache gaps 8.9e-8 (lm_head and tied) against floors of 4.5e-8 and 6.0e-8, so 0.13 and 0.09 of
    the tolerance (10 x floor + 4 ulps of the largest logit, as conftest's); logits one position
    off are 0.71 and 1.2 away, about 1e6 times it."""
    model = MODELS[name]
    tokens = jax.random.randint(jax.random.key(1), (2, 16), 0, 256)
    params = jax.jit(model.init)(jax.random.key(0), tokens)["params"]
    apply = jax.jit(lambda p, t: model.apply({"params": p}, t))
    whole = apply(params, tokens)
    orders = [apply(params, tokens[:, :9]) - whole[:, :9], apply(params, tokens[:1]) - whole[:1]]
    floor = max(float(jnp.abs(gap).max()) for gap in orders)

    logits, cache = jax.jit(lambda p, t: prefill(model, p, t, 16))(params, tokens[:, :5])
    step = jax.jit(lambda p, t, c, i: decode_step(model, p, t, c, i))
    cached = [logits]
    for i in range(5, 15):
        logits, cache = step(params, tokens[:, i], cache, i)
        cached.append(logits)
    cached = np.stack(cached, axis=1)  # the logits after positions 4 .. 14
    assert_within_floor(cached, np.asarray(whole[:, 4:15]), floor, "cached logits")
    with pytest.raises(AssertionError):  # even at 100 x the floor
        assert_within_floor(cached[:, 1:], np.asarray(whole[:, 4:14]), 100 * floor, "one position off")


def test_greedy_decoding_reproduces_a_memorised_text(devices, tmp_path, capsys):
    """A tiny GPT trained at stage 3 on ``data: 4, model: 2`` on one sentence, repeated, then
    decoded on the run's mesh with its parameters as they rest (each device reads its own shard):
    through the Python API (streamed text equals the returned text) and the command line; and on
    one device, with a note, when the run's mesh needs more devices than there are. One test, so
    that the model is trained once under pytest-xdist."""
    (tmp_path / "text.txt").write_text(TEXT * 40)
    run = tmp_path / "run"
    overrides = [f"run.dir={run}", f"data.path={tmp_path / 'text.txt'}", f"train.steps={STEPS}", f"checkpoint.every={STEPS // 2}"]
    overrides += ["model.seq_len=32", "optimizer.learning_rate=1e-2", "zero.stage=3", "run.tensorboard=false"]
    overrides += ["mesh.axes={data: 4, model: 2}"]
    train(load_config(None, [*TINY, *overrides]), progress=False)
    capsys.readouterr()

    config = load_config(run / "config.yaml")
    where, job = placement(config), build_job(config)
    assert len(where.devices) == 8 and where.note is None
    assert {p: s.spec for p, s in where.shardings.items()} == {t.path: t.param_spec for t in job.plan.tensors}
    params = tree_paths(_restore_params(run, job.model, where, None, print))
    kernel = params["blocks/mlp_in/kernel"]  # [layers, embed, mlp]: mlp over model, embed over data
    assert kernel.sharding.spec == jax.P(None, "data", "model")
    assert {shard.data.shape for shard in kernel.addressable_shards} == {(2, 32 // 4, 128 // 2)}

    out = io.StringIO()
    assert sample(run, PROMPT, max_tokens=len(CONTINUATION), temperature=0.0, out=out) == CONTINUATION
    assert out.getvalue() == CONTINUATION
    # Top-1 sampling is greedy at any temperature.
    assert sample(run, PROMPT, max_tokens=len(CONTINUATION), temperature=0.8, top_k=1, seed=3) == CONTINUATION

    before = snapshot(run)
    assert main(["sample", str(run), "--prompt", PROMPT, "--max-tokens", "5", "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    assert captured.out == CONTINUATION[:5] + "\n" and captured.err == ""
    # More tokens than model.seq_len leaves room for: cut, with a note on stderr.
    assert main(["sample", str(run), "--prompt", PROMPT + CONTINUATION[:8], "--max-tokens", "50", "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    assert captured.out == CONTINUATION[8:] + "\n"
    assert "--max-tokens 50 cut to 4" in captured.err and len(captured.err.splitlines()) == 1
    assert snapshot(run) == before
    # Onto a full disk (/dev/full: every write is ENOSPC): one line naming it, not the text or a
    # traceback; a real process, as Python flushes stdout again at exit, and would report a failure.
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "jzero.cli", "sample", str(run), "--prompt", PROMPT, "--max-tokens", "5"],
                              cwd=ROOT, env=jzero_env(), stdout=full, stderr=subprocess.PIPE, text=True, timeout=300)  # fmt: skip
    assert (done.returncode, done.stderr) == (1, "jzero: writing /dev/full failed: No space left on device\n")
    assert snapshot(run) == before

    # A run's mesh this host cannot hold: one device, and a note saying why.
    trained = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(dump_config(load_config(run / "config.yaml", ["mesh.axes={data: 8, model: 2}"])))
    notes = []
    assert sample(run, PROMPT, max_tokens=len(CONTINUATION), temperature=0.0, warn=notes.append) == CONTINUATION
    assert len(notes) == 1 and notes[0].startswith("jzero: note: decoding on one device (mesh.axes: "), notes
    (run / "config.yaml").write_text(trained)

    # A damaged newest step is named, and the one before it is read; nothing is moved aside.
    state = run / "checkpoints" / str(STEPS) / "state"
    victim = max((p for p in state.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    warnings = []
    assert len(sample(run, PROMPT, max_tokens=2, temperature=0.0, warn=warnings.append)) == 2
    assert len(warnings) == 1 and "is damaged" in warnings[0] and "trying the previous checkpoint" in warnings[0], warnings
    assert main(["sample", str(run), "--step", str(STEPS)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1 and "is damaged" in captured.err
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == sorted([str(STEPS // 2), str(STEPS)])


def test_the_loop_decodes_any_model_with_a_prefill_and_a_step(devices):
    """:func:`decode_loop` with a model that is not the GPT: token t is followed by t + 1 (mod 6),
    and its cache is the sequence so far. Rows stop at eos (0); the loop ends when all have."""
    table = jnp.where(jnp.arange(6)[None, :] == (jnp.arange(6)[:, None] + 1) % 6, 10.0, 0.0)

    def prefill_fn(params, prompt, max_len):
        cache = jnp.zeros((prompt.shape[0], max_len), jnp.int32).at[:, : prompt.shape[1]].set(prompt)
        return params[prompt[:, -1]], cache

    def step_fn(params, token, cache, position):
        return params[token], jax.lax.dynamic_update_slice_in_dim(cache, token[:, None], position, axis=1)

    seen = []
    tokens, count = decode_loop(prefill_fn, step_fn, table, jnp.array([[4, 1], [5, 3]]), jax.random.key(0), max_tokens=8,
                                eos_id=0, on_token=lambda t, i: seen.append((i, t.tolist())))  # fmt: skip
    assert count == 5 and tokens.tolist() == [[2, 3, 4, 5, 0, 0, 0, 0], [4, 5, 0, 0, 0, 0, 0, 0]]
    assert seen == [(i, tokens[:, i].tolist()) for i in range(count)]  # in order, as made


@pytest.fixture
def untrained(tmp_path):
    """A run folder as ``train`` leaves it before its first checkpoint: its config and an empty checkpoints folder."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text(dump_config(load_config(None, [*TINY, "model.seq_len=32", f"run.dir={run}"])))
    return run


BAD = {
    "no checkpoint": ([], "has no committed checkpoint"),
    "no checkpoints folder": ([], "holds no checkpoints"),
    "not a run folder": ([], "is not a run folder"),
    "step not committed": (["--step", "7"], "--step: no committed checkpoint at step 7"),
    "prompt too long": (["--prompt", TEXT], "--prompt: is 45 tokens; model.seq_len is 32"),
    "max tokens": (["--max-tokens", "0"], "--max-tokens: must be at least 1"),
    "temperature": (["--temperature", "-0.5"], "--temperature: must be 0"),
    "top-k zero": (["--top-k", "0"], "--top-k: must be from 1 to the vocabulary's 256"),
    "top-k over vocab": (["--top-k", "257"], "--top-k: must be from 1"),
    "seed past 64 bits": (["--seed", str(2**64)], "--seed: must be from 0 to 4294967295 (JAX's key keeps 32 bits), not 1844"),
    "seed past 32 bits": (["--seed", str(2**32)], "--seed: must be from 0 to 4294967295"),
    "negative seed": (["--seed", "-1"], "--seed: must be from 0 to 4294967295"),
    "BPE run without its tokenizer": ([], "tokenizer.json: is missing: the run trained on the BPE token folder data.tokens="),
    "an XLA option XLA does not know": ([], "compiler.xla_options.xla_no_such_flag: unknown XLA flag"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_and_exit_2(devices, untrained, capsys, case):
    flags, message = BAD[case]
    run = untrained
    if case == "no checkpoints folder":
        (run / "checkpoints").rmdir()
    elif case == "not a run folder":
        (run / "config.yaml").unlink()
    elif case == "an XLA option XLA does not know":  # config.yaml edited, or written by another JAX
        bad = load_config(None, [*TINY, "model.seq_len=32", f"run.dir={run}", "compiler.xla_options.xla_no_such_flag=1"])
        (run / "config.yaml").write_text(dump_config(bad))
    elif case == "BPE run without its tokenizer":  # never decoded as bytes
        bpe = load_config(None, [*TINY, "model.seq_len=32", f"run.dir={run}", "data.tokens=/data/tok", "model.vocab_size=512"])
        (run / "config.yaml").write_text(dump_config(bpe))
    before = snapshot(run.parent), sorted(run.parent.rglob("*"))  # files' bytes, and every path (empty folders too)
    assert main(["sample", str(run), *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1, captured.err
    assert captured.err.startswith("jzero: error: ") and message in captured.err, captured.err
    assert (snapshot(run.parent), sorted(run.parent.rglob("*"))) == before


@pytest.fixture(scope="module")
def sharp_run(tmp_path_factory):
    """A run folder holding a step-1 checkpoint of the tiny GPT's init with its head scaled 30x (the
    init's logits are near uniform, where a temperature hardly changes a draw), and those parameters."""
    run = tmp_path_factory.mktemp("sharp") / "run"
    config = load_config(None, [*TINY, "model.seq_len=32", f"run.dir={run}"])
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(config))
    job = build_job(config)
    state = job.init_state()
    params = {**state.params, "lm_head": {"kernel": state.params["lm_head"]["kernel"] * 30}}
    with RunCheckpoints(run) as checkpoints:
        assert checkpoints.save(1, state.replace(params=params))
    return run, job.model, jax.device_get(params)


@functools.cache
def _apply(model):
    """The model's own ``apply``, jitted once per model (so traced once for every draw)."""
    return jax.jit(lambda p, t: model.apply({"params": p}, t))


def _drawn(model, params, prompt, count, temperature, seed):
    """``count`` tokens after ``prompt``, drawn independently of jzero's decoding: the logits of the
    model's own ``apply`` on the whole sequence so far (causal: the positions after it change
    nothing), and as the sampler documents its key use, step i's token ``jax.random.categorical(
    fold_in(key(seed), i), logits / temperature)`` over a [1, vocab] row; argmax at temperature 0."""
    apply = _apply(model)
    ids, key = list(prompt), jax.random.key(seed)
    for i in range(count):
        logits = apply(params, jnp.asarray([ids + [0] * (model.seq_len - len(ids))], jnp.int32))[:, len(ids) - 1]
        if temperature == 0:
            ids.append(int(jnp.argmax(logits[0])))
        else:
            ids.append(int(jax.random.categorical(jax.random.fold_in(key, i), logits / temperature, axis=-1)[0]))
    return ids[len(prompt) :]


def test_sampled_tokens_follow_the_temperature_and_seed(devices, sharp_run, capsys):
    """At temperature 1.7 and seed 5 the text (through the API and ``jzero sample --temperature``) is
    the tokens :func:`_drawn` draws from the model's logits / 1.7, which differ from those at 0.8
    (the default) and at 0 (greedy), so a temperature left out or fixed is caught."""
    run, model, params = sharp_run
    prompt, count, seed = BYTES.encode(PROMPT), 12, 5
    want, greedy = _drawn(model, params, prompt, count, 1.7, seed), _drawn(model, params, prompt, count, 0.0, seed)
    assert want != _drawn(model, params, prompt, count, 0.8, seed)
    assert want != greedy
    text = sample(run, PROMPT, max_tokens=count, temperature=1.7, seed=seed)
    assert text == BYTES.decode(want)
    flags = ["--prompt", PROMPT, "--max-tokens", str(count), "--temperature", "1.7", "--seed", str(seed)]
    assert main(["sample", str(run), *flags]) == 0
    assert capsys.readouterr().out == text + "\n"
    # Greedy is the argmax of the same logits (:func:`_drawn` uses no key at temperature 0: any seed's).
    assert sample(run, PROMPT, max_tokens=count, temperature=0.0) == BYTES.decode(greedy)
