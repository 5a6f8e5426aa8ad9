"""Start-to-ready with many stdio servers: the daemon vs a bare spawner doing the same handshakes.

    python bench/bench_startup.py [--servers 50] [--rounds 3]

**Daemon**: a config with ``--servers`` stdio fixture servers; the time from starting the daemon
(in this process, so the clock starts at ``Daemon.run``) until every link is ready and every
server's channel is registered. **Spawner**: the same programs spawned with the same pipes,
each given ``initialize``, ``notifications/initialized`` and ``featureSets/update`` over the same
Peer, concurrently, until each has registered its channel. Interleaved and repeated; medians.
Each side's servers have exited before the next round starts (the daemon's shutdown waits for
its children; the spawner closes their stdin and waits too), so no round's start shares the
cores with the last round's 50 exiting processes.
"""

from __future__ import annotations

import argparse
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from harness import median

from mcpl_router.config import parse_config
from mcpl_router.daemon import Daemon
from mcpl_router.jsonrpc import Inbound, NdjsonStream, Peer
from mcpl_router.logs import configure_logging
from mcpl_router.testing.control import fixture_command, wait_until


def _argv(workdir: Path, n: int) -> list[str]:
    return fixture_command("stdio", "strict", ["general"], workdir / f"ctl-{n}.json", server_name=f"s{n}", log_level="error")


async def through_daemon(workdir: Path, servers: int) -> float:
    entries = {}
    for n in range(servers):
        argv = _argv(workdir, n)
        entries[f"s{n}"] = {"command": argv[0], "args": argv[1:], "inheritEnv": True}
    config = parse_config(
        {"mcplServers": entries, "host": {"unixSocket": False, "websocket": {"enabled": False}},
         "journal": {"path": str(workdir / f"journal-{time.monotonic_ns()}.sqlite3")}},
        source="<bench>",
        base_dir=workdir,
    )
    daemon = Daemon(config)
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        await wait_until(lambda: len(daemon.router.registry) == servers and all(l.state.value == "ready" for l in daemon.links.values()), timeout=300, interval=0.01)
        elapsed = time.perf_counter() - start
        daemon.request_shutdown()
    return elapsed


async def through_spawner(workdir: Path, servers: int) -> float:
    registered = 0
    done = trio.Event()
    processes: list[trio.Process] = []

    async def one(n: int, nursery: trio.Nursery) -> None:
        nonlocal registered
        process = await trio.lowlevel.open_process(_argv(workdir, n), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert process.stdin is not None and process.stdout is not None
        processes.append(process)

        async def on_message(inbound: Inbound) -> Any:
            nonlocal registered
            if inbound.method == "channels/register":
                registered += 1
                if registered == servers:
                    done.set()
                return {"results": [{"id": "general", "accepted": True}]}
            return None if inbound.is_notification else {}

        peer = Peer(NdjsonStream(process.stdin, process.stdout), on_message)
        nursery.start_soon(peer.run)
        await peer.request("initialize", {"protocolVersion": "2024-11-05", "capabilities": {"experimental": {"mcpl": {"version": "0.5"}}}})
        await peer.notify("notifications/initialized")
        await peer.request("featureSets/update", {"effectiveCapabilities": ["channels.register", "channels.incoming"]})

    start = time.perf_counter()
    try:
        async with trio.open_nursery() as nursery:
            for n in range(servers):
                nursery.start_soon(one, n, nursery)
            with trio.fail_after(300):
                await done.wait()
            elapsed = time.perf_counter() - start
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await _reap(processes)
    return elapsed


async def _reap(processes: list[trio.Process]) -> None:
    """Ends the spawner's servers as the daemon's shutdown ends its own (stdin closed, then
    waited for), so no round starts while the last one's 50 processes are still exiting."""
    for process in processes:
        assert process.stdin is not None
        await process.stdin.aclose()
    with trio.move_on_after(30):
        for process in processes:
            await process.wait()
    for process in processes:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def startup(workdir: Path, servers: int, rounds: int) -> dict[str, Any]:
    daemon: list[float] = []
    spawner: list[float] = []
    for round_ in range(rounds):
        spawner.append(await through_spawner(workdir, servers))
        daemon.append(await through_daemon(workdir, servers))
        print(f"  startup round {round_ + 1}: daemon {daemon[-1]:.2f} s, spawner {spawner[-1]:.2f} s", flush=True)
    return {
        "servers": servers,
        "daemon_s": median(daemon),
        "spawner_s": median(spawner),
        "vs_spawner": median([d / s for d, s in zip(daemon, spawner, strict=True)]),
    }


def print_startup(figures: dict[str, Any]) -> None:
    print(f"\nStart-to-ready with {figures['servers']} stdio servers")
    print(f"daemon {figures['daemon_s']:.2f} s, bare spawner {figures['spawner_s']:.2f} s, ratio {figures['vs_spawner']:.3f}")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="mr-bench-", dir="/tmp") as tmp:
        print_startup(await startup(Path(tmp), args.servers, args.rounds))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    configure_logging("error", json=True)
    trio.run(main, parser.parse_args())
