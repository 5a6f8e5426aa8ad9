"""The examples in ``examples/`` run as real processes against a real daemon (``mcpl-router run``)
and a fixture server: what a host author copies must work as written."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.jsonrpc import Inbound, MethodTable, NdjsonStream, Peer
from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import daemon_process, wait_daemon_ready, write_config

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
REPLY = "Fixed reply from the example host."


@asynccontextmanager
async def example(name: str, *args: str, log: Path) -> AsyncIterator[trio.Process]:
    """``examples/<name>`` as a process (stdout and stderr to ``log``); killed at the end."""
    with log.open("wb") as out:
        process = await trio.lowlevel.open_process(
            [sys.executable, str(EXAMPLES / name), *args], stdin=subprocess.DEVNULL, stdout=out, stderr=out, cwd=ROOT
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()


async def owned_by(socket: str, agent: str, host: str) -> bool:
    async with RouterClient.connect_unix(socket, timeout=5) as probe:
        status = await probe.status()
    return any(row.name == agent and row.host == host for row in status.agents)


async def test_the_fixed_reply_host_answers_a_wake_and_the_server_gets_the_reply(short_tmp: Path) -> None:
    with trio.fail_after(60):
        async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp) as server:
            assert server.listen_url is not None
            socket = str(short_tmp / "run" / "host.sock")
            async with daemon_process(write_config(short_tmp, server.listen_url), short_tmp / "daemon.log") as daemon:
                await daemon.start()
                await wait_daemon_ready(socket)
                args = ("--socket", socket, "--agent", "kai", "--reply", REPLY, "--count", "1")
                async with example("fixed_reply_host.py", *args, log=short_tmp / "host.log") as host:
                    try:
                        await wait_until(lambda: owned_by(socket, "kai", "fixed-reply-host"), timeout=20, interval=0.05)
                    except trio.TooSlowError:
                        raise AssertionError("the example host never said hello: " + (short_tmp / "host.log").read_text()) from None
                    await server.incoming([{"channelId": "general", "messageId": "m-1", "text": "hi kai", "tags": ["chat:mention"]}])
                    # --count 1: the host exits after answering the one wake.
                    assert await host.wait() == 0, (short_tmp / "host.log").read_text()
                publishes = await server.recorded("channels/publish")
                texts = ["".join(block.get("text", "") for block in entry["params"]["content"]) for entry in publishes]
                assert texts == [REPLY]
                assert publishes[0]["params"]["channelId"] == "general"
                log = (short_tmp / "host.log").read_text()
                assert "[delivered]" in log and "general" in log
                # The wake was acked: nothing is left for kai.
                async with RouterClient.connect_unix(socket) as probe:
                    assert [row.unacked_wakes for row in (await probe.status()).agents if row.name == "kai"] == [0]


# ------------------------------------------------------------------ inference_host.py


@asynccontextmanager
async def stand_in_daemon(path: Path) -> AsyncIterator[tuple[list[Any], list[Peer], list[Any]]]:
    """A Unix socket at ``path`` answering hello like the daemon, recording the hello's params
    and the host's ``inference/chunk`` notifications; yields (hellos, host peers, chunks)."""
    hellos: list[Any] = []
    peers: list[Peer] = []
    chunks: list[Any] = []
    table = MethodTable()

    async def hello(params: Any, _inbound: Inbound) -> Any:
        hellos.append(msgspec.json.decode(params))
        return {"daemonVersion": "stand-in", "servers": [], "agents": [], "wakeSeq": 0}

    async def chunk(params: Any, _inbound: Inbound) -> None:
        chunks.append(msgspec.json.decode(params))

    table.add("session/hello", hello)
    table.add("inference/chunk", chunk)

    async def serve(stream: trio.SocketStream) -> None:
        peer = Peer(NdjsonStream(stream, stream, skip_log_lines=False), table)
        peers.append(peer)
        await peer.run()

    sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await sock.bind(str(path))
    sock.listen()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, serve, [trio.SocketListener(sock)])
        yield hellos, peers, chunks
        nursery.cancel_scope.cancel()


async def test_the_inference_host_declares_serves_and_streams_an_echo(short_tmp: Path) -> None:
    socket = short_tmp / "stand-in.sock"
    with trio.fail_after(30):
        async with stand_in_daemon(socket) as (hellos, peers, chunks):
            async with example("inference_host.py", "--socket", str(socket), "--agent", "ada", log=short_tmp / "host.log"):
                await wait_until(lambda: bool(hellos), timeout=20, interval=0.05)
                assert hellos[0]["host"] == "inference-host" and hellos[0]["agents"] == [{"name": "ada"}]
                assert hellos[0]["serves"] == {"inference": ["ada"], "modelInfo": ["ada"]}
                request = {"messages": [{"role": "user", "content": "repeat after me"}], "preferences": {"maxTokens": 50}}
                params = {"requestId": "r-1", "agent": "ada", "serverId": "s", "stream": True, "request": request}
                answer = await peers[0].request("inference/request", params, timeout=10)
                assert answer["content"] == "echo: repeat after me" and answer["model"] == "echo-1"
                assert answer["finishReason"] == "end_turn"
                # The chunks came before the answer, and join to it.
                assert [c["requestId"] for c in chunks] == ["r-1"] * len(chunks) and len(chunks) >= 2
                assert "".join(c["chunk"]["delta"] for c in chunks) == answer["content"]
                info = await peers[0].request("model/info", {"requestId": "r-2", "agent": "ada", "serverId": "s"}, timeout=10)
                assert info["id"] == "echo-1"


async def test_a_servers_inference_request_reaches_the_example_host_and_its_echo_comes_back(short_tmp: Path) -> None:
    """End to end through real processes: a fixture server configured to ask for ``ada``'s
    model sends ``inference/request`` (streamed); the example host serving ``ada`` answers; the
    chunks and the answer reach that server."""
    with trio.fail_after(60):
        async with FixtureProcess.start(
            transport="tcp", channels=["general"], control_dir=short_tmp, server_name="s", inference=True
        ) as server:
            assert server.listen_url is not None
            socket = str(short_tmp / "run" / "host.sock")
            servers = {"s": {"url": server.listen_url, "inference": {"agent": "ada"}}}
            async with daemon_process(write_config(short_tmp, None, servers=servers), short_tmp / "daemon.log") as daemon:
                await daemon.start()
                await wait_daemon_ready(socket)
                log = short_tmp / "host.log"
                async with example("inference_host.py", "--socket", socket, "--agent", "ada", log=log) as host:

                    def settled() -> bool:
                        return host.poll() is not None or "serving inference for ada" in log.read_text()

                    await wait_until(settled, timeout=20, interval=0.05)
                    assert host.poll() is None, f"the inference host exited: {log.read_text()}"
                    # Its hello (with serves) was answered: the daemon gave it the agent.
                    assert await owned_by(socket, "ada", "inference-host")
                    request = {"featureSet": "s.inference", "stream": True, "messages": [{"role": "user", "content": "repeat after me"}]}
                    answer = await server.host_call("inference/request", request)
                    assert answer["result"]["content"] == "echo: repeat after me"
                    chunks = [entry["params"] for entry in await server.recorded("inference/chunk")]
                    assert "".join(chunk["delta"] for chunk in chunks) == "echo: repeat after me"
                    info = await server.host_call("model/info", {})
                    assert info["result"]["id"] == "echo-1"
