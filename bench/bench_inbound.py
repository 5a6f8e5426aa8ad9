"""Inbound: throughput with many servers sending at once, and latency under an offered load.

    python bench/bench_inbound.py [--servers 4] [--messages 3000] [--rounds 3]

**Throughput.** ``--servers`` fixture servers (processes, TCP) each send ``--messages``
``channels/incoming`` requests of one message, 128 outstanding (pipelined), all at once. One
host on the Unix socket reads every wake and acks every 100 from its own task. A side's rate is
messages over the time from the first send to the last wake; its CPU cost is messages per
CPU-second of its own process. Sides, interleaved and repeated:
- the **forwarder** (bench/forwarder.py): answers ``accepted`` and forwards one wake per message;
- the **daemon** with its journal pre-filled with 0, 50,000 and 200,000 acked rows;
- the daemon with the journal's fsync off (``synchronous=OFF``): the journal's share;
- with ``--journal-rounds N``: an empty and a 200,000-row journal alone, alternating N rounds.

**Latency.** One server paced open-loop at 200, 500, 1,000 and 2,000 msgs/s for ``--seconds``
each; the host measures each wake's delay from the message's send time (CLOCK_MONOTONIC, shared
by the processes); p50/p99 through the daemon, the daemon with its journal's fsync off, and the
forwarder, and the added p99 of each daemon.

Prints a table and returns the figures (``bench/run.py`` collects them). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from harness import (
    cpu_seconds,
    daemon_running,
    fixtures_running,
    forwarder_running,
    median,
    percentile,
    read_wakes,
)

from mcpl_router.client import RouterClient
from mcpl_router.logs import configure_logging

SIZES = (0, 50_000, 200_000)


async def _drive(socket: str, pid: int, fixtures: list[Any], messages: int, tag: str, *, rate: float | None = None) -> dict[str, Any]:
    total = messages * len(fixtures)
    latencies: list[float] = []
    async with RouterClient.connect_unix(socket) as host:
        await host.hello("bench", ["bench"])
        result: dict[str, float] = {}
        cpu_before = cpu_seconds(pid)
        async with trio.open_nursery() as nursery:

            async def reader() -> None:
                result["done"] = await read_wakes(host, total, latencies=latencies)

            nursery.start_soon(reader)
            start = time.perf_counter()
            for index, fixture in enumerate(fixtures):
                options: dict[str, Any] = {"outstanding": 128 if rate is None else 100_000, "prefix": f"{tag}-{index}"}
                if rate is not None:
                    options["rate"] = rate
                nursery.start_soon(lambda f=fixture, o=options: f.flood(messages, **o))
        cpu = cpu_seconds(pid) - cpu_before
    elapsed = result["done"] - start
    return {"rate": total / elapsed, "per_cpu_second": total / cpu if cpu else float("nan"), "latencies": latencies}


def _servers(fixtures: list[Any]) -> dict[str, dict[str, Any]]:
    return {f"s{n}": {"url": fixture.listen_url} for n, fixture in enumerate(fixtures)}


async def throughput(workdir: Path, servers: int, messages: int, rounds: int) -> dict[str, Any]:
    sides = ["forwarder", *(f"daemon@{rows}" for rows in SIZES), "daemon-no-fsync"]
    rates: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    for round_ in range(rounds):
        for side in sides:
            tag = f"t{round_}-{side.replace('@', '-')}"
            async with fixtures_running(workdir, servers) as fixtures:
                if side == "forwarder":
                    context = forwarder_running(workdir, fixtures, tag=tag)
                elif side == "daemon-no-fsync":
                    context = daemon_running(workdir, _servers(fixtures), tag=tag, fsync=False)
                else:
                    context = daemon_running(workdir, _servers(fixtures), tag=tag, rows=int(side.split("@")[1]))
                async with context as (proc, socket):
                    measured = await _drive(socket, proc.pid, fixtures, messages, tag)
            rates[side].append(measured["rate"])
            cpu[side].append(measured["per_cpu_second"])
        print(f"  inbound round {round_ + 1}: " + ", ".join(f"{s} {rates[s][-1]:,.0f}/s" for s in sides), flush=True)
    forwarder = rates["forwarder"]
    empty = rates["daemon@0"]
    return {
        side: {
            "msgs_per_s": median(rates[side]),
            "msgs_per_cpu_s": median(cpu[side]),
            "vs_forwarder": median([v / f for v, f in zip(rates[side], forwarder, strict=True)]),
            "vs_empty_journal": median([v / e for v, e in zip(rates[side], empty, strict=True)]) if side.startswith("daemon") else None,
        }
        for side in sides
    }


async def journal_sizes(workdir: Path, servers: int, messages: int, rounds: int) -> dict[str, Any]:
    """An empty journal against one of 200,000 rows, alternating, ``rounds`` times: the cost of
    history alone, with the noise of the other sides out of the way."""
    rates: dict[int, list[float]] = {0: [], 200_000: []}
    cpu: dict[int, list[float]] = {0: [], 200_000: []}
    for round_ in range(rounds):
        for rows in (0, 200_000) if round_ % 2 == 0 else (200_000, 0):
            tag = f"j{round_}-{rows}"
            async with fixtures_running(workdir, servers) as fixtures, daemon_running(workdir, _servers(fixtures), tag=tag, rows=rows) as (proc, socket):
                measured = await _drive(socket, proc.pid, fixtures, messages, tag)
            rates[rows].append(measured["rate"])
            cpu[rows].append(measured["per_cpu_second"])
        print(f"  journal round {round_ + 1}: empty {rates[0][-1]:,.0f}/s, 200,000 rows {rates[200_000][-1]:,.0f}/s", flush=True)
    return {
        "rounds": rounds,
        "empty_msgs_per_s": median(rates[0]),
        "full_msgs_per_s": median(rates[200_000]),
        "rate_ratio": median([f / e for e, f in zip(rates[0], rates[200_000], strict=True)]),
        "cpu_ratio": median([f / e for e, f in zip(cpu[0], cpu[200_000], strict=True)]),
    }


async def latency(workdir: Path, rates: tuple[int, ...], seconds: float) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for rate in rates:
        messages = max(50, int(rate * seconds))
        row: dict[str, Any] = {}
        for side in ("forwarder", "daemon", "daemon-no-fsync"):
            tag = f"l{rate}-{side}"
            async with fixtures_running(workdir, 1) as fixtures:
                if side == "forwarder":
                    context = forwarder_running(workdir, fixtures, tag=tag)
                else:
                    context = daemon_running(workdir, _servers(fixtures), tag=tag, fsync=side == "daemon")
                async with context as (proc, socket):
                    measured = await _drive(socket, proc.pid, fixtures, messages, tag, rate=rate)
            delays = [d * 1000 for d in measured["latencies"]]
            row[side] = {"p50_ms": percentile(delays, 0.5), "p99_ms": percentile(delays, 0.99), "achieved": measured["rate"]}
        row["added_p50_ms"] = row["daemon"]["p50_ms"] - row["forwarder"]["p50_ms"]
        row["added_p99_ms"] = row["daemon"]["p99_ms"] - row["forwarder"]["p99_ms"]
        # The journal's fsync's share: the same daemon with synchronous=OFF.
        row["no_fsync_added_p99_ms"] = row["daemon-no-fsync"]["p99_ms"] - row["forwarder"]["p99_ms"]
        rows[str(rate)] = row
        print(f"  latency at {rate}/s: daemon p99 {row['daemon']['p99_ms']:.2f} ms, forwarder p99 {row['forwarder']['p99_ms']:.2f} ms", flush=True)
    return rows


def print_throughput(figures: dict[str, Any], servers: int, messages: int) -> None:
    print(f"\nInbound: {servers} servers × {messages} messages, 128 outstanding each; host acks every 100")
    print(f"{'':<30}{'msgs/s':>10}{'msgs/CPU-s':>12}{'÷ forwarder':>13}{'÷ empty journal':>17}")
    for side, row in figures.items():
        vs_empty = "" if row["vs_empty_journal"] is None else f"{row['vs_empty_journal']:.3f}"
        print(f"{side:<30}{row['msgs_per_s']:>10,.0f}{row['msgs_per_cpu_s']:>12,.0f}{row['vs_forwarder']:>13.3f}{vs_empty:>17}")


def print_latency(rows: dict[str, Any]) -> None:
    print("\nInbound→wake latency under offered load (open loop, one server)")
    print(f"{'offered/s':>10}{'daemon p50':>12}{'p99':>9}{'fwd p50':>10}{'p99':>9}{'added p50':>11}{'added p99':>11}{'no fsync p50':>14}{'p99':>9}{'added p99':>11}  (ms)")
    for rate, row in rows.items():
        d, f, n = row["daemon"], row["forwarder"], row["daemon-no-fsync"]
        print(
            f"{rate:>10}{d['p50_ms']:>12.2f}{d['p99_ms']:>9.2f}{f['p50_ms']:>10.2f}{f['p99_ms']:>9.2f}{row['added_p50_ms']:>11.2f}"
            f"{row['added_p99_ms']:>11.2f}{n['p50_ms']:>14.2f}{n['p99_ms']:>9.2f}{row['no_fsync_added_p99_ms']:>11.2f}"
        )


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="mr-bench-", dir="/tmp") as tmp:
        figures = await throughput(Path(tmp), args.servers, args.messages, args.rounds)
        print_throughput(figures, args.servers, args.messages)
        if args.journal_rounds:
            sizes = await journal_sizes(Path(tmp), args.servers, args.messages, args.journal_rounds)
            print(f"\n200,000-row journal ÷ empty, {sizes['rounds']} alternating rounds: {sizes['rate_ratio']:.3f} (msgs/s), {sizes['cpu_ratio']:.3f} (msgs per CPU-second)")
        if args.latency:
            print_latency(await latency(Path(tmp), (200, 500, 1000, 2000), args.seconds))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", action="store_true", help="also measure latency under offered load")
    parser.add_argument("--journal-rounds", type=int, default=0, help="also compare an empty and a 200,000-row journal, alternating, this many rounds")
    parser.add_argument("--seconds", type=float, default=3.0)
    configure_logging("error", json=True)
    trio.run(main, parser.parse_args())
