"""Wake gating end to end: real fixture processes, a host on the socket declaring a gated agent.

Servers ``a`` and ``b`` both register ``general``, in both registration orders. A debounced
batch routed to ``b:general`` names ``b`` (``routeServerId``) and a turn opened on it is b's; a
batch whose server withdrew the channel before delivery wakes no one, is logged and counted; a
deferred wake survives a daemon restart (an unacked journal delivery, gated again at replay).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from structlog.testing import capture_logs

from mcpl_router.client import RouterClient
from mcpl_router.daemon import Daemon
from mcpl_router.testing.control import FixtureProcess, wait_until
from mcpl_router.testing.descriptors import channel_descriptor

from .conftest import dialled_server, running_daemon, two_servers_sharing_general, wait_channel, wait_ready

pytestmark = pytest.mark.integration

AGENT = "kai"


def gated(rules: list[dict[str, Any]], default: Any = "always") -> dict[str, Any]:
    return {"name": AGENT, "wakeGate": {"rules": rules, "default": default}}


@asynccontextmanager
async def host(daemon: Daemon, agent: dict[str, Any]) -> AsyncIterator[RouterClient]:
    assert daemon.host_socket_path is not None
    async with RouterClient.connect_unix(daemon.host_socket_path) as client:
        await client.hello("test-host", [agent])
        yield client


async def mention(server: FixtureProcess, text: str) -> None:
    await server.incoming([{"channelId": "general", "text": text, "tags": ["chat:mention"]}])


async def next_wake(client: RouterClient) -> dict[str, Any]:
    return dict((await client.next_notification("wake")).params)


@pytest.mark.parametrize("first", ["a", "b"])
async def test_a_debounced_batch_routed_to_b_general_carries_route_server_b(tmp_path: Path, first: str) -> None:
    agent = gated([{"channels": ["b:general"], "behaviour": {"debounce": {"ms": 300}}}])
    with trio.fail_after(60):
        async with two_servers_sharing_general(tmp_path, first) as (daemon, servers), host(daemon, agent) as client:
            await mention(servers["b"], "one")
            await mention(servers["b"], "two")
            batch = await next_wake(client)
            assert batch["reason"] == "batch"
            assert batch["routeServerId"] == "b"
            assert batch["routeChannel"] == {"serverId": "b", "channelId": "general", "shown": "b:general"}
            assert batch["channel"] == batch["routeChannel"]
            assert len(batch["seqs"]) == 2 and batch["seq"] == batch["seqs"][-1]
            assert [row["serverId"] for row in batch["conversations"]] == ["b"]
            assert [m["content"][0]["text"] for m in batch["messages"]] == ["one", "two"]
            # The rule names b's general alone: a's general (same id) wakes at once, ungated.
            await mention(servers["a"], "on a")
            direct = await next_wake(client)
            assert direct["reason"] == "message" and direct["channel"]["serverId"] == "a"
            # A turn opened on the batch's wakes is b's.
            turn = await client.call("turn/open", {"agent": AGENT, "wakes": batch["seqs"]})
            assert turn["channel"]["serverId"] == "b"
            await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
            acked = await client.call("wake/ack", {"seqs": [*batch["seqs"], direct["seq"]]})
            assert acked["acked"] == 3


@pytest.mark.parametrize("first", ["a", "b"])
async def test_a_batch_whose_server_withdrew_the_channel_wakes_no_one_and_is_logged(tmp_path: Path, first: str) -> None:
    agent = gated([{"channels": [{"serverId": "b", "channelId": "general"}], "behaviour": {"debounce": {"ms": 500}}}])
    with trio.fail_after(60), capture_logs() as logs:
        async with two_servers_sharing_general(tmp_path, first) as (daemon, servers), host(daemon, agent) as client:
            await mention(servers["b"], "held")
            await wait_until(lambda: daemon.gates.statistics()["held"].get(AGENT) == 1, timeout=10)
            held_seq = daemon.journal.last_seq()
            await servers["b"].withdraw(["general"])
            await wait_until(lambda: daemon.gates.counters.get("dropped") == 1, timeout=10)
            # Nothing was sent for it; the next wake is a's message.
            await mention(servers["a"], "on a")
            direct = await next_wake(client)
            assert direct["reason"] == "message" and direct["channel"]["serverId"] == "a"
            # Settled: it never comes back, not even to a new claim.
            await wait_until(lambda: daemon.journal.unacked_count(AGENT) == 1, timeout=10)
    dropped = [entry for entry in logs if entry["event"] == "gate.held.dropped"]
    assert dropped == [
        {"event": "gate.held.dropped", "log_level": "warning", "agent": AGENT, "seq": held_seq, "server": "b",
         "channel": "general", "reason": "channel withdrawn"}
    ]


async def test_a_deferred_wake_survives_a_restart_and_comes_with_the_next_wake(tmp_path: Path) -> None:
    agent = gated([{"servers": ["b"], "behaviour": "defer"}])
    with trio.fail_after(90):
        async with AsyncExitStack() as stack:
            servers = {}
            for name in ("a", "b"):
                servers[name] = await stack.enter_async_context(
                    FixtureProcess.start(transport="tcp", personality="strict", control_dir=tmp_path, server_name=name)
                )
            config = {name: dialled_server(fixture) for name, fixture in servers.items()}

            async def registered(daemon: Daemon) -> None:
                for name in ("a", "b"):
                    await wait_ready(daemon, name)
                    await servers[name].register([{**channel_descriptor("general"), "initiallyOpen": True}])
                    await wait_channel(daemon, name, "general")

            async with running_daemon(tmp_path, config, unix_socket=True) as daemon:
                await registered(daemon)
                async with host(daemon, agent):
                    await mention(servers["b"], "deferred")
                    await wait_until(lambda: daemon.gates.statistics()["held"].get(AGENT) == 1, timeout=10)
            async with running_daemon(tmp_path, config, unix_socket=True) as daemon:
                await registered(daemon)
                async with host(daemon, agent) as client:
                    # The saved spec (gate included) defers it again at the claim's replay.
                    await wait_until(lambda: daemon.gates.statistics()["held"].get(AGENT) == 1, timeout=10)
                    await mention(servers["a"], "now")
                    batch = await next_wake(client)
                    assert batch["reason"] == "batch" and batch["gate"]["cause"] == "wake"
                    assert [m["content"][0]["text"] for m in batch["messages"]] == ["deferred", "now"]
                    assert batch["routeServerId"] == "a"
                    assert [row["serverId"] for row in batch["conversations"]] == ["b", "a"]


@pytest.mark.parametrize("first", ["a", "b"])
async def test_a_held_wake_that_is_dropped_never_set_the_default_channel(tmp_path: Path, first: str) -> None:
    """A mention on a:general goes out (a's general is the default); one on b:general is held,
    then dropped when b withdraws it: the default stays a's, so a publish naming no channel
    goes to a, not refused as a gone b:general."""
    agent = gated([{"channels": ["b:general"], "behaviour": {"debounce": {"ms": 500}}}])
    with trio.fail_after(60):
        async with two_servers_sharing_general(tmp_path, first) as (daemon, servers), host(daemon, agent) as client:
            await mention(servers["a"], "on a")
            assert (await next_wake(client))["channel"]["serverId"] == "a"
            await mention(servers["b"], "held on b")
            await wait_until(lambda: daemon.gates.statistics()["held"].get(AGENT) == 1, timeout=10)
            assert daemon.channel_tools.defaults.get(AGENT).ref.server_id == "a"  # not set while held
            await servers["b"].withdraw(["general"])
            await wait_until(lambda: daemon.gates.counters.get("dropped") == 1, timeout=10)
            turn = await client.call("turn/open", {"agent": AGENT})
            sent = await client.call("turn/tool", {"turnId": turn["turnId"], "callId": "c1", "name": "channel_publish",
                                                    "arguments": {"content": "by default"}})
            assert not sent.get("isError"), sent
            await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
            published = [e["params"]["content"][0]["text"] for e in await servers["a"].recorded("channels/publish")]
            assert published == ["by default"]
            assert await servers["b"].recorded("channels/publish") == []


@pytest.mark.parametrize("first", ["a", "b"])
async def test_a_held_push_naming_a_channel_its_server_withdrew_is_dropped(tmp_path: Path, first: str) -> None:
    """The admission check at delivery is by the push's channel too, on its own server."""
    agent = gated([{"kinds": ["push"], "behaviour": {"debounce": {"ms": 500}}}])
    with trio.fail_after(60), capture_logs() as logs:
        async with two_servers_sharing_general(tmp_path, first) as (daemon, servers), host(daemon, agent) as client:
            await servers["b"].push("ev-1", origin={"mcplChannelId": "general"}, payload={"content": [{"type": "text", "text": "p"}]},
                                    tags=["chat:mention"])
            await wait_until(lambda: daemon.gates.statistics()["held"].get(AGENT) == 1, timeout=10)
            await servers["b"].withdraw(["general"])
            await wait_until(lambda: daemon.gates.counters.get("dropped") == 1, timeout=10)
            await mention(servers["a"], "on a")
            direct = await next_wake(client)  # the push never came
            assert direct["reason"] == "message" and direct["channel"]["serverId"] == "a"
    [dropped] = [entry for entry in logs if entry["event"] == "gate.held.dropped"]
    assert (dropped["server"], dropped["channel"], dropped["reason"]) == ("b", "general", "channel withdrawn")
