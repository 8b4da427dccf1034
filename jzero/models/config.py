"""The ``model:`` and ``lora:`` sections: their records (:class:`ModelConfig`,
:class:`RopeScalingConfig`, :class:`LoraConfig`), their checks, and jzero's GPT or Llama they build
(:meth:`ModelConfig.build`). No JAX until a model is built."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jzero.checks import MAX_INT32, MAX_PARAMS, PathText, at_least_zero, check_regexes, one_of, positive
from jzero.compiler.platforms import flash_attention_available, on_gpus
from jzero.errors import ConfigError, show_value
from jzero.memory.remat import REMAT_POLICIES, policy_name
from jzero.models.names import ATTENTION, AUTO_ATTENTION, DECODERS, KEYS, MODELS, OWN, is_adapter
from jzero.models.names import GPT as GPT_NAME
from jzero.models.sizes import flops_per_token, head_size, kv_heads, mlp_units, param_count, sliding_layers

if TYPE_CHECKING:
    from jzero.memory.precision import Precision
    from jzero.models.decoder import Decoder
    from jzero.models.gpt import GPT
    from jzero.models.lora import LoraSpec

__all__ = ["LoraConfig", "ModelConfig", "RopeScalingConfig", "attention_for"]


@dataclasses.dataclass(frozen=True)
class RopeScalingConfig:
    """``model.rope_scaling``: Hugging Face's ``rope_scaling``. ``rope_type: llama3`` is Llama 3.1's
    long-context scaling (all four numbers); ``linear`` divides every frequency by ``factor`` (Gemma 3's
    full-attention layers). :func:`jzero.models.layers.rope_frequencies` computes both."""

    rope_type: str = "llama3"  # llama3 or linear
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def check(self) -> None:
        """Raises: ConfigError: naming ``model.rope_scaling.<key>``."""
        if self.rope_type not in ROPE_TYPES:
            kinds = " or ".join(ROPE_TYPES)
            raise ConfigError("model.rope_scaling.rope_type", f"must be {kinds}, got {show_value(self.rope_type)}")
        positive(self.factor, "model.rope_scaling.factor", math.inf)
        if self.rope_type == ROPE_TYPES[1]:
            _check_unread(self, ("rope_type", "factor"), "rope_type linear reads only factor", "model.rope_scaling")
            return
        for field in ("low_freq_factor", "original_max_position_embeddings"):
            positive(getattr(self, field), f"model.rope_scaling.{field}", math.inf)
        if not self.high_freq_factor > self.low_freq_factor:
            low = f"low_freq_factor={self.low_freq_factor}"
            raise ConfigError("model.rope_scaling.high_freq_factor", f"must be over {low}, got {self.high_freq_factor}")


ROPE_TYPES = ("llama3", "linear")
LAYER_TYPES = ("full", "sliding")  # model.layer_types: a layer attends to every earlier position, or to its window


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """``model:``: a row of the architecture table (:mod:`jzero.models.architectures`: jzero's GPT,
    or the decoder of Llama, Qwen2, Qwen3, Mistral, Gemma 2 or Gemma 3), its shape and its remat
    policy; or, with ``name: own``, a model of yours, of which only ``seq_len`` and ``vocab_size``
    are read (the batch is ``[train.global_batch_size, seq_len + 1]`` int32 ids below
    ``vocab_size``). Which keys each model reads: :data:`jzero.models.names.KEYS`."""

    name: str = "gpt"  # a row of jzero.models.architectures (gpt, llama, qwen2, qwen3, mistral, gemma2, gemma3) or own
    # name: own: ``FILE.py:FUNCTION`` (relative to the working directory) or ``MODULE:FUNCTION``;
    # ``FUNCTION(config)`` returns ``(init_fn, loss_fn)``. None: they are passed to jzero.build_job.
    entry: PathText | None = None
    vocab_size: int = 256
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    mlp_ratio: int = 4
    seq_len: int = 128
    remat: str | bool = "full"  # a policy of REMAT_POLICIES; true and false read as full and none
    tie_embeddings: bool = False
    # ZeRO-R's P_a: each block's saved input is split over ``model`` along the sequence and gathered
    # again for recomputation. None: on whenever the model axis is larger than 1.
    partition_activations: bool | None = None
    # auto: cuDNN's flash attention on GPUs with 16-bit compute and cuDNN installed, else xla.
    attention: str = AUTO_ATTENTION
    # the decoders (every row but gpt):
    n_kv_heads: int | None = None  # key and value heads (grouped-query attention); None: n_heads
    mlp_hidden: int | None = None  # the gated MLP's units; None: 8/3 d_model rounded up to 256 (Meta's rule)
    head_dim: int | None = None  # one head's size; None: d_model / n_heads
    rope_theta: float = 500_000.0  # the rotary base
    rope_scaling: RopeScalingConfig | None = None  # Llama 3.1's or a linear one; None: unscaled
    rms_norm_eps: float = 1e-5
    # qwen2, qwen3, mistral, gemma2, gemma3 (jzero.models.names.KEYS):
    sliding_window: int | None = None  # a sliding layer's query sees this many positions, its own included
    layer_types: list[str] | None = None  # full or sliding, one per layer; None: the row's pattern (sliding_every)
    attn_scalar: float | None = None  # attention's logits times attn_scalar**-0.5; None: head_dim's
    attn_softcap: float | None = None  # logits become cap * tanh(logits / cap) (Gemma 2); None: none
    final_softcap: float | None = None  # the same on the output logits
    rope_local_theta: float = 10_000.0  # gemma3: the sliding layers' rotary base (unscaled)

    def check(self) -> None:
        """Refuse a model jzero cannot build, or a key its model does not read.

        Raises:
          ConfigError: the first such key, ``model.<key>`` (``model`` for a size past 2**53 parameters).
        """
        one_of(self.name, "model.name", MODELS, "model")
        if self.name == OWN:
            _check_own(self)
            return
        if self.entry is not None:
            raise ConfigError("model.entry", f"names a model of your own: only with model.name: {OWN}")
        _check_unread(self, KEYS[self.name], f"jzero's {self.name} does not read it (model.name: {self.name})")
        for field in ("vocab_size", "d_model", "n_layers", "n_heads", "mlp_ratio", "seq_len"):
            positive(getattr(self, field), f"model.{field}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ConfigError("model.n_heads", f"{self.n_heads} does not divide model.d_model={self.d_model}")
        if self.head_dim is None and (self.d_model // self.n_heads) % 2:
            raise ConfigError("model.n_heads", f"head size d_model/n_heads={self.d_model // self.n_heads} must be even (rotary)")
        if self.name in DECODERS:
            _check_decoder(self)
        _check_width(self)
        if self.remat not in REMAT_POLICIES:
            policies = ", ".join(REMAT_POLICIES)
            raise ConfigError("model.remat", f"must be one of {policies} (or true, false), got {show_value(self.remat)}")
        if self.attention not in (AUTO_ATTENTION, *ATTENTION):
            known = f"{AUTO_ATTENTION}, {' or '.join(ATTENTION)}"
            raise ConfigError("model.attention", f"must be {known}, got {show_value(self.attention)}")
        _check_vocab(self)
        _check_count(self)

    def partitions_activations(self, model_parallel: int) -> bool:
        """``partition_activations``, with its default resolved: on whenever N_m > 1."""
        return model_parallel > 1 if self.partition_activations is None else self.partition_activations

    def flops_per_token(self, plan: Any = None) -> int:
        """The training FLOPs per token of jzero's model with this shape
        (:func:`jzero.models.sizes.flops_per_token`: 6 per matmul weight, and attention's), and with
        the frozen parameters and LoRA adapters of ``plan`` (a :class:`jzero.sharding.plan.Plan`): a
        frozen matmul weight (a layer's kernel, the head, or the embedding a tied head multiplies by)
        skips its weight gradient, 2 FLOPs less per weight; an adapter's two matmuls cost 6 per
        weight, as any trained weight's."""
        total = flops_per_token(self)
        for t in plan.tensors if plan is not None else ():
            count = math.prod(t.shape)
            if is_adapter(t.path):
                total += 6 * count
            elif not t.trainable and (t.path.endswith("/kernel") or (self.tie_embeddings and t.path.endswith("/embedding"))):
                total -= 2 * count
        return total

    def build(
        self,
        precision: Precision,
        *,
        model_parallel: int = 1,
        fetch_params: bool = False,
        devices: Sequence[Any] = (),
        lora: LoraSpec | None = None,
    ) -> GPT | Decoder:
        """jzero's GPT or the decoder of its row with this shape: the fields its model reads
        (:data:`jzero.models.names.KEYS`), defaults resolved.

        Args:
          precision: its compute dtype is the model's.
          model_parallel: N_m; ``partition_activations`` left unset means on when it is over 1.
          fetch_params: parameters rest in host memory and each block fetches its own (``zero.offload_params``).
          devices: what it runs on, which picks its attention (:func:`attention_for`).
          lora: low-rank adapters on the layers' kernels it targets (:meth:`LoraConfig.build`).
        """
        from jzero.models.decoder import Decoder, rope_scaling_pairs
        from jzero.models.gpt import GPT

        shape = {key: getattr(self, key) for key in KEYS[self.name]}
        shape["remat"] = policy_name(self.remat)
        shape["partition_activations"] = self.partitions_activations(model_parallel)
        shape["attention"] = attention_for(self.attention, devices, precision, self.attn_softcap)
        common = dict(fetch_params=fetch_params, dtype=precision.compute_dtype, lora=lora, fp8=precision.fp8)
        if self.name == GPT_NAME:
            return GPT(**shape, **common)
        scaling = dataclasses.asdict(self.rope_scaling) if self.rope_scaling is not None else None
        shape.update(n_kv_heads=kv_heads(self), mlp_hidden=mlp_units(self), head_dim=head_size(self))
        shape.update(rope_scaling=rope_scaling_pairs(scaling), layer_types=sliding_layers(self))
        return Decoder(arch=self.name, **shape, **common)


def _check_decoder(m: ModelConfig) -> None:
    kv = m.n_kv_heads if m.n_kv_heads is not None else m.n_heads
    positive(kv, "model.n_kv_heads")
    if m.n_heads % kv:
        raise ConfigError("model.n_kv_heads", f"{kv} does not divide model.n_heads={m.n_heads} (grouped-query attention)")
    for field in ("mlp_hidden", "head_dim", "sliding_window"):
        if getattr(m, field) is not None:
            positive(getattr(m, field), f"model.{field}")
    if m.head_dim is not None and m.head_dim % 2:
        raise ConfigError("model.head_dim", f"must be even (rotary), got {m.head_dim}")
    for field in ("rope_theta", "rms_norm_eps", "rope_local_theta", "attn_scalar", "attn_softcap", "final_softcap"):
        if getattr(m, field) is not None:
            positive(getattr(m, field), f"model.{field}", math.inf)
    if m.rope_scaling is not None:
        m.rope_scaling.check()
    _check_layer_types(m)


def _check_layer_types(m: ModelConfig) -> None:
    if m.layer_types is None:
        return
    if m.sliding_window is None:
        raise ConfigError("model.layer_types", "needs model.sliding_window: the size of a sliding layer's window")
    if not isinstance(m.layer_types, list) or len(m.layer_types) != m.n_layers:
        raise ConfigError("model.layer_types", f"must list one of {' or '.join(LAYER_TYPES)} per layer ({m.n_layers})")
    bad = next((t for t in m.layer_types if t not in LAYER_TYPES), None)
    if bad is not None:
        raise ConfigError("model.layer_types", f"each must be {' or '.join(LAYER_TYPES)}, got {show_value(bad)}")


def _check_width(m: ModelConfig) -> None:
    """The MLP's hidden width is a dimension too."""
    if mlp_units(m) > MAX_INT32:
        width = "the MLP width mlp_ratio x d_model" if m.name == GPT_NAME else "the MLP width mlp_hidden"
        key = "model.mlp_ratio" if m.name == GPT_NAME else "model.mlp_hidden"
        raise ConfigError(key, f"{width} = {mlp_units(m)} is over {MAX_INT32}")


def _check_count(m: ModelConfig) -> None:
    count = param_count(m)
    if count > MAX_PARAMS:
        mlp = f"mlp_ratio={m.mlp_ratio}" if m.name == GPT_NAME else f"mlp_hidden={mlp_units(m)}"
        sizes = f"d_model={m.d_model}, n_layers={m.n_layers}, {mlp}, vocab_size={m.vocab_size}"
        raise ConfigError("model", f"{sizes} make {count:.3g} parameters, over the limit of 2**53 ({MAX_PARAMS:.3g})")


def _check_unread(m: Any, read: tuple[str, ...], why: str, section: str = "model") -> None:
    """Every key of ``m`` (a section's record) that ``read`` leaves out keeps its default: a value
    nothing reads is a mistake."""
    default = type(m)()
    for field in dataclasses.fields(m):
        name = field.name
        if name not in (*read, "name", "entry") and getattr(m, name) != getattr(default, name):
            raise ConfigError(f"{section}.{name}", why)


def _check_vocab(m: ModelConfig) -> None:
    if m.vocab_size < 256:
        raise ConfigError("model.vocab_size", f"byte-level data needs at least 256, got {m.vocab_size}")


def _check_own(m: ModelConfig) -> None:
    """A model of yours: the batch's shape, the entry's form (:func:`jzero.training.job.build_job`
    imports it), and none of jzero's models' keys, which nothing would read."""
    for field in ("vocab_size", "seq_len"):
        positive(getattr(m, field), f"model.{field}")
    _check_vocab(m)
    if m.entry is not None and not _ENTRY.match(m.entry):
        raise ConfigError("model.entry", f"must be FILE.py:FUNCTION or MODULE:FUNCTION, got {show_value(m.entry)}")
    own = f"a model of your own (model.name: {OWN}) reads only seq_len and vocab_size"
    _check_unread(m, ("vocab_size", "seq_len"), f"is jzero's models'; {own}")


# FILE.py:FUNCTION or MODULE:FUNCTION (a dotted module name); the file may have any path.
_ENTRY = re.compile(r"^(?:.+\.py|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):[A-Za-z_]\w*$")


def attention_for(asked: str, devices: Sequence[Any], precision: Precision, softcap: float | None = None) -> str:
    """``model.attention`` resolved for ``devices``: ``auto`` is cuDNN's flash kernel on GPUs (real or
    a target's) with 16-bit compute and cuDNN installed, and no soft-capped logits (``softcap``:
    ``model.attn_softcap``, which its kernel does not compute), else XLA's.

    Raises:
      ConfigError: ``cudnn`` asked where it cannot run, naming ``model.attention`` and why.
    """
    why = "soft-capped logits (model.attn_softcap) need xla" if softcap is not None else _no_flash(devices, precision)
    if asked == AUTO_ATTENTION:
        return ATTENTION[0] if why else ATTENTION[1]
    if asked == ATTENTION[1] and why:
        raise ConfigError("model.attention", f"cudnn: {why}")
    return asked


def _no_flash(devices: Sequence[Any], precision: Precision) -> str:
    """Why cuDNN's flash attention cannot run on ``devices`` ('' when it can)."""
    import jax.numpy as jnp

    if not devices or not on_gpus(devices):
        return "needs GPUs (or a GPU --target)"
    if jnp.dtype(precision.compute_dtype or jnp.float32).itemsize != 2:
        return "needs 16-bit compute (precision.compute_dtype bfloat16 or float16)"
    if not flash_attention_available():
        return "cuDNN is not installed (pip install nvidia-cudnn-cu12, or the gpu-target extra)"
    return ""


@dataclasses.dataclass(frozen=True)
class LoraConfig:
    """``lora:``: low-rank adapters on the kernels of jzero's models' layers (:mod:`jzero.models.lora`).
    Rank 0 is off. Only the adapters train unless ``train.trainable`` says otherwise."""

    rank: int = 0
    alpha: float = 16.0  # the update is alpha / rank times A B
    targets: list[str] = dataclasses.field(default_factory=lambda: ["kernel"])  # path regexes: every kernel in the layers

    def check(self, model: str) -> None:
        """Adapters only on jzero's models (``model``: ``model.name``).

        Raises:
          ConfigError: naming ``lora.<key>``.
        """
        at_least_zero(self.rank, "lora.rank")
        if not self.rank:
            return
        if model == OWN:
            where = f"jzero's models' layers (model.name gpt or llama), not model.name: {OWN}"
            raise ConfigError("lora.rank", f"adapters go on {where}")
        positive(self.alpha, "lora.alpha", math.inf)
        if not self.targets:
            raise ConfigError("lora.targets", "must name at least one kernel path regex")
        check_regexes(self.targets, "lora.targets")

    def build(self) -> LoraSpec | None:
        """The adapters as the model reads them (:func:`jzero.models.lora.lora_spec`); None at rank 0."""
        from jzero.models.lora import lora_spec

        return lora_spec(self)
