"""The journal's backends in one run: inbound throughput and latency on SQLite and on PostgreSQL.

    python bench/bench_backends.py [--servers 4] [--messages 2000] [--rounds 2] [--rates 500,1000] [--seconds 3] [--commits 500]

Needs PostgreSQL 15's server binaries (Debian's ``postgresql-15``) and root (the servers run as
the ``postgres`` user), as the tests do. Sides, interleaved round by round:

- the **forwarder** (bench/forwarder.py): ``accepted`` and a wake per message, nothing kept;
- the **daemon on SQLite** (``backend = "sqlite"``: WAL, fsync at every commit);
- the **daemon on PostgreSQL**, one server on loopback (``synchronous_commit = on``, no standby);
- the **daemon on a PostgreSQL pair**: a primary and a synchronous standby on loopback
  (``FIRST 1 (standby)``), so a commit waits for the standby: the setting docs/journal.md
  recommends, and what survives the primary's loss.

**Commits alone** first: the journal itself (no daemon, no sockets) recording one event at a time
(``--commits`` of them, each awaited: one commit's latency) and then batches of 256 (what a
flood's group commit holds), on each backend.

Each side gets a new journal (a new file, a new database) each round. **Throughput**: like
bench_inbound.py's, ``--servers`` fixture servers each send ``--messages`` messages, 128
outstanding; rate over the time to the last wake, and its ratio to the forwarder in the same
round (medians over rounds). **Latency**: one server paced open loop at each of ``--rates``;
each wake's delay from the message's send; p50/p99 (medians over rounds) and the p99 added over
the forwarder's. Prints tables and returns the figures. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import trio
from bench_inbound import _drive, _servers
from harness import daemon_running, fixtures_running, forwarder_running, median, percentile

from mcpl_router.store.records import EventKind
from mcpl_router.logs import configure_logging
from mcpl_router.testing import postgres

SIDES = ("forwarder", "sqlite", "postgres", "postgres-sync-pair")
_databases = itertools.count(1)


@contextlib.contextmanager
def databases() -> Iterator[dict[str, postgres.Server]]:
    """A lone PostgreSQL and a synchronous pair, for the run."""
    with postgres.postgres_server() as lone, postgres.postgres_pair() as pair:
        yield {"postgres": lone, "postgres-sync-pair": pair.primary}


@contextlib.asynccontextmanager
async def side_running(workdir: Path, side: str, fixtures: list[Any], tag: str, servers: dict[str, postgres.Server]) -> AsyncIterator[tuple[trio.Process, str]]:
    if side == "forwarder":
        async with forwarder_running(workdir, fixtures, tag=tag) as running:
            yield running
        return
    dsn = None if side == "sqlite" else postgres.fresh_database(servers[side], f"bench_{next(_databases)}")
    async with daemon_running(workdir, _servers(fixtures), tag=tag, postgres_dsn=dsn) as running:
        yield running


async def commits_alone(workdir: Path, servers: dict[str, postgres.Server], count: int) -> dict[str, Any]:
    """Each backend's journal recording ``count`` events one commit at a time, then 10 batches of 256."""
    from mcpl_router.store.journal import Delivery, InboundEvent
    from mcpl_router.testing.journal import JournalPlace, open_journal

    woken = [Delivery("bench", "message", ("chat:mention",), True)]

    def event(n: int) -> InboundEvent:
        payload = {"channelId": "general", "messageId": f"m-{n}", "content": [{"type": "text", "text": "x" * 200}]}
        return InboundEvent("s", "general", EventKind.MESSAGE, f"m-{n}", payload)

    figures: dict[str, Any] = {}
    for side in SIDES[1:]:
        place = JournalPlace(path=workdir / "commits.sqlite3") if side == "sqlite" else JournalPlace(
            dsn=postgres.fresh_database(servers[side], f"commits_{next(_databases)}"))
        async with open_journal(place) as journal:
            alone = []
            for n in range(count):
                started = time.perf_counter()
                await journal.record_inbound([(event(n), woken)])
                alone.append((time.perf_counter() - started) * 1000)
            batches = []
            for b in range(10):
                started = time.perf_counter()
                await journal.record_inbound([(event(count + b * 256 + n), woken) for n in range(256)])
                batches.append((time.perf_counter() - started) * 1000)
        figures[side] = {"p50_ms": percentile(alone, 0.5), "p99_ms": percentile(alone, 0.99), "batch_256_ms": median(batches)}
        print(f"  commits alone, {side}: p50 {figures[side]['p50_ms']:.2f} ms, p99 {figures[side]['p99_ms']:.2f} ms,"
              f" a batch of 256 {figures[side]['batch_256_ms']:.1f} ms", flush=True)
    return figures


async def throughput(workdir: Path, servers: dict[str, postgres.Server], count: int, messages: int, rounds: int) -> dict[str, Any]:
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    for round_ in range(rounds):
        for side in SIDES if round_ % 2 == 0 else tuple(reversed(SIDES)):
            tag = f"bt{round_}-{side}"
            async with fixtures_running(workdir, count) as fixtures, side_running(workdir, side, fixtures, tag, servers) as (proc, socket):
                rates[side].append((await _drive(socket, proc.pid, fixtures, messages, tag))["rate"])
        print(f"  throughput round {round_ + 1}: " + ", ".join(f"{s} {rates[s][-1]:,.0f}/s" for s in SIDES), flush=True)
    return {
        side: {
            "msgs_per_s": median(rates[side]),
            "vs_forwarder": median([v / f for v, f in zip(rates[side], rates["forwarder"], strict=True)]),
            "vs_sqlite": median([v / s for v, s in zip(rates[side], rates["sqlite"], strict=True)]),
        }
        for side in SIDES
    }


async def latency(workdir: Path, servers: dict[str, postgres.Server], rates: tuple[int, ...], seconds: float, rounds: int) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for rate in rates:
        messages = max(50, int(rate * seconds))
        readings: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
        for round_ in range(rounds):
            for side in SIDES if round_ % 2 == 0 else tuple(reversed(SIDES)):
                tag = f"bl{rate}-{round_}-{side}"
                async with fixtures_running(workdir, 1) as fixtures, side_running(workdir, side, fixtures, tag, servers) as (proc, socket):
                    measured = await _drive(socket, proc.pid, fixtures, messages, tag, rate=rate)
                delays = [d * 1000 for d in measured["latencies"]]
                readings[side].append({"p50_ms": percentile(delays, 0.5), "p99_ms": percentile(delays, 0.99)})
        row: dict[str, Any] = {side: {key: median([r[key] for r in readings[side]]) for key in ("p50_ms", "p99_ms")} for side in SIDES}
        for side in SIDES[1:]:
            row[side]["added_p99_ms"] = median([mine["p99_ms"] - fwd["p99_ms"] for mine, fwd in zip(readings[side], readings["forwarder"], strict=True)])
        rows[str(rate)] = row
        print(f"  latency at {rate}/s: " + ", ".join(f"{s} p99 {row[s]['p99_ms']:.2f} ms" for s in SIDES), flush=True)
    return rows


def print_figures(figures: dict[str, Any], count: int, messages: int, rounds: int) -> None:
    print("\nCommits alone: the journal recording one event per commit (each awaited), and a batch of 256 (ms)")
    print(f"{'':<22}{'p50':>8}{'p99':>8}{'256 at once':>13}")
    for side, row in figures["commits"].items():
        print(f"{side:<22}{row['p50_ms']:>8.2f}{row['p99_ms']:>8.2f}{row['batch_256_ms']:>13.1f}")
    print(f"\nThe journal's backends: inbound, {count} servers × {messages} messages, 128 outstanding each (medians of {rounds} rounds)")
    print(f"{'':<22}{'msgs/s':>10}{'÷ forwarder':>13}{'÷ sqlite':>10}")
    for side, row in figures["throughput"].items():
        print(f"{side:<22}{row['msgs_per_s']:>10,.0f}{row['vs_forwarder']:>13.3f}{row['vs_sqlite']:>10.3f}")
    print("\nInbound→wake latency, one server paced open loop (ms; added p99: over the forwarder's, same round)")
    print(f"{'offered/s':>10}  " + "".join(f"{side:>28}" for side in SIDES))
    print(f"{'':>10}  " + "".join(f"{'p50':>9}{'p99':>9}{'added p99':>10}" for _ in SIDES))
    for rate, row in figures["latency"].items():
        cells = "".join(f"{row[s]['p50_ms']:>9.2f}{row[s]['p99_ms']:>9.2f}{row[s].get('added_p99_ms', 0.0):>10.2f}" for s in SIDES)
        print(f"{rate:>10}  {cells}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    configure_logging("error", json=True)
    rates = tuple(int(rate) for rate in args.rates.split(","))
    with tempfile.TemporaryDirectory(prefix="mr-backends-", dir="/tmp") as tmp, databases() as servers:
        workdir = Path(tmp)
        figures = {
            "commits": await commits_alone(workdir, servers, args.commits),
            "throughput": await throughput(workdir, servers, args.servers, args.messages, args.rounds),
            "latency": await latency(workdir, servers, rates, args.seconds, args.rounds),
        }
    print_figures(figures, args.servers, args.messages, args.rounds)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rates", default="500,1000")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--commits", type=int, default=500)
    args = parser.parse_args()
    reason = postgres.missing_reason()
    if reason is not None:
        raise SystemExit(f"bench_backends: {reason}")
    trio.run(run, args)


if __name__ == "__main__":
    main()
