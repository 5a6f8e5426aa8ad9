"""The host Unix socket answers every line: a non-JSON line from a host gets -32700."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from mcpl_router.jsonrpc import NdjsonStream

from .conftest import running_daemon

pytestmark = pytest.mark.integration


async def test_a_hosts_non_json_line_is_answered_and_the_connection_stays(short_tmp: Path) -> None:
    with trio.fail_after(20):
        async with running_daemon(short_tmp, {}, unix_socket=True) as daemon:
            assert daemon.host_socket_path is not None
            stream = await trio.open_unix_socket(daemon.host_socket_path)
            framed = NdjsonStream(stream, stream)
            try:
                await stream.send_all(b"oops not json\n")
                answer = json.loads(await framed.receive_message())
                assert answer["error"]["code"] == -32700 and answer["id"] is None
                await stream.send_all(b'{"jsonrpc": "2.0", "id": 1, "method": "status", "params": {}}\n')
                assert json.loads(await framed.receive_message())["result"]["version"]
            finally:
                await stream.aclose()


async def test_a_hosts_typing_is_stopped_when_the_host_goes_away(short_tmp: Path) -> None:
    from mcpl_router.client import RouterClient
    from mcpl_router.testing.control import FixtureProcess, wait_until

    from .conftest import dialled_server, wait_channel, wait_ready

    with trio.fail_after(30):
        async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp) as server:
            async with running_daemon(short_tmp, {"b": dialled_server(server)}, unix_socket=True) as daemon:
                await wait_ready(daemon, "b")
                await wait_channel(daemon, "b", "general")
                async with RouterClient.connect_unix(daemon.host_socket_path) as host:
                    await host.hello("crashy-host", [])
                    await host.call("channels/typing", {"channel": "b:general", "op": "start"})
                # The host is gone without a stop: the daemon sends it.

                async def typing_ops() -> list[str] | None:
                    ops = [entry["params"].get("op", "start") for entry in await server.recorded("channels/typing")]
                    return ops if ops[-1:] == ["stop"] else None

                assert await wait_until(typing_ops, timeout=10) == ["start", "stop"]


async def test_status_reports_agents_their_owner_and_unacked_wakes(short_tmp: Path) -> None:
    from mcpl_router.client import RouterClient
    from mcpl_router.testing.control import FixtureProcess

    from .conftest import dialled_server, wait_channel, wait_ready

    with trio.fail_after(30):
        async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp) as server:
            async with running_daemon(short_tmp, {"b": dialled_server(server)}, unix_socket=True) as daemon:
                await wait_ready(daemon, "b")
                await wait_channel(daemon, "b", "general")
                async with RouterClient.connect_unix(daemon.host_socket_path) as host:
                    await host.hello("status-host", [{"name": "kai"}])
                    await server.incoming([{"channelId": "general", "text": "hi", "tags": ["chat:mention"]}])
                    await host.next_wake()
                    [kai] = (await host.call("status"))["agents"]
                    assert (kai["name"], kai["host"], kai["unackedWakes"]) == ("kai", "status-host", 1)
