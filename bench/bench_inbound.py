"""Inbound: throughput with many servers sending at once, and latency under an offered load.

    python bench/bench_inbound.py [--servers 4] [--messages 3000] [--rounds 3]

**Throughput.** ``--servers`` fixture servers (processes, TCP) each send ``--messages``
``channels/incoming`` requests of one message, 128 outstanding (pipelined), all at once. One
host on the Unix socket reads every wake and acks each from a task of its own, as a host on the
shipped client does (the client gathers the acks issued during one ``wake/ack`` into the next). A side's rate is
messages over the time from the first send to the last wake; its CPU cost is messages per
CPU-second of its own process, split into its main thread's and its other threads' (the daemon's
journal commits and reads run there: the journal's share off the trio thread), beside the
load's own CPU a message (the fixture servers and the bench's host client, on the same cores).
Sides, interleaved and repeated:
- the **forwarder** (bench/forwarder.py): answers ``accepted`` and forwards one wake per message;
- the **journal floor** (``forwarder.py --journal``): the forwarder committing each message's
  event and delivery rows (group commit, fsync) before ``accepted`` and the wake, and each ack
  before its answer: the least any daemon keeping the delivery promise does;
- the **daemon** with its journal pre-filled with 0, 50,000 and 200,000 acked rows;
- the daemon with the journal's fsync off (``synchronous=OFF``): the disk's share;
- with ``--journal-rounds N``: an empty and a 200,000-row journal alone, alternating N rounds;
- with ``--per-request N``: the daemon and the forwarder with one message a request and with N
  (the same messages outstanding), two rounds each: the trio thread's CPU a message split into
  what a request costs whatever it carries and what each message costs;
- with ``--thread-states``: one more daemon round, its threads sampled about once a millisecond
  from ``/proc`` (running or waiting for a core, idle in ``epoll_wait``, in a ``futex``: the GIL
  or a lock…); trio's worker threads are pooled as "other threads".

**Latency.** One server paced open-loop at 200, 500, 1,000 and 2,000 msgs/s for ``--seconds``
each; the host measures each wake's delay from the message's send time (CLOCK_MONOTONIC, shared
by the processes); p50/p99 through the daemon, the daemon with its journal's fsync off, the
journal floor and the forwarder, ``--latency-rounds`` interleaved rounds of each (medians), and
the added p99 of each over the forwarder (the median of the rounds' differences).

Prints a table and returns the figures (``bench/run.py`` collects them). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import collections
import os
import tempfile
import threading
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


async def _drive(
    socket: str, pid: int, fixtures: list[Any], messages: int, tag: str, *, rate: float | None = None, per_request: int = 1
) -> dict[str, Any]:
    total = messages // per_request * per_request * len(fixtures)
    latencies: list[float] = []
    async with RouterClient.connect_unix(socket) as host:
        await host.hello("bench", ["bench"])
        result: dict[str, float] = {}
        cpu_before = cpu_seconds(pid)
        trio_cpu_before = cpu_seconds(pid, main_thread=True)
        # The load's own cost (the fixture servers, and this process: the host client), which
        # shares the machine's cores with the side measured.
        load_before = sum(cpu_seconds(f.process.pid) for f in fixtures) + time.process_time()
        async with trio.open_nursery() as nursery:

            async def reader() -> None:
                result["done"] = await read_wakes(host, total, latencies=latencies)

            nursery.start_soon(reader)
            start = time.perf_counter()
            for index, fixture in enumerate(fixtures):
                # The same messages outstanding whatever their number a request.
                outstanding = max(1, 128 // per_request) if rate is None else 100_000
                options: dict[str, Any] = {"outstanding": outstanding, "per_request": per_request, "prefix": f"{tag}-{index}"}
                if rate is not None:
                    options["rate"] = rate
                nursery.start_soon(lambda f=fixture, o=options: f.flood(messages // per_request, **o))
        cpu = cpu_seconds(pid) - cpu_before
        trio_cpu = cpu_seconds(pid, main_thread=True) - trio_cpu_before
        load = sum(cpu_seconds(f.process.pid) for f in fixtures) + time.process_time() - load_before
    elapsed = result["done"] - start
    return {
        "rate": total / elapsed,
        "per_cpu_second": total / cpu if cpu else float("nan"),
        # Where a message's CPU goes: the main (trio) thread, and the others (SQLite and fsync
        # in worker threads: the journal's share beside the trio thread's).
        "main_thread_us": trio_cpu / total * 1e6,
        "other_threads_us": (cpu - trio_cpu) / total * 1e6,
        "load_us": load / total * 1e6,
        "latencies": latencies,
    }


def _servers(fixtures: list[Any]) -> dict[str, dict[str, Any]]:
    return {f"s{n}": {"url": fixture.listen_url} for n, fixture in enumerate(fixtures)}


async def throughput(workdir: Path, servers: int, messages: int, rounds: int) -> dict[str, Any]:
    sides = ["forwarder", "floor", *(f"daemon@{rows}" for rows in SIZES), "daemon-no-fsync"]
    rates: dict[str, list[float]] = {side: [] for side in sides}
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    threads: dict[str, list[tuple[float, float, float]]] = {side: [] for side in sides}
    for round_ in range(rounds):
        for side in sides:
            tag = f"t{round_}-{side.replace('@', '-')}"
            async with fixtures_running(workdir, servers) as fixtures:
                if side in ("forwarder", "floor"):
                    context = forwarder_running(workdir, fixtures, tag=tag, journal=side == "floor")
                elif side == "daemon-no-fsync":
                    context = daemon_running(workdir, _servers(fixtures), tag=tag, fsync=False)
                else:
                    context = daemon_running(workdir, _servers(fixtures), tag=tag, rows=int(side.split("@")[1]))
                async with context as (proc, socket):
                    measured = await _drive(socket, proc.pid, fixtures, messages, tag)
            rates[side].append(measured["rate"])
            cpu[side].append(measured["per_cpu_second"])
            threads[side].append((measured["main_thread_us"], measured["other_threads_us"], measured["load_us"]))
        print(f"  inbound round {round_ + 1}: " + ", ".join(f"{s} {rates[s][-1]:,.0f}/s" for s in sides), flush=True)
    forwarder = rates["forwarder"]
    empty = rates["daemon@0"]
    return {
        side: {
            "msgs_per_s": median(rates[side]),
            "msgs_per_cpu_s": median(cpu[side]),
            "vs_forwarder": median([v / f for v, f in zip(rates[side], forwarder, strict=True)]),
            "vs_empty_journal": median([v / e for v, e in zip(rates[side], empty, strict=True)]) if side.startswith("daemon") else None,
            "vs_floor": median([v / f for v, f in zip(rates[side], rates["floor"], strict=True)]),
            "main_thread_us_per_msg": median([main for main, _, _ in threads[side]]),
            "other_threads_us_per_msg": median([other for _, other, _ in threads[side]]),
            "load_us_per_msg": median([load for _, _, load in threads[side]]),
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


LATENCY_SIDES = ("forwarder", "floor", "daemon", "daemon-no-fsync")


async def latency(workdir: Path, rates: tuple[int, ...], seconds: float, rounds: int = 3) -> dict[str, Any]:
    """Each rate's sides, interleaved, ``rounds`` times. A side's p50 and p99 are the medians of
    its rounds'; an added p99 is the median of the rounds' differences from the forwarder (one
    reading's p99 is a handful of wakes: the 40th-slowest of 4,000 at 1,000/s for 4 seconds, so
    one pause of the machine's moves it)."""
    if rounds < 1:
        raise ValueError(f"latency needs at least one round, got {rounds}")
    rows: dict[str, Any] = {}
    for rate in rates:
        messages = max(50, int(rate * seconds))
        readings: dict[str, list[dict[str, float]]] = {side: [] for side in LATENCY_SIDES}
        for round_ in range(rounds):
            for side in LATENCY_SIDES:
                tag = f"l{rate}-{round_}-{side}"
                async with fixtures_running(workdir, 1) as fixtures:
                    if side in ("forwarder", "floor"):
                        context = forwarder_running(workdir, fixtures, tag=tag, journal=side == "floor")
                    else:
                        context = daemon_running(workdir, _servers(fixtures), tag=tag, fsync=side == "daemon")
                    async with context as (proc, socket):
                        measured = await _drive(socket, proc.pid, fixtures, messages, tag, rate=rate)
                delays = [d * 1000 for d in measured["latencies"]]
                readings[side].append({"p50_ms": percentile(delays, 0.5), "p99_ms": percentile(delays, 0.99), "achieved": measured["rate"]})

        def added(side: str, key: str) -> float:
            return median([mine[key] - fwd[key] for mine, fwd in zip(readings[side], readings["forwarder"], strict=True)])

        row: dict[str, Any] = {side: {key: median([r[key] for r in readings[side]]) for key in readings[side][0]} for side in LATENCY_SIDES}
        row["rounds"] = rounds
        row["added_p50_ms"] = added("daemon", "p50_ms")
        row["added_p99_ms"] = added("daemon", "p99_ms")
        row["added_p99_ms_each"] = [d["p99_ms"] - f["p99_ms"] for d, f in zip(readings["daemon"], readings["forwarder"], strict=True)]
        # The journal's fsync's share: the same daemon with synchronous=OFF.
        row["no_fsync_added_p99_ms"] = added("daemon-no-fsync", "p99_ms")
        # What the delivery promise alone adds (the journal floor), and the daemon beyond it.
        row["floor_added_p99_ms"] = added("floor", "p99_ms")
        row["floor_added_p99_ms_each"] = [d["p99_ms"] - f["p99_ms"] for d, f in zip(readings["floor"], readings["forwarder"], strict=True)]
        rows[str(rate)] = row
        print(
            f"  latency at {rate}/s ({rounds} rounds): added p99 daemon {row['added_p99_ms']:+.2f} ms,"
            f" floor {row['floor_added_p99_ms']:+.2f} ms (forwarder p99 {row['forwarder']['p99_ms']:.2f} ms)",
            flush=True,
        )
    return rows


def print_throughput(figures: dict[str, Any], servers: int, messages: int) -> None:
    print(f"\nInbound: {servers} servers × {messages} messages, 128 outstanding each; the host acks each wake, the shipped client gathering them")
    print(f"{'':<30}{'msgs/s':>10}{'msgs/CPU-s':>12}{'÷ forwarder':>13}{'÷ floor':>9}{'÷ empty journal':>17}{'µs/msg: trio thread':>21}{'others':>8}{'load':>7}")
    for side, row in figures.items():
        vs_empty = "" if row["vs_empty_journal"] is None else f"{row['vs_empty_journal']:.3f}"
        print(
            f"{side:<30}{row['msgs_per_s']:>10,.0f}{row['msgs_per_cpu_s']:>12,.0f}{row['vs_forwarder']:>13.3f}{row['vs_floor']:>9.3f}{vs_empty:>17}"
            f"{row['main_thread_us_per_msg']:>21,.0f}{row['other_threads_us_per_msg']:>8,.0f}{row['load_us_per_msg']:>7,.0f}"
        )
    print("(µs of CPU a message: the side's main thread, the trio loop; its other threads, the journal's SQLite and fsync;")
    print(" the load beside it on the same cores: the fixture servers and the host client)")


def print_latency(rows: dict[str, Any]) -> None:
    rounds = next(iter(rows.values()), {}).get("rounds", 1)
    print(f"\nInbound→wake latency under offered load (open loop, one server; medians of {rounds} interleaved rounds)")
    print(
        f"{'offered/s':>10}{'daemon p50':>12}{'p99':>9}{'fwd p50':>10}{'p99':>9}{'added p50':>11}{'added p99':>11}"
        f"{'floor p50':>11}{'p99':>9}{'added p99':>11}{'no fsync p50':>14}{'p99':>9}{'added p99':>11}  (ms)"
    )
    for rate, row in rows.items():
        d, f, fl, n = row["daemon"], row["forwarder"], row["floor"], row["daemon-no-fsync"]
        print(
            f"{rate:>10}{d['p50_ms']:>12.2f}{d['p99_ms']:>9.2f}{f['p50_ms']:>10.2f}{f['p99_ms']:>9.2f}{row['added_p50_ms']:>11.2f}"
            f"{row['added_p99_ms']:>11.2f}{fl['p50_ms']:>11.2f}{fl['p99_ms']:>9.2f}{row['floor_added_p99_ms']:>11.2f}"
            f"{n['p50_ms']:>14.2f}{n['p99_ms']:>9.2f}{row['no_fsync_added_p99_ms']:>11.2f}"
        )


#: Linux x86-64 system call numbers a thread of the daemon is seen waiting in.
_SYSCALLS = {"232": "epoll_wait (idle)", "202": "futex (the GIL, a lock)", "74": "fsync", "75": "fdatasync", "44": "sendto", "45": "recvfrom", "1": "write", "0": "read"}


def _sample_threads(pid: int, stop: threading.Event, seen: dict[str, collections.Counter[str]]) -> None:
    # /proc/<pid>/task/<tid>/syscall names the call a thread is blocked in, or says "running"
    # (on a core, or runnable and waiting for one).
    while not stop.is_set():
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                call = Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()[0]
            except (OSError, IndexError):
                continue
            seen["trio thread" if tid == str(pid) else "other threads"][_SYSCALLS.get(call, call if call == "running" else f"syscall {call}")] += 1
        time.sleep(0.001)


async def thread_states(workdir: Path, servers: int, messages: int) -> dict[str, dict[str, float]]:
    """One daemon round of the throughput run, its threads sampled about once a millisecond (the
    sampler runs in this process, beside the host client): the share of samples the trio thread,
    and trio's worker threads pooled, spent running (or waiting for a core) and in each blocking
    call."""
    seen: dict[str, collections.Counter[str]] = {"trio thread": collections.Counter(), "other threads": collections.Counter()}
    stop = threading.Event()
    async with fixtures_running(workdir, servers) as fixtures, daemon_running(workdir, _servers(fixtures), tag="states") as (proc, socket):
        sampler = threading.Thread(target=_sample_threads, args=(proc.pid, stop, seen), daemon=True)
        sampler.start()
        try:
            await _drive(socket, proc.pid, fixtures, messages, "states")
        finally:
            stop.set()
            sampler.join()
    return {name: {state: count / max(1, sum(counts.values())) for state, count in counts.most_common()} for name, counts in seen.items()}


async def per_request_split(workdir: Path, servers: int, messages: int, per_request: int, rounds: int) -> dict[str, Any]:
    """One message a request against ``per_request``, for the daemon and the forwarder,
    alternating: the trio thread's CPU a message each way, and from the two the part a request
    costs whatever it carries and the part each message costs."""
    sides = [(side, per) for side in ("daemon", "forwarder") for per in (1, per_request)]
    main_us: dict[str, list[float]] = {f"{side}/{per}": [] for side, per in sides}
    for round_ in range(rounds):
        for side, per in sides:
            tag = f"pr{round_}-{side}-{per}"
            async with fixtures_running(workdir, servers) as fixtures:
                context = daemon_running(workdir, _servers(fixtures), tag=tag) if side == "daemon" else forwarder_running(workdir, fixtures, tag=tag)
                async with context as (proc, socket):
                    measured = await _drive(socket, proc.pid, fixtures, messages, tag, per_request=per)
            main_us[f"{side}/{per}"].append(measured["main_thread_us"])
    figures: dict[str, Any] = {"per_request": per_request, "main_thread_us": {key: median(v) for key, v in main_us.items()}}
    for side in ("daemon", "forwarder"):
        one, many = figures["main_thread_us"][f"{side}/1"], figures["main_thread_us"][f"{side}/{per_request}"]
        # one = R + M and many = R / n + M: R a request's own cost, M a message's.
        request = (one - many) * per_request / (per_request - 1)
        figures[side] = {"request_us": request, "message_us": one - request}
    return figures


def print_per_request(figures: dict[str, Any]) -> None:
    n = figures["per_request"]
    print(f"\nThe trio thread's CPU a message, one message a request and {n} a request (medians)")
    print(f"{'side':10s} {'1/request':>10s} {f'{n}/request':>11s} {'a request':>10s} {'a message':>10s}")
    for side in ("daemon", "forwarder"):
        us = figures["main_thread_us"]
        print(f"{side:10s} {us[f'{side}/1']:10.0f} {us[f'{side}/{n}']:11.0f} {figures[side]['request_us']:10.0f} {figures[side]['message_us']:10.0f}")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="mr-bench-", dir="/tmp") as tmp:
        figures = await throughput(Path(tmp), args.servers, args.messages, args.rounds)
        print_throughput(figures, args.servers, args.messages)
        if args.journal_rounds:
            sizes = await journal_sizes(Path(tmp), args.servers, args.messages, args.journal_rounds)
            print(f"\n200,000-row journal ÷ empty, {sizes['rounds']} alternating rounds: {sizes['rate_ratio']:.3f} (msgs/s), {sizes['cpu_ratio']:.3f} (msgs per CPU-second)")
        if args.latency:
            print_latency(await latency(Path(tmp), (200, 500, 1000, 2000), args.seconds, args.latency_rounds))
        if args.per_request > 1:
            print_per_request(await per_request_split(Path(tmp), args.servers, args.messages, args.per_request, 2))
        if args.thread_states:
            print("\nThe daemon's threads during one throughput round (share of 1 ms samples)")
            for name, states in (await thread_states(Path(tmp), args.servers, args.messages)).items():
                print(f"  {name}: " + ", ".join(f"{state} {share:.0%}" for state, share in states.items() if share >= 0.005))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency", action="store_true", help="also measure latency under offered load")
    parser.add_argument("--journal-rounds", type=int, default=0, help="also compare an empty and a 200,000-row journal, alternating, this many rounds")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--latency-rounds", type=int, default=3, help="interleaved rounds of each rate's sides (medians)")
    parser.add_argument("--per-request", type=int, default=1, help="also split the trio thread's cost into a request's and a message's, against this many messages a request")
    parser.add_argument("--thread-states", action="store_true", help="also sample what the daemon's threads are doing in one more round")
    configure_logging("error", json=True)
    trio.run(main, parser.parse_args())
