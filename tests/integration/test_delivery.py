"""Issue 9, delivery: nothing a host or a server sends is lost, and no input stops the daemon.

Real processes throughout: fixture MCPL servers over TCP, hosts on the daemon's Unix socket and
WebSocket. Where a test needs to kill or restart the daemon, or to be sure one input cannot end
it, the daemon is a process of its own (``python -m mcpl_router run``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_websocket

from mcpl_router.client import RouterClient
from mcpl_router.jsonrpc import NdjsonStream
from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import daemon_process, running_daemon, servers_and_daemon, wait_channel, wait_daemon_ready, write_config

pytestmark = pytest.mark.integration

# ~2 KB of brackets, 1,000 deep: the line that used to end the daemon with a RecursionError.
DEPTH = 1000
NESTED = '{"jsonrpc":"2.0","id":%s,"method":"%s","params":' + "[" * DEPTH + "]" * DEPTH + "}"


def listening_url(log: Path) -> str:
    for line in log.read_text().splitlines():
        if '"host.websocket.listening"' in line:
            return str(json.loads(line)["url"])
    raise AssertionError("the daemon never logged host.websocket.listening")


async def answers_of(server: FixtureProcess) -> list[dict[str, Any]]:
    return [entry for entry in await server.recorded() if entry["kind"] == "answer"]


async def test_a_nested_line_on_every_surface_is_refused_and_the_daemon_keeps_answering(short_tmp: Path) -> None:
    with trio.fail_after(90):
        async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp) as server:
            assert server.listen_url is not None
            config = write_config(short_tmp, server.listen_url, host={"websocket": {"enabled": True, "port": 0}})
            socket = str(short_tmp / "run" / "host.sock")
            async with daemon_process(config, short_tmp / "daemon.log") as daemon:
                await daemon.start()
                await wait_daemon_ready(socket)

                # The host Unix socket.
                stream = await trio.open_unix_socket(socket)
                framed = NdjsonStream(stream, stream, skip_log_lines=False)
                await stream.send_all((NESTED % (1, "status")).encode() + b"\n")
                refused = json.loads(await framed.receive_message())
                assert refused["error"]["code"] == -32600 and "nested too deeply" in refused["error"]["message"]
                await stream.send_all(b'{"jsonrpc":"2.0","id":2,"method":"status"}\n')
                assert json.loads(await framed.receive_message())["result"]["ready"] == 1
                await stream.aclose()

                # The host WebSocket, with its bearer token.
                token = (short_tmp / "host-token").read_text().strip()
                headers = [(b"Authorization", f"Bearer {token}".encode())]
                async with trio_websocket.open_websocket_url(listening_url(daemon.log), extra_headers=headers) as ws:
                    await ws.send_message(NESTED % (1, "status"))
                    refused = json.loads(await ws.get_message())
                    assert refused["error"]["code"] == -32600
                    await ws.send_message('{"jsonrpc":"2.0","id":2,"method":"status"}')
                    assert json.loads(await ws.get_message())["result"]["ready"] == 1

                # The server link: the server writes the line; the daemon answers it there.
                await server.send_raw(NESTED % ('"deep"', "channels/list") + "\n")

                async def refused_on_the_link() -> bool:
                    return any(a.get("error", {}).get("code") == -32600 for a in await answers_of(server))

                await wait_until(refused_on_the_link, timeout=10)
                async with RouterClient.connect_unix(socket) as host:
                    status = await host.call("status")
                [link] = status["servers"]
                assert (link["state"], link["epoch"]) == ("ready", 1)  # the same connection, still up
                assert daemon.process is not None and daemon.process.poll() is None


@pytest.mark.parametrize("field", ["messageId", "channelId", "threadId", "timestamp", "metadata"])
async def test_invalid_utf8_in_a_field_refuses_that_message_alone_and_names_the_field(tmp_path: Path, field: str) -> None:
    bad = b"\xed\xb3\xbf"  # a UTF-16 surrogate encoded as UTF-8: not valid UTF-8
    values = {"messageId": b'"m-bad' + bad + b'"', "channelId": b'"general' + bad + b'"',
              "threadId": b'"t' + bad + b'"', "timestamp": b'"2026' + bad + b'"', "metadata": b'{"k":"' + bad + b'"}'}
    fields = {"channelId": b'"general"', "messageId": b'"m-bad"', "content": b'[{"type":"text","text":"hi"}]'}
    fields[field] = values[field]
    broken = b"{" + b",".join(b'"%s":%s' % (k.encode(), v) for k, v in fields.items()) + b"}"
    good = b'{"channelId":"general","messageId":"m-good","content":[{"type":"text","text":"ok"}]}'
    line = b'{"jsonrpc":"2.0","id":"utf8","method":"channels/incoming","params":{"messages":[' + broken + b"," + good + b"]}}\n"
    with trio.fail_after(40):
        async with servers_and_daemon(tmp_path, ["a"]) as (daemon, servers):
            server = servers["a"]
            await server.register(["general"])
            await wait_channel(daemon, "a", "general")
            await server.send_bytes(line)

            async def answered() -> list[dict[str, Any]]:
                return [a for a in await answers_of(server) if a["id"] == "utf8"]

            await wait_until(answered, timeout=10)
            [answer] = await answered()
            refused, accepted = answer["result"]["results"]
            assert refused["accepted"] is False and refused["code"] == -32602
            assert "invalid UTF-8" in refused["reason"] and field in refused["reason"]
            assert accepted["accepted"] is True and accepted["messageId"] == "m-good"
            # The link is up and the daemon kept the good message.
            assert daemon.links["a"].state.value == "ready"
            assert [e.payload["messageId"] for e in daemon.journal.events()] == ["m-good"]


async def test_400_deltas_behind_another_agents_slow_round_are_all_published(tmp_path: Path) -> None:
    """ann's round waits on a slow publish; bob, on the same connection, streams 400 deltas."""
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"]) as (daemon, servers):
            for name in ("a", "b"):
                await servers[name].register([{"id": "general", "label": "general", "initiallyOpen": True}])
                await wait_channel(daemon, name, "general")
            await servers["a"].configure(publish={"delayMs": 2000})
            assert daemon.host_socket_path is not None
            async with RouterClient.connect_unix(daemon.host_socket_path) as host:
                await host.hello("host", [{"name": "ann", "wake": {"servers": ["a"]}}, {"name": "bob", "wake": {"servers": ["b"]}}])
                await servers["a"].incoming([{"channelId": "general", "text": "hi ann", "tags": ["chat:mention"]}])
                await servers["b"].incoming([{"channelId": "general", "text": "hi bob", "tags": ["chat:mention"]}])
                wakes = {}
                home = {"ann": "a", "bob": "b"}
                while len(wakes) < 2:
                    wake = await host.next_wake()
                    assert wake.channel is not None
                    if wake.channel.server_id == home[wake.agent]:
                        wakes[wake.agent] = wake
                ann = await host.call("turn/open", {"agent": "ann", "wakes": [wakes["ann"].seq]})
                bob = await host.call("turn/open", {"agent": "bob", "wakes": [wakes["bob"].seq]})
                async with trio.open_nursery() as nursery:
                    await host.notify("turn/text", {"turnId": ann["turnId"], "round": 1, "delta": "ann speaks slowly"})

                    async def ann_round() -> None:
                        await host.call("turn/round", {"turnId": ann["turnId"], "round": 1})

                    nursery.start_soon(ann_round)
                    deltas = [f"w{i:03d} " for i in range(400)]
                    for delta in deltas:
                        await host.notify("turn/text", {"turnId": bob["turnId"], "round": 1, "delta": delta})
                    await host.call("turn/round", {"turnId": bob["turnId"], "round": 1})
                    await host.call("turn/close", {"turnId": bob["turnId"], "outcome": "completed"})
                await host.call("turn/close", {"turnId": ann["turnId"], "outcome": "completed"})
            published = [e for e in await servers["b"].recorded("channels/publish")]
            assert len(published) == 1
            assert published[0]["params"]["content"][0]["text"].strip() == "".join(deltas).strip()


async def test_20000_unacked_wakes_reach_a_host_that_reads_in_order_once_each(tmp_path: Path) -> None:
    total, batch = 20_000, 500
    with trio.fail_after(240):
        async with servers_and_daemon(tmp_path, ["a"]) as (daemon, servers):
            server = servers["a"]
            await server.register(["general"])
            await wait_channel(daemon, "a", "general")
            assert daemon.host_socket_path is not None
            # The host declares kai, then goes away: every wake for kai piles up in the journal.
            async with RouterClient.connect_unix(daemon.host_socket_path) as host:
                await host.hello("host", ["kai"])
            for start in range(0, total, batch):
                messages = [{"channelId": "general", "messageId": f"m-{n}", "text": f"n{n}", "tags": ["chat:mention"]}
                            for n in range(start, start + batch)]
                answer = await server.incoming(messages)
                assert all(r["accepted"] for r in answer["results"])
            assert daemon.journal.unacked_count("kai") == total

            seen: list[int] = []
            async with RouterClient.connect_unix(daemon.host_socket_path) as host:
                await host.hello("host", ["kai"])
                pending: list[int] = []
                while len(seen) < total:
                    wake = await host.next_wake()
                    seen.append(wake.seq)
                    pending.append(wake.seq)
                    if len(pending) >= 200:
                        await host.ack(pending)
                        pending = []
                await host.ack(pending)
                status = await host.call("status")
            assert seen == sorted(set(seen)) and len(seen) == total  # in order, once each
            assert daemon.journal.unacked_count("kai") == 0
            assert status["hosts"]["stalledDisconnects"] == 0 and status["hosts"]["outboxFullDisconnects"] == 0


async def test_four_servers_pipelining_never_knock_off_a_host_that_reads(tmp_path: Path) -> None:
    """Wakes go out as fast as messages are accepted: every accepted message's wake arrives."""
    names = ["a", "b", "c", "d"]
    per_server, batch = 1500, 50
    with trio.fail_after(180):
        async with servers_and_daemon(tmp_path, names) as (daemon, servers):
            for name in names:
                await servers[name].register(["general"])
                await wait_channel(daemon, name, "general")
            assert daemon.host_socket_path is not None
            async with RouterClient.connect_unix(daemon.host_socket_path) as host:
                await host.hello("host", ["kai"])
                received: list[int] = []
                accepted = 0

                async def send(name: str) -> None:
                    nonlocal accepted
                    for start in range(0, per_server, batch):
                        messages = [{"channelId": "general", "messageId": f"{name}-{n}", "text": "x", "tags": ["chat:mention"]}
                                    for n in range(start, start + batch)]
                        answer = await servers[name].incoming(messages)
                        accepted += sum(1 for r in answer["results"] if r["accepted"])

                async def read() -> None:
                    pending: list[int] = []
                    while len(received) < per_server * len(names):
                        wake = await host.next_wake()
                        received.append(wake.seq)
                        pending.append(wake.seq)
                        if len(pending) >= 100:
                            await host.ack(pending)
                            pending = []
                    await host.ack(pending)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(read)
                    for name in names:
                        nursery.start_soon(send, name)
                status = await host.call("status")
            assert accepted == per_server * len(names) == len(set(received))
            assert status["hosts"]["stalledDisconnects"] == 0 and status["hosts"]["outboxFullDisconnects"] == 0


async def test_junk_from_a_client_that_never_reads_costs_bounded_memory_then_a_disconnect(short_tmp: Path) -> None:
    with trio.fail_after(60):
        async with running_daemon(short_tmp, {}, unix_socket=True, host={"stallTimeout": 1}) as daemon:
            assert daemon.host_socket_path is not None
            stream = await trio.open_unix_socket(daemon.host_socket_path)
            sent = 0
            try:
                with trio.move_on_after(30):
                    while True:  # ends when the daemon closes the connection on us
                        await stream.send_all(b"junk line\n" * 1000)
                        sent += 1000
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            finally:
                await stream.aclose()
            await wait_until(lambda: daemon.sessions.host_statistics()["stalledDisconnects"] == 1, timeout=10)
            hosts = daemon.sessions.host_statistics()
            limits = daemon.config.host
            assert sent > 10_000  # far more junk than the outbox holds answers for
            # Bounded: at most the outbox's bytes plus one write batch, however much was sent.
            assert hosts["outboxHighWaterBytes"] <= 8 * 1024 * 1024 + 256 * 1024
            assert limits.stall_timeout == 1
            async with RouterClient.connect_unix(daemon.host_socket_path) as host:
                assert (await host.call("status"))["hosts"]["stalledDisconnects"] == 1


async def test_a_second_daemon_on_the_same_journal_is_refused_naming_the_file_and_pid(short_tmp: Path) -> None:
    with trio.fail_after(60):
        config = write_config(short_tmp, None)
        other = write_config(short_tmp / "other", None)
        # The second config shares the first one's journal, with a socket of its own.
        data = json.loads(other.read_text())
        data["journal"]["path"] = str(short_tmp / "journal.sqlite3")
        other.write_text(json.dumps(data))
        socket = str(short_tmp / "run" / "host.sock")
        async with daemon_process(config, short_tmp / "daemon.log") as first:
            await first.start()
            await wait_daemon_ready(socket, servers=0)
            async with daemon_process(other, short_tmp / "second.log") as second:
                await second.start()
                assert await second.wait() == 2
            message = (short_tmp / "second.log").read_text()
            assert "journal.sqlite3 is in use by another daemon" in message
            assert first.process is not None and f"pid {first.process.pid}" in message
            assert first.process.poll() is None
