"""Every benchmark in one run: the figures docs/performance.md quotes, against their targets.

    python bench/run.py [--quick] [--json PATH]

Sections (each also runs alone; see its module): inbound throughput against the bare
forwarder and the journal floor (the forwarder journaling what the durability promises need),
and by journal size (bench_inbound), latency under offered load (bench_inbound),
speech with 10 agents against a same-wire-work forwarder (bench_speech), memory and listing at
1k/10k/100k channels (bench_scale), start-to-ready with 50 stdio servers (bench_startup), the
limit of a minimal relay (bench_relay), and one durable commit alone on this disk
(bench_commit). Everything runs on loopback; the machine is noisy, so
sides are interleaved and repeated and ratios are medians of per-round ratios. Writes the
figures as JSON and prints each table and the targets. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_commit  # noqa: E402
import bench_inbound  # noqa: E402
import bench_relay  # noqa: E402
import bench_scale  # noqa: E402
import bench_speech  # noqa: E402
import bench_startup  # noqa: E402

from mcpl_router.logs import configure_logging  # noqa: E402

TARGETS = {
    "inbound ÷ forwarder": (">=", 0.8),
    "200k-row journal ÷ empty": (">=", 0.9),
    "added p99 at 1,000/s (ms)": ("<=", 1.0),
    "speech ÷ forwarder": (">=", 0.8),
    "bytes per channel at 100k": ("<=", 1024),
    "start-to-ready ÷ spawner (50 servers)": ("<=", 1.1),
}


#: The per-message path's targets (issue 30): against the journal floor, the least that keeps
#: the delivery promises, and on the trio thread's CPU.
PATH_TARGETS = {
    "inbound, daemon ÷ journal floor": (">=", 0.8),
    "trio thread µs a message (inbound, 4 servers)": ("<=", 50.0),
    "speech, 10 agents ÷ same-wire-work forwarder": (">=", 0.9),
    "added p99 at 1,000/s, daemon − floor (ms)": ("<=", 1.0),
    "servers/list at the most channels (100k) ÷ at 1": ("<=", 1.5),
}


def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "?")
    return {"cores": os.cpu_count(), "cpu": model, "python": platform.python_version(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    quick = args.quick
    results: dict[str, Any] = {"machine": machine()}
    with tempfile.TemporaryDirectory(prefix="mr-bench-", dir="/tmp") as tmp:
        workdir = Path(tmp)
        print("inbound…", flush=True)
        results["inbound"] = await bench_inbound.throughput(workdir, 4, 1000 if quick else 3000, 1 if quick else 3)
        print("journal sizes…", flush=True)
        results["journal_sizes"] = await bench_inbound.journal_sizes(workdir, 4, 1000 if quick else 3000, 2 if quick else 5)
        print("latency…", flush=True)
        results["latency"] = await bench_inbound.latency(workdir, (200, 500, 1000, 2000), 1.5 if quick else 4.0, 1 if quick else 3)
        print("speech…", flush=True)
        results["speech"] = await bench_speech.speech(workdir, 10, 20 if quick else 200, 1 if quick else 7)
        print("startup…", flush=True)
        results["startup"] = await bench_startup.startup(workdir, 20 if quick else 50, 1 if quick else 5)
    print("scale…", flush=True)
    results["scale"] = bench_scale.scale([1000, 10_000] if quick else [1000, 10_000, 100_000])
    print("relay…", flush=True)
    results["relay"] = bench_relay.relay(5000 if quick else 20_000)
    print("commit floor…", flush=True)
    results["commit_floor"] = bench_commit.commit_floor(1000, 2.0 if quick else 4.0)
    return results


def against_targets(results: dict[str, Any]) -> dict[str, float | None]:
    inbound = results["inbound"]
    latency = results["latency"].get("1000", {})
    scale = {row["channels"] // 1000 * 1000: row for row in results["scale"]}
    largest = max(scale) if scale else None
    return {
        "inbound ÷ forwarder": inbound["daemon@0"]["vs_forwarder"],
        "200k-row journal ÷ empty": results["journal_sizes"]["rate_ratio"],
        "added p99 at 1,000/s (ms)": latency.get("added_p99_ms"),
        "speech ÷ forwarder": results["speech"]["vs_forwarder"],
        "bytes per channel at 100k": scale[largest]["rss_bytes_per_channel"] if largest else None,
        "start-to-ready ÷ spawner (50 servers)": results["startup"]["vs_spawner"],
    }


def against_path_targets(results: dict[str, Any]) -> dict[str, float | None]:
    inbound = results["inbound"]["daemon@0"]
    latency = results["latency"].get("1000", {})
    beyond_floor = [d - f for d, f in zip(latency.get("added_p99_ms_each", []), latency.get("floor_added_p99_ms_each", []), strict=True)]
    scale = max(results["scale"], key=lambda row: row["channels"]) if results["scale"] else None
    return {
        "inbound, daemon ÷ journal floor": inbound["vs_floor"],
        "trio thread µs a message (inbound, 4 servers)": inbound["main_thread_us_per_msg"],
        "speech, 10 agents ÷ same-wire-work forwarder": results["speech"]["vs_forwarder"],
        "added p99 at 1,000/s, daemon − floor (ms)": sorted(beyond_floor)[len(beyond_floor) // 2] if beyond_floor else None,
        "servers/list at the most channels (100k) ÷ at 1": None if scale is None else scale["servers_list_ratio"],
    }


def _print_targets(title: str, targets: dict[str, tuple[str, float]], measured: dict[str, float | None]) -> dict[str, Any]:
    print(f"\n{title}")
    for name, (op, limit) in targets.items():
        value = measured[name]
        met = value is not None and (value >= limit if op == ">=" else value <= limit)
        shown = "—" if value is None else f"{value:,.3f}"
        print(f"  {name:<48} {shown:>10}  target {op} {limit:<6} {'met' if met else 'MISSED'}")
    return {name: {"measured": measured[name], "target": f"{op} {limit}"} for name, (op, limit) in targets.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller and fewer rounds: a smoke run, not figures to quote")
    parser.add_argument("--json", help="where the figures go (bench/results/latest.json; a --quick run's: quick.json)")
    args = parser.parse_args()
    # A smoke run never overwrites the figures docs/performance.md quotes.
    args.json = args.json or str(Path(__file__).resolve().parent / "results" / ("quick.json" if args.quick else "latest.json"))
    configure_logging("error", json=True)
    results = trio.run(run, args)
    print(f"\nmachine: {results['machine']}")
    bench_inbound.print_throughput(results["inbound"], 4, 1000 if args.quick else 3000)
    sizes = results["journal_sizes"]
    print(f"200,000-row journal ÷ empty, {sizes['rounds']} alternating rounds: {sizes['rate_ratio']:.3f} (msgs/s), {sizes['cpu_ratio']:.3f} (msgs per CPU-second)")
    bench_inbound.print_latency(results["latency"])
    bench_speech.print_speech(results["speech"])
    bench_startup.print_startup(results["startup"])
    bench_scale.print_scale(results["scale"])
    bench_relay.print_relay(results["relay"])
    daemon_cpu = results["inbound"]["daemon@0"]["msgs_per_cpu_s"]
    print(f"daemon inbound: {daemon_cpu:,.0f} msgs per CPU-second ({daemon_cpu / results['relay']['msgs_per_cpu_s']:.3f} of the relay's)")
    bench_commit.print_commit_floor(results["commit_floor"])
    results["targets"] = _print_targets("Targets (issue 15)", TARGETS, against_targets(results))
    results["path_targets"] = _print_targets(
        f"The per-message path (issue 30; {results['machine']['cores']} cores, load {os.getloadavg()[0]:.2f} at the end)",
        PATH_TARGETS, against_path_targets(results),
    )
    floor = results["commit_floor"]["durable"]["p99_ms"]
    print(f"  (one durable commit alone on this disk: p99 {floor:.2f} ms)")
    journal_floor = results["inbound"]["floor"]["vs_forwarder"]
    floor_latency = results["latency"].get("1000", {}).get("floor_added_p99_ms")
    print(
        f"  (the journal floor, the forwarder doing only the durable writes the promises need: inbound ÷ forwarder {journal_floor:.3f},"
        f" added p99 at 1,000/s {floor_latency if floor_latency is None else f'{floor_latency:.2f} ms'};"
        f" the daemon ÷ the floor: {results['inbound']['daemon@0']['vs_floor']:.3f})"
    )
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2, default=str))
    print(f"\nfigures: {path}")


if __name__ == "__main__":
    main()
