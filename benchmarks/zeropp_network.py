"""ZeRO++'s predicted gain over ZeRO-3 by the network between hosts: each program compiled once for
the target, then predicted on clusters that differ only in their NICs.

    python benchmarks/zeropp_network.py [--config configs/gpt-7b.yaml] [--target h100x64]

ZeRO-3 partitions over ``data`` (every device); ZeRO++ (Wang et al., 2023) adds qwZ (int8 gathers),
hpZ (a second copy of the parameters partitioned within each host, over ``data``, with ``replica``
across the hosts) and qgZ (int8 gradient all-to-alls), in bf16 at stage 3 with ``mesh.dcn`` across
the hosts. The networks: a DGX H100's 8 x 400 Gb/s per host, one 400 Gb/s NIC per host, and one
100 Gb/s NIC per host. The tokens/s are the step-time model's predictions (docs/planner.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # GPU targets compile on a CPU host
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jzero.config.loading import load_config  # noqa: E402
from jzero.ledger.targets import parse_target, target_devices  # noqa: E402
from jzero.training.job import build_job  # noqa: E402
from jzero.training.report import plan_report  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
import zeropp_bytes  # noqa: E402  (its cases and precision: one list of ZeRO++'s configurations)

NETWORKS = {"8 x 400 Gb/s": (8, 400.0), "1 x 400 Gb/s": (1, 400.0), "1 x 100 Gb/s": (1, 100.0)}
# zeropp_bytes.py's baseline and its case with every knob, under the names of this table.
CASES = {"ZeRO-3": "ZeRO-3 (baseline)", "ZeRO++ (qwZ + hpZ + qgZ int8)": "+ qwZ + hpZ + qgZ int8"}


def cases(hosts: int, per_host: int) -> dict[str, list[str]]:
    every = zeropp_bytes.cases(hosts, per_host)
    return {name: every[theirs] for name, theirs in CASES.items()}


def measure(config: str, target_name: str) -> list[dict]:
    target = parse_target(target_name)
    rows = []
    for name, sets in cases(target.hosts, target.gpus_per_host).items():
        start = time.perf_counter()
        job = build_job(load_config(ROOT / config, [*zeropp_bytes.BF16, *sets]), target_devices(target))
        _, compiled = job.compile_step()
        compile_s = time.perf_counter() - start
        for network, (nics, gbps) in NETWORKS.items():
            hardware = parse_target(target_name, nics_per_host=nics, nic_gbps=gbps).hardware()
            p = plan_report(job, compiled, hardware).predicted
            rows.append({
                "case": name, "network": network, "tokens_per_sec": p.tokens_per_sec, "step_time_s": p.step_time_s,
                "exposed_communication_s": p.exposed_communication_s, "across_hosts_s": p.communication_across_hosts_s,
                "bus_bandwidth_across_hosts": p.bus_bandwidth.across_hosts, "compile_s": compile_s,
            })  # fmt: skip
    return rows


def table(rows: list[dict]) -> str:
    base = {r["network"]: r["tokens_per_sec"] for r in rows if r["case"] == "ZeRO-3"}
    lines = [
        "| network per host | case | predicted tokens/s | step | exposed communication | across-host busbw | gain over ZeRO-3 |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (list(NETWORKS).index(r["network"]), r["case"])):
        lines.append(
            f"| {r['network']} | {r['case']} | {r['tokens_per_sec']:,.0f} | {1e3 * r['step_time_s']:,.1f} ms | "
            f"{1e3 * r['exposed_communication_s']:,.1f} ms | {r['bus_bandwidth_across_hosts'] / 1e9:.3g} GB/s | "
            f"{r['tokens_per_sec'] / base[r['network']]:.2f}x |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/gpt-7b.yaml")
    parser.add_argument("--target", default="h100x64")
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/zeropp_network.json"))
    args = parser.parse_args()
    rows = measure(args.config, args.target)
    Path(args.out).write_text(json.dumps({"config": args.config, "target": args.target, "rows": rows}, indent=1) + "\n")
    Path(args.out).with_suffix(".md").write_text(table(rows) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
