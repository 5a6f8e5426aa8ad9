"""How long a cluster is without a holder: repeated kills of the holder, and drains.

    python bench/bench_takeover.py [--kills 5] [--drains 3] [--lease 5]

Needs PostgreSQL 15's server binaries and root, as the tests do. One PostgreSQL on loopback,
one fixture MCPL server over TCP, two nodes (``mcpl-router run`` processes, one config file,
``[cluster] node`` from ``MCPL_ROUTER_NODE``). Each round: wait until a node holds the links and
serves (server ``s`` ready, ``general`` registered), then

- **kill**: ``kill -9`` the holder; the takeover time is from the kill until the other node
  serves (polled every 20 ms through its host socket, as a host would see it); the killed node
  is started again (a standby) before the next round;
- **drain**: SIGTERM the holder; from its exit until the other node serves.

Prints each time, the median and the maximum. Nothing is asserted (tests/integration/
test_cluster.py holds the promises); docs/performance.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

import trio

from mcpl_router.client import RouterClient
from mcpl_router.testing import postgres
from mcpl_router.testing.control import FixtureProcess, wait_until

ROOT = Path(__file__).resolve().parents[1]


async def serves(socket: str) -> bool:
    try:
        async with RouterClient.connect_unix(socket, timeout=1) as probe:
            status = await probe.status()
            channels = await probe.all_channels()
    except Exception:
        return False
    return status.ready == 1 and any(row.channel_id == "general" for row in channels)


class Node:
    def __init__(self, name: str, config: Path, workdir: Path) -> None:
        self.name = name
        self.config = config
        self.socket = str(workdir / "run" / f"{name}.sock")
        self.log = workdir / f"{name}.log"
        self.process: trio.Process | None = None

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "mcpl_router", "run", "--config", str(self.config)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT,
                env={**os.environ, "MCPL_ROUTER_NODE": self.name},
            )

    async def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            with trio.move_on_after(10):
                await self.process.wait()
            if self.process.poll() is None:
                self.process.kill()
                await self.process.wait()


async def holder_of(nodes: list[Node]) -> Node:
    async def which() -> Node | None:
        for node in nodes:
            if node.process is not None and node.process.poll() is None and await serves(node.socket):
                return node
        return None

    found = await wait_until(which, timeout=60, interval=0.05)
    assert isinstance(found, Node)
    return found


async def measure(dsn: str, workdir: Path, kills: int, drains: int, lease: float) -> tuple[list[float], list[float]]:
    async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=workdir) as server:
        config = workdir / "cluster.json"
        config.write_text(json.dumps({
            "mcplServers": {"s": {"url": server.listen_url, "reconnect": {"initialDelay": 0.05, "maxDelay": 0.5}}},
            "host": {"unixSocket": str(workdir / "run" / "${MCPL_ROUTER_NODE}.sock"), "websocket": {"enabled": False}},
            "journal": {"backend": "postgres", "dsn": dsn, "path": str(workdir / "unused.sqlite3")},
            "cluster": {"node": "${MCPL_ROUTER_NODE}", "leaseTtl": lease},
            "logging": {"level": "info", "format": "json"},
        }))
        nodes = [Node(name, config, workdir) for name in ("a", "b")]
        try:
            for node in nodes:
                await node.start()
            killed: list[float] = []
            drained: list[float] = []
            for kind, rounds, times in (("kill", kills, killed), ("drain", drains, drained)):
                for _ in range(rounds):
                    holder = await holder_of(nodes)
                    other = next(node for node in nodes if node is not holder)
                    await trio.sleep(lease * 0.3)  # a few renewals in: the lease is as fresh as it usually is
                    assert holder.process is not None
                    holder.process.send_signal(signal.SIGKILL if kind == "kill" else signal.SIGTERM)
                    await holder.process.wait()
                    gone = time.monotonic()
                    await wait_until(lambda: serves(other.socket), timeout=60, interval=0.02)
                    times.append(time.monotonic() - gone)
                    print(f"  {kind} of {holder.name}: {other.name} serving after {times[-1]:.2f} s", flush=True)
                    await holder.start()  # back as a standby
            return killed, drained
        finally:
            for node in nodes:
                await node.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--drains", type=int, default=3)
    parser.add_argument("--lease", type=float, default=5.0)
    args = parser.parse_args()
    postgres.require()
    with postgres.postgres_server() as pg, tempfile.TemporaryDirectory(prefix="mr-takeover-") as tmp:
        dsn = postgres.fresh_database(pg, "takeover")
        killed, drained = trio.run(measure, dsn, Path(tmp), args.kills, args.drains, args.lease)
    load = os.getloadavg()[0]
    print(f"\ntakeover with a {args.lease:g} s lease ({os.cpu_count()} cores, load {load:.2f}):")
    if killed:
        print(f"  holder kill -9: median {median(killed):.2f} s, max {max(killed):.2f} s over {len(killed)}")
    if drained:
        print(f"  holder drained: median {median(drained):.2f} s, max {max(drained):.2f} s over {len(drained)}")


if __name__ == "__main__":
    main()
