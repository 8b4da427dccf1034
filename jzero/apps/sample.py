"""``jzero sample RUN_DIR``: continue a prompt with a run's trained GPT or Llama, streamed to stdout.

It reads the run's ``config.yaml`` and tokenizer: a run with its own ``tokenizer.json`` decodes with
it (a run on a token folder, ``data.tokens``, has a copy of the folder's, and one without it is
refused in one line, never decoded as bytes; ``jzero checkpoint import`` copies a Hugging Face
folder's); any other run is bytes. It checks a committed
checkpoint against its manifest, reads only its parameters (not the optimizer state), each device
its own shard, onto the run's mesh as the run trained (:func:`placement`; this host's first device
when it lacks the mesh's devices), and decodes with :func:`jzero.models.decode.generate`: a KV cache
inside one compiled loop, partitioned by XLA as the parameters are. Only the continuation
is printed, as it is made; the prompt is not repeated. Nothing is written to the run folder; an
output that cannot be written (``> /dev/full``) is one line naming it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util
from jax.sharding import Mesh, NamedSharding, Sharding
from jax.sharding import PartitionSpec as P

from jzero.checkpoint.catalog import NO_COMMITTED_STEP, committed_steps
from jzero.checkpoint.export import restore_numpy, restore_placed
from jzero.checkpoint.runs import array_metadata, shape_differences
from jzero.checkpoint.verify import rotated_away, step_folder, verify_step
from jzero.compiler.compiling import check_options
from jzero.compiler.options import compiler_options
from jzero.config.loading import load_config
from jzero.config.run_folder import RunDir, not_a_folder
from jzero.config.schema import MAX_SEED, Config
from jzero.data.tokenizer import BYTES, Tokenizer, load_tokenizer
from jzero.data.tokens import TOKENIZER_FILE
from jzero.errors import (
    CheckpointError,
    ConfigError,
    DamagedCheckpoint,
    JzeroError,
    OutputWriteError,
    RotatedAway,
    error_line,
    show_value,
)
from jzero.models.decode import generate
from jzero.models.lora import merged_adapters
from jzero.models.names import AUTO_ATTENTION, OWN
from jzero.sharding.mesh import simulate_cpu_devices
from jzero.training.job import Model, build_job
from jzero.trees import tree_paths

__all__ = ["Placement", "placement", "run_config", "sample", "sample_command"]

_WORDS = {"missing": "missing", "extra": "not in the model", "shape": "shape {found}, the model has {want}"}


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr)


def sample_command(args: argparse.Namespace) -> int:
    """``jzero sample``: the continuation of ``--prompt`` on stdout, then a newline; 0.

    Raises:
      JzeroError: bad input (:func:`sample`); nothing has been printed on stdout then.
      OutputWriteError: stdout could not be written (a full disk).
    """
    from jzero.distributed.process import start_backends

    config = run_config(args.run_dir)  # not a run folder: refused before JAX starts
    with contextlib.suppress(ConfigError):  # a bad count is refused with the run's other keys
        simulate_cpu_devices(config.runtime.cpu_devices)  # the run's mesh, where JAX has only the CPU
    start_backends()  # one process: no jax.distributed
    options = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_k": args.top_k, "seed": args.seed}
    sample(args.run_dir, args.prompt, **options, step=args.step, out=sys.stdout, warn=_to_stderr)
    _write(sys.stdout, "\n")
    return 0


def _write(out: IO[str], text: str) -> None:
    """Write and flush ``text``; a failure is an :class:`OutputWriteError` naming the file. (A
    failed flush drops what it held, so Python's own flush at exit does not fail again.)"""
    try:
        out.write(text)
        out.flush()
    except OSError as err:
        raise OutputWriteError(_file_name(out), err) from None


def _file_name(out: IO[str]) -> str:
    """The file behind ``out``: for stdout the one the shell opened (``> FILE``), where Linux says."""
    try:
        return os.readlink(f"/proc/self/fd/{out.fileno()}")
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both
        return str(getattr(out, "name", "the output"))


def run_config(run_dir: str | Path) -> Config:
    """The resolved config a run folder holds (its ``config.yaml``).

    Raises:
      CheckpointError: the folder holds no ``config.yaml`` (it is not a run folder).
      ConfigError: the file does not read as a config.
    """
    path = RunDir(Path(run_dir)).config
    if problem := not_a_folder(run_dir):
        raise CheckpointError(str(run_dir), problem)
    if not path.is_file():
        raise CheckpointError(str(run_dir), f"is not a run folder: it holds no {path.name} (train writes one)")
    return load_config(path)


@dataclasses.dataclass(frozen=True)
class _Request:
    """What :func:`sample` was asked for, checked: the model, the tokenizer and the prompt's ids."""

    model: Model
    tokenizer: Tokenizer
    ids: list[int]
    max_tokens: int
    note: str | None  # why max_tokens was cut, told once the checkpoint has been read
    options: dict[str, Any] | None  # the XLA options the run trained with, for these devices
    placement: Placement


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where a run's parameters go to be decoded.

    Attributes:
      mesh: the run's mesh; None: this host's first device.
      shardings: each parameter's resting sharding on the mesh, by path (as it trained); None on one device.
      note: why decoding is on one device, when it is.
    """

    mesh: Mesh | None = None
    shardings: dict[str, Sharding] | None = None
    note: str | None = None

    @property
    def devices(self) -> list[Any]:
        """The devices the decoding runs on."""
        return list(self.mesh.devices.flat) if self.mesh is not None else jax.local_devices()[:1]

    @property
    def prompt(self) -> Sharding:
        """The prompt's sharding: whole on every device."""
        if self.mesh is None:
            return jax.sharding.SingleDeviceSharding(self.devices[0])
        return NamedSharding(self.mesh, P())


def placement(config: Config) -> Placement:
    """The run's mesh and each parameter's resting sharding on it, as the run trained (stage 3's
    partitioned over ``data``, the ``model`` axis's split), when this host has the mesh's devices;
    else this host's first device, with a note saying why.

    Args:
      config: the run's config.
    """
    try:
        job = build_job(config)
    except ConfigError as err:  # the mesh needs more devices than this host has
        return Placement(note=f"jzero: note: decoding on one device ({err})")
    return Placement(job.mesh, {t.path: NamedSharding(job.mesh, t.param_spec) for t in job.plan.tensors})


def sample(
    run_dir: str | Path,
    prompt: str = "",
    *,
    max_tokens: int = 200,
    temperature: float = 0.8,
    top_k: int | None = None,
    seed: int = 0,
    step: int | None = None,
    out: IO[str] | None = None,
    warn: Callable[[str], None] = _to_stderr,
) -> str:
    """Continue ``prompt`` with a run's checkpoint, writing the text to ``out`` as it is made.

    The prompt and the new tokens together fit ``model.seq_len`` (the positions trained): a larger
    ``max_tokens`` is cut to what is left, with a note to ``warn``. Decoding ends early at the
    tokenizer's end-of-document token (BPE), which is not printed. An empty prompt starts after
    that token, or after a newline for bytes.

    Args:
      run_dir: a run folder (``run.dir``) with a committed checkpoint.
      prompt: the text to continue.
      max_tokens: how many tokens to make, at least 1.
      temperature: 0 for greedy decoding, else the softmax temperature.
      top_k: sample from the ``top_k`` most likely tokens only (1 to ``model.vocab_size``).
      seed: the sampling key's seed, from 0 to :data:`~jzero.config.schema.MAX_SEED` (JAX's key keeps 32 bits).
      step: a committed step (default: the newest that reads back; a damaged one is named and skipped).
      out: where the continuation streams (default: nowhere; it is returned).
      warn: told of notes and skipped checkpoints, one line each.

    Returns:
      The continuation's text.

    Raises:
      ConfigError: a bad option (``--max-tokens``, ``--temperature``, ``--top-k``, ``--seed``, ``--prompt``,
        ``--step``), or a BPE run without its ``tokenizer.json``.
      CheckpointError: not a run folder, no committed checkpoint, or one of another model's shapes.
      OutputWriteError: ``out`` could not be written.
    """
    if not 0 <= seed <= MAX_SEED:  # a larger one would make a smaller one's text: JAX keeps 32 bits
        raise ConfigError("--seed", f"must be from 0 to {MAX_SEED} (JAX's key keeps 32 bits), not {show_value(seed)}")
    req = _request(run_dir, prompt, max_tokens, temperature, top_k)
    params, model = _restore_params(run_dir, req.model, req.placement, step, warn), req.model
    if model.lora is not None:  # decoding reads the kernels by name: each adapter folded into its own
        params, model = merged_adapters(params, model.lora.scale), model.clone(lora=None)
    for note in (req.note, req.placement.note):
        if note:
            warn(note)  # after every refusal, so that bad input stays one line
    stream = _Stream(req.tokenizer, out)
    prompt_ids = jax.device_put(np.asarray([req.ids], np.int32), req.placement.prompt)
    tokens, count = generate(
        model,
        params,
        prompt_ids,
        jax.random.key(seed),
        max_tokens=req.max_tokens,
        temperature=temperature,
        top_k=top_k,
        eos_id=req.tokenizer.eos_id,
        on_token=stream,
        compiler_options=req.options,
    )
    text = stream.finish([int(t) for t in tokens[0, :count] if t != req.tokenizer.eos_id])
    if stream.failed is not None:
        raise stream.failed
    return text


def _request(run_dir: str | Path, prompt: str, max_tokens: int, temperature: float, top_k: int | None) -> _Request:
    """The options checked against the run's model and tokenizer, before any checkpoint is read."""
    if max_tokens < 1:
        raise ConfigError("--max-tokens", f"must be at least 1, not {max_tokens}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ConfigError("--temperature", f"must be 0 (greedy) or more, not {temperature}")
    config = run_config(run_dir)
    m = config.model
    if m.name == OWN:
        yours = "jzero.models.decode.decode_loop decodes yours"
        ours = "jzero sample decodes jzero's own models (jzero.models.architectures)"
        raise ConfigError("model.name", f"{run_dir} trained a model of your own; {ours}, {yours}")
    if top_k is not None and not 1 <= top_k <= m.vocab_size:
        raise ConfigError("--top-k", f"must be from 1 to the vocabulary's {m.vocab_size}, not {top_k}")
    tokenizer = _tokenizer(run_dir, config)
    ids = tokenizer.encode(prompt) if prompt else _start(tokenizer)
    if len(ids) >= m.seq_len:
        raise ConfigError(
            "--prompt", f"is {len(ids)} tokens; model.seq_len is {m.seq_len}, so at most {m.seq_len - 1} leave room for one more"
        )
    room = m.seq_len - len(ids)
    note = None
    if max_tokens > room:
        note = (f"jzero: note: --max-tokens {max_tokens} cut to {room}: the prompt's {len(ids)} tokens and the new ones "
                f"fit model.seq_len {m.seq_len}, the positions the model was trained on")  # fmt: skip
    # Decoding has its own attention over the cache: the trained attention's choice does not apply.
    shape = dataclasses.replace(m, attention=AUTO_ATTENTION)
    model = shape.build(config.precision.build(), lora=config.lora.build())
    where, mine = placement(config), config.compiler.xla_options
    options = compiler_options(where.devices, options=mine)
    check_options(where.devices, options, mine)  # a bad one is refused before any checkpoint is read
    return _Request(model, tokenizer, ids, min(max_tokens, room), note, options, where)


def _tokenizer(run_dir: str | Path, config: Config) -> Tokenizer:
    """The run's own ``tokenizer.json`` when it has one (a run on a token folder, ``data.tokens``, or
    one imported from Hugging Face with its tokenizer), else bytes; a token-folder run without it is refused."""
    path = RunDir(Path(run_dir)).tokenizer
    if path.exists():
        return load_tokenizer(path, key=str(path))
    if config.data.tokens is not None:
        given = Path(config.data.tokens) / TOKENIZER_FILE
        why = f"the run trained on the BPE token folder data.tokens={config.data.tokens}, and decodes with its tokenizer"
        raise ConfigError(str(path), f"is missing: {why}; copy {given} there")
    return BYTES


def _start(tokenizer: Tokenizer) -> list[int]:
    """What an empty prompt starts from: the end of a document (BPE), or a newline (bytes)."""
    return [tokenizer.eos_id] if tokenizer.eos_id is not None else tokenizer.encode("\n")


def _restore_params(run_dir: str | Path, model: Model, where: Placement, step: int | None, warn: Callable[[str], None]) -> Any:
    """The parameters of ``step`` (or of the newest step that reads back), placed as ``where`` says."""
    steps = committed_steps(run_dir, step)
    if not steps:
        raise CheckpointError(str(run_dir), NO_COMMITTED_STEP)
    expected = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), np.zeros((1, 1), np.int32))["params"]))
    for s in reversed(steps):
        folder = step_folder(run_dir, s)
        try:
            return _read_params(folder, expected, where, warn)
        except Exception as err:
            if rotated_away(folder):  # not damage: the run saved a newer step and deleted this one
                if step is not None:
                    raise RotatedAway(folder) from None
                return _restore_params(run_dir, model, where, step, warn)
            if isinstance(err, JzeroError) and not isinstance(err, DamagedCheckpoint):
                raise  # another model's shapes: the config's fault, not the checkpoint's
            unreadable = CheckpointError(str(folder), f"could not be read ({error_line(err)})")
            problem = err if isinstance(err, JzeroError) else unreadable  # tensorstore raises plain Exceptions
        if step is not None:
            raise problem
        warn(f"jzero: warning: {problem}; trying the previous checkpoint")  # read only: nothing is moved aside
    tried = ", ".join(map(str, reversed(steps)))
    raise CheckpointError(str(run_dir), f"no committed checkpoint could be read (tried steps {tried})")


def _read_params(step_dir: Path, expected: Any, where: Placement, warn: Callable[[str], None]) -> Any:
    """A step's ``params`` (verified against its manifest first) as the model's tree, each read
    straight into its sharding on the run's mesh, or whole onto one device."""
    verify_step(step_dir, warn)
    state_dir = step_dir / "state"
    found = {p[len("params/") :]: shape for p, (shape, _) in array_metadata(state_dir).items() if p.startswith("params/")}
    want = {p: x.shape for p, x in tree_paths(expected).items()}
    differ = shape_differences(found, want, words=_WORDS)
    if differ:
        raise CheckpointError(str(step_dir), f"the run's model.* shapes differ from the checkpoint's: {differ}")
    if where.shardings is not None:  # reads nothing else, and each device only its shard
        arrays = restore_placed(state_dir, {f"params/{p}": where.shardings[p] for p in want})
    else:
        arrays = jax.device_put(restore_numpy(state_dir, [f"params/{p}" for p in want]), where.devices[0])
    return traverse_util.unflatten_dict({tuple(p.split("/")[1:]): a for p, a in arrays.items()})


class _Stream:
    """The ``on_token`` callback of :func:`jzero.models.decode.generate` for one sequence: the text
    so far, written out as it grows. Text that ends in an unfinished UTF-8 character (U+FFFD) is
    held back until the character's last byte comes."""

    def __init__(self, tokenizer: Tokenizer, out: IO[str] | None):
        self.tokenizer, self.out = tokenizer, out
        self.ids: list[int] = []
        self.shown = ""
        self.failed: OutputWriteError | None = None  # raised by sample: inside JAX's callback it would be a traceback

    def __call__(self, tokens: np.ndarray, index: int) -> None:
        token = int(tokens[0])
        if token != self.tokenizer.eos_id:
            self.ids.append(token)
            self._show(final=False)

    def _show(self, final: bool) -> None:
        text = self.tokenizer.decode(self.ids)
        if (final or not text.endswith("\ufffd")) and text.startswith(self.shown):
            if self.out is not None and len(text) > len(self.shown):
                try:
                    _write(self.out, text[len(self.shown) :])
                except OutputWriteError as err:
                    self.failed, self.out = err, None
            self.shown = text

    def finish(self, ids: list[int]) -> str:
        """Write what was held back, given the tokens made (end-of-document dropped); returns their text."""
        self.ids = ids
        self._show(final=True)
        return self.tokenizer.decode(ids)
