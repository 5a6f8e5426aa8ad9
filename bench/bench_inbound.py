"""Inbound throughput with many servers sending at once, daemon vs bare forwarder, by journal size.

    python bench/bench_inbound.py [--servers 4] [--messages 3000] [--outstanding 128] [--rounds 3]

Each run starts ``--servers`` fixture MCPL servers (real processes, TCP). Every server sends
``--messages`` ``channels/incoming`` requests of one message each, ``--outstanding`` in flight
at once (pipelined, the fixture's ``flood``), all servers at the same time. One host on the Unix
socket reads every wake and acks in batches of 100. A run's rate is messages over the time from
the first send to the last wake at the host.

- **daemon**: the real daemon (admission, group-committed journal with ``synchronous=FULL``,
  deliveries, flow-controlled wakes), with its journal pre-filled with 0, 50,000 and 200,000
  acked rows (events with their deliveries), so the cost of history shows.
- **forwarder**: the same server processes and the same host framing (ndjson on a Unix socket,
  the same Peer layer), answering ``accepted`` and forwarding one wake per message at once: no
  grant, registry, journal or flow control.

Sides are interleaved and repeated (``--rounds``); the table shows each side's median rate and
the medians of the per-round ratios. Nothing is asserted: see docs/performance.md.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trio  # noqa: E402

from mcpl_router.client import RouterClient  # noqa: E402
from mcpl_router.config import parse_config  # noqa: E402
from mcpl_router.daemon import Daemon  # noqa: E402
from mcpl_router.jsonrpc import Inbound, MethodTable, NdjsonStream, Peer  # noqa: E402
from mcpl_router.logs import configure_logging  # noqa: E402
from mcpl_router.store.journal import Journal  # noqa: E402
from mcpl_router.testing.control import FixtureProcess, wait_until  # noqa: E402

ACK_BATCH = 100


def prefill(path: Path, rows: int) -> None:
    """``rows`` acked events (and a delivery each), as a busy daemon's last day leaves them."""
    Journal(path).close()  # the schema
    db = sqlite3.connect(str(path))
    now = time.time()
    with db:
        db.executemany(
            "INSERT INTO inbound (server, channel, kind, dedup, digest, payload, received_at, acked) VALUES (?, ?, ?, ?, ?, ?, ?, 1)",
            ((f"old{n % 4}", "general", "message", f"old-{n}", b"d", b'{"text":"old"}', now) for n in range(rows)),
        )
        db.execute("INSERT INTO deliveries (agent, seq, reason, tags, addressed, acked) SELECT 'bench', seq, 'message', '[]', 1, 1 FROM inbound")
    # Checkpointed, as a journal that has been running is: the measured run doesn't pay for
    # moving the pre-fill out of the WAL.
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


async def read_wakes(host: RouterClient, total: int) -> float:
    """Read ``total`` wakes, acking in batches from another task; the moment the last arrived.

    Acks go out from their own task, as a real host's would: a reader that waited on each
    ack's answer would stop reading (and a sender with no flow control would fill it up).
    """
    acks_send, acks_receive = trio.open_memory_channel[list[int]](1000)
    async with trio.open_nursery() as nursery:

        async def acker() -> None:
            async for batch in acks_receive:
                await host.ack(batch)

        nursery.start_soon(acker)
        pending: list[int] = []
        async with acks_send:
            for _ in range(total):
                wake = await host.next_wake()
                pending.append(wake.seq)
                if len(pending) >= ACK_BATCH:
                    await acks_send.send(pending)
                    pending = []
            done = time.perf_counter()
            if pending:
                await acks_send.send(pending)
    return done


async def drive(fixtures: list[FixtureProcess], host: RouterClient, messages: int, outstanding: int, tag: str) -> float:
    total = messages * len(fixtures)
    result: dict[str, float] = {}
    async with trio.open_nursery() as nursery:

        async def reader() -> None:
            result["done"] = await read_wakes(host, total)

        nursery.start_soon(reader)
        start = time.perf_counter()
        for index, fixture in enumerate(fixtures):
            nursery.start_soon(lambda f=fixture, i=index: f.flood(messages, outstanding=outstanding, prefix=f"{tag}-{i}"))
    return total / (result["done"] - start)


@asynccontextmanager
async def fixtures_running(workdir: Path, count: int) -> AsyncIterator[list[FixtureProcess]]:
    async with AsyncExitStack() as stack:
        fixtures = [
            await stack.enter_async_context(
                FixtureProcess.start(transport="tcp", channels=["general"], control_dir=workdir, server_name=f"s{n}", log_level="error")
            )
            for n in range(count)
        ]
        yield fixtures


async def through_daemon(workdir: Path, args: argparse.Namespace, rows: int, tag: str) -> float:
    journal = workdir / f"journal-{tag}.sqlite3"
    prefill(journal, rows)
    async with fixtures_running(workdir, args.servers) as fixtures:
        config = parse_config(
            {
                "mcplServers": {f"s{n}": {"url": f.listen_url} for n, f in enumerate(fixtures)},
                "host": {"unixSocket": str(workdir / "d" / "host.sock"), "websocket": {"enabled": False}},
                "journal": {"path": str(journal)},
            },
            source="<bench>",
            base_dir=workdir,
        )
        daemon = Daemon(config)
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            await wait_until(lambda: len(daemon.channels_list()) == args.servers, timeout=30)
            assert daemon.host_socket_path is not None
            async with RouterClient.connect_unix(daemon.host_socket_path) as host:
                await host.hello("bench", ["bench"])
                rate = await drive(fixtures, host, args.messages, args.outstanding, tag)
            daemon.request_shutdown()
    return rate


async def through_forwarder(workdir: Path, args: argparse.Namespace, tag: str) -> float:
    async with fixtures_running(workdir, args.servers) as fixtures:
        socket_path = workdir / f"f-{tag}.sock"
        hosts: list[Peer] = []
        seq = 0
        async with trio.open_nursery() as nursery:

            async def from_server(inbound: Inbound) -> Any:
                nonlocal seq
                if inbound.method == "channels/incoming" and hosts:
                    seq += 1
                    await hosts[0].notify("wake", {"seq": seq, "agent": "bench", "reason": "message", "channel": None, "tags": []})
                    return {"results": [{"messageId": "x", "accepted": True}]}
                return {"results": []} if not inbound.is_notification else None

            for fixture in fixtures:
                stream = await trio.open_tcp_stream("127.0.0.1", fixture.listen_port)
                server = Peer(NdjsonStream(stream, stream), from_server)
                await nursery.start(server.run)
                await server.request("initialize", {"protocolVersion": "2024-11-05", "capabilities": {}})
                await server.notify("notifications/initialized")
                await server.request("featureSets/update", {"effectiveCapabilities": ["channels.register", "channels.incoming"]})

            table = MethodTable()

            async def hello(_params: Any, _inbound: Inbound) -> Any:
                return {}

            async def ack(_params: Any, _inbound: Inbound) -> Any:
                return {"acked": ACK_BATCH}

            table.add("session/hello", hello)
            table.add("wake/ack", ack)

            async def serve(stream: trio.SocketStream) -> None:
                peer = Peer(NdjsonStream(stream, stream, skip_log_lines=False), table)
                hosts.append(peer)
                await peer.run()

            listener_socket = trio.socket.socket(trio.socket.AF_UNIX)
            await listener_socket.bind(str(socket_path))
            listener_socket.listen(8)
            nursery.start_soon(trio.serve_listeners, serve, [trio.SocketListener(listener_socket)])
            async with RouterClient.connect_unix(str(socket_path)) as host:
                await host.hello("bench", ["bench"])
                rate = await drive(fixtures, host, args.messages, args.outstanding, tag)
            nursery.cancel_scope.cancel()
    return rate


async def main(args: argparse.Namespace) -> None:
    sizes = (0, 50_000, 200_000)
    rates: dict[str, list[float]] = {"forwarder": [], **{f"daemon@{n}": [] for n in sizes}}
    with tempfile.TemporaryDirectory(prefix="mr-bench-", dir="/tmp") as tmp:
        workdir = Path(tmp)
        (workdir / "d").mkdir(mode=0o700)
        for round_ in range(args.rounds):
            rates["forwarder"].append(await through_forwarder(workdir, args, f"f{round_}"))
            for rows in sizes:
                rates[f"daemon@{rows}"].append(await through_daemon(workdir, args, rows, f"d{round_}-{rows}"))
            print(f"round {round_ + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rates.items()), flush=True)
    forwarder = rates["forwarder"]
    print()
    print(f"{args.servers} servers × {args.messages} messages, {args.outstanding} outstanding each; host acks every {ACK_BATCH}")
    print(f"{'':<28}{'msgs/s (median)':>16}{'÷ forwarder':>13}{'÷ empty journal':>17}")
    for name, values in rates.items():
        vs_forwarder = statistics.median(v / f for v, f in zip(values, forwarder, strict=True))
        empty = rates["daemon@0"]
        vs_empty = statistics.median(v / e for v, e in zip(values, empty, strict=True)) if name.startswith("daemon") else float("nan")
        label = name if name == "forwarder" else f"daemon, journal {int(name.split('@')[1]):,} rows"
        print(f"{label:<28}{statistics.median(values):>16,.0f}{vs_forwarder:>13.3f}{vs_empty:>17.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--outstanding", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    configure_logging("error", json=True)
    trio.run(main, parser.parse_args())
