"""The ZeRO stages, in one place: what each partitions, its label, the options a stage may have
(:class:`ZeroOptions`, the one record of them) and the paper's formulas.

Rajbhandari et al., SC'20: stage 1 partitions the optimizer state (P_os), stage 2 the gradients too
(P_os+g), stage 3 the parameters too (P_os+g+p); stage 0 is plain data parallelism. Every other
module reads a stage through :func:`stage_rule`, never by comparing its number.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping

from jzero.communication import units
from jzero.dtypes import QUANTIZED_WIDTHS
from jzero.errors import JzeroError, PlanError
from jzero.lazy import moved_names
from jzero.records import record
from jzero.sharding.axes import MODEL, REPLICA

__getattr__ = moved_names(__name__, {name: f"jzero.ledger.report.{name}" for name in ("PaperRow", "PaperTable")})  # the report's

__all__ = [
    "DEFAULT_BLOCK",
    "HIERARCHICAL",
    "OFFLOADABLE",
    "QUANTIZED_GRADIENTS",
    "QUANTIZED_WEIGHTS",
    "STAGES",
    "StageCollective",
    "StageRule",
    "ZeroOptions",
    "check_fp8_gather",
    "check_hierarchical",
    "check_offload",
    "check_quantization",
    "check_quantized_gradients",
    "layout_stage",
    "paper_bytes_per_device",
    "paper_communication_bytes",
    "paper_parts_per_device",
    "per_device_parts",
    "stage_rule",
]


@record
class StateBytes:
    """Model-state bytes per device, by part.

    Attributes:
      params: the parameters.
      grads: the gradients.
      optimizer: the optimizer state.
      total: the three together.
    """

    params: int
    grads: int
    optimizer: int
    total: int

    @classmethod
    def of(cls, params: int, grads: int, optimizer: int) -> StateBytes:
        """The three parts and their total."""
        return cls(params=params, grads=grads, optimizer=optimizer, total=params + grads + optimizer)


@record
class HostBytes(StateBytes):
    """Bytes per device resting in pinned host memory: model states by part, and saved activations.

    Attributes:
      activations: the activations the layer loops save in host memory.
    """

    activations: int

    @classmethod
    def of(cls, states: StateBytes, activations: int) -> HostBytes:  # type: ignore[override]
        """The model states resting in host memory and the activations saved there."""
        return cls(
            params=states.params, grads=states.grads, optimizer=states.optimizer, total=states.total, activations=activations
        )


@dataclasses.dataclass(frozen=True)
class StageCollective:
    """One data-parallel collective (``kind``: ``all-reduce``, ``reduce-scatter`` or ``all-gather``)
    of one model's worth of a ``state`` (``grads`` or ``params``), ``when``: once a ``step``, or in the
    ``forward`` or ``backward`` (stage 3's gathers for compute, once per microbatch)."""

    kind: str
    state: str
    when: str = "step"

    @property
    def units(self) -> int:
        """Parameter sizes per device, as the paper counts them: an all-reduce is two."""
        return 2 if self.kind == "all-reduce" else 1


@dataclasses.dataclass(frozen=True)
class StageRule:
    """Which model states a ZeRO stage partitions over the ``data`` axis.

    Attributes:
      params: parameters at rest (stage 3).
      grads: the reduced gradients (stages 2 and 3).
      optimizer: the optimizer state, and so the update (stages 1 to 3).
      partitioned: what the stage partitions, in the words of the paper's table.
    """

    params: bool
    grads: bool
    optimizer: bool
    partitioned: str

    @property
    def collectives(self) -> tuple[StageCollective, ...]:
        """A step's data-parallel collectives (the paper's section 7): the gradients all-reduced; or
        reduce-scattered and the updated parameters all-gathered; or, parameters partitioned, these
        gathered in the forward and again in the backward and the gradients reduce-scattered."""
        if not self.optimizer:
            return (StageCollective("all-reduce", "grads"),)
        if not self.params:
            return StageCollective("reduce-scatter", "grads"), StageCollective("all-gather", "params")
        gathers = (StageCollective("all-gather", "params", when) for when in ("forward", "backward"))
        return *gathers, StageCollective("reduce-scatter", "grads")

    @property
    def communication_units(self) -> int:
        """The paper's data-parallel traffic per step, in parameter sizes: 2Ψ, or 3Ψ at stage 3."""
        return sum(c.units for c in self.collectives)

    def can_offload(self, part: str) -> bool:
        """Whether ``part`` (one of :data:`OFFLOADABLE`) may rest in host memory at this stage: only a
        part that the stage partitions, since ZeRO-Offload moves each device's own shard."""
        return getattr(self, part)


STAGES: dict[int, StageRule] = {
    0: StageRule(params=False, grads=False, optimizer=False, partitioned="nothing"),  # plain data parallelism
    1: StageRule(params=False, grads=False, optimizer=True, partitioned="optimizer state"),  # P_os
    2: StageRule(params=False, grads=True, optimizer=True, partitioned="+ gradients"),  # P_os+g
    3: StageRule(params=True, grads=True, optimizer=True, partitioned="+ parameters"),  # P_os+g+p
}


# The model states that can rest in pinned host memory, as ``zero.offload_<part>`` names them.
OFFLOADABLE = ("optimizer", "params")
_PART_WORDS = {"optimizer": "optimizer state", "params": "parameters"}


def stage_rule(stage: int, error: type[JzeroError] = PlanError) -> StageRule:
    """The rule of ``stage``.

    Raises:
      PlanError (or ``error``): ``stage`` is not a ZeRO stage, naming ``zero.stage``.
    """
    if stage not in STAGES or isinstance(stage, bool):
        raise error("zero.stage", f"must be {_spoken(STAGES)}, got {stage!r}")
    return STAGES[stage]


def layout_stage(params: bool, optimizer: bool) -> int | str:
    """The stage a state's shardings show: the one whose rule partitions the parameters so (and,
    where they rest whole, the optimizer state), or the stages that all do, joined (``"1-2"``: the
    reduced gradients, which alone tell 1 from 2, are not in a state)."""
    found = [s for s, rule in STAGES.items() if rule.params == params and (params or rule.optimizer == optimizer)]
    return found[0] if len(found) == 1 else "-".join(map(str, found))


def _spoken(stages: Iterable[int]) -> str:
    """``0, 1, 2 or 3``."""
    *rest, last = map(str, stages)
    return f"{', '.join(rest)} or {last}" if rest else last


def check_offload(stage: int, *, optimizer: bool = False, params: bool = False, error: type[JzeroError] = PlanError) -> None:
    """Refuse an offload that ``stage`` cannot have (:meth:`StageRule.can_offload`).

    Raises:
      PlanError (or ``error``): naming ``zero.offload_optimizer`` or ``zero.offload_params``.
    """
    for part, wanted in (("optimizer", optimizer), ("params", params)):
        if wanted and not stage_rule(stage).can_offload(part):
            able = _spoken(s for s, rule in STAGES.items() if rule.can_offload(part))
            needs = f"needs zero.stage {able} (the {_PART_WORDS[part]} partitioned)"
            raise error(f"zero.offload_{part}", f"{needs}, got stage {stage}")


# qwZ (ZeRO++): the widths a parameter gather may send, and its elements per scale.
QUANTIZED_WEIGHTS = ("none", QUANTIZED_WIDTHS[0])
DEFAULT_BLOCK = 2048


def check_quantization(
    stage: int, quantized_weights: str, block: int, *, master_copy: bool, error: type[JzeroError] = PlanError
) -> None:
    """Refuse a qwZ setting the stage or the precision cannot have.

    Args:
      master_copy: the optimizer keeps an fp32 master copy (16-bit parameters).

    Raises:
      PlanError (or ``error``): an unknown width, a block that is not a power of two, quantization at
        stage 0, or at stages 1-2 without a master copy, naming the key.
    """
    key = "zero.quantized_weights"
    if quantized_weights not in QUANTIZED_WEIGHTS:
        raise error(key, f"must be {' or '.join(QUANTIZED_WEIGHTS)}, got {quantized_weights!r}")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1 or block & (block - 1):
        raise error("zero.quantization_block", f"must be a power of two, got {block!r}")
    if quantized_weights == QUANTIZED_WEIGHTS[0]:
        return
    rule = stage_rule(stage, error)
    if not rule.optimizer:
        raise error(key, f"needs zero.stage 1, 2 or 3 (stage {stage} gathers no parameters)")
    if not rule.params and not master_copy:
        # Without a master the quantized copy would be what the next update starts from.
        needs = "needs a master copy (precision.param_dtype bfloat16) or stage 3"
        raise error(key, f"at stage {stage} the gathered parameters are the ones updated: it {needs}")


def check_fp8_gather(stage: int, fp8_gather: bool, qwz: bool, *, error: type[JzeroError] = PlanError) -> None:
    """Refuse float8 parameter gathers where no parameter is gathered before use, or beside qwZ.

    Raises:
      PlanError (or ``error``): naming ``zero.fp8_gather``.
    """
    key = "zero.fp8_gather"
    if not isinstance(fp8_gather, bool):
        raise error(key, f"must be true or false, got {fp8_gather!r}")
    if fp8_gather and stage != 3:
        raise error(key, f"needs zero.stage 3 (stage {stage} does not gather parameters before their use)")
    if fp8_gather and qwz:
        raise error(key, "zero.quantized_weights already quantizes the parameter gathers (qwZ): use one of the two")


# hpZ (ZeRO++): none, or a secondary copy of the parameter shards within each host.
HIERARCHICAL = ("none", "hpz")


def check_hierarchical(stage: int, hierarchical: str, replica: int, *, error: type[JzeroError] = PlanError) -> None:
    """Refuse an hpZ setting the stage or the mesh cannot have.

    Args:
      replica: the size of the mesh's ``replica`` axis (1 when it has none): the hosts, across which
        the primary partition spans and the secondary one does not.

    Raises:
      PlanError (or ``error``): an unknown value, hpZ below stage 3, or hpZ without a ``replica`` axis.
    """
    key = "zero.hierarchical"
    if hierarchical not in HIERARCHICAL:
        raise error(key, f"must be {' or '.join(HIERARCHICAL)}, got {hierarchical!r}")
    if hierarchical == HIERARCHICAL[0]:
        return
    if not stage_rule(stage, error).params:
        raise error(key, f"hpz keeps a secondary copy of parameter shards: needs zero.stage 3, got {stage}")
    if replica in (0, 1):
        raise error(key, "hpz needs a replica axis (mesh.axes.replica > 1, across the hosts) to keep its secondary copy within")


# qgZ (ZeRO++): the widths a gradient reduction may send (its all-to-all's values).
QUANTIZED_GRADIENTS = ("none", *QUANTIZED_WIDTHS)


def check_quantized_gradients(
    stage: int,
    quantized_gradients: str,
    hierarchical: str,
    axes: Mapping[str, int],
    *,
    offload_params: bool = False,
    error: type[JzeroError] = PlanError,
) -> None:
    """Refuse a qgZ setting the stage or the mesh cannot have.

    qgZ runs the loss under ``jax.shard_map`` over the batch axes, every gather and gradient
    reduction an explicit collective. That step has no ``model`` axis yet, and its two hops need
    the gradient partitioned over every batch axis: with a ``replica`` axis, hpZ's partition.

    Args:
      axes: the mesh's axis sizes.
      offload_params: ``zero.offload_params``.

    Raises:
      PlanError (or ``error``): an unknown width, qgZ below stage 3, with a ``model`` axis over 1,
        with a ``replica`` axis but no hpZ, or with the parameters offloaded.
    """
    key = "zero.quantized_gradients"
    if quantized_gradients not in QUANTIZED_GRADIENTS:
        widths = f"{', '.join(QUANTIZED_GRADIENTS[:-1])} or {QUANTIZED_GRADIENTS[-1]}"
        raise error(key, f"must be {widths}, got {quantized_gradients!r}")
    if quantized_gradients == QUANTIZED_GRADIENTS[0]:
        return
    if not stage_rule(stage, error).params:
        raise error(key, f"reduces the gradients layer by layer as stage 3 does: needs zero.stage 3, got {stage}")
    if int(axes.get(MODEL, 1)) > 1:
        raise error(key, f"needs mesh.axes.model 1 (got {axes[MODEL]}): the all-to-all step does not split the model yet")
    if int(axes.get(REPLICA, 1)) > 1 and hierarchical == HIERARCHICAL[0]:
        raise error(key, "with a replica axis it needs zero.hierarchical hpz (the second hop runs across replica)")
    if offload_params:
        raise error(key, "not with zero.offload_params yet (the all-to-all step fetches nothing from the host)")


def per_device_parts(params: float, grads: float, optimizer: float, stage: int, n_d: int, n_m: int = 1) -> dict[str, float]:
    """Model-state bytes per device from each part's whole-model bytes.

    Args:
      params, grads, optimizer: bytes of the whole model's parameters, gradients and optimizer state.
      stage: the ZeRO stage; each part it partitions is divided by ``n_d``.
      n_d: the ``data`` axis size.
      n_m: the model-parallel size, which divides every part.

    Returns:
      ``{"params", "grads", "optimizer", "total"}`` in bytes per device.
    """
    rule = stage_rule(stage)
    parts = {
        "params": params / (n_d if rule.params else 1) / n_m,
        "grads": grads / (n_d if rule.grads else 1) / n_m,
        "optimizer": optimizer / (n_d if rule.optimizer else 1) / n_m,
    }
    return {**parts, "total": sum(parts.values())}


def paper_parts_per_device(
    num_params: float, stage: int, n_d: int, k: float = 12, param_bytes: float = 2, grad_bytes: float = 2, n_m: int = 1
) -> dict[str, float]:
    """The paper's model-state bytes per device, by part: (p + g + K)Ψ with the stage's parts over N_d.

    Args:
      num_params: Ψ.
      stage: the ZeRO stage.
      n_d: the ``data`` axis size.
      k: optimizer-state bytes per parameter (12 for mixed-precision Adam: master, momentum, variance).
      param_bytes, grad_bytes: bytes per parameter and per gradient element (2 in mixed precision).
      n_m: the model-parallel size.

    Returns:
      ``{"params", "grads", "optimizer", "total"}`` in bytes per device.
    """
    psi = float(num_params)
    return per_device_parts(param_bytes * psi, grad_bytes * psi, k * psi, stage, n_d, n_m)


def paper_bytes_per_device(
    num_params: float, stage: int, n_d: int, k: float = 12, param_bytes: float = 2, grad_bytes: float = 2, n_m: int = 1
) -> float:
    """The total of :func:`paper_parts_per_device`: the paper's Figure 1 per-device model states."""
    return paper_parts_per_device(num_params, stage, n_d, k, param_bytes, grad_bytes, n_m)["total"]


def paper_communication_bytes(num_params: float, stage: int, grad_bytes: float, n_m: int = 1) -> float:
    """The paper's data-parallel volume per device per step: 2Ψ (stages 0-2) or 3Ψ (stage 3), in
    bytes of ``grad_bytes`` per element, over N_m."""
    return stage_rule(stage).communication_units * float(num_params) * grad_bytes / n_m


@dataclasses.dataclass(frozen=True)
class ZeroOptions:
    """``zero:``: the ZeRO stage and every ZeRO and ZeRO++ option, with its default; the one record
    of them that the config, :func:`jzero.sharding.plan.make_plan`, the plan, the planner's candidates and the
    report all carry. A new option is a field here and its rule in :meth:`check`.

    Attributes:
      stage: the ZeRO stage (:data:`STAGES`).
      offload_optimizer: ZeRO-Offload: the optimizer state (and fp32 master copy) rests in pinned
        host memory, partitioned as the stage says, and streams to the device for the update.
      offload_params: ZeRO-Infinity's parameter offload (stage 3): parameters rest in pinned host
        memory and each layer's shard comes to the device inside the layer loop.
      gather_units: stage 3's gathering units (:mod:`jzero.communication.units`): ``auto``, ``none`` or a list of
        regexes over parameter path prefixes.
      prefetch: units ahead a gather may start (0: once the previous unit is done).
      persist_below_bytes: stage 3: parameters smaller than this rest whole, never gathered.
      quantized_weights: ZeRO++'s qwZ (:data:`QUANTIZED_WEIGHTS`): parameter gathers send int8
        blocks with a float32 scale each (:mod:`jzero.communication.quantize`).
      quantization_block: qwZ's (and qgZ's) elements per scale, a power of two.
      hierarchical: ZeRO++'s hpZ (:data:`HIERARCHICAL`): everything partitioned over replica x data,
        plus a secondary copy of each gathered layer's shards over data (within a host) that the
        backward gathers again from.
      quantized_gradients: ZeRO++'s qgZ (:data:`QUANTIZED_GRADIENTS`): the gradient reduce-scatter
        becomes an all-to-all of int8 or int4 blocks (two hops under hpZ), summed in float32
        between the hops.
      fp8_gather: stage 3: each parameter of two or more dimensions is cast to float8 (e4m3, one
        scale from the whole tensor's largest magnitude) before its all-gather, and back to the
        compute dtype after (:mod:`jzero.memory.float8`).
    """

    stage: int = 0
    offload_optimizer: bool = False
    offload_params: bool = False
    gather_units: str | list[str] = units.AUTO
    prefetch: int = 1
    persist_below_bytes: int = 0
    quantized_weights: str = QUANTIZED_WEIGHTS[0]
    quantization_block: int = DEFAULT_BLOCK
    hierarchical: str = HIERARCHICAL[0]
    quantized_gradients: str = QUANTIZED_GRADIENTS[0]
    fp8_gather: bool = False

    @property
    def rule(self) -> StageRule:
        """The stage's rule (:func:`stage_rule`)."""
        return stage_rule(self.stage)

    @property
    def qwz(self) -> bool:
        """Parameter gathers send quantized blocks."""
        return self.quantized_weights != QUANTIZED_WEIGHTS[0]

    @property
    def hpz(self) -> bool:
        """A secondary copy of the parameter shards within each host."""
        return self.hierarchical != HIERARCHICAL[0]

    @property
    def qgz(self) -> bool:
        """Gradients are reduced by quantized all-to-alls."""
        return self.quantized_gradients != QUANTIZED_GRADIENTS[0]

    def check(self, axes: Mapping[str, int], *, master_copy: bool, error: type[JzeroError] = PlanError) -> None:
        """Refuse a value no run can have, or one the stage, mesh or precision cannot.

        Args:
          axes: the mesh's axis sizes.
          master_copy: the optimizer keeps an fp32 master copy (16-bit parameters).
          error: the error to raise (:class:`~jzero.errors.ConfigError` for a config).

        Raises:
          PlanError (or ``error``): the first bad option, naming its ``zero.`` key.
        """
        stage_rule(self.stage, error)
        check_hierarchical(self.stage, self.hierarchical, int(axes.get(REPLICA, 1)), error=error)
        check_quantization(self.stage, self.quantized_weights, self.quantization_block, master_copy=master_copy, error=error)
        qgz = (self.stage, self.quantized_gradients, self.hierarchical, axes)
        check_quantized_gradients(*qgz, offload_params=self.offload_params, error=error)
        check_offload(self.stage, optimizer=self.offload_optimizer, params=self.offload_params, error=error)
        check_fp8_gather(self.stage, self.fp8_gather, self.qwz, error=error)
        units.check(self.gather_units, error)
        for key in ("prefetch", "persist_below_bytes"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise error(f"zero.{key}", f"must be a whole number >= 0, got {value!r}")

    def for_stage(self, stage: int, axes: Mapping[str, int], *, master_copy: bool) -> ZeroOptions:
        """These options at another stage or mesh, less what that stage or mesh cannot have (another
        stage of the same run, in a comparison): an offload of a part the stage does not partition,
        qwZ where the stage gathers no parameters or would quantize what it updates, hpZ without
        stage 3 and a ``replica`` axis, qgZ without stage 3."""
        rule = stage_rule(stage)
        quantizes = rule.params or (rule.optimizer and master_copy)
        return dataclasses.replace(
            self,
            stage=stage,
            offload_optimizer=self.offload_optimizer and rule.can_offload("optimizer"),
            offload_params=self.offload_params and rule.can_offload("params"),
            quantized_weights=self.quantized_weights if quantizes else QUANTIZED_WEIGHTS[0],
            hierarchical=self.hierarchical if rule.params and REPLICA in axes else HIERARCHICAL[0],
            quantized_gradients=self.quantized_gradients if rule.params else QUANTIZED_GRADIENTS[0],
            fp8_gather=self.fp8_gather and rule.params,
        )

    def words(self) -> list[str]:
        """Every option as a ``--set`` override: ``["zero.stage=3", "zero.offload_optimizer=false", ...]``."""
        return [f"zero.{f.name}={_word(getattr(self, f.name))}" for f in dataclasses.fields(self)]

    def knobs(self) -> list[str]:
        """The options that are on, in a few words each: ``["offload optimizer", "qwZ int8", "hpZ"]``."""
        words = [
            "offload optimizer" * self.offload_optimizer,
            "offload params" * self.offload_params,
            f"qwZ {self.quantized_weights}" * self.qwz,
            "hpZ" * self.hpz,
            f"qgZ {self.quantized_gradients}" * self.qgz,
            "fp8 gather" * self.fp8_gather,
        ]
        return [w for w in words if w]


def _word(value: object) -> str:
    """A value as YAML reads it back from a ``--set``: ``true``, ``3``, ``none``, ``["h/\\\\d+"]``."""
    if isinstance(value, bool):
        return str(value).lower()
    return json.dumps(list(value)) if isinstance(value, list | tuple) else str(value)
