"""A host's ``channels/publish`` (publishForAgent), end to end with real fixture processes.

Issue 6 item 6: a name or a ref; a ref is its exact pair (an empty ``serverId`` is malformed, not
a bare id); a bare id two servers share is refused with ``shared-id``; every other refusal has its
machine-readable reason (each one is returned in a test here), and ``messageId`` comes back when
the server gives one. Servers ``a`` and ``b`` register ``general`` in both orders; ``c`` is not
granted ``channels.publish``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.daemon import Daemon
from mcpl_router.jsonrpc import RpcError
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.testing.control import FixtureProcess, wait_until
from mcpl_router.testing.descriptors import channel_descriptor

from .conftest import dialled_server, running_daemon, wait_channel, wait_ready

pytestmark = pytest.mark.integration

AGENT = "ann"


@asynccontextmanager
async def three_servers(workdir: Path, first: str) -> AsyncIterator[tuple[Daemon, dict[str, FixtureProcess]]]:
    async with AsyncExitStack() as stack:
        fixtures = {
            name: await stack.enter_async_context(
                FixtureProcess.start(transport="tcp", personality="strict", control_dir=workdir, server_name=name)
            )
            for name in ("a", "b", "c")
        }
        config = {name: dialled_server(fixture) for name, fixture in fixtures.items()}
        config["c"]["disabledCapabilities"] = ["channels.publish"]
        daemon = await stack.enter_async_context(running_daemon(workdir, config, unix_socket=True))
        for name in fixtures:
            await wait_ready(daemon, name)
        for name in (first, "b" if first == "a" else "a"):
            await fixtures[name].register([channel_descriptor("general")])
            await wait_channel(daemon, name, "general")
        await fixtures["c"].register([channel_descriptor("quiet")])
        await wait_channel(daemon, "c", "quiet")
        yield daemon, fixtures


@asynccontextmanager
async def host(daemon: Daemon) -> AsyncIterator[RouterClient]:
    assert daemon.host_socket_path is not None
    async with RouterClient.connect_unix(daemon.host_socket_path) as client:
        await client.hello("test-host", [AGENT])
        yield client


async def publish(client: RouterClient, channel: Any, content: Any = "hello") -> dict[str, Any]:
    return await client.call("channels/publish", {"agent": AGENT, "channel": channel, "content": content})


async def texts_of(server: FixtureProcess) -> list[tuple[str, str]]:
    return [(e["params"]["channelId"], e["params"]["content"][0]["text"]) for e in await server.recorded("channels/publish")]


@pytest.mark.parametrize("first", ["a", "b"])
async def test_host_publish_reads_a_ref_as_its_pair_and_refuses_a_shared_bare_id(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with three_servers(tmp_path, first) as (daemon, servers):
            async with host(daemon) as client:
                shared = await publish(client, "general")
                assert shared["delivered"] is False and shared["reason"] == "shared-id"
                assert {(c["serverId"], c["channelId"]) for c in shared["candidates"]} == {("a", "general"), ("b", "general")}
                assert "a:general" in shared["text"] and "b:general" in shared["text"]

                by_ref = await publish(client, {"serverId": "b", "channelId": "general"}, "to b")
                assert by_ref == {"delivered": True, "serverId": "b", "channelId": "general", "shown": "b:general",
                                  "messageId": by_ref["messageId"]}
                assert by_ref["messageId"]
                by_name = await publish(client, "a:general", [{"type": "text", "text": "to a"}])
                assert by_name["delivered"] is True and by_name["serverId"] == "a"

                with pytest.raises(RpcError) as malformed:
                    await publish(client, {"serverId": "", "channelId": "general"})
                assert malformed.value.code == -32602

                unknown = await publish(client, "nowhere")
                assert unknown["delivered"] is False and unknown["reason"] == "channel-not-registered"
                not_there = await publish(client, {"serverId": "a", "channelId": "quiet"})
                assert not_there["reason"] == "channel-not-registered"
                # Told where the id is, by the name channelId takes there, and not to go there.
                assert 'A channel "quiet" is on server "c" (' in not_there["text"]
                assert "elsewhere" not in not_there["text"] and "name it" not in not_there["text"]

                not_permitted = await publish(client, "quiet")
                assert not_permitted["delivered"] is False and not_permitted["reason"] == "not-permitted"
            assert await texts_of(servers["a"]) == [("general", "to a")]
            assert await texts_of(servers["b"]) == [("general", "to b")]
            assert await servers["c"].recorded("channels/publish") == []


async def test_host_publish_unconfirmed_and_server_unavailable(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with three_servers(tmp_path, "a") as (daemon, servers):
            daemon.turns.publish_timeout = 0.3
            async with host(daemon) as client:
                await servers["b"].configure(publish={"delayMs": 2000})
                unconfirmed = await publish(client, "b:general")
                assert unconfirmed["delivered"] is False and unconfirmed["reason"] == "unconfirmed"
                assert "Check the channel" in unconfirmed["text"]

                await servers["a"].configure(publish={"delivered": False})
                refused = await publish(client, "a:general")
                assert refused["reason"] == "not-delivered"

                await servers["a"].exit()
                await wait_until(lambda: daemon.links["a"].state.value != "ready", timeout=10)
                await wait_until(lambda: not daemon.router.registry.is_registered(ChannelRef("a", "general")), timeout=10)
                unavailable = await publish(client, {"serverId": "a", "channelId": "general"})
                assert unavailable["delivered"] is False and unavailable["reason"] == "server-unavailable"
                # The bare id now names b's general alone.
                assert (await publish(client, "general"))["serverId"] == "b"


async def test_host_publish_needs_the_agent(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with three_servers(tmp_path, "a") as (daemon, _servers):
            async with host(daemon) as client:
                with pytest.raises(RpcError) as unknown:
                    await client.call("channels/publish", {"agent": "bob", "channel": "a:general", "content": "x"})
                assert unknown.value.code == -32011
