"""The configurations ``jzero plan --search`` considers, and what it predicts of each before compiling.

A candidate is a set of ``--set`` overrides on the user's config: the stage, the remat policy, the
microbatches, optimizer and parameter offload, the ``replica`` and ``model`` axis sizes, ZeRO++'s
knobs (qwZ, hpZ, qgZ), float8 matmuls and gathers on GPUs that have float8 tensor cores and, when
it is free, the global batch. Before any compile each one gets the
paper's model-state bytes (:func:`jzero.sharding.stages.per_device_parts`) plus an activation estimate, and
a step time from the same model the compiled plan uses (:func:`jzero.ledger.timing.predict`) fed
with the paper's communication volumes: a prediction used only to prune and to order the compiles.
"""

from __future__ import annotations

import dataclasses
import itertools
import warnings
from collections.abc import Iterator

from jzero.compiler.options import PIPELINED_GATHERS
from jzero.config.schema import Config
from jzero.dtypes import FP8_RECIPES, array_bytes
from jzero.lazy import moved_names
from jzero.ledger.targets import GPUS, Target
from jzero.ledger.timing import StepCost, Transfer
from jzero.memory.remat import REMAT_POLICIES, offloads
from jzero.models.sizes import LayerShape, attention_flops_per_token, layer_shape
from jzero.sharding.axes import DATA, MODEL, REPLICA
from jzero.sharding.plan import Plan
from jzero.sharding.stages import QUANTIZED_WEIGHTS, STAGES, StageCollective, ZeroOptions, per_device_parts, stage_rule

__all__ = ["Candidate", "EstimateInputs", "candidates", "estimate", "estimate_inputs"]
# Renamed: "figures" said nothing of what they are for.
__getattr__ = moved_names(__name__, {"Figures": f"{__name__}.EstimateInputs", "figures_of": f"{__name__}.estimate_inputs"})

MICROBATCHES = (1, 2, 4, 8)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One configuration: what differs from the user's config, as ``--set`` words (:meth:`sets`)."""

    zero: ZeroOptions
    remat: str
    microbatches: int
    global_batch_size: int
    axes: tuple[tuple[str, int], ...]
    dcn: tuple[tuple[str, int], ...] = ()
    pipelined_gathers: bool = True  # XLA's all-gather pipeliner (GPU_COMPILER_OPTIONS) left on
    fp8: str = FP8_RECIPES[0]  # precision.fp8

    def sets(self) -> list[str]:
        """The overrides that make the user's config this candidate."""
        axes = ", ".join(f"{name}: {size}" for name, size in self.axes)
        dcn = ", ".join(f"{name}: {ways}" for name, ways in self.dcn)
        unpipelined = [f"compiler.xla_options.{PIPELINED_GATHERS}=false"] * (not self.pipelined_gathers)
        return [
            *self.zero.words(), f"model.remat={self.remat}", f"train.microbatches={self.microbatches}",
            f"train.global_batch_size={self.global_batch_size}", f"mesh.axes={{{axes}}}", f"mesh.dcn={{{dcn}}}",
            f"precision.fp8={self.fp8}", *unpipelined,
        ]  # fmt: skip

    @property
    def label(self) -> str:
        """``stage 3, data=64, remat full, batch 64 x 1`` and the knobs that are on."""
        axes = " x ".join(f"{n}={s}" for n, s in self.axes if s > 1) or "data=1"
        mb = f" in {self.microbatches}" if self.microbatches > 1 else ""
        head = [f"stage {self.zero.stage}", axes, f"remat {self.remat}", f"batch {self.global_batch_size}{mb}"]
        fp8 = [f"fp8 {self.fp8}"] * (self.fp8 != FP8_RECIPES[0])
        return ", ".join([*head, *fp8, *self.zero.knobs(), *["gathers not pipelined"] * (not self.pipelined_gathers)])

    @property
    def axis_sizes(self) -> tuple[int, int, int]:
        """The ``model``, ``replica`` and ``data`` axis sizes (1 where absent)."""
        axes = dict(self.axes)
        return axes.get(MODEL, 1), axes.get(REPLICA, 1), axes[DATA]

    @property
    def ways(self) -> tuple[int, int, int]:
        """Deprecated: :attr:`axis_sizes`."""
        warnings.warn("Candidate.ways is deprecated: use Candidate.axis_sizes", DeprecationWarning, stacklevel=2)
        return self.axis_sizes


@dataclasses.dataclass(frozen=True)
class EstimateInputs:
    """What the estimate needs of the model, from the user's job (its plan and config)."""

    num_params: float
    param_bytes: float  # all parameters, at rest
    grad_bytes: float
    optimizer_bytes: float
    compute_itemsize: int
    vocab: int
    n_layers: int
    layer: LayerShape  # what each layer multiplies by and saves (jzero.models.sizes, either model)
    seq_len: int
    flops_per_token: float
    attention_flops: float  # per token (jzero.models.sizes.attention_flops_per_token)

    @property
    def d_model(self) -> int:
        return self.layer.d_model


def candidates(
    figures: EstimateInputs, target: Target, batches: list[int], zero: ZeroOptions | None = None, fp8: str | None = None
) -> Iterator[Candidate]:
    """Every candidate for ``target``: stages 0-3 x remat policies x microbatches x offload x meshes
    (``model`` within a host, ``replica`` over the hosts for hpZ) x ZeRO++ knobs x ``batches``, each
    with the rest of ``zero`` (the user's; default: :class:`~jzero.sharding.stages.ZeroOptions`'s);
    on a GPU with float8 tensor cores and ``fp8`` (a recipe: the user's, or ``tensorwise``) given,
    without and with float8 matmuls, and at stage 3 float8 gathers where qwZ is off.
    Combinations a config cannot have (offload below its stage, qgZ with a model axis, a batch that
    does not split) are left out here or refused by config validation afterwards."""
    base = zero or ZeroOptions()
    float8 = fp8 is not None and GPUS[target.gpu].float8_dense_flops is not None
    recipes = (FP8_RECIPES[0], fp8) if float8 and fp8 != FP8_RECIPES[0] else (FP8_RECIPES[0],)
    heads = (figures.layer.n_heads, figures.layer.kv_heads)
    models = [m for m in (1, 2, 4, 8) if target.gpus_per_host % m == 0 and all(h % m == 0 for h in heads)]
    for stage, remat, mb, batch, m in itertools.product(STAGES, REMAT_POLICIES, MICROBATCHES, batches, models):
        for replica in {1, target.hosts} if stage_rule(stage).params else {1}:  # hpZ: a second copy of partitioned parameters
            data = target.count // (m * replica)
            if batch % (data * replica * mb):
                continue
            axes, dcn = _mesh(replica, data, m, target.hosts)
            for optimizer, params in _offloads(stage):
                z = dataclasses.replace(base, stage=stage, offload_optimizer=optimizer, offload_params=params)
                knobs = itertools.product(_zeropp(z, replica, m, float8), _pipelining(stage, mb), recipes)
                for zeropp, pipelined, recipe in knobs:
                    yield Candidate(zeropp, remat, mb, batch, axes, dcn=dcn, pipelined_gathers=pipelined, fp8=recipe)


def _mesh(replica: int, data: int, model: int, hosts: int) -> tuple[tuple[tuple[str, int], ...], tuple[tuple[str, int], ...]]:
    axes = ((REPLICA, replica),) * (replica > 1) + ((DATA, data), (MODEL, model))
    outer = REPLICA if replica > 1 else DATA
    return axes, ((outer, hosts),) * (hosts > 1)


def _pipelining(stage: int, microbatches: int) -> tuple[bool, ...]:
    """XLA's all-gather pipeliner on, and off where it costs memory: at stage 3 with microbatches it
    peels the step's first and last microbatch out of the microbatch loop, and two microbatches'
    saved values are live at once (MPT-3B at seq 8192 in 6 microbatches on h100x8: a device peak of
    96.3 GB with it, 55.0 without; docs/planner.md)."""
    return (True, False) if stage_rule(stage).params and microbatches > 1 else (True,)


def _offloads(stage: int) -> list[tuple[bool, bool]]:
    rule = stage_rule(stage)
    return [(False, False)] + [(True, False)] * rule.can_offload("optimizer") + [(True, True)] * rule.can_offload("params")


def _zeropp(zero: ZeroOptions, replica: int, model: int, float8: bool = False) -> Iterator[ZeroOptions]:
    """ZeRO++'s settings the search tries: qwZ and qgZ on or off, hpZ exactly when there is a ``replica``
    axis, and with ``float8`` float8 gathers where qwZ is off; none below stage 3, whose knobs act on
    partitioned parameters."""
    off = dataclasses.replace(zero, quantized_weights="none", hierarchical="none", quantized_gradients="none", fp8_gather=False)
    if not zero.rule.params:
        yield off
        return
    hpz = "hpz" if replica > 1 else "none"
    for qwz in QUANTIZED_WEIGHTS:
        for qgz in QUANTIZED_WEIGHTS if model == 1 and not zero.offload_params else ("none",):  # qgZ at qwZ's int8
            for fp8_gather in (False, True) if float8 and qwz == "none" else (False,):
                knobs = dict(quantized_weights=qwz, hierarchical=hpz, quantized_gradients=qgz, fp8_gather=fp8_gather)
                yield dataclasses.replace(off, **knobs)


def estimate(c: Candidate, f: EstimateInputs, target: Target) -> tuple[float, StepCost]:
    """A candidate's predicted device bytes and step cost, before compiling (a prediction: the
    search certifies memory by the compiled peak and ranks by the compiled step's prediction).

    Returns:
      ``(device_bytes, cost)``: the paper's model states (an offloaded part counts 0) plus saved
      activations, one layer's working set, the logits and two gathered layers; and a
      :class:`~jzero.ledger.timing.StepCost` with the paper's volumes, none of them hidden.
    """
    m, replica, data = c.axis_sizes
    parts = per_device_parts(f.param_bytes, f.grad_bytes, f.optimizer_bytes, c.zero.stage, data * replica, m)
    states = parts["total"] - parts["optimizer"] * c.zero.offload_optimizer - parts["params"] * c.zero.offload_params
    tokens = c.global_batch_size // (data * replica * c.microbatches) * f.seq_len
    unit = tokens * f.compute_itemsize  # bytes of one element per token
    working = unit * f.layer.working_per_token() / m  # one layer's values, all held while its backward runs
    # With the pipeliner peeling microbatches (:func:`_pipelining`), two microbatches' values at once.
    copies = 2 if c.pipelined_gathers and c.zero.rule.params and c.microbatches > 1 else 1
    activations = copies * f.n_layers * unit * f.layer.saved_per_token(c.remat) / m + working
    logits = 2 * tokens * f.vocab * 4 / m
    gathered = 2 * f.layer.matmul_params * f.compute_itemsize / m if c.zero.rule.params else 0
    return states + activations + logits + gathered, _cost(c, f, target, tokens, parts)


def _cost(c: Candidate, f: EstimateInputs, target: Target, tokens: int, parts: dict[str, float]) -> StepCost:
    m = c.axis_sizes[0]
    matmul = f.n_layers * f.layer.matmul_params
    attention = f.attention_flops / 12  # the scores' and weighted values' multiply-adds, forward
    model_flops = f.flops_per_token * c.global_batch_size * f.seq_len / target.count
    recompute = (2 * matmul + 4 * attention) / f.flops_per_token if c.remat == "full" else 0.0
    # Float8 runs the layers' projections: 6 FLOPs a weight a token, 8 with full remat's recomputation.
    projections = (8 if c.remat == "full" else 6) * matmul / f.flops_per_token if c.fp8 != FP8_RECIPES[0] else 0.0
    transfers = [_transfer(c, f, each, target) for each in c.zero.rule.collectives]
    if m > 1:  # tensor parallelism: two all-reduces of the activations per layer forward, two backward
        transfers.append(Transfer(8 * tokens * f.d_model * f.compute_itemsize * f.n_layers * c.microbatches, m))
    host = 2 * parts["optimizer"] * c.zero.offload_optimizer + 2 * parts["params"] * c.zero.offload_params * c.microbatches
    if offloads(c.remat):
        host += 2 * f.n_layers * tokens * f.compute_itemsize * f.layer.saved_per_token(c.remat) / m * c.microbatches
    return StepCost(
        flops=model_flops * (1 + recompute),
        model_flops=model_flops,
        tokens=c.global_batch_size * f.seq_len,
        hbm_bytes=2 * parts["total"],  # the update's reads and writes; the rest is read from the compiled program
        transfers=tuple(transfers),
        host_bytes=host,
        float8_flops=model_flops * projections,
    )


def _transfer(c: Candidate, f: EstimateInputs, each: StageCollective, target: Target) -> Transfer:
    """One of the stage's collectives (:attr:`jzero.sharding.stages.StageRule.collectives`) as bytes
    per device over its group: the gradients in their reduce dtype (qgZ's int4 a quarter of them),
    the updated parameters in theirs, stage 3's gathers in the compute dtype (qwZ's int8 and float8
    gathers half of them) once per microbatch, hpZ's backward gather within the data axis only."""
    m, replica, data = c.axis_sizes
    group = data * (1 if each.when == "backward" and c.zero.hpz else replica)  # laid over the hosts by _shape
    if each.state == "grads":
        size = f.grad_bytes / m * each.units * (0.25 if c.zero.qgz else 1.0)
    elif each.when == "step":
        size = f.param_bytes / m
    else:
        size = f.num_params * f.compute_itemsize / m * (0.5 if c.zero.qwz or c.zero.fp8_gather else 1.0)
    times = c.microbatches if c.zero.rule.params else 1
    return Transfer(size * times, group, *_shape(group, m, target))


def _shape(group: int, model: int, target: Target) -> tuple[int, int]:
    """``(hosts, per_host)`` of a group of ``group`` devices laid over the hosts outside a ``model``
    axis of that size within each host (:func:`_mesh`)."""
    per_host = max(1, min(group, target.gpus_per_host // model))
    return max(1, group // per_host), per_host


def estimate_inputs(plan: Plan, config: Config, flops_per_token: float, compute_itemsize: int) -> EstimateInputs:
    """The :class:`EstimateInputs` of a built job's plan and config."""
    params = sum(t.nbytes for t in plan.tensors)
    optimizer = sum(array_bytes(shape, dtype) for _, shape, dtype, _ in plan.opt_leaves)
    mc = config.model
    return EstimateInputs(
        plan.num_params, params, params, optimizer, compute_itemsize, mc.vocab_size, mc.n_layers, layer_shape(mc),
        mc.seq_len, flops_per_token, attention_flops_per_token(mc),
    )  # fmt: skip
