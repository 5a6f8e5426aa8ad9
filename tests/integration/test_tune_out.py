"""Tune-out and the subconscious tools end to end: real fixture processes, a host on the socket.

Issue 6 item 5: a tuned-out channel stays open, its wakes are held and come as one summary wake
at the cadence; ``tune_out`` and ``cancel_tuneout`` read names as every tool does (the turn's
own channel first, one resolver) and refuse a name several channels answer to; a subconscious
agent cancels its primary's tune-out, speaks, and delivers summaries, refusing a gone or shared
name. Servers ``a`` and ``b`` both register ``general``, in both registration orders. A
tune-out survives a daemon restart on the same journal (issue 13).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from structlog.testing import capture_logs

from mcpl_router.client import RouterClient
from mcpl_router.daemon import Daemon
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.testing.control import FixtureProcess, wait_until
from mcpl_router.testing.descriptors import channel_descriptor

from .conftest import dialled_server, running_daemon, two_servers_sharing_general, wait_channel, wait_ready

pytestmark = pytest.mark.integration

AGENT = "ann"
SUB = {"name": "sub", "subconsciousFor": AGENT, "wake": {"tags": []}}
A_GENERAL, B_GENERAL = ChannelRef("a", "general"), ChannelRef("b", "general")


@asynccontextmanager
async def host(daemon: Daemon, *agents: Mapping[str, Any] | str) -> AsyncIterator[RouterClient]:
    assert daemon.host_socket_path is not None
    async with RouterClient.connect_unix(daemon.host_socket_path) as client:
        await client.hello("test-host", list(agents) or [AGENT])
        yield client


async def mention(server: FixtureProcess, text: str = "hi ann") -> None:
    await server.incoming([{"channelId": "general", "text": text, "tags": ["chat:mention"]}])


async def next_wake(client: RouterClient) -> dict[str, Any]:
    return dict((await client.next_notification("wake")).params)


async def tool(client: RouterClient, turn_id: str, name: str, arguments: dict[str, Any]) -> Any:
    return await client.call("turn/tool", {"turnId": turn_id, "callId": name, "name": name, "arguments": arguments})


@pytest.mark.parametrize("first", ["a", "b"])
async def test_tune_out_reads_the_turns_own_channel_holds_its_wakes_and_summarizes_them(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with two_servers_sharing_general(tmp_path, first) as (daemon, servers), host(daemon) as client:
            await mention(servers["b"])
            wake = await next_wake(client)
            opened = await client.call("turn/open", {"agent": AGENT, "wakes": [wake["seq"]]})
            # "general" is the turn's own channel: b's, though a registers the id too.
            entered = await tool(client, opened["turnId"], "tune_out", {"channelId": "general", "cadence": 600})
            assert entered["isError"] is False
            assert entered["structuredContent"]["serverId"] == "b"
            assert entered["content"][0]["text"].startswith("[tune-out] b:general is tuned out")
            assert daemon.tune_outs.tuned_out(AGENT) == {B_GENERAL}
            await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})

            # b's traffic is held; a's general (same id) still wakes at once.
            await mention(servers["b"], "one")
            await mention(servers["b"], "two")
            await wait_until(lambda: len(daemon.tune_outs.table.get(AGENT, B_GENERAL).held) == 2, timeout=10)
            await mention(servers["a"], "on a")
            direct = await next_wake(client)
            assert direct["reason"] == "message" and direct["channel"]["serverId"] == "a"
            # Entering again restarts the cadence and keeps what is held.
            quick = await client.call("turn/open", {"agent": AGENT})
            again = await tool(client, quick["turnId"], "tune_out", {"channelId": "b:general", "cadence": 0.2})
            assert again["isError"] is False
            await client.call("turn/close", {"turnId": quick["turnId"], "outcome": "completed"})
            summary = await next_wake(client)
            assert summary["reason"] == "tuneout-summary"
            assert summary["channel"] == {"serverId": "b", "channelId": "general", "shown": "b:general"}
            assert len(summary["held"]) == 2 and summary["seq"] == summary["held"][-1]
            assert summary["final"] is False and "2 message(s) held" in summary["text"]
            # The held wakes are the agent's durable wakes: a turn opens on them.
            turn = await client.call("turn/open", {"agent": AGENT, "wakes": summary["held"]})
            assert turn["channel"]["serverId"] == "b"

            # Outside b's turn the shared name is refused, naming both; the qualified one cancels.
            second = await client.call("turn/open", {"agent": AGENT})
            refused = await tool(client, second["turnId"], "tune_out", {"channelId": "general", "op": "cancel"})
            assert refused["isError"] is True and refused["reason"] == "ambiguous"
            assert "a:general" in refused["content"][0]["text"] and "b:general" in refused["content"][0]["text"]
            assert daemon.tune_outs.tuned_out(AGENT) == {B_GENERAL}
            cancelled = await tool(client, second["turnId"], "tune_out", {"channelId": "b:general", "op": "cancel"})
            assert cancelled["isError"] is False and cancelled["structuredContent"]["serverId"] == "b"
            assert daemon.tune_outs.tuned_out(AGENT) == frozenset()
            await client.call("turn/close", {"turnId": second["turnId"], "outcome": "completed"})
            await mention(servers["b"], "back")
            again = await next_wake(client)
            assert again["reason"] == "message" and again["channel"]["serverId"] == "b"


async def test_tune_out_of_the_turns_own_channel_after_its_server_withdrew_it_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with two_servers_sharing_general(tmp_path, "a") as (daemon, servers), host(daemon) as client:
            await mention(servers["b"])
            wake = await next_wake(client)
            opened = await client.call("turn/open", {"agent": AGENT, "wakes": [wake["seq"]]})
            await servers["b"].withdraw(["general"])
            await wait_until(lambda: not daemon.router.registry.is_registered(B_GENERAL), timeout=10)
            refused = await tool(client, opened["turnId"], "tune_out", {"channelId": "general"})
            assert refused["isError"] is True and refused["reason"] == "own-channel-withdrawn"
            assert "Nothing was tuned out." in refused["content"][0]["text"]
            # Never re-read as a's general, though a registers that id.
            assert daemon.tune_outs.tuned_out(AGENT) == frozenset()
            bad = await tool(client, opened["turnId"], "tune_out", {"channelId": "a:general", "cadence": -1})
            assert bad["isError"] is True and bad["reason"] == "bad-argument"
            await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})


async def test_a_tune_out_ends_after_its_max_wakes(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with two_servers_sharing_general(tmp_path, "a") as (daemon, servers), host(daemon) as client:
            opened = await client.call("turn/open", {"agent": AGENT, "channel": "a:general"})
            settings = {"channelId": "general", "maxWakes": 1, "backlogCap": 1}
            await tool(client, opened["turnId"], "tune_out", {**settings, "cadence": 600})
            await mention(servers["a"], "one")
            await mention(servers["a"], "two")
            await wait_until(lambda: daemon.tune_outs.table.get(AGENT, A_GENERAL).dropped == 1, timeout=10)
            await tool(client, opened["turnId"], "tune_out", {**settings, "cadence": 0.2})
            await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
            summary = await next_wake(client)
            assert summary["reason"] == "tuneout-summary" and summary["final"] is True
            assert len(summary["held"]) == 1 and summary["dropped"] == 1
            assert daemon.tune_outs.tuned_out(AGENT) == frozenset()


async def test_the_subconscious_cancels_speaks_and_delivers_summaries_by_refs_only(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with two_servers_sharing_general(tmp_path, "b") as (daemon, servers), host(daemon, AGENT, SUB) as client:
            primary = await client.call("turn/open", {"agent": AGENT, "channel": "b:general"})
            tool_names = {spec["name"] for spec in primary["tools"]}
            assert "tune_out" in tool_names and "cancel_tuneout" not in tool_names
            await tool(client, primary["turnId"], "tune_out", {"channelId": "general", "cadence": 600})
            not_sub = await tool(client, primary["turnId"], "cancel_tuneout", {"channelId": "general"})
            assert not_sub["isError"] is True and not_sub["reason"] == "not-subconscious"
            await client.call("turn/close", {"turnId": primary["turnId"], "outcome": "completed"})
            await mention(servers["b"], "held")
            await wait_until(lambda: daemon.tune_outs.table.get(AGENT, B_GENERAL).held, timeout=10)

            sub = await client.call("turn/open", {"agent": "sub"})
            assert {"cancel_tuneout", "speak_in_channel", "deliver_summary"} <= {s["name"] for s in sub["tools"]}
            # A name two channels answer to is refused, never stored bare.
            for name, arguments in (
                ("deliver_summary", {"channelId": "general", "summary": "quiet"}),
                ("cancel_tuneout", {"channelId": "general"}),
                ("speak_in_channel", {"channelId": "general", "text": "hello"}),
            ):
                refused = await tool(client, sub["turnId"], name, arguments)
                assert refused["isError"] is True and refused["reason"] == "ambiguous", name
            assert daemon.tune_outs.table.get(AGENT, B_GENERAL).summary is None
            delivered = await tool(client, sub["turnId"], "deliver_summary", {"channelId": "b:general", "summary": "all quiet"})
            assert delivered["isError"] is False and delivered["structuredContent"]["agent"] == AGENT
            spoke = await tool(client, sub["turnId"], "speak_in_channel", {"channelId": "b:general", "text": "brb"})
            assert spoke["isError"] is False and spoke["structuredContent"]["serverId"] == "b"
            cancelled = await tool(client, sub["turnId"], "cancel_tuneout", {"channelId": "b:general"})
            assert cancelled["isError"] is False and cancelled["structuredContent"]["held"] == 1
            final = await next_wake(client)
            assert final["agent"] == AGENT and final["reason"] == "tuneout-summary"
            assert final["final"] is True and final["summary"] == "all quiet"
            assert daemon.tune_outs.tuned_out(AGENT) == frozenset()
            await client.call("turn/close", {"turnId": sub["turnId"], "outcome": "completed"})
            b_publishes = [e["params"] for e in await servers["b"].recorded("channels/publish")]
            assert [p["content"][0]["text"] for p in b_publishes] == ["brb"]
            assert await servers["a"].recorded("channels/publish") == []


async def test_turn_round_naming_the_tune_out_tools_holds_text_only_for_speak_in_channel(tmp_path: Path) -> None:
    # turn/round names the round's tool calls before they run: speak_in_channel posts (its
    # round's plain text is held, as for channel_publish); tune_out does not.
    with trio.fail_after(60):
        async with two_servers_sharing_general(tmp_path, "a") as (daemon, servers), host(daemon, AGENT, SUB) as client:
            primary = await client.call("turn/open", {"agent": AGENT, "channel": "b:general"})
            await client.call("turn/text", {"turnId": primary["turnId"], "round": 1, "delta": "stepping away"})
            tune = {"name": "tune_out", "arguments": {"channelId": "b:general", "cadence": 600}}
            ended = await client.call("turn/round", {"turnId": primary["turnId"], "round": 1, "toolCalls": [tune]})
            assert [d["outcome"] for d in ended["deliveries"]] == ["delivered"]
            await client.call("turn/close", {"turnId": primary["turnId"], "outcome": "completed"})

            sub = await client.call("turn/open", {"agent": "sub", "channel": "b:general"})
            await client.call("turn/text", {"turnId": sub["turnId"], "round": 1, "delta": "I'll say it there"})
            speak = {"name": "speak_in_channel", "arguments": {"channelId": "b:general", "text": "brb"}}
            ended = await client.call("turn/round", {"turnId": sub["turnId"], "round": 1, "toolCalls": [speak]})
            assert ended["deliveries"] == []
            await client.call("turn/close", {"turnId": sub["turnId"], "outcome": "completed"})
            b_publishes = [e["params"]["content"][0]["text"] for e in await servers["b"].recorded("channels/publish")]
            assert b_publishes == ["stepping away"]


@pytest.mark.parametrize("first", ["a", "b"])
async def test_tuned_out_traffic_does_not_set_the_default_channel(tmp_path: Path, first: str) -> None:
    """A held message of a tuned-out channel is not one the agent answers: channel_publish with
    no channelId still goes to the channel the agent was last woken in (a's general)."""
    with trio.fail_after(60):
        async with two_servers_sharing_general(tmp_path, first) as (daemon, servers), host(daemon) as client:
            await mention(servers["a"], "on a")
            wake = await next_wake(client)
            opened = await client.call("turn/open", {"agent": AGENT, "wakes": [wake["seq"]]})
            entered = await tool(client, opened["turnId"], "tune_out", {"channelId": "b:general", "cadence": 600})
            assert entered["isError"] is False
            await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
            await mention(servers["b"], "held on b")
            await wait_until(lambda: len(daemon.tune_outs.table.get(AGENT, B_GENERAL).held) == 1, timeout=10)
            later = await client.call("turn/open", {"agent": AGENT})
            posted = await tool(client, later["turnId"], "channel_publish", {"content": "to my default"})
            assert posted["isError"] is False and posted["structuredContent"]["serverId"] == "a"
            await client.call("turn/close", {"turnId": later["turnId"], "outcome": "completed"})
            published = [entry["params"]["content"][0]["text"] for entry in await servers["a"].recorded("channels/publish")]
            assert published == ["to my default"]
            assert await servers["b"].recorded("channels/publish") == []



async def test_tuned_out_refuses_open_close_and_decline_but_not_a_publish(tmp_path: Path) -> None:
    """What docs/errors.md says of ``tuned-out``: the channel lifecycle tools are refused for a
    channel the agent tuned out (the tune-out decides whether it is open), while a publish there
    is the agent choosing to speak, and goes out through the channel's own server."""
    with trio.fail_after(60):
        async with two_servers_sharing_general(tmp_path, "a") as (daemon, servers), host(daemon) as client:
            await mention(servers["a"], "on a")
            wake = await next_wake(client)
            opened = await client.call("turn/open", {"agent": AGENT, "wakes": [wake["seq"]]})
            entered = await tool(client, opened["turnId"], "tune_out", {"channelId": "b:general", "cadence": 600})
            assert entered["isError"] is False
            for verb in ("channel_open", "channel_close", "channel_decline"):
                refused = await tool(client, opened["turnId"], verb, {"channelId": "b:general"})
                assert refused["isError"] is True and refused["reason"] == "tuned-out", (verb, refused)
            posted = await tool(client, opened["turnId"], "channel_publish", {"channelId": "b:general", "content": "still here"})
            assert posted["isError"] is False and posted["structuredContent"]["serverId"] == "b", posted
            await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
            published = [entry["params"]["content"][0]["text"] for entry in await servers["b"].recorded("channels/publish")]
            assert published == ["still here"]


@pytest.mark.parametrize("first", ["a", "b"])
async def test_tune_out_of_a_closed_channel_opens_it_on_its_own_server(tmp_path: Path, first: str) -> None:
    """Tuning out a channel that is registered but closed opens it (``channels/open``) on its
    own server, so its traffic comes in to be summarized; a's closed ``lounge`` stays closed."""
    with trio.fail_after(60):
        async with two_servers_sharing_general(tmp_path, first) as (daemon, servers), host(daemon) as client:
            for name in ("a", "b"):
                await servers[name].register([channel_descriptor("lounge")])
                await wait_channel(daemon, name, "lounge")
            b_lounge = ChannelRef("b", "lounge")
            entry = daemon.router.registry.get(b_lounge)
            assert entry is not None and not entry.open
            turn = await client.call("turn/open", {"agent": AGENT})
            entered = await tool(client, turn["turnId"], "tune_out", {"channelId": "b:lounge", "cadence": 600})
            assert entered["isError"] is False and entered["structuredContent"]["serverId"] == "b"
            await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
            [opened] = await servers["b"].recorded("channels/open")
            assert opened["params"] == {"channelId": "lounge"}
            assert await servers["a"].recorded("channels/open") == []
            entry = daemon.router.registry.get(b_lounge)
            assert entry is not None and entry.open
            assert daemon.tune_outs.tuned_out(AGENT) == {b_lounge}


# ---------------------------------------------------------------------- across a restart (issue 13)


@asynccontextmanager
async def fixture_servers(workdir: Path) -> AsyncIterator[dict[str, FixtureProcess]]:
    """Servers a and b (tcp, strict), outliving the daemons a test runs against them."""
    async with AsyncExitStack() as stack:
        servers = {}
        for name in ("a", "b"):
            servers[name] = await stack.enter_async_context(
                FixtureProcess.start(transport="tcp", personality="strict", control_dir=workdir, server_name=name)
            )
        yield servers


async def register_general(daemon: Daemon, servers: Mapping[str, FixtureProcess], first: str) -> None:
    for name in (first, "b" if first == "a" else "a"):
        if name in daemon.links:
            await wait_ready(daemon, name)
            await servers[name].register([{**channel_descriptor("general"), "initiallyOpen": True}])
            await wait_channel(daemon, name, "general")


@pytest.mark.parametrize("first", ["a", "b"])
async def test_a_tune_out_survives_a_restart_holding_old_and_new_wakes_at_its_cadence(tmp_path: Path, first: str) -> None:
    """Both servers' ``general`` tuned out, each its own tune-out: after a restart on the same
    journal b's wake held before it is still held, new traffic on either wakes no one, a's summary
    comes at a's cadence, and cancelling b's hands over both of b's held wakes."""
    with trio.fail_after(90):
        async with fixture_servers(tmp_path) as servers:
            config = {name: dialled_server(fixture) for name, fixture in servers.items()}
            async with running_daemon(tmp_path, config, unix_socket=True) as daemon:
                await register_general(daemon, servers, first)
                async with host(daemon) as client:
                    turn = await client.call("turn/open", {"agent": AGENT, "channel": "b:general"})
                    # b's cadence never comes in this test: what it holds must outlast the restart.
                    for channel, cadence in (("b:general", 600), ("a:general", 1.0)):
                        entered = await tool(client, turn["turnId"], "tune_out", {"channelId": channel, "cadence": cadence})
                        assert entered["isError"] is False
                    await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
                    await mention(servers["b"], "before")
                    await wait_until(lambda: len(daemon.tune_outs.table.get(AGENT, B_GENERAL).held) == 1, timeout=10)
                    [before] = daemon.tune_outs.table.get(AGENT, B_GENERAL).held

            async with running_daemon(tmp_path, config, unix_socket=True) as daemon:
                # Resumed before any server or host connected.
                assert daemon.tune_outs.tuned_out(AGENT) == {A_GENERAL, B_GENERAL}
                assert daemon.tune_outs.table.get(AGENT, B_GENERAL).held == [before]
                await register_general(daemon, servers, first)
                async with host(daemon) as client:
                    await mention(servers["b"], "after on b")
                    await mention(servers["a"], "after on a")
                    await wait_until(lambda: len(daemon.tune_outs.table.get(AGENT, B_GENERAL).held) == 2, timeout=10)
                    # The first wake after the hello is a's summary: neither message, nor the
                    # held "before" (not replayed at the hello), woke the agent.
                    summary = await next_wake(client)
                    assert summary["reason"] == "tuneout-summary" and summary["final"] is False
                    assert summary["channel"] == {"serverId": "a", "channelId": "general", "shown": "a:general"}
                    [after_a] = summary["held"]
                    assert after_a > before
                    assert daemon.tune_outs.tuned_out(AGENT) == {A_GENERAL, B_GENERAL}

                    turn = await client.call("turn/open", {"agent": AGENT})
                    cancelled = await tool(client, turn["turnId"], "tune_out", {"channelId": "b:general", "op": "cancel"})
                    assert cancelled["isError"] is False and cancelled["structuredContent"]["held"] == 2
                    await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
                    final = await next_wake(client)
                    assert final["reason"] == "tuneout-summary" and final["final"] is True
                    assert final["channel"]["serverId"] == "b" and final["held"][0] == before and len(final["held"]) == 2
                    await mention(servers["b"], "back")
                    plain = await next_wake(client)
                    assert plain["reason"] == "message" and plain["channel"]["serverId"] == "b"
                await daemon.journal.flush()
                # Cancelled: only a's row is left.
                assert [(row.server_id, row.channel_id) for row in await daemon.journal.saved_tune_outs()] == [("a", "general")]


async def test_a_tune_out_whose_server_left_the_config_is_dropped_at_restart_and_its_wakes_replayed(tmp_path: Path) -> None:
    with trio.fail_after(90):
        async with fixture_servers(tmp_path) as servers:
            both = {name: dialled_server(fixture) for name, fixture in servers.items()}
            async with running_daemon(tmp_path, both, unix_socket=True) as daemon:
                await register_general(daemon, servers, "a")
                async with host(daemon) as client:
                    turn = await client.call("turn/open", {"agent": AGENT})
                    await tool(client, turn["turnId"], "tune_out", {"channelId": "b:general", "cadence": 600})
                    await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
                    await mention(servers["b"], "held on b")
                    await wait_until(lambda: len(daemon.tune_outs.table.get(AGENT, B_GENERAL).held) == 1, timeout=10)
                    [held] = daemon.tune_outs.table.get(AGENT, B_GENERAL).held

            with capture_logs() as logs:
                async with running_daemon(tmp_path, {"a": both["a"]}, unix_socket=True) as daemon:
                    assert daemon.tune_outs.tuned_out(AGENT) == frozenset()
                    await register_general(daemon, servers, "a")
                    async with host(daemon) as client:
                        # Nothing holds it now: it is the agent's backlog, sent at the hello.
                        replayed = await next_wake(client)
                        assert replayed["seq"] == held and replayed["reason"] == "message"
                        assert replayed["channel"]["serverId"] == "b"
                    await daemon.journal.flush()
                    assert await daemon.journal.saved_tune_outs() == []
            dropped = [entry for entry in logs if entry["event"] == "tuneout.dropped"]
            assert dropped == [{"event": "tuneout.dropped", "log_level": "warning", "reason": "server-not-configured",
                                "agent": AGENT, "server": "b", "channel": "general", "held": 1}]
