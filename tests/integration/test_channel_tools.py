"""The channel tools end to end: real fixture processes, the daemon in-process, a host on the socket.

Issue 6 items 1, 2, 3 and 8 (seed ``000_…``'s channel_publish cases, the turn's own channel, calls
made outside the turn, removal semantics; seed ``002_…``'s named mode). Servers ``a`` and ``b``
both register ``general``, in both registration orders, so "first registered" can't pass for the
right answer; what each server received is read from its own recordings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.tools.channel_lifecycle import ChannelLifecycle
from mcpl_router.client import RouterClient
from mcpl_router.daemon import Daemon
from mcpl_router.jsonrpc import RpcError
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.testing.control import FixtureProcess, wait_until
from mcpl_router.testing.descriptors import channel_descriptor

from .conftest import servers_and_daemon as shared_servers_and_daemon
from .conftest import wait_channel

pytestmark = pytest.mark.integration

AGENT = "ann"
ORDERS = pytest.mark.parametrize("first", ["a", "b"])
A_GENERAL = ChannelRef("a", "general")
B_GENERAL = ChannelRef("b", "general")


def open_channel(channel_id: str) -> dict[str, Any]:
    return {**channel_descriptor(channel_id), "initiallyOpen": True}


@asynccontextmanager
async def servers_and_daemon(
    workdir: Path, first: str = "a", options: Mapping[str, dict[str, Any]] | None = None
) -> AsyncIterator[tuple[Daemon, dict[str, FixtureProcess]]]:
    """The shared harness with ``a`` and ``b``, ``general`` registered on both, ``first``'s first."""
    async with shared_servers_and_daemon(workdir, ("a", "b"), options) as (daemon, fixtures):
        for name in (first, "b" if first == "a" else "a"):
            await fixtures[name].register([open_channel("general")])
            await wait_channel(daemon, name, "general")
        yield daemon, fixtures


@asynccontextmanager
async def host(daemon: Daemon, agent: Mapping[str, Any] | str = AGENT) -> AsyncIterator[RouterClient]:
    assert daemon.host_socket_path is not None
    async with RouterClient.connect_unix(daemon.host_socket_path) as client:
        await client.hello("test-host", [agent])
        yield client


async def tool(
    client: RouterClient, turn_id: str, name: str, arguments: dict[str, Any], *, caller: str | None = None
) -> dict[str, Any]:
    params: dict[str, Any] = {"turnId": turn_id, "callId": f"c-{name}", "name": name, "arguments": arguments}
    if caller is not None:
        params["callerTurnId"] = caller
    return await client.call("turn/tool", params)


async def published(server: FixtureProcess) -> list[tuple[str, str]]:
    """(channelId, text) of every channels/publish the server received."""
    return [
        (entry["params"]["channelId"], entry["params"]["content"][0]["text"])
        for entry in await server.recorded("channels/publish")
    ]


async def woken_turn(client: RouterClient, server: FixtureProcess, **message: Any) -> dict[str, Any]:
    """A message on ``server``'s general wakes ann; the turn it opens."""
    await server.incoming([{"channelId": "general", "text": "hi ann", "tags": ["chat:mention"], **message}])
    wake = await client.next_wake()
    return await client.call("turn/open", {"agent": AGENT, "wakes": [wake.seq]})


# ---------------------------------------------------------------------- channel_publish (seed)


@ORDERS
async def test_channel_publish_seed_cases_and_default_gone_after_its_server_left(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, first) as (daemon, servers):
            async with host(daemon) as client:
                turn = await woken_turn(client, servers["b"], threadId="th-1")
                tid = turn["turnId"]
                names = {spec["name"] for spec in turn["tools"]}
                assert {"channel_list", "channel_open", "channel_close", "channel_decline", "channel_publish"} <= names

                # Inside the turn, its own channel's id means b's general.
                own = await tool(client, tid, "channel_publish", {"channelId": "general", "content": "own"})
                assert own["isError"] is False and own["structuredContent"]["serverId"] == "b"
                assert own["structuredContent"]["messageId"]

                # A second turn with no channel: the shared id is refused, naming both candidates.
                bare = await client.call("turn/open", {"agent": AGENT})
                shared = await tool(client, bare["turnId"], "channel_publish", {"channelId": "general", "content": "x"})
                assert shared["isError"] is True and shared["reason"] == "ambiguous"
                text = shared["content"][0]["text"]
                assert "- a:general" in text and "- b:general" in text and "Nothing was sent." in text
                assert {(c["serverId"], c["channelId"]) for c in shared["structuredContent"]["candidates"]} == {
                    ("a", "general"), ("b", "general")}

                qualified = await tool(client, bare["turnId"], "channel_publish", {"channelId": "a:general", "content": "q"})
                assert qualified["structuredContent"]["serverId"] == "a"
                # A serverId beside a channelId is that exact pair (the schema has no serverId).
                pair = await tool(client, bare["turnId"], "channel_publish",
                                  {"channelId": "general", "serverId": "a", "content": "pair"})
                assert pair["structuredContent"]["serverId"] == "a"
                # No channelId: the default, on the server whose message set it, in its thread.
                default = await tool(client, bare["turnId"], "channel_publish", {"content": "default", "channelId": ""})
                assert default["structuredContent"]["serverId"] == "b"
                # serverId alone: the default's id on that server.
                alone = await tool(client, bare["turnId"], "channel_publish", {"content": "alone", "serverId": "a"})
                assert (alone["structuredContent"]["serverId"], alone["structuredContent"]["channelId"]) == ("a", "general")
                assert alone["isError"] is False

                b_threads = [e["params"].get("threadId") for e in await servers["b"].recorded("channels/publish")]
                assert b_threads == [None, "th-1"]
                assert await published(servers["a"]) == [("general", "q"), ("general", "pair"), ("general", "alone")]
                assert await published(servers["b"]) == [("general", "own"), ("general", "default")]

                # b's connection ends: its channels go; the default keeps its ref, not its message.
                a_before = len(await published(servers["a"]))
                await servers["b"].disconnect()
                await wait_until(lambda: not daemon.router.registry.is_registered(B_GENERAL), timeout=10)
                kept = daemon.channel_tools.defaults.get(AGENT)
                assert kept is not None and kept.ref == B_GENERAL and kept.message_id is None and kept.thread_id is None
                third = await client.call("turn/open", {"agent": AGENT})
                gone = await tool(client, third["turnId"], "channel_publish", {"content": "lost?"})
                assert gone["isError"] is True and gone["reason"] == "default-gone"
                gone_text = gone["content"][0]["text"]
                assert "b:general" in gone_text and '"b"' in gone_text and "Nothing was sent." in gone_text
                assert "channel_list" not in gone_text  # no advice leading to a's general
                # Nothing of it reached a.
                assert len(await published(servers["a"])) == a_before
                await client.call("turn/close", {"turnId": third["turnId"], "outcome": "completed"})


async def test_a_named_agent_must_name_its_channel_from_a_turn_and_from_a_script(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path) as (daemon, servers):
            async with host(daemon, {"name": AGENT, "proseRouting": "named"}) as client:
                first = await woken_turn(client, servers["b"])
                spec = next(s for s in first["tools"] if s["name"] == "channel_publish")
                assert "channelId" in spec["inputSchema"]["required"]
                assert "nothing is sent to a default channel" in spec["description"]
                second = await client.call("turn/open", {"agent": AGENT})
                for arguments, caller in (
                    ({"content": "x"}, None),
                    ({"content": "x", "channelId": ""}, None),
                    ({"content": "x", "serverId": "b"}, None),
                    ({"content": "x", "serverId": "b"}, first["turnId"]),  # a script of an earlier turn
                ):
                    refused = await tool(client, second["turnId"], "channel_publish", arguments, caller=caller)
                    assert refused["isError"] is True and refused["reason"] == "channel-required"
                    assert refused["content"][0]["text"] == (
                        "Nothing was posted: channel_publish needs a channelId, since nothing is sent to a"
                        " default channel. channel_list shows the channel ids."
                    )
                named = await tool(client, second["turnId"], "channel_publish", {"content": "hi", "channelId": "b:general"})
                assert named["isError"] is False
            assert await published(servers["a"]) == []
            assert await published(servers["b"]) == [("general", "hi")]


# ---------------------------------------------------------------------- calls outside the turn


@ORDERS
async def test_a_script_of_an_earlier_turn_takes_moves_and_engages_nothing(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, first) as (daemon, servers):
            async with host(daemon) as client:
                earlier = await woken_turn(client, servers["b"])
                later = await client.call("turn/open", {"agent": AGENT, "channel": "a:general"})
                run = daemon.turns.run_of(later["turnId"])
                routing = run.turn.routing
                before = (routing.trigger, routing.locus, routing.was_in, routing.engaged)

                # The earlier turn's own channel is not the script's: "general" is two channels.
                shared = await tool(client, later["turnId"], "channel_open", {"channelId": "general"}, caller=earlier["turnId"])
                assert shared["reason"] == "ambiguous"
                opened = await tool(client, later["turnId"], "channel_open", {"channelId": "general", "serverId": "b"},
                                    caller=earlier["turnId"])
                assert opened["isError"] is False and opened["structuredContent"]["serverId"] == "b"
                assert opened["structuredContent"]["speechTarget"] is False
                sent = await tool(client, later["turnId"], "channel_publish", {"channelId": "b:general", "content": "from script"},
                                  caller=earlier["turnId"])
                assert sent["isError"] is False
                # The later turn moved nowhere and engaged nothing.
                assert (routing.trigger, routing.locus, routing.was_in, routing.engaged) == before
                assert run.explicit_send_rounds == set()

                # The same calls inside the later turn: its own channel is a's general.
                own = await tool(client, later["turnId"], "channel_publish", {"channelId": "general", "content": "inside"})
                assert own["structuredContent"]["serverId"] == "a"
                assert routing.engaged == (A_GENERAL,)
                moved = await tool(client, later["turnId"], "channel_open", {"channelId": "b:general"})
                assert moved["structuredContent"]["speechTarget"] is True
                assert routing.was_in == (A_GENERAL, B_GENERAL) and routing.locus == B_GENERAL
                # The turn's channels with that id are now on two servers: "general" means neither.
                neither = await tool(client, later["turnId"], "channel_publish", {"channelId": "general", "content": "?"})
                assert neither["reason"] == "ambiguous"
                await client.call("turn/close", {"turnId": later["turnId"], "outcome": "completed"})
            assert await published(servers["b"]) == [("general", "from script")]
            assert await published(servers["a"]) == [("general", "inside")]


async def test_between_turns_an_open_sets_no_trigger(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path) as (daemon, servers):
            async with host(daemon) as client:
                earlier = await woken_turn(client, servers["b"])
                await client.call("turn/close", {"turnId": earlier["turnId"], "outcome": "completed"})
                later = await client.call("turn/open", {"agent": AGENT})
                result = await tool(client, later["turnId"], "channel_open", {"channelId": "a:general"}, caller=earlier["turnId"])
                assert result["isError"] is False
                assert "outside your current turn" in result["content"][0]["text"]
                routing = daemon.turns.run_of(later["turnId"]).turn.routing
                assert routing.trigger is None and routing.locus is None and routing.was_in == ()


# ---------------------------------------------------------------------- open, close, decline, list


@ORDERS
async def test_channel_open_moves_the_turn_and_a_withdrawn_own_channel_is_refused(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, first) as (daemon, servers):
            async with host(daemon) as client:
                turn = await woken_turn(client, servers["b"])
                tid = turn["turnId"]
                routing = daemon.turns.run_of(tid).turn.routing
                kept = await tool(client, tid, "channel_open",
                                  {"channelId": "general", "serverId": "a", "setSpeechTarget": False, "backscroll": 5})
                assert kept["isError"] is False and kept["structuredContent"]["serverId"] == "a"
                assert routing.locus == B_GENERAL and routing.was_in == (B_GENERAL, A_GENERAL)
                [a_open] = await servers["a"].recorded("channels/open")
                assert a_open["params"] == {"channelId": "general", "history": {"limit": 5}}
                await client.call("turn/close", {"turnId": tid, "outcome": "completed"})

                # A turn that was only in b's general: once b withdraws it, "general" is refused,
                # never read as a's.
                second = await woken_turn(client, servers["b"])
                await servers["b"].withdraw(["general"])
                await wait_until(lambda: not daemon.router.registry.is_registered(B_GENERAL), timeout=10)
                for name in ("channel_open", "channel_close", "channel_decline", "channel_publish"):
                    refused = await tool(client, second["turnId"], name, {"channelId": "general", "content": "x"})
                    assert refused["isError"] is True and refused["reason"] == "own-channel-withdrawn", name
                    assert 'Nothing can reach it until server "b" registers it again.' in refused["content"][0]["text"]
                await client.call("turn/close", {"turnId": second["turnId"], "outcome": "completed"})
            assert len(await servers["a"].recorded("channels/open")) == 1
            assert await servers["a"].recorded("channels/close") == []
            assert await published(servers["a"]) == []
            assert daemon.journal.declines() == []


@ORDERS
async def test_channel_close_stops_typing_on_its_own_channel_only(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, first) as (daemon, servers):
            daemon.turns.typing_interval = 0.2
            async with host(daemon) as client:
                turn = await woken_turn(client, servers["b"])
                tid = turn["turnId"]
                await wait_until(lambda: daemon.turns.run_of(tid).typing_sent is not None, timeout=10)
                other = await tool(client, tid, "channel_close", {"channelId": "a:general"})
                assert other["isError"] is False and other["structuredContent"] == {
                    "serverId": "a", "channelId": "general", "shown": "a:general", "open": False}
                assert daemon.turns.run_of(tid).turn.routing.typing_channel == B_GENERAL
                assert not any(e["params"].get("op") == "stop" for e in await servers["b"].recorded("channels/typing"))
                own = await tool(client, tid, "channel_close", {"channelId": "general"})
                assert own["structuredContent"]["serverId"] == "b"
                ops = [e["params"].get("op") for e in await servers["b"].recorded("channels/typing")]
                assert ops[-1] == "stop"
                assert not daemon.router.registry.get(B_GENERAL).open
                assert not daemon.router.registry.get(A_GENERAL).open
                await client.call("turn/close", {"turnId": tid, "outcome": "completed"})
            assert [e["params"] for e in await servers["a"].recorded("channels/close")] == [{"channelId": "general"}]
            assert [e["params"] for e in await servers["b"].recorded("channels/close")] == [{"channelId": "general"}]
            assert await servers["a"].recorded("channels/typing") == []


@ORDERS
async def test_channel_decline_is_durable_acknowledges_and_shows_in_channel_list(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, first) as (daemon, servers):
            async with host(daemon) as client:
                turn = await woken_turn(client, servers["b"])
                default = daemon.channel_tools.defaults.get(AGENT)
                assert default is not None and default.ref == B_GENERAL and default.message_id
                declined = await tool(client, turn["turnId"], "channel_decline", {"channelId": "general", "acknowledge": "👋"})
                assert declined["isError"] is False
                assert declined["structuredContent"]["serverId"] == "b" and declined["structuredContent"]["acknowledged"] is True
                [ack] = await servers["b"].recorded("channels/acknowledge")
                assert ack["kind"] == "request"
                assert ack["params"] == {"channelId": "general", "messageId": default.message_id, "intent": "seen-not-opening", "value": "👋"}
                assert await servers["a"].recorded("channels/acknowledge") == []

                listed = await tool(client, turn["turnId"], "channel_list", {})
                rows = {(r["serverId"], r["channelId"]): r for r in listed["structuredContent"]["channels"]}
                assert rows[("b", "general")]["desired"] == "declined" and rows[("a", "general")]["desired"] is None
                assert rows[("a", "general")]["name"] == "a:general" and rows[("b", "general")]["name"] == "b:general"
                assert rows[("a", "general")]["open"] is True and rows[("a", "general")]["direction"] == "bidirectional"
                assert "b:general" in listed["content"][0]["text"]
                await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
            assert daemon.journal.declines() == [(AGENT, "b", "general")]
            # Durable: a fresh reader of the same journal reads it back.
            assert ChannelLifecycle(daemon.router, daemon.links, daemon.journal).desired.decisions() == {(AGENT, B_GENERAL): "declined"}


@ORDERS
async def test_desired_state_and_declines_are_each_agents_own(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, first) as (daemon, _servers):
            async with host(daemon) as client:
                await client.hello("test-host", [AGENT, "bob"])

                async def in_turn(agent: str, *calls: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
                    turn = await client.call("turn/open", {"agent": agent})
                    results = [await tool(client, turn["turnId"], name, arguments) for name, arguments in calls]
                    await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
                    assert all(result["isError"] is False for result in results), results
                    return results

                async def desired(agent: str) -> dict[tuple[str, str], str | None]:
                    [listed] = await in_turn(agent, ("channel_list", {}))
                    return {(r["serverId"], r["channelId"]): r["desired"] for r in listed["structuredContent"]["channels"]}

                await in_turn(AGENT, ("channel_decline", {"channelId": "b:general"}))
                # ann's decline is ann's: bob sees nothing decided for b:general.
                assert (await desired("bob"))[("b", "general")] is None
                assert (await desired(AGENT))[("b", "general")] == "declined"
                # bob opening it is bob's decision: ann's decline stands, in the list and the journal.
                await in_turn("bob", ("channel_open", {"channelId": "b:general", "setSpeechTarget": False}))
                assert (await desired("bob"))[("b", "general")] == "open"
                assert (await desired(AGENT))[("b", "general")] == "declined"
                assert daemon.journal.declines() == [(AGENT, "b", "general")]
                # ann closes it: her close replaces her decline, in the journal too; then she opens it.
                await in_turn(AGENT, ("channel_close", {"channelId": "b:general"}))
                assert (await desired(AGENT))[("b", "general")] == "closed"
                assert daemon.journal.declines() == []
                assert (AGENT, "b", "general", "closed") in daemon.journal.channel_decisions()
                await in_turn(AGENT, ("channel_open", {"channelId": "b:general", "setSpeechTarget": False}))
                assert (AGENT, "b", "general", "open") in daemon.journal.channel_decisions()
                assert (await desired(AGENT))[("b", "general")] == "open"
                # bob's decline of a:general is durable and his alone.
                await in_turn("bob", ("channel_decline", {"channelId": "a:general"}))
                assert (await desired(AGENT))[("a", "general")] is None
            assert daemon.journal.declines() == [("bob", "a", "general")]
            fresh = ChannelLifecycle(daemon.router, daemon.links, daemon.journal).desired.decisions()
            assert fresh == {("bob", A_GENERAL): "declined", ("bob", B_GENERAL): "open", (AGENT, B_GENERAL): "open"}


async def test_refusals_say_what_was_not_done_and_empty_strings_are_not_given(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path) as (daemon, _servers):
            async with host(daemon) as client:
                turn = await client.call("turn/open", {"agent": AGENT})
                tid = turn["turnId"]
                nothing = await tool(client, tid, "channel_open", {"channelId": "", "serverId": ""})
                assert nothing["reason"] == "no-name" and "Nothing was opened." in nothing["content"][0]["text"]
                elsewhere = await tool(client, tid, "channel_close", {"channelId": "general", "serverId": "c"})
                assert elsewhere["reason"] == "not-on-server" and "Nothing was closed." in elsewhere["content"][0]["text"]
                empty = await tool(client, tid, "channel_publish", {"channelId": "a:general", "content": "  "})
                assert empty["reason"] == "no-content"
                no_default = await tool(client, tid, "channel_publish", {"content": "hi"})
                assert no_default["reason"] == "no-default" and "Nothing was sent." in no_default["content"][0]["text"]
                await client.call("turn/close", {"turnId": tid, "outcome": "completed"})

                # The schemas don't change because an id is shared (or stops being shared).
                mine = [spec for spec in turn["tools"] if spec["name"].startswith("channel_")]
                await _servers["b"].withdraw(["general"])
                await wait_until(lambda: not daemon.router.registry.is_registered(B_GENERAL), timeout=10)
                again = await client.call("turn/open", {"agent": AGENT})
                assert [spec for spec in again["tools"] if spec["name"].startswith("channel_")] == mine
                properties = {spec["name"]: set(spec["inputSchema"]["properties"]) for spec in mine}
                assert properties == {
                    "channel_list": set(),
                    "channel_open": {"channelId", "serverId", "backscroll", "beforeMessageId", "setSpeechTarget", "threadId"},
                    "channel_close": {"channelId", "serverId"},
                    "channel_decline": {"channelId", "serverId", "acknowledge", "messageId"},
                    "channel_publish": {"channelId", "threadId", "content", "text"},
                }
                await client.call("turn/close", {"turnId": again["turnId"], "outcome": "completed"})


@ORDERS
async def test_open_close_and_decline_refuse_a_tuned_out_channel_saying_how_it_ends(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, first) as (daemon, servers):
            async with host(daemon) as client:
                turn = await woken_turn(client, servers["b"])
                tid = turn["turnId"]
                entered = await tool(client, tid, "tune_out", {"channelId": "general", "duration": 600})
                assert entered["isError"] is False and entered["structuredContent"]["serverId"] == "b"
                for name, not_done in (("channel_open", "Nothing was opened."), ("channel_close", "Nothing was closed."),
                                       ("channel_decline", "Nothing was declined.")):
                    refused = await tool(client, tid, name, {"channelId": "general"})
                    assert refused["isError"] is True and refused["reason"] == "tuned-out", name
                    text = refused["content"][0]["text"]
                    assert not_done in text and "The tune-out ends" in text
                    assert refused["structuredContent"]["serverId"] == "b"
                # a's general, the same id on another server, is not tuned out.
                other = await tool(client, tid, "channel_close", {"channelId": "a:general"})
                assert other["isError"] is False
                await client.call("turn/close", {"turnId": tid, "outcome": "completed"})
            assert await servers["b"].recorded("channels/open") == []
            assert await servers["b"].recorded("channels/close") == []
            assert daemon.journal.declines() == []


# ---------------------------------------------------------------------- a call after its turn


@ORDERS
async def test_a_call_after_its_turn_ended_is_taken_and_reads_no_turns_channels(tmp_path: Path, first: str) -> None:
    """A script its turn left running still calls tools: the call is taken, with no turn's
    channels, so the turn's own ``general`` (b's) no longer settles the shared name."""
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, first) as (daemon, servers):
            async with host(daemon) as client:
                turn = await woken_turn(client, servers["b"])
                inside = await tool(client, turn["turnId"], "channel_publish", {"channelId": "general", "content": "in turn"})
                assert not inside["isError"] and inside["structuredContent"]["serverId"] == "b"
                await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
                assert daemon.turns.run_of(turn["turnId"]) is None
                shared = await tool(client, turn["turnId"], "channel_publish", {"channelId": "general", "content": "after"})
                assert shared["isError"] and shared["reason"] == "ambiguous"
                named = await tool(client, turn["turnId"], "channel_publish", {"channelId": "b:general", "content": "after, by ref"})
                assert not named["isError"] and named["structuredContent"]["serverId"] == "b"
                # A turn the daemon never had is still refused.
                with pytest.raises(RpcError) as unknown:
                    await tool(client, "t-0-never", "channel_publish", {"channelId": "b:general", "content": "x"})
                assert unknown.value.code == -32050
            assert await published(servers["b"]) == [("general", "in turn"), ("general", "after, by ref")]
            assert await published(servers["a"]) == []


@ORDERS
async def test_a_publish_result_names_the_channel_as_it_is_picked_when_the_answer_comes(tmp_path: Path, first: str) -> None:
    """``lounge`` is a's alone when the publish goes out; b registers one too before a answers:
    the result names a's channel by what picks it then (``a:lounge``), not the stale ``lounge``."""
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, first) as (daemon, servers):
            await servers["a"].register([open_channel("lounge")])
            await wait_channel(daemon, "a", "lounge")
            await servers["a"].configure(publish={"delayMs": 800, "error": {"code": -32000, "message": "no"}})
            async with host(daemon) as client:
                turn = await woken_turn(client, servers["a"])
                async with trio.open_nursery() as nursery:
                    results: list[dict[str, Any]] = []

                    async def publish() -> None:
                        results.append(await tool(client, turn["turnId"], "channel_publish", {"channelId": "lounge", "content": "x"}))

                    nursery.start_soon(publish)
                    await wait_until(lambda: daemon.router.registry.get(ChannelRef("a", "lounge")) is not None, timeout=5)
                    await trio.sleep(0.2)  # the publish is out, waiting on a's answer
                    await servers["b"].register([open_channel("lounge")])
                    await wait_channel(daemon, "b", "lounge")
                [refused] = results
                assert refused["isError"] and refused["structuredContent"]["serverId"] == "a"
                assert "a:lounge" in refused["content"][0]["text"]

