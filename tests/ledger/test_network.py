"""The network model: each collective timed by its groups' shape over the hosts (jzero.ledger.timing.bus_bandwidth).

A handwritten program on 2 hosts of 8 GPUs gathers one 1.6 GB bf16 tensor four ways, and every
expected time below is worked out here by hand from round figures: NVLink's ring bus bandwidth
300 GB/s, NICs of 25 GB/s.

- within a host, groups of 8 on one host: a ring over NVSwitch, 300 GB/s;
- all 16 devices, 8 on each host: NCCL's rings run one channel per NIC, so each host's bytes
  leave it over all 8 NICs at once: 8 x 25 = 200 GB/s (below NVLink's 300);
- 4 devices on each host: two such groups run at once and share the NICs, 4 each: 100 GB/s;
- along the rails, one device per host: each GPU's ring runs over its own NIC, 25 GB/s;
- groups of 4 with 3 devices on one host and 1 on the other: the lone device's one NIC bounds
  the ring, 25 GB/s.
"""

import json

import pytest
from support.cli import keyed_error
from support.configs import TINY

from jzero.cli.main import main
from jzero.ledger.flops import matmul_flops
from jzero.ledger.hlo import parse_collectives
from jzero.ledger.levels import group_shape
from jzero.ledger.prediction import transfers
from jzero.ledger.render import format_plan
from jzero.ledger.report import CheckedPlanReport
from jzero.ledger.targets import NIC_SHARE, parse_target
from jzero.ledger.timing import Hardware, StepCost, Transfer, bus_bandwidth, predict
from jzero.records import from_json, to_json

# No sum over a batch here: each figure is a few float64 products and quotients. Their floor, the
# same factors multiplied in every order, differs by at most 1.9e-16 relative (measured on the
# expected values below); rel=1e-12 is a margin of about 5e3 over it, and a bus bandwidth wrong by
# one NIC's share (8x) is 1e12 times over the tolerance.
REL = 1e-12
HOSTS = [0] * 8 + [1] * 8  # each device's host, in the program's order
HW = Hardware(
    peak_flops=1e15, hbm_bytes_per_s=1e12, within_host_bytes_per_s=300e9, nic_bytes_per_s=25e9, host_bytes_per_s=1e10,
    gpus_per_host=8, nics_per_host=8,
)  # fmt: skip
SHARD = 50_000_000  # bf16 elements of one device's shard: a 100 MB shard of a 1.6 GB tensor
WHOLE = 16 * SHARD * 2  # the gathered bytes, the paper's volume of one all-gather over 16
GROUPS = {
    "within": "{{0,1,2,3,4,5,6,7},{8,9,10,11,12,13,14,15}}",
    "across": "[1,16]<=[16]",
    "half_hosts": "{{0,1,2,3,8,9,10,11},{4,5,6,7,12,13,14,15}}",
    "rails": "[8,2]<=[2,8]T(1,0)",  # {0,8}, {1,9}, ...: one device on each host
    "uneven": "{{0,1,2,8},{3,4,5,9},{6,7,10,11},{12,13,14,15}}",  # {0,1,2,8} has one device on host 1
}
SIZES = {"within": 8, "across": 16, "half_hosts": 8, "rails": 2, "uneven": 4}


def _program() -> str:
    lines = ["HloModule m", "", "ENTRY %main (x: bf16[50000000]) -> bf16[800000000] {", "  %x = bf16[50000000]{0} parameter(0)"]
    for i, (name, groups) in enumerate(GROUPS.items()):
        n = SIZES[name]
        lines.append(
            f"  %{name} = bf16[{n * SHARD}]{{0}} all-gather(%x), channel_id={i + 1}, replica_groups={groups}, "
            "dimensions={0}, use_global_device_ids=true"
        )
    lines += ["  ROOT %out = bf16[800000000]{0} copy(%across)", "}"]
    return "\n".join(lines)


def _transfers() -> dict[str, Transfer]:
    text = _program()
    ops = parse_collectives(text)
    return {op.name: t for op, t in zip(ops, transfers(ops, HOSTS, matmul_flops(text)), strict=True)}


def test_each_groups_shape_over_the_hosts_is_read_from_the_replica_groups():
    shapes = {op.name: group_shape(op, HOSTS) for op in parse_collectives(_program())}
    assert shapes == {"within": (1, 8), "across": (2, 8), "half_hosts": (2, 4), "rails": (2, 1), "uneven": (2, 1)}


def test_each_collectives_bus_bandwidth_and_time_by_hand():
    t = _transfers()
    assert {name: bus_bandwidth(t[name], HW) for name in GROUPS} == {
        "within": ("nvlink", 300e9),
        "across": ("ring", 200e9),  # 8 NICs x 25 GB/s, not one NIC's 25
        "half_hosts": ("ring", 100e9),
        "rails": ("rail", 25e9),
        "uneven": ("rail", 25e9),
    }
    # bytes x (n - 1) / n over the bus bandwidth; each gathers n shards of 100 MB.
    expected = {
        "within": 8e8 * 7 / 8 / 300e9,
        "across": 1.6e9 * 15 / 16 / 200e9,
        "half_hosts": 8e8 * 7 / 8 / 100e9,
        "rails": 2e8 * 1 / 2 / 25e9,
        "uneven": 4e8 * 3 / 4 / 25e9,
    }
    for name, seconds in expected.items():
        p = predict(StepCost(flops=0.0, model_flops=1.0, tokens=1, transfers=(t[name],)), HW)
        assert p.communication_s == pytest.approx(seconds, rel=REL), name
        level = "within_host" if name == "within" else "across_hosts"
        assert getattr(p, f"communication_{level}_s") == pytest.approx(seconds, rel=REL), name
        assert getattr(p.bus_bandwidth, level) == pytest.approx(bus_bandwidth(t[name], HW)[1], rel=REL), name


def test_fewer_nics_per_host_share_the_same_bytes():
    t = _transfers()
    four = Hardware(**{**HW.__dict__, "nics_per_host": 4, "nic_bytes_per_s": 50e9})  # the same 200 GB/s a host
    assert bus_bandwidth(t["across"], four) == ("ring", 200e9)
    assert bus_bandwidth(t["rails"], four) == ("rail", 25e9)  # 8 rail groups over 4 NICs: half a NIC each
    one = Hardware(**{**HW.__dict__, "nics_per_host": 1, "nic_bytes_per_s": 12.5e9})  # 1 x 100 Gb/s a host
    assert bus_bandwidth(t["across"], one)[1] == 12.5e9
    assert bus_bandwidth(t["rails"], one)[1] == 12.5e9 / 8
    fast = Hardware(**{**HW.__dict__, "nic_bytes_per_s": 100e9})  # 8 x 100 GB/s: NVLink's 300 bounds the ring
    assert bus_bandwidth(t["across"], fast)[1] == 300e9


def test_a_step_adds_each_levels_collectives_and_reports_each_levels_bus_bandwidth():
    t = _transfers()
    p = predict(StepCost(flops=0.0, model_flops=1.0, tokens=1, transfers=tuple(t.values())), HW)
    across = [1.6e9 * 15 / 16 / 200e9, 8e8 * 7 / 8 / 100e9, 2e8 / 2 / 25e9, 4e8 * 3 / 4 / 25e9]
    assert p.communication_within_host_s == pytest.approx(8e8 * 7 / 8 / 300e9, rel=REL)
    assert p.communication_across_hosts_s == pytest.approx(sum(across), rel=REL)
    ring_bytes = 1.6e9 * 15 / 16 + 8e8 * 7 / 8 + 2e8 / 2 + 4e8 * 3 / 4
    assert to_json(p.bus_bandwidth) == pytest.approx({"within_host": 300e9, "across_hosts": ring_bytes / sum(across)}, rel=REL)
    # A level without collectives reports what a group of every GPU of each host reaches.
    alone = predict(StepCost(flops=0.0, model_flops=1.0, tokens=1, transfers=(t["within"],)), HW)
    assert alone.bus_bandwidth.across_hosts == 200e9


def test_a_targets_network_comes_from_its_gpu_or_the_flags():
    dgx = parse_target("h100x64").hardware()
    assert (dgx.gpus_per_host, dgx.nics_per_host) == (8, 8)
    assert dgx.nic_bytes_per_s == pytest.approx(400e9 / 8 * NIC_SHARE, rel=REL) == pytest.approx(48e9, rel=REL)
    assert dgx.within_host_bytes_per_s == 370e9  # NCCL's ring busbw over NVLink 4 (nccl-tests#212)
    slow = parse_target("h100x64", nics_per_host=4, nic_gbps=100).hardware()
    assert (slow.nics_per_host, slow.nic_bytes_per_s) == (4, pytest.approx(12e9, rel=REL))


def test_the_plan_prints_and_reports_each_levels_bus_bandwidth(capsys, h100x8):
    sets = [a for kv in TINY for a in ("--set", kv)]
    plan = ["plan", "configs/gpt-tiny.yaml", "--target", "h100x16", "--set", "mesh.axes={data: 16}", *sets]
    assert main([*plan, "--json"]) == 0
    bus = json.loads(capsys.readouterr().out)["predicted"]["bus_bandwidth"]
    # Every group spans both hosts, 8 devices on each: 8 NICs of 48 GB/s, bounded by NVLink's 370.
    assert bus == pytest.approx({"within_host": 370e9, "across_hosts": 370e9}, rel=REL)
    assert main([*plan, "--json", "--nics-per-host", "1", "--nic-gbps", "100"]) == 0
    report = json.loads(capsys.readouterr().out)
    bus = report["predicted"]["bus_bandwidth"]
    assert bus["across_hosts"] == pytest.approx(100e9 / 8 * NIC_SHARE, rel=REL)  # one NIC a host, all 8 GPUs' rings on it
    # The same report as jzero plan prints it without --json (the text of the report read back, not
    # a third compile of the same program: the flags change the prediction, not the compile).
    line = "bus bandwidth (predicted, as nccl-tests' busbw): within a host 370 GB/s, across hosts 12 GB/s"
    assert line in format_plan(from_json(CheckedPlanReport, report))


def test_bad_network_flags_are_one_line(capsys, h100x8):
    plan = ["plan", "configs/gpt-tiny.yaml"]
    assert "only with --target" in keyed_error(capsys, [*plan, "--nics-per-host", "4"], "--nics-per-host")
    assert "only with --target" in keyed_error(capsys, [*plan, "--nic-gbps", "100"], "--nic-gbps")
    assert "positive" in keyed_error(capsys, [*plan, "--target", "h100x8", "--nic-gbps", "0"], "--nic-gbps")
    assert "positive" in keyed_error(capsys, [*plan, "--target", "h100x8", "--nic-gbps", "nan"], "--nic-gbps")
    assert "at least 1" in keyed_error(capsys, [*plan, "--target", "h100x8", "--nics-per-host", "0"], "--nics-per-host")
