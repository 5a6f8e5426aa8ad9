"""The journal's backends in one run: inbound throughput and latency on SQLite and on PostgreSQL.

    python bench/bench_backends.py [--servers 4] [--messages 2000] [--rounds 2] [--rates 500,1000] [--seconds 3]

Needs PostgreSQL 15's server binaries (Debian's ``postgresql-15``) and root (the servers run as
the ``postgres`` user), as the tests do. Sides, interleaved round by round:

- the **forwarder** (bench/forwarder.py): ``accepted`` and a wake per message, nothing kept;
- the **daemon on SQLite** (``backend = "sqlite"``: WAL, fsync at every commit);
- the **daemon on PostgreSQL**, one server on loopback (``synchronous_commit = on``, no standby);
- the **daemon on a PostgreSQL pair**: a primary and a synchronous standby on loopback
  (``FIRST 1 (standby)``), so a commit waits for the standby: the setting docs/journal.md
  recommends, and what survives the primary's loss.

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
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import trio
from bench_inbound import _drive, _servers
from harness import daemon_running, fixtures_running, forwarder_running, median, percentile

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
    args = parser.parse_args()
    reason = postgres.missing_reason()
    if reason is not None:
        raise SystemExit(f"bench_backends: {reason}")
    trio.run(run, args)


if __name__ == "__main__":
    main()
