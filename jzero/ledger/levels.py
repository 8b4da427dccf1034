"""Which bytes cross hosts: each collective's traffic split into within-host and cross-host parts,
from its replica groups and the hosts of the program's devices.

The accounting is ZeRO++'s (Wang et al., 2023): a collective whose group spans hosts counts all its
bytes (:func:`jzero.ledger.hlo.paper_bytes`) as cross-host, whatever algorithm the library runs
inside it; one whose every group stays on one host counts as within-host. A group's members are
partition ids, indices into the program's devices (the mesh's, flattened), and a device's host is
its ``process_index``: a GPU target's hosts, or the processes of a multi-process run.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Sequence

import numpy as np

from jzero.ledger.collectives import Collective, paper_bytes
from jzero.records import record

__all__ = ["LEVELS", "ZEROPP_CROSS_HOST_SHARE", "bytes_by_level", "group_members", "group_shape", "spans_hosts"]


@record
class Communication:
    """Bytes each device sends per step, against the paper's volume, and by level.

    Attributes:
      bytes_per_step: by op kind (an all-reduce counts twice, loops times their trip counts).
      by_dtype: by op kind, then element type.
      total: all kinds together.
      paper: the paper's 2Ψ or 3Ψ, in bytes.
      paper_model: which of the two, in words.
      ratio: ``total`` over ``paper``.
      hosts: how many hosts the devices are on.
      within_host_bytes: the bytes of collectives within a host.
      cross_host_bytes: the bytes of collectives whose group spans hosts.
      cross_host_ratio: those over ``paper``.
      zeropp_cross_host_bytes: ZeRO++'s 0.75Ψ cross-host figure; None below stage 3.
    """

    bytes_per_step: dict[str, int]
    by_dtype: dict[str, dict[str, int]]
    total: int
    paper: float
    paper_model: str
    ratio: float | None
    hosts: int
    within_host_bytes: int
    cross_host_bytes: int
    cross_host_ratio: float | None
    zeropp_cross_host_bytes: float | None


LEVELS = ("within_host", "cross_host")
# ZeRO++'s cross-host volume at stage 3: 0.75M of ZeRO-3's 3M (qwZ halves the forward gather, hpZ
# keeps the backward's within the host, qgZ sends a quarter of the gradient).
ZEROPP_CROSS_HOST_SHARE = 0.25
_IOTA = re.compile(r"\[(?P<shape>[\d,]+)\]<=\[(?P<dims>[\d,]+)\](?:T\((?P<perm>[\d,]+)\))?")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def _iota(dims: list[int], perm: list[int] | None) -> np.ndarray:
    """XLA's iota device list: ``arange`` reshaped to ``dims``, transposed by ``perm``, flattened."""
    ids = np.arange(int(np.prod(dims))).reshape(dims)
    return (ids.transpose(perm) if perm else ids).reshape(-1)


def group_members(groups: str, num_devices: int) -> list[list[int]] | None:
    """The device indices of each replica group, from any of XLA's three spellings, or None when
    the text is none of them.

    Args:
      groups: the op's ``replica_groups`` text (a :class:`jzero.ledger.hlo.Collective`'s).
      num_devices: the program's devices; ``{}`` (or no groups) means one group of all of them.
    """
    text = groups.strip()
    if text in ("", "{}"):
        return [list(range(num_devices))]
    if text.startswith("{{"):
        return [_ints(g) for g in re.findall(r"\{([\d,]+)\}", text)]
    if text.startswith("mesh["):
        return _mesh_members(text)
    if match := _IOTA.fullmatch(text):
        perm = _ints(match["perm"]) if match["perm"] else None
        return _iota(_ints(match["dims"]), perm).reshape(_ints(match["shape"])).tolist()
    return None


def _mesh_members(text: str) -> list[list[int]]:
    """``mesh['axis_0'=4,'axis_1'=2], device_ids=([2,4]T(1,0)) {'axis_0'}``: the devices laid out
    on the named axes (in ``device_ids``' order, else in order), one group per position of the axes
    not listed."""
    head, listed = text.rsplit("{", 1)
    sizes = [(name, int(size)) for name, size in re.findall(r"'([^']+)'=(\d+)", head.split("]")[0])]
    shape = [size for _, size in sizes]
    ids = np.arange(int(np.prod(shape)))
    if match := re.search(r"device_ids=\(\[(?P<dims>[\d,]+)\](?:T\((?P<perm>[\d,]+)\))?\)", head):  # an iota
        ids = _iota(_ints(match["dims"]), _ints(match["perm"]) if match["perm"] else None)
    elif match := re.search(r"device_ids=\[(?P<ids>[\d,]+)\]", head):  # the ids themselves
        ids = np.array(_ints(match["ids"]))
    axes = [i for i, (name, _) in enumerate(sizes) if f"'{name}'" in listed]
    rest = [i for i in range(len(sizes)) if i not in axes]
    grouped = ids.reshape(shape).transpose(rest + axes)
    return grouped.reshape(-1, int(np.prod([shape[i] for i in axes]))).tolist()


def spans_hosts(op: Collective, hosts: Sequence[int]) -> bool | None:
    """Whether any of ``op``'s groups holds devices of more than one host (None: groups unreadable).

    Args:
      op: a collective of the program.
      hosts: the host (``process_index``) of each of the program's devices, in their order.
    """
    members = group_members(op.replica_groups, len(hosts))
    if members is None:
        return None
    return any(len({hosts[i] for i in group}) > 1 for group in members)


def group_shape(op: Collective, hosts: Sequence[int]) -> tuple[int, int]:
    """``(hosts, per_host)``: the most hosts one of ``op``'s groups spans, and the fewest devices a
    group has on one of its hosts (what sets its share of a host's NICs, :func:`jzero.ledger.timing.bus_bandwidth`).

    Groups that cannot be read take the costlier reading: every host, one device on each.

    Args:
      op: a collective of the program.
      hosts: the host (``process_index``) of each of the program's devices, in their order.
    """
    members = group_members(op.replica_groups, len(hosts))
    if members is None:
        spanned = len(set(hosts))
        return spanned, 1 if spanned > 1 else len(hosts)
    spanned, fewest = 1, len(hosts)
    for group in members:
        per_host = collections.Counter(hosts[i] for i in group)
        spanned = max(spanned, len(per_host))
        fewest = min(fewest, *per_host.values())
    return spanned, fewest


def bytes_by_level(ops: Sequence[Collective], hosts: Sequence[int]) -> dict[str, int]:
    """Bytes each device sends per step (the paper's accounting, loops times their trip counts),
    as ``within_host`` and ``cross_host``. A collective whose groups cannot be read counts as
    cross-host, the costlier reading."""
    out = dict.fromkeys(LEVELS, 0)
    for op in ops:
        level = "within_host" if spans_hosts(op, hosts) is False else "cross_host"
        out[level] += paper_bytes(op) * op.executions
    return out
