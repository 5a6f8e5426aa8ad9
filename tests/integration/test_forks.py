"""Conversation forks end to end: real fixture processes, the daemon in-process, a host on the
socket that makes fork agents when asked (``fork/spawn``).

Servers ``a`` and ``b`` both register a DM ``dm-1`` and a channel ``general``, in both
registration orders, so "first registered" can't pass for the right answer; what each server
received is read from its own recordings.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from structlog.testing import capture_logs

from mcpl_router.client import RouterClient
from mcpl_router.client.serving import ForkSpawnRequest
from mcpl_router.daemon import Daemon
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.testing.control import FixtureProcess, wait_until
from mcpl_router.testing.descriptors import channel_descriptor

from .conftest import servers_and_daemon as shared_servers_and_daemon
from .conftest import wait_channel

pytestmark = pytest.mark.integration

AGENT = "kai"
ORDERS = pytest.mark.parametrize("first", ["a", "b"])
FORKING = {"name": AGENT, "conversations": {"forkPrefix": "kai-", "channel": {"trigger": "mention"}}}


def dm(channel_id: str) -> dict[str, Any]:
    return {**channel_descriptor(channel_id, "Ann", channel_type="dm"), "initiallyOpen": True}


def channel(channel_id: str) -> dict[str, Any]:
    return {**channel_descriptor(channel_id), "initiallyOpen": True}


@asynccontextmanager
async def servers_and_daemon(workdir: Path, first: str) -> AsyncIterator[tuple[Daemon, dict[str, FixtureProcess]]]:
    async with shared_servers_and_daemon(workdir, ("a", "b")) as (daemon, fixtures):
        for name in (first, "b" if first == "a" else "a"):
            await fixtures[name].register([dm("dm-1"), channel("general")])
            await wait_channel(daemon, name, "dm-1")
            await wait_channel(daemon, name, "general")
        yield daemon, fixtures


@asynccontextmanager
async def forking_host(daemon: Daemon, agent: Mapping[str, Any] = FORKING) -> AsyncIterator[tuple[RouterClient, list[ForkSpawnRequest]]]:
    """A host running ``kai``; asked to spawn, it declares the fork agent, then answers."""
    assert daemon.host_socket_path is not None
    spawned: list[ForkSpawnRequest] = []
    async with RouterClient.connect_unix(daemon.host_socket_path) as client:

        async def spawn(request: ForkSpawnRequest) -> None:
            await client.hello("test-host", [{"name": request.fork, "proseRouting": "locus"}])
            spawned.append(request)

        client.serve_fork_spawn(spawn)
        await client.hello("test-host", [dict(agent)])
        yield client, spawned


async def message(server: FixtureProcess, channel_id: str, text: str, *tags: str) -> None:
    await server.incoming([{"channelId": channel_id, "text": text, "tags": list(tags)}])


async def wake_of(client: RouterClient, agent: str) -> dict[str, Any]:
    while True:
        params = dict((await client.next_notification("wake")).params)
        if params["agent"] == agent:
            return params


async def published(server: FixtureProcess) -> list[tuple[str, str]]:
    return [(e["params"]["channelId"], e["params"]["content"][0]["text"]) for e in await server.recorded("channels/publish")]


async def reply(client: RouterClient, agent: str, seq: int, text: str) -> dict[str, Any]:
    turn = await client.call("turn/open", {"agent": agent, "wakes": [seq]})
    await client.call("turn/text", {"turnId": turn["turnId"], "round": 1, "delta": text})
    await client.call("turn/round", {"turnId": turn["turnId"], "round": 1})
    await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
    return turn


async def fork_for(daemon: Daemon, client: RouterClient, spawned: list[ForkSpawnRequest], server: FixtureProcess,
                   server_id: str, text: str) -> tuple[str, dict[str, Any]]:
    """A DM on ``server``'s dm-1 spawns a fork: its name and its first wake."""
    await message(server, "dm-1", text)
    name = f"kai-{server_id}-dm-1-1"
    await wait_until(lambda: any(r.fork == name for r in spawned), timeout=10)
    await wait_until(lambda: daemon.forks.home_of(name) == ChannelRef(server_id, "dm-1")
                     and daemon.forks.book.fork(name).state == "bound", timeout=10)
    return name, await wake_of(client, name)


@ORDERS
async def test_two_servers_dms_on_one_id_each_spawn_their_own_fork_whose_replies_reach_only_its_server(
    tmp_path: Path, first: str
) -> None:
    with trio.fail_after(60), capture_logs() as logs:
        async with servers_and_daemon(tmp_path, first) as (daemon, servers), forking_host(daemon) as (client, spawned):
            a_fork, a_wake = await fork_for(daemon, client, spawned, servers["a"], "a", "hi from a")
            b_fork, b_wake = await fork_for(daemon, client, spawned, servers["b"], "b", "hi from b")
            assert a_fork != b_fork
            assert [(r.agent, r.fork, r.home, r.template) for r in spawned] == [
                (AGENT, "kai-a-dm-1-1", {"serverId": "a", "channelId": "dm-1"}, AGENT),
                (AGENT, "kai-b-dm-1-1", {"serverId": "b", "channelId": "dm-1"}, AGENT),
            ]
            assert a_wake["channel"]["serverId"] == "a" and b_wake["channel"]["serverId"] == "b"
            # The trunk heard neither: each DM went to its own fork.
            assert daemon.journal.unacked_count(AGENT) == 0
            # A second DM on b joins b's fork, not a new one, and not a's.
            await message(servers["b"], "dm-1", "again from b")
            again = await wake_of(client, b_fork)
            assert again["channel"] == b_wake["channel"] and len(spawned) == 2
            # A fork hears only its home: b's DMs woke a's fork not at all (its own policy is not asked).
            assert daemon.journal.unacked_count(a_fork) == 1 and daemon.journal.unacked_count(b_fork) == 2
            # Each fork's reply goes out through its own server only.
            turn = await reply(client, b_fork, b_wake["seq"], "b's fork answers")
            assert turn["channel"]["serverId"] == "b"
            await reply(client, a_fork, a_wake["seq"], "a's fork answers")
            assert await published(servers["b"]) == [("dm-1", "b's fork answers")]
            assert await published(servers["a"]) == [("dm-1", "a's fork answers")]
            # The counters are journaled: both bindings at generation 1.
            await daemon.journal.flush()
            assert sorted(daemon.journal.fork_generations()) == [(AGENT, "a", "dm-1", 1), (AGENT, "b", "dm-1", 1)]
    traces = [(e["event"], e["fork"], e["server"]) for e in logs if str(e.get("event", "")).startswith("fork.")]
    assert ("fork.spawning", "kai-b-dm-1-1", "b") in traces and ("fork.bound", "kai-b-dm-1-1", "b") in traces
    assert ("fork.spawning", "kai-a-dm-1-1", "a") in traces and ("fork.bound", "kai-a-dm-1-1", "a") in traces


@ORDERS
async def test_a_channel_message_forks_only_on_a_mention_and_unaddressed_ones_wake_the_trunk(tmp_path: Path, first: str) -> None:
    agent = {**FORKING, "wake": {"channels": ["general"]}}
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, first) as (daemon, servers), forking_host(daemon, agent) as (client, spawned):
            await message(servers["b"], "general", "ambient")
            trunk = await wake_of(client, AGENT)
            assert trunk["channel"]["serverId"] == "b" and spawned == []
            await message(servers["b"], "general", "hey kai", "chat:mention")
            fork = await wake_of(client, "kai-b-general-1")
            assert fork["channel"] == {"serverId": "b", "channelId": "general", "shown": "b:general"}
            assert [r.home for r in spawned] == [{"serverId": "b", "channelId": "general"}]
            # a's general (same id) is another binding: unaddressed there wakes the trunk.
            await message(servers["a"], "general", "ambient on a")
            trunk = await wake_of(client, AGENT)
            assert trunk["channel"]["serverId"] == "a"


@ORDERS
async def test_a_spawn_the_host_refuses_hands_its_message_to_the_trunk_and_the_next_tries_a_newer_generation(
    tmp_path: Path, first: str
) -> None:
    """The message journaled for the fork is not left owed to an agent that never came: the
    trunk is woken for it (on b, the server it came from), and can answer it there."""
    with trio.fail_after(60), capture_logs() as logs:
        async with servers_and_daemon(tmp_path, first) as (daemon, servers):
            assert daemon.host_socket_path is not None
            async with RouterClient.connect_unix(daemon.host_socket_path) as client:
                await client.hello("test-host", [FORKING])  # serves no fork/spawn: -32601
                await message(servers["b"], "dm-1", "one")
                handed = await wake_of(client, AGENT)
                assert handed["channel"] == {"serverId": "b", "channelId": "dm-1", "shown": "b:dm-1"}
                assert handed["messages"][-1]["content"][0]["text"] == "one"
                assert daemon.forks.book.binding(AGENT, ChannelRef("b", "dm-1")) is None
                assert daemon.journal.unacked_count("kai-b-dm-1-1") == 0 and daemon.journal.unacked_count(AGENT) == 1
                assert daemon.journal.delivery_now(handed["seq"], "kai-b-dm-1-1") is None
                await reply(client, AGENT, handed["seq"], "the trunk answers")
                assert await published(servers["b"]) == [("dm-1", "the trunk answers")]
                assert await published(servers["a"]) == []
                await message(servers["b"], "dm-1", "two")
                await wait_until(lambda: daemon.forks.book.generation(AGENT, ChannelRef("b", "dm-1")) == 2, timeout=10)
                second = await wake_of(client, AGENT)  # that spawn fails too: the trunk again
                assert second["messages"][-1]["content"][0]["text"] == "two"
    failed = [e for e in logs if e.get("event") == "fork.spawn.failed"]
    assert failed[0]["server"] == "b" and failed[0]["fork"] == "kai-b-dm-1-1" and failed[0]["handed_to_trunk"] == 1


# -- the fence -------------------------------------------------------------------------------------


async def tool(client: RouterClient, turn_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return await client.call("turn/tool", {"turnId": turn_id, "callId": f"c-{name}", "name": name, "arguments": arguments})


async def fork_turn_on_b_general(daemon: Daemon, client: RouterClient, servers: dict[str, FixtureProcess]) -> tuple[str, str]:
    """A mention on b's general spawns kai-b-general-1; the turn its host opens on that wake."""
    await message(servers["b"], "general", "hey kai", "chat:mention")
    fork = "kai-b-general-1"
    wake = await wake_of(client, fork)
    await wait_until(lambda: daemon.forks.book.fork(fork) is not None and daemon.forks.book.fork(fork).state == "bound", timeout=10)
    turn = await client.call("turn/open", {"agent": fork, "wakes": [wake["seq"]]})
    return fork, turn["turnId"]


@ORDERS
async def test_a_fork_homed_on_b_general_cannot_close_or_post_to_a_general_and_is_told_why(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, first) as (daemon, servers), forking_host(daemon) as (client, _):
            fork, tid = await fork_turn_on_b_general(daemon, client, servers)
            # By the qualified name, or with a's serverId: refused, naming its own channel.
            for arguments in ({"channelId": "a:general"}, {"channelId": "general", "serverId": "a"}):
                for name in ("channel_close", "channel_publish"):
                    refused = await tool(client, tid, name, {**arguments, "content": "leak"})
                    assert refused["isError"] and refused["reason"] == "fork-not-home", (name, arguments, refused)
                    assert "b:general" in refused["content"][0]["text"]
                    assert refused["structuredContent"]["serverId"] == "b"
                    # It quotes what was asked for, as given.
                    assert refused["structuredContent"]["asked"] == {"channelId": arguments["channelId"], "serverId": arguments.get("serverId")}
                    assert arguments["channelId"] in refused["content"][0]["text"]
            # A serverId alone must be the home's.
            refused = await tool(client, tid, "channel_publish", {"serverId": "a", "content": "leak"})
            assert refused["reason"] == "fork-not-home"
            # The home's qualified name with the home's serverId: that pair names no channel.
            alone = await tool(client, tid, "channel_publish", {"channelId": "b:general", "serverId": "b", "content": "x"})
            assert alone["reason"] == "fork-name-works-alone"
            # It opens nothing, and declines nothing but its home.
            assert (await tool(client, tid, "channel_open", {"channelId": "general"}))["reason"] == "fork-cannot-open"
            assert (await tool(client, tid, "channel_decline", {"channelId": "a:general"}))["reason"] == "fork-not-home"
            # By its home's id, and by its qualified name: its home, on b.
            posted = await tool(client, tid, "channel_publish", {"channelId": "general", "content": "home by id"})
            assert not posted["isError"] and posted["structuredContent"]["serverId"] == "b"
            posted = await tool(client, tid, "channel_publish", {"channelId": "b:general", "content": "home by name"})
            assert not posted["isError"] and posted["structuredContent"]["serverId"] == "b"
            posted = await tool(client, tid, "channel_publish", {"content": "home by default"})
            assert not posted["isError"] and posted["structuredContent"]["serverId"] == "b"
            closed = await tool(client, tid, "channel_close", {"channelId": "general"})
            assert not closed["isError"] and closed["structuredContent"]["serverId"] == "b"
            await client.call("turn/close", {"turnId": tid, "outcome": "completed"})
            assert fork == "kai-b-general-1"
            assert await published(servers["a"]) == []
            assert await servers["a"].recorded("channels/close") == []
            assert await servers["a"].recorded("channels/open") == []
            assert [text for _, text in await published(servers["b"])] == ["home by id", "home by name", "home by default"]
            assert [e["params"] for e in await servers["b"].recorded("channels/close")] == [{"channelId": "general"}]


@ORDERS
async def test_with_b_gone_a_forks_home_is_refused_as_gone_with_nothing_posted_or_closed(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, first) as (daemon, servers), forking_host(daemon) as (client, _):
            _, tid = await fork_turn_on_b_general(daemon, client, servers)
            await servers["b"].withdraw(["general"])
            await wait_until(lambda: not daemon.router.registry.is_registered(ChannelRef("b", "general")), timeout=10)
            for name, arguments in (("channel_publish", {"channelId": "general", "content": "x"}),
                                    ("channel_publish", {"content": "x"}), ("channel_close", {"channelId": "general"})):
                gone = await tool(client, tid, name, arguments)
                assert gone["isError"] and gone["reason"] == "fork-home-gone", (name, gone)
                text = gone["content"][0]["text"]
                assert 'no longer registered by server "b"' in text and "until its server registers it again" in text
            # b's connection gone as well (not only the channel withdrawn): the same refusal.
            await servers["b"].disconnect()
            await wait_until(lambda: daemon.links["b"].state.value != "ready", timeout=10)
            gone = await tool(client, tid, "channel_publish", {"channelId": "general", "content": "x"})
            assert gone["isError"] and gone["reason"] == "fork-home-gone", gone
            await client.call("turn/close", {"turnId": tid, "outcome": "completed"})
            # a's general, with the same id, took nothing; nor did b.
            assert await published(servers["a"]) == [] and await servers["a"].recorded("channels/close") == []
            assert await published(servers["b"]) == [] and await servers["b"].recorded("channels/close") == []


# -- idle ------------------------------------------------------------------------------------------


async def test_an_idle_fork_gets_its_closure_prompt_and_is_released_and_traces_name_its_server(tmp_path: Path) -> None:
    agent = {"name": AGENT, "conversations": {"forkPrefix": "kai-", "idleTtl": 1, "closurePrompt": "Wrap up."}}
    with trio.fail_after(60), capture_logs() as logs:
        async with servers_and_daemon(tmp_path, "a") as (daemon, servers), forking_host(daemon, agent) as (client, spawned):
            fork, first = await fork_for(daemon, client, spawned, servers["b"], "b", "hi")
            await client.ack([first["seq"]])
            closing = await wake_of(client, fork)
            assert closing["reason"] == "fork/close" and closing["prompt"] == "Wrap up." and closing["seq"] == 0
            assert closing["channel"] == {"serverId": "b", "channelId": "dm-1"}
            assert closing["fork"] == {"agent": AGENT, "home": {"serverId": "b", "channelId": "dm-1"}, "generation": 1}
            assert daemon.forks.book.fork(fork) is None
            assert daemon.forks.home_of(fork) == ChannelRef("b", "dm-1")  # still fenced to its home
            # The next DM there spawns a newer generation.
            await message(servers["b"], "dm-1", "back again")
            await wait_until(lambda: any(r.fork == "kai-b-dm-1-2" for r in spawned), timeout=10)
    traces = [(e["event"], e["server"], e["channel"]) for e in logs if e.get("fork") == "kai-b-dm-1-1"]
    assert [event for event, _, _ in traces] == ["fork.spawning", "fork.bound", "fork.released"]
    assert {(server, channel) for _, server, channel in traces} == {("b", "dm-1")}


# -- forks and the wake gate -------------------------------------------------------------------------

DEBOUNCE = {"debounce": {"ms": 300}}
#: kai forks a channel on a mention and keeps every later message there (bind: always); its
#: wakes on any server's ``general`` are debounced, so they come as batches.
FORKING_GATED = {
    "name": AGENT,
    "wake": {"channels": ["general"]},
    "conversations": {"forkPrefix": "kai-", "channel": {"trigger": "mention", "bind": "always"}},
    "wakeGate": {"rules": [{"channels": ["*:general"], "behaviour": DEBOUNCE}]},
}


@asynccontextmanager
async def gated_forking_host(daemon: Daemon) -> AsyncIterator[tuple[RouterClient, list[ForkSpawnRequest]]]:
    """A host running the gated ``kai``; each fork it makes debounces its own wakes too."""
    assert daemon.host_socket_path is not None
    spawned: list[ForkSpawnRequest] = []
    async with RouterClient.connect_unix(daemon.host_socket_path) as client:

        async def spawn(request: ForkSpawnRequest) -> None:
            await client.hello("test-host", [{"name": request.fork, "proseRouting": "locus",
                                              "wakeGate": {"rules": [], "default": DEBOUNCE}}])
            spawned.append(request)

        client.serve_fork_spawn(spawn)
        await client.hello("test-host", [FORKING_GATED])
        yield client, spawned


async def ambient(server: FixtureProcess, text: str) -> None:
    await message(server, "general", text)


def texts(wake: Mapping[str, Any]) -> list[str]:
    return [m["content"][0]["text"] for m in wake["messages"]]


async def wakes_until(client: RouterClient, agents: set[str], *, quiet: float = 1.0) -> list[dict[str, Any]]:
    """Every wake until one has come for each of ``agents``, then any more within ``quiet`` seconds."""
    got: list[dict[str, Any]] = []
    with trio.fail_after(10):
        while not agents <= {w["agent"] for w in got}:
            got.append(dict((await client.next_notification("wake")).params))
    with trio.move_on_after(quiet):
        while True:
            got.append(dict((await client.next_notification("wake")).params))
    return got


@ORDERS
async def test_a_batch_routed_to_b_general_never_wakes_the_fork_homed_on_a_general_and_a_general_batches_go_to_that_fork(
    tmp_path: Path, first: str
) -> None:
    """kai (wake on ``general``; channels fork on a mention, bind always; ``*:general`` debounced)
    has a fork homed on ``a:general``. Unaddressed messages on b's ``general`` fork nothing: they
    are the **trunk**'s, and come to kai as one batch with ``routeServerId: "b"``; the fork on
    a's ``general`` (same id) hears none of it. Conversely messages on a's ``general`` are the
    fork's (its own gate debounces them): one batch to the fork, ``routeServerId: "a"``, none to
    the trunk, even interleaved with b's in one burst."""
    fork = "kai-a-general-1"
    a_general = {"serverId": "a", "channelId": "general", "shown": "a:general"}
    b_general = {"serverId": "b", "channelId": "general", "shown": "b:general"}
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, first) as (daemon, servers), gated_forking_host(daemon) as (client, spawned):
            # A mention on a's general spawns the fork homed there; its first wake is its own batch.
            await message(servers["a"], "general", "hey kai", "chat:mention")
            [opening] = await wakes_until(client, {fork})
            await wait_until(lambda: daemon.forks.book.fork(fork) is not None and daemon.forks.book.fork(fork).state == "bound",
                             timeout=10)
            assert [r.home for r in spawned] == [{"serverId": "a", "channelId": "general"}]
            assert daemon.forks.home_of(fork) == ChannelRef("a", "general")
            assert opening["agent"] == fork and opening["routeServerId"] == "a" and texts(opening) == ["hey kai"]
            await client.ack(opening["seqs"], agent=fork)
            assert daemon.journal.unacked_count(fork) == 0 and daemon.journal.unacked_count(AGENT) == 0

            # b's general: a batch routed to b:general, the trunk's; nothing for a's fork.
            await ambient(servers["b"], "b one")
            await ambient(servers["b"], "b two")
            got = await wakes_until(client, {AGENT})
            assert [w["agent"] for w in got] == [AGENT], got
            [batch] = got
            assert batch["reason"] == "batch" and batch["gate"]["cause"] == "debounce"
            assert batch["routeServerId"] == "b" and batch["routeChannel"] == b_general and batch["channel"] == b_general
            assert [row["serverId"] for row in batch["conversations"]] == ["b"] and texts(batch) == ["b one", "b two"]
            assert daemon.journal.unacked_count(fork) == 0 and daemon.journal.unacked_count(AGENT) == 2
            assert spawned[1:] == []  # unaddressed on b: no fork of b's general
            turn = await client.call("turn/open", {"agent": AGENT, "wakes": batch["seqs"]})
            assert turn["channel"]["serverId"] == "b"
            await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
            await client.ack(batch["seqs"], agent=AGENT)

            # The converse, interleaved in one burst: a's general goes to its fork, b's to the trunk.
            await ambient(servers["a"], "a one")
            await ambient(servers["b"], "b three")
            await ambient(servers["a"], "a two")
            await ambient(servers["b"], "b four")
            got = await wakes_until(client, {AGENT, fork})
            assert sorted(w["agent"] for w in got) == sorted([AGENT, fork]), got
            to_fork = next(w for w in got if w["agent"] == fork)
            to_trunk = next(w for w in got if w["agent"] == AGENT)
            assert to_fork["reason"] == "batch" and to_fork["routeServerId"] == "a" and to_fork["routeChannel"] == a_general
            assert [row["serverId"] for row in to_fork["conversations"]] == ["a"] and texts(to_fork) == ["a one", "a two"]
            assert to_trunk["reason"] == "batch" and to_trunk["routeServerId"] == "b" and to_trunk["routeChannel"] == b_general
            assert [row["serverId"] for row in to_trunk["conversations"]] == ["b"] and texts(to_trunk) == ["b three", "b four"]
            assert daemon.journal.unacked_count(fork) == 2 and daemon.journal.unacked_count(AGENT) == 2
            # A turn the fork opens on its batch is a's; its reply goes out through a alone.
            turn = await reply_on(client, fork, to_fork["seqs"], "fork answers")
            assert turn["channel"]["serverId"] == "a"
            assert await published(servers["a"]) == [("general", "fork answers")]
            assert await published(servers["b"]) == []


async def reply_on(client: RouterClient, agent: str, seqs: list[int], text: str) -> dict[str, Any]:
    """A turn on ``seqs`` that says ``text``; the turn."""
    turn = await client.call("turn/open", {"agent": agent, "wakes": seqs})
    await client.call("turn/text", {"turnId": turn["turnId"], "round": 1, "delta": text})
    await client.call("turn/round", {"turnId": turn["turnId"], "round": 1})
    await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
    return turn


@ORDERS
async def test_a_trunks_batch_held_before_its_fork_took_the_channel_never_routes_there(tmp_path: Path, first: str) -> None:
    """An unaddressed message on a's general is held in the trunk's debounce; a mention there
    spawns the fork homed on a:general before the batch falls due. The trunk's batch carries the
    held message but no route, and a turn the trunk opens on it has no channel: the trunk never
    speaks into its fork's conversation (seed 000: mayTakeGateRoute)."""
    fork = "kai-a-general-1"
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, first) as (daemon, servers), gated_forking_host(daemon) as (client, spawned):
            await ambient(servers["a"], "before the fork")
            await wait_until(lambda: daemon.gates.statistics()["held"].get(AGENT) == 1, timeout=10)
            await message(servers["a"], "general", "hey kai", "chat:mention")
            got = await wakes_until(client, {AGENT, fork})
            [batch] = [w for w in got if w["agent"] == AGENT]
            assert texts(batch) == ["before the fork"]
            assert batch["routeChannel"] is None and batch["channel"] is None and batch["routeServerId"] is None
            turn = await client.call("turn/open", {"agent": AGENT, "wakes": batch["seqs"]})
            assert turn["channel"] is None
            await client.call("turn/text", {"turnId": turn["turnId"], "round": 1, "delta": "trunk words"})
            await client.call("turn/round", {"turnId": turn["turnId"], "round": 1})
            closed = await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
            assert closed["receipt"]["delivered"] == [] and len(closed["drafts"]) == 1
            # The fork, opened on no wake (as to answer its closure prompt), is in its home.
            own = await client.call("turn/open", {"agent": fork})
            assert own["channel"] == {"serverId": "a", "channelId": "general", "shown": "a:general"}
            await client.call("turn/text", {"turnId": own["turnId"], "round": 1, "delta": "fork words"})
            await client.call("turn/close", {"turnId": own["turnId"], "outcome": "completed"})
            assert await published(servers["a"]) == [("general", "fork words")]
            assert await published(servers["b"]) == []
            # Nor does the trunk's default point into the fork's home.
            assert daemon.channel_tools.defaults.get(AGENT) is None


@ORDERS
async def test_a_forks_context_takes_no_injection_namespaced_to_another_channel(tmp_path: Path, first: str) -> None:
    """A fork homed on b:dm-1: b's injection for its ``general`` (a channel b registers) is not
    the fork's; b's for ``dm-1`` (its home) and a module namespace (no channel) are; a's for
    ``dm-1`` (a's dm-1 is another channel with the home's id) is not."""
    injections = [
        {"namespace": "dm-1", "position": "beforeUser", "content": "home"},
        {"namespace": "general", "position": "beforeUser", "content": "another channel"},
        {"namespace": "project:state", "position": "beforeUser", "content": "module"},
    ]
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, first) as (daemon, servers), forking_host(daemon) as (client, spawned):
            for server in servers.values():
                await server.configure(before_inference={"injections": injections})
            fork, wake = await fork_for(daemon, client, spawned, servers["b"], "b", "hi from b")
            turn = await client.call("turn/open", {"agent": fork, "wakes": [wake["seq"]]})
            context = await client.call("turn/context", {"turnId": turn["turnId"]})
            got = [(i["serverId"], i["namespace"], i["content"]) for i in context["injections"]["beforeUser"]]
            await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
            # The trunk's own turn still takes everything.
            trunk = await client.call("turn/open", {"agent": AGENT})
            everything = await client.call("turn/context", {"turnId": trunk["turnId"]})
            await client.call("turn/close", {"turnId": trunk["turnId"], "outcome": "completed"})
    assert sorted(got) == [("a", "project:state", "module"), ("b", "dm-1", "home"), ("b", "project:state", "module")]
    assert len(everything["injections"]["beforeUser"]) == 6
