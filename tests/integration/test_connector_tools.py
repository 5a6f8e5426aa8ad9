"""Connector tools end to end: real fixture processes, the daemon in-process, a host on the socket.

Issue 6 item 7: each server's own tools are listed (and re-listed on ``list_changed`` and after
a reconnect), offered under the server's prefix, filtered by ``enabledTools``/``disabledTools``
at dispatch as well as in the listing, forwarded with a deadline to their own server only, and
a send engages its channel on that server only. Servers ``a`` and ``b`` both register
``general``; what each server received is read from its own recordings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from mcpl_router.client import RouterClient
from mcpl_router.daemon import Daemon
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.tools.connector_tools import ConnectorTool
from mcpl_router.testing.control import FixtureProcess, wait_until
from mcpl_router.testing.descriptors import channel_descriptor

from .conftest import daemon_config, daemon_running, dialled_server, wait_channel, wait_ready
from .conftest import servers_and_daemon as shared_servers_and_daemon

pytestmark = pytest.mark.integration

AGENT = "ann"
A_SEND = "mcpl--a--send_message"
B_SEND = "mcpl--b--send_message"


@asynccontextmanager
async def servers_and_daemon(
    workdir: Path, names: Sequence[str], options: Mapping[str, dict[str, Any]] | None = None
) -> AsyncIterator[tuple[Daemon, dict[str, FixtureProcess]]]:
    """The shared harness, once each server's tools are listed too."""
    async with shared_servers_and_daemon(workdir, names, options) as (daemon, fixtures):
        for name in names:
            await wait_until(lambda name=name: daemon.connector_tools.tools_of(name), timeout=10)
        yield daemon, fixtures


@asynccontextmanager
async def host(daemon: Daemon, agent: Mapping[str, Any] | str = AGENT) -> AsyncIterator[RouterClient]:
    assert daemon.host_socket_path is not None
    async with RouterClient.connect_unix(daemon.host_socket_path) as client:
        await client.hello("test-host", [agent])
        yield client


async def tool(client: RouterClient, turn_id: str, name: str, arguments: dict[str, Any], call_id: str = "c1") -> Any:
    return await client.call("turn/tool", {"turnId": turn_id, "callId": call_id, "name": name, "arguments": arguments})


def server_tool_named(daemon: Daemon, name: str) -> ConnectorTool | None:
    """The server tool the name table gives ``name`` to (None: no tool, or a daemon tool)."""
    entry = daemon.tools.entry(name)
    if entry is None or entry.provider is not daemon.connector_tools or entry.tool.server_tool is None:
        return None
    pair = entry.tool.server_tool
    return next((tool for tool in daemon.connector_tools.tools_of(pair.server_id) if tool.name == pair.tool), None)


def offered_by_server(daemon: Daemon, name: str) -> bool:
    return server_tool_named(daemon, name) is not None


def names_of(opened: Mapping[str, Any]) -> list[str]:
    return [spec["name"] for spec in opened["tools"] if spec["name"].startswith("mcpl--")]


async def tool_calls(server: FixtureProcess) -> list[dict[str, Any]]:
    return [entry["params"] for entry in await server.recorded("tools/call")]


async def test_prefixes_keep_two_servers_tools_apart_and_a_disabled_tool_is_refused_at_dispatch(tmp_path: Path) -> None:
    options = {"a": {"disabledTools": ["fetch_*"]}, "b": {"enabledTools": ["*"], "disabledTools": ["send_*"]}}
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"], options) as (daemon, servers):
            for name in ("a", "b"):
                await servers[name].register([channel_descriptor("general")])
                await wait_channel(daemon, name, "general")
            async with host(daemon) as client:
                opened = await client.call("turn/open", {"agent": AGENT, "channel": "a:general"})
                turn_id = opened["turnId"]
                # Deny wins: a offers no fetch_*, b no send_* though enabledTools says "*".
                assert names_of(opened) == [A_SEND, "mcpl--b--fetch_history"]
                spec = next(s for s in opened["tools"] if s["name"] == A_SEND)
                assert spec["description"].startswith("[server a] ")
                assert spec["inputSchema"]["required"] == ["channelId", "text"]

                # Called by name without being listed: refused, nothing sent to either server.
                for name, server in (("mcpl--a--fetch_history", "a"), (B_SEND, "b")):
                    refused = await tool(client, turn_id, name, {"channelId": "general", "text": "x"})
                    assert refused["isError"] is True and refused["reason"] == "tool-disabled"
                    assert refused["structuredContent"]["serverId"] == server
                    assert "Nothing was sent" in refused["content"][0]["text"]

                # The offered ones reach their own server only.
                fetched = await tool(client, turn_id, "mcpl--b--fetch_history", {"channelId": "general"})
                assert fetched["isError"] is False
                assert fetched["_meta"]["mcpl-router"]["serverId"] == "b"
                sent = await tool(client, turn_id, A_SEND, {"channelId": "general", "text": "hi"})
                assert sent["isError"] is False and sent["structuredContent"]["messageId"]
                await client.call("turn/close", {"turnId": turn_id, "outcome": "completed"})

            assert [(p["name"], p["arguments"]) for p in await tool_calls(servers["a"])] == [
                ("send_message", {"channelId": "general", "text": "hi"})
            ]
            assert [p["name"] for p in await tool_calls(servers["b"])] == ["fetch_history"]


async def test_the_agents_allowed_tools_hold_at_dispatch_for_connector_tools(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a"]) as (daemon, servers):
            await servers["a"].register([channel_descriptor("general")])
            await wait_channel(daemon, "a", "general")
            async with host(daemon, {"name": AGENT, "allowedTools": ["mcpl--a--fetch_*"]}) as client:
                opened = await client.call("turn/open", {"agent": AGENT, "channel": "general"})
                assert names_of(opened) == ["mcpl--a--fetch_history"]
                refused = await tool(client, opened["turnId"], A_SEND, {"channelId": "general", "text": "x"})
                assert refused["isError"] is True and refused["reason"] == "not-permitted"
                await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
            assert await tool_calls(servers["a"]) == []


@pytest.mark.parametrize("first", ["a", "b"])
async def test_a_send_engages_its_channel_on_its_own_server_only(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"]) as (daemon, servers):
            for name in (first, "b" if first == "a" else "a"):
                # Registered closed (no initiallyOpen) on both servers.
                await servers[name].register([channel_descriptor("general")])
                await wait_channel(daemon, name, "general")
            a_ref, b_ref = ChannelRef("a", "general"), ChannelRef("b", "general")
            registry = daemon.router.registry
            assert not registry.get(b_ref).open and not registry.get(a_ref).open
            async with host(daemon) as client:
                # The turn is in a's general; the send goes through b's own tool.
                opened = await client.call("turn/open", {"agent": AGENT, "channel": "a:general"})
                turn_id = opened["turnId"]
                sent = await tool(client, turn_id, B_SEND, {"channelId": "general", "text": "to b"})
                assert sent["isError"] is False
                about = sent["_meta"]["mcpl-router"]
                assert about["serverId"] == "b"
                assert about["channel"] == {"serverId": "b", "channelId": "general", "shown": "b:general"}
                assert sent["content"][-1]["text"].startswith("[channels] b:general was closed")
                routing = daemon.turns.run_of(turn_id).turn.routing
                assert routing.engaged == (b_ref,)
                assert registry.get(b_ref).open and not registry.get(a_ref).open
                # The qualified form reaches b's own id; a's channel is still untouched.
                again = await tool(client, turn_id, B_SEND, {"channelId": "b:general", "text": "again"}, "c2")
                assert again["isError"] is False and len(again["content"]) == 1
                assert routing.engaged == (b_ref,)
                await client.call("turn/close", {"turnId": turn_id, "outcome": "completed"})

            assert [p["arguments"] for p in await tool_calls(servers["b"])] == [
                {"channelId": "general", "text": "to b"},
                {"channelId": "general", "text": "again"},
            ]
            a_methods = {entry["method"] for entry in await servers["a"].recorded()}
            assert "tools/call" not in a_methods and "channels/publish" not in a_methods


async def test_a_send_outside_the_turn_engages_nothing(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a"]) as (daemon, servers):
            await servers["a"].register([{**channel_descriptor("general"), "initiallyOpen": True}])
            await wait_channel(daemon, "a", "general")
            async with host(daemon) as client:
                first = await client.call("turn/open", {"agent": AGENT, "channel": "general"})
                second = await client.call("turn/open", {"agent": AGENT})
                # A script the first turn started sends during the second turn.
                sent = await client.call("turn/tool", {
                    "turnId": second["turnId"], "callId": "s1", "name": A_SEND,
                    "arguments": {"channelId": "general", "text": "late"}, "callerTurnId": first["turnId"],
                })
                assert sent["isError"] is False
                run = daemon.turns.run_of(second["turnId"])
                assert run.turn.routing.engaged == () and run.explicit_send_rounds == set()
                await client.call("turn/close", {"turnId": second["turnId"], "outcome": "completed"})
            assert len(await tool_calls(servers["a"])) == 1


async def test_a_call_that_times_out_after_sending_has_an_unknown_outcome(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"]) as (daemon, servers):
            for name in ("a", "b"):
                await servers[name].register([{**channel_descriptor("general"), "initiallyOpen": True}])
                await wait_channel(daemon, name, "general")
            daemon.connector_tools.call_timeout = 0.3
            await servers["b"].configure(tool_call={"delayMs": 1500})
            async with host(daemon) as client:
                opened = await client.call("turn/open", {"agent": AGENT, "channel": "b:general"})
                result = await tool(client, opened["turnId"], B_SEND, {"channelId": "general", "text": "slow"})
                assert result["isError"] is False
                assert result["reason"] == "unconfirmed"
                assert result["structuredContent"] == {"serverId": "b", "tool": "send_message", "outcome": "unknown"}
                assert "Check" in result["content"][0]["text"]
                # Possibly sent: counted as a send on b's general, as an unconfirmed publish is.
                assert daemon.turns.run_of(opened["turnId"]).turn.routing.engaged == (ChannelRef("b", "general"),)
                await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
            assert len(await tool_calls(servers["b"])) == 1
            assert await tool_calls(servers["a"]) == []


async def test_the_tool_list_is_fetched_again_on_list_changed_and_after_a_reconnect(tmp_path: Path) -> None:
    extra = {"name": "react", "description": "React to a message.", "inputSchema": {"type": "object"}}
    renamed = {"name": "send.later", "description": "Send later.", "inputSchema": {"type": "object"}}
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a"]) as (daemon, servers):
            tools = daemon.connector_tools
            assert [t.name for t in tools.tools_of("a")] == ["send_message", "fetch_history"]
            await servers["a"].configure(tools=[extra])
            await servers["a"].host_call("notifications/tools/list_changed", form="notification")
            await wait_until(lambda: [t.name for t in tools.tools_of("a")] == ["react"], timeout=10)
            assert offered_by_server(daemon, "mcpl--a--react") and not offered_by_server(daemon, A_SEND)

            # A reconnect (a new epoch) lists again, unprompted.
            await servers["a"].configure(tools=[renamed])
            await servers["a"].disconnect()
            await wait_ready(daemon, "a", epoch=2)
            await wait_until(lambda: [t.name for t in tools.tools_of("a")] == ["send.later"], timeout=10)
            [later] = tools.tools_of("a")
            assert later.exposed.startswith("mcpl--a--send_later-") and server_tool_named(daemon, later.exposed) is later
            lists = await servers["a"].recorded("tools/list")
            assert [entry["epoch"] for entry in lists] == [1, 1, 2]


async def test_two_servers_given_one_prefix_offer_neither_tool_under_the_shared_name(tmp_path: Path) -> None:
    options = {"a": {"toolPrefix": "chat--"}, "b": {"toolPrefix": "chat--", "disabledTools": ["fetch_history"]}}
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"], options) as (daemon, servers):
            await servers["b"].configure(tools=[{"name": "send_message"}, {"name": "react"}])
            await servers["b"].host_call("notifications/tools/list_changed", form="notification")
            await wait_until(lambda: [t.name for t in daemon.connector_tools.tools_of("b")] == ["send_message", "react"], timeout=10)
            async with host(daemon) as client:
                opened = await client.call("turn/open", {"agent": AGENT})
                offered = [spec["name"] for spec in opened["tools"] if spec["name"].startswith("chat--")]
                # send_message is on both: the name means neither, and a call by it is unknown.
                assert offered == ["chat--fetch_history", "chat--react"]
                refused = await tool(client, opened["turnId"], "chat--send_message", {"channelId": "general", "text": "x"})
                assert refused["isError"] is True and refused["reason"] == "unknown-tool"
                await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
            assert await tool_calls(servers["a"]) == [] and await tool_calls(servers["b"]) == []


# ---------------------------------------------------------------------- one name table


def clash_events(logs: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [entry for entry in logs if entry.get("event") == "tools.name_clash"]


def clash_count(daemon: Daemon, kind: str) -> float:
    for family in text_string_to_metric_families(daemon.metrics.render().decode()):
        for sample in family.samples:
            if sample.name == "mcpl_router_tool_name_clashes_total" and sample.labels == {"kind": kind}:
                return sample.value
    return 0.0


async def relist(daemon: Daemon, server: FixtureProcess, server_id: str, tools: Sequence[Mapping[str, Any]]) -> None:
    """Give ``server`` a new tool list, announce it, and wait until the daemon holds it."""
    generation = daemon.connector_tools.generation
    await server.configure(tools=tools)
    await server.host_call("notifications/tools/list_changed", form="notification")
    names = [tool["name"] for tool in tools]
    await wait_until(
        lambda: daemon.connector_tools.generation > generation
        and [t.name for t in daemon.connector_tools.tools_of(server_id)] == names,
        timeout=10,
    )


async def test_a_server_tool_offered_under_a_daemon_tools_name_is_not_offered_and_the_daemon_tool_answers(
    tmp_path: Path,
) -> None:
    # toolPrefix "s" and the server's tool "leep": the offered name would be the daemon's "sleep".
    with trio.fail_after(60), capture_logs() as logs:
        async with servers_and_daemon(tmp_path, ["a"], {"a": {"toolPrefix": "s"}}) as (daemon, servers):
            await relist(daemon, servers["a"], "a", [{"name": "leep"}, {"name": "send_message"}])
            async with host(daemon) as client:
                opened = await client.call("turn/open", {"agent": AGENT})
                named_sleep = [spec for spec in opened["tools"] if spec["name"] == "sleep"]
                assert len(named_sleep) == 1 and not named_sleep[0]["description"].startswith("[server ")
                assert "ssend_message" in [spec["name"] for spec in opened["tools"]]
                # The call by that name is the daemon's own sleep, never the server's leep.
                slept = await tool(client, opened["turnId"], "sleep", {})
                assert slept["isError"] is False and slept["structuredContent"] == {"sleep": True}
                await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
            assert await tool_calls(servers["a"]) == []
            [clash] = clash_events(logs)
            assert clash["log_level"] == "warning" and clash["name"] == "sleep" and clash["kind"] == "daemon-tool"
            assert clash["sides"] == [{"server": None, "tool": "sleep"}, {"server": "a", "tool": "leep"}]
            assert clash_count(daemon, "daemon-tool") == 1


@pytest.mark.parametrize("first", ["discord", "discord--eu"])
async def test_two_servers_tools_joined_into_one_name_are_both_refused_whichever_lists_first(
    tmp_path: Path, first: str
) -> None:
    # "mcpl--discord--" + "eu--send" and "mcpl--discord--eu--" + "send" are one string.
    shared = "mcpl--discord--eu--send"
    second = "discord--eu" if first == "discord" else "discord"
    lists = {"discord": [{"name": "eu--send"}, {"name": "react"}], "discord--eu": [{"name": "send"}]}
    with trio.fail_after(60), capture_logs() as logs:
        async with servers_and_daemon(tmp_path, [first, second]) as (daemon, servers):
            await relist(daemon, servers[first], first, lists[first])
            await relist(daemon, servers[second], second, lists[second])
            # Another listing that changes nothing about the clash: it is not logged again.
            await relist(daemon, servers["discord"], "discord", lists["discord"])
            async with host(daemon) as client:
                opened = await client.call("turn/open", {"agent": AGENT})
                offered = names_of(opened)
                assert shared not in offered and "mcpl--discord--react" in offered
                refused = await tool(client, opened["turnId"], shared, {"channelId": "general", "text": "x"})
                assert refused["isError"] is True and refused["reason"] == "unknown-tool"
                await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
            assert await tool_calls(servers["discord"]) == [] and await tool_calls(servers["discord--eu"]) == []
            [clash] = clash_events(logs)
            assert clash["name"] == shared and clash["kind"] == "servers"
            assert sorted(clash["sides"], key=lambda side: side["server"]) == [
                {"server": "discord", "tool": "eu--send"},
                {"server": "discord--eu", "tool": "send"},
            ]
            assert clash_count(daemon, "servers") == 1

            # discord--eu stops listing "send": the name is discord's eu--send alone, and reaches it.
            await relist(daemon, servers["discord--eu"], "discord--eu", [{"name": "other"}])
            async with host(daemon) as client:
                opened = await client.call("turn/open", {"agent": AGENT})
                assert shared in names_of(opened)
                answered = await tool(client, opened["turnId"], shared, {"x": 1})
                assert answered["isError"] is False and answered["_meta"]["mcpl-router"]["serverId"] == "discord"
                await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
            assert [p["name"] for p in await tool_calls(servers["discord"])] == ["eu--send"]
            assert await tool_calls(servers["discord--eu"]) == []
            assert len(clash_events(logs)) == 1


async def test_a_sends_channel_is_read_by_the_one_resolver_on_the_tools_own_server(tmp_path: Path) -> None:
    # DM labels are names too: "bob" is b's DM dm-9; "Alice" is two of b's DMs, so it names neither.
    dms = [
        channel_descriptor("dm-7", "Alice", channel_type="dm"),
        channel_descriptor("dm-8", "alice", channel_type="dm"),
        channel_descriptor("dm-9", "Bob", channel_type="dm"),
    ]
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"]) as (daemon, servers):
            await servers["b"].register(dms)
            await wait_channel(daemon, "b", "dm-9")
            async with host(daemon) as client:
                opened = await client.call("turn/open", {"agent": AGENT})
                turn_id = opened["turnId"]
                refused = await tool(client, turn_id, B_SEND, {"channelId": "Alice", "text": "hi"})
                assert refused["isError"] is True and refused["reason"] == "ambiguous"
                assert refused["structuredContent"]["candidates"] == [
                    {"serverId": "b", "channelId": "dm-7"},
                    {"serverId": "b", "channelId": "dm-8"},
                ]
                assert "Nothing was sent" in refused["content"][0]["text"]
                sent = await tool(client, turn_id, B_SEND, {"channelId": "bob", "text": "hi bob"}, "c2")
                assert sent["isError"] is False
                assert sent["_meta"]["mcpl-router"]["channel"] == {"serverId": "b", "channelId": "dm-9", "shown": "dm-9"}
                assert daemon.turns.run_of(turn_id).turn.routing.engaged == (ChannelRef("b", "dm-9"),)
                await client.call("turn/close", {"turnId": turn_id, "outcome": "completed"})
            # The server got its own id for the one DM, and nothing for the name that meant two.
            assert [p["arguments"] for p in await tool_calls(servers["b"])] == [{"channelId": "dm-9", "text": "hi bob"}]
            assert await tool_calls(servers["a"]) == []


async def test_a_reload_changes_the_servers_whose_tools_are_offered(short_tmp: Path) -> None:
    # The providers hold the daemon's own links dict: a reload adds and removes servers in it.
    with trio.fail_after(60):
        async with AsyncExitStack() as stack:
            fixtures = {
                name: await stack.enter_async_context(
                    FixtureProcess.start(transport="tcp", personality="strict", control_dir=short_tmp, server_name=name)
                )
                for name in ("a", "b")
            }
            entries = {name: dialled_server(fixture) for name, fixture in fixtures.items()}
            daemon = await stack.enter_async_context(daemon_running(daemon_config(short_tmp, {"a": entries["a"]}, unix_socket=True)))
            await wait_until(lambda: daemon.connector_tools.tools_of("a"), timeout=15)
            added = await daemon.reload(daemon_config(short_tmp, entries, unix_socket=True))
            assert added["outcome"] == "applied" and added["added"] == ["b"]
            await wait_until(lambda: daemon.connector_tools.tools_of("b"), timeout=15)
            async with host(daemon) as client:
                opened = await client.call("turn/open", {"agent": AGENT})
                assert {A_SEND, B_SEND} <= set(names_of(opened))
                await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
            removed = await daemon.reload(daemon_config(short_tmp, {"b": entries["b"]}, unix_socket=True))
            assert removed["outcome"] == "applied" and removed["removed"] == ["a"]
            async with host(daemon) as client:
                opened = await client.call("turn/open", {"agent": AGENT})
                assert B_SEND in names_of(opened) and not any(name.startswith("mcpl--a--") for name in names_of(opened))
                gone = await tool(client, opened["turnId"], A_SEND, {"channelId": "general", "text": "x"})
                assert gone["isError"] is True and gone["reason"] == "unknown-tool"
                await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
            assert await tool_calls(fixtures["a"]) == []
