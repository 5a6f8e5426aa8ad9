"""Aggregate inbound of a cluster: the links on two nodes against one node, on the same journal.

    python bench/bench_cluster_inbound.py [--servers 4] [--messages 2000] [--rounds 3]

Needs PostgreSQL 15's server binaries and root, as the tests do. One PostgreSQL on loopback
(fsync on), ``--servers`` fixture MCPL servers over TCP each flooding ``--messages``
``channels/incoming`` requests of one message (128 outstanding), all at once, and one host on
the router's Unix socket reading every wake and acking each as the shipped client does
(bench/harness.py ``read_wakes``). Two sides, interleaved, each on a fresh database:

- **one node**: ``[cluster] links = "router"``: the router's node holds every link;
- **links on two nodes**: ``links = "balanced"``, three nodes: the router (``r``, started
  first) and two link nodes (``l1``, ``l2``) with the servers pinned half to each; the router
  reaches every server through the link nodes' relays.

A side's rate is messages over the time from the first send to the last wake. Each process's
CPU a message is read from ``/proc`` (the router's trio thread apart). Prints the rates and
their ratio (two nodes ÷ one node) per round and the medians; docs/performance.md quotes it.
Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import trio
from harness import cpu_seconds, fixtures_running, median, process, read_wakes

from mcpl_router.client import RouterClient
from mcpl_router.testing import postgres
from mcpl_router.testing.control import wait_until


def _config(workdir: Path, fixtures: list[Any], dsn: str, balanced: bool) -> Path:
    servers = {f"s{n}": {"url": fixture.listen_url} for n, fixture in enumerate(fixtures)}
    cluster: dict[str, Any] = {"node": "${MCPL_ROUTER_NODE}", "leaseTtl": 5}
    if balanced:
        cluster |= {"links": "balanced", "pin": {server: ("l1" if n % 2 == 0 else "l2") for n, server in enumerate(servers)}}
    config = {
        "mcplServers": servers,
        "host": {"unixSocket": str(workdir / "run" / "${MCPL_ROUTER_NODE}.sock"), "websocket": {"enabled": False}},
        "journal": {"backend": "postgres", "dsn": dsn, "path": str(workdir / "unused.sqlite3")},
        "cluster": cluster,
        "logging": {"level": os.environ.get("MCPL_ROUTER_BENCH_LOG_LEVEL", "error"), "format": "json"},
    }
    path = workdir / f"cluster-{'balanced' if balanced else 'one'}.json"
    path.write_text(json.dumps(config))
    return path


@asynccontextmanager
async def cluster_running(workdir: Path, fixtures: list[Any], dsn: str, balanced: bool) -> AsyncIterator[tuple[dict[str, int], str]]:
    """The nodes as processes; yields their pids by name and the router's host socket once every
    server is ready there (through the relays of the link nodes, when balanced)."""
    (workdir / "run").mkdir(mode=0o700, exist_ok=True)
    config = _config(workdir, fixtures, dsn, balanced)
    names = ("r", "l1", "l2") if balanced else ("r",)
    async with AsyncExitStack() as stack:
        pids: dict[str, int] = {}
        for name in names:
            proc = await stack.enter_async_context(process([sys.executable, "-m", "mcpl_router", "run", "--config", str(config)],
                                                           workdir / f"{name}.log", env={**os.environ, "MCPL_ROUTER_NODE": name}))
            pids[name] = proc.pid
            if name == "r":
                socket = str(workdir / "run" / "r.sock")
                await wait_until(lambda: _serving(socket, 0), timeout=60, interval=0.1)
        want = len(fixtures)
        await wait_until(lambda: _serving(socket, want, via=balanced), timeout=90, interval=0.2)
        yield pids, socket


async def _serving(socket: str, servers: int, *, via: bool = False) -> bool:
    try:
        async with RouterClient.connect_unix(socket, timeout=5) as probe:
            status = await probe.call("status")
    except OSError:
        return False
    if status["ready"] < servers:
        return False
    rows = status.get("servers") or []
    return not via or all(str(row.get("endpoint", "")).split(" via node ")[-1] in ("l1", "l2") for row in rows)


async def drive(socket: str, pids: dict[str, int], fixtures: list[Any], messages: int, tag: str) -> dict[str, Any]:
    total = messages * len(fixtures)
    async with RouterClient.connect_unix(socket) as host:
        await host.hello("bench", ["bench"])
        before = {name: cpu_seconds(pid) for name, pid in pids.items()}
        trio_before = cpu_seconds(pids["r"], main_thread=True)
        done: dict[str, float] = {}
        async with trio.open_nursery() as nursery:

            async def reader() -> None:
                done["at"] = await read_wakes(host, total)

            nursery.start_soon(reader)
            start = time.perf_counter()
            for index, fixture in enumerate(fixtures):
                nursery.start_soon(lambda f=fixture, i=index: f.flood(messages, outstanding=128, prefix=f"{tag}-{i}"))
        cpu = {name: (cpu_seconds(pid) - before[name]) / total * 1e6 for name, pid in pids.items()}
        router_trio = (cpu_seconds(pids["r"], main_thread=True) - trio_before) / total * 1e6
    return {"rate": total / (done["at"] - start), "cpu_us": cpu, "router_trio_us": router_trio}


async def measure(pg: postgres.Server, workdir: Path, servers: int, messages: int, rounds: int) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {"one": [], "balanced": []}
    for round_ in range(rounds):
        for side in ("one", "balanced") if round_ % 2 == 0 else ("balanced", "one"):
            tag = f"r{round_}-{side}"
            side_dir = workdir / tag
            side_dir.mkdir()
            dsn = postgres.fresh_database(pg, f"bench_{round_}_{side}")
            async with fixtures_running(side_dir, servers) as fixtures, cluster_running(side_dir, fixtures, dsn, side == "balanced") as (pids, socket):
                results[side].append(await drive(socket, pids, fixtures, messages, tag))
            got = results[side][-1]
            print(f"  round {round_ + 1} {side:<8} {got['rate']:,.0f} msgs/s; router trio {got['router_trio_us']:.0f} µs/msg; "
                  + ", ".join(f"{name} {us:.0f} µs/msg" for name, us in got["cpu_us"].items()), flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    postgres.require()
    with postgres.postgres_server() as pg, tempfile.TemporaryDirectory(prefix="mr-cluster-inbound-") as tmp:
        results = trio.run(measure, pg, Path(tmp), args.servers, args.messages, args.rounds)
    one, two = results["one"], results["balanced"]
    ratios = [b["rate"] / o["rate"] for o, b in zip(one, two, strict=True)]
    print(f"\naggregate inbound, {args.servers} servers × {args.messages} messages ({os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}):")
    print(f"  one node (links with the router):    {median([r['rate'] for r in one]):,.0f} msgs/s;"
          f" router trio {median([r['router_trio_us'] for r in one]):.0f} µs/msg")
    print(f"  links on two nodes, router on a third: {median([r['rate'] for r in two]):,.0f} msgs/s;"
          f" router trio {median([r['router_trio_us'] for r in two]):.0f} µs/msg;"
          f" each link node {median([r['cpu_us']['l1'] for r in two]):.0f} and {median([r['cpu_us']['l2'] for r in two]):.0f} µs/msg")
    print(f"  two nodes ÷ one node: median {median(ratios):.3f} (rounds: {', '.join(f'{r:.3f}' for r in ratios)})")


if __name__ == "__main__":
    main()
