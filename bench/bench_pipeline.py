"""Inbound→wake and speech→publish through the daemon, against a bare forwarder, in one run.

    python bench/bench_pipeline.py [--n 300]

Both sides use the same transports and the same real fixture MCPL server process (TCP):

- **daemon**: the fixture sends ``channels/incoming``; the daemon admits it against the grant
  and the registry, journals it with its deliveries (SQLite, one commit), answers ``accepted``
  and sends the ``wake`` to the host over the Unix socket. Speech: the host opens a turn, sends
  its text and closes it; the daemon publishes to the trigger channel's server and answers.
- **bare forwarder**: a minimal host-side program on the same Peer layer that answers
  ``accepted`` and forwards a ``wake`` at once (no grant, registry, journal or turn), and for
  speech forwards one ``channels/publish`` and answers.

Latency is measured at the host: from asking the fixture to send a message (over its control
channel, the same cost on both sides) to the wake arriving; and from the host's request to its
answer for speech. Prints p50/p99 and throughput per side and the ratios. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec  # noqa: E402
import trio  # noqa: E402

from mcpl_router.client import RouterClient  # noqa: E402
from mcpl_router.config import parse_config  # noqa: E402
from mcpl_router.daemon import Daemon  # noqa: E402
from mcpl_router.jsonrpc import Inbound, MethodTable, NdjsonStream, Peer  # noqa: E402
from mcpl_router.logs import configure_logging  # noqa: E402
from mcpl_router.testing.control import FixtureProcess, wait_until  # noqa: E402

MESSAGE = {"channelId": "general", "content": [{"type": "text", "text": "ping"}], "tags": ["chat:mention"]}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def measure(fixture: FixtureProcess, host: RouterClient, n: int, speak: Any) -> dict[str, float]:
    inbound: list[float] = []
    start = time.perf_counter()
    for _ in range(n):
        sent = time.perf_counter()
        await fixture.incoming([MESSAGE])
        wake = await host.next_wake()
        inbound.append(time.perf_counter() - sent)
        await host.ack([wake.seq])
    inbound_elapsed = time.perf_counter() - start
    speech: list[float] = []
    start = time.perf_counter()
    for i in range(n):
        sent = time.perf_counter()
        await speak(f"reply {i}")
        speech.append(time.perf_counter() - sent)
    speech_elapsed = time.perf_counter() - start
    return {
        "in_p50": percentile(inbound, 0.5) * 1e3,
        "in_p99": percentile(inbound, 0.99) * 1e3,
        "in_rate": n / inbound_elapsed,
        "sp_p50": percentile(speech, 0.5) * 1e3,
        "sp_p99": percentile(speech, 0.99) * 1e3,
        "sp_rate": n / speech_elapsed,
    }


async def through_daemon(workdir: Path, n: int) -> dict[str, float]:
    async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=workdir, log_level="error") as fixture:
        config = parse_config(
            {
                "mcplServers": {"s": {"url": fixture.listen_url}},
                "host": {"unixSocket": str(workdir / "d" / "host.sock"), "websocket": {"enabled": False}},
                "journal": {"path": str(workdir / "journal.sqlite3")},
            },
            source="<bench>",
            base_dir=workdir,
        )
        daemon = Daemon(config)
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            await wait_until(lambda: daemon.channels_list(), timeout=15)
            async with RouterClient.connect_unix(daemon.host_socket_path) as host:
                await host.hello("bench", [{"name": "bench"}])
                last_wake: list[int] = []

                async def speak(text: str) -> None:
                    if not last_wake:
                        await fixture.incoming([MESSAGE])
                        last_wake.append((await host.next_wake()).seq)
                    turn = await host.call("turn/open", {"agent": "bench", "wakes": last_wake})
                    await host.notify("turn/text", {"turnId": turn["turnId"], "round": 0, "delta": text})
                    await host.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})

                result = await measure(fixture, host, n, speak)
            daemon.request_shutdown()
        return result


async def through_forwarder(workdir: Path, n: int) -> dict[str, float]:
    async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=workdir, log_level="error") as fixture:
        socket_path = workdir / "f.sock"
        hosts: list[Peer] = []
        async with trio.open_nursery() as nursery:
            server_stream = await trio.open_tcp_stream("127.0.0.1", fixture.listen_port)

            async def from_server(inbound: Inbound) -> Any:
                if inbound.method == "channels/incoming" and hosts:
                    await hosts[0].notify("wake", {"seq": 0, "agent": "bench", "reason": "message", "channel": None, "tags": []})
                    return {"results": [{"messageId": "x", "accepted": True}]}
                return {"results": []} if not inbound.is_notification else None

            server = Peer(NdjsonStream(server_stream, server_stream), from_server)
            await nursery.start(server.run)
            await server.request("initialize", {"protocolVersion": "2024-11-05", "capabilities": {}})
            await server.notify("notifications/initialized")
            await server.request("featureSets/update", {"effectiveCapabilities": ["channels.register", "channels.incoming", "channels.publish"]})

            table = MethodTable()

            async def hello(_params: Any, _inbound: Inbound) -> Any:
                return {}

            class PublishParams(msgspec.Struct):
                text: str

            async def publish(params: PublishParams, _inbound: Inbound) -> Any:
                content = [{"type": "text", "text": params.text}]
                return await server.request("channels/publish", {"conversationId": "c", "channelId": "general", "content": content})

            async def ack(_params: Any, _inbound: Inbound) -> Any:
                return {"acked": 1}

            table.add("session/hello", hello)
            table.add("wake/ack", ack)
            table.add("publish", publish, PublishParams)

            async def serve(stream: trio.SocketStream) -> None:
                peer = Peer(NdjsonStream(stream, stream), table)
                hosts.append(peer)
                await peer.run()

            listener_socket = trio.socket.socket(trio.socket.AF_UNIX)
            await listener_socket.bind(str(socket_path))
            listener_socket.listen(8)
            nursery.start_soon(trio.serve_listeners, serve, [trio.SocketListener(listener_socket)])
            async with RouterClient.connect_unix(str(socket_path)) as host:
                await host.hello("bench", [{"name": "bench"}])

                async def speak(text: str) -> None:
                    await host.call("publish", {"text": text})

                result = await measure(fixture, host, n, speak)
            nursery.cancel_scope.cancel()
        return result


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory(prefix="mr-bench-", dir="/tmp") as tmp:
        (Path(tmp) / "d").mkdir(mode=0o700)
        (Path(tmp) / "f").mkdir()
        daemon = await through_daemon(Path(tmp), n)
        bare = await through_forwarder(Path(tmp) / "f", n)
    print(f"n={n} sequential round trips per measurement, fixture over TCP, host over a Unix socket")
    print(f"{'':<26}{'daemon':>12}{'forwarder':>12}{'ratio':>9}")
    rows = [
        ("inbound→wake p50 (ms)", "in_p50"),
        ("inbound→wake p99 (ms)", "in_p99"),
        ("inbound→wake (msg/s)", "in_rate"),
        ("speech→publish p50 (ms)", "sp_p50"),
        ("speech→publish p99 (ms)", "sp_p99"),
        ("speech→publish (turn/s)", "sp_rate"),
    ]
    for label, key in rows:
        print(f"{label:<26}{daemon[key]:>12.2f}{bare[key]:>12.2f}{daemon[key] / bare[key]:>9.2f}")
    print("(speech through the daemon is a whole turn: turn/open + turn/text + turn/close with typing")
    print(" start/stop and one channels/publish; the forwarder sends the publish alone.)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=300)
    args = parser.parse_args()
    configure_logging("error", json=True)
    trio.run(main, args.n)
