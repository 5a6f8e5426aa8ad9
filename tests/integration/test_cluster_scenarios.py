"""The routing scenarios of shared channel ids, driven through a cluster from outside (issue 29).

A host author's view: two ``mcpl-router run`` nodes on one PostgreSQL journal, fixture servers
``a`` and ``b`` that both register ``general`` (``a`` also ``lounge``, ``b`` also ``random``)
and ``c`` (``quiet``, keeping no subscriptions of its own), and a host on
:class:`FailoverClient` given both nodes' sockets, running agents in three prose modes (locus,
explicit, named). The same scenarios run on the holder, then on the node that took the links
over (after a ``kill -9``, and after a drain), and must come out as one daemon's would; what
the journal keeps (channel decisions, tune-outs, drafts, unacked wakes, host-declared agents)
must be there on the new holder. Every post and typing indicator is read from the fixture
servers' own recordings.

Candidates are compared as sets: they come in the channels' registration order, and which
server's ``general`` a node registers first is a race between its connections (it differs from
one node to the next, as from one restart of a single daemon to the next).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import ConnectionLost, FailoverClient, RouterClient, RpcError
from mcpl_router.client.wakes import WakeNotice
from mcpl_router.testing import postgres
from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import FAST_RECONNECT, DaemonProcess, daemon_process, daemon_serving

pytestmark = pytest.mark.integration

LEASE = 5.0
NODES = ("n1", "n2")
#: The host's agents, one per prose mode the scenarios read.
AGENTS: list[dict[str, Any]] = [
    {"name": "kai", "proseRouting": "locus"},
    {"name": "ann", "proseRouting": "explicit"},
    {"name": "nell", "proseRouting": "named"},
]
CHANNELS = {"a": ["general", "lounge"], "b": ["general", "random"], "c": ["quiet"]}
#: c keeps no subscriptions of its own, as discord-mcpl: a channel the host has not opened on
#: this connection registers closed and sends nothing.
SERVER_OPTIONS: dict[str, dict[str, Any]] = {"c": {"host_owns_subscriptions": True}}


def socket_of(workdir: Path, node: str) -> str:
    return str(workdir / "run" / f"{node}.sock")


def cluster_config(workdir: Path, servers: dict[str, FixtureProcess], dsn: str) -> Path:
    config = {
        "mcplServers": {name: {"url": server.listen_url, "reconnect": FAST_RECONNECT} for name, server in servers.items()},
        "host": {"unixSocket": str(workdir / "run" / "${MCPL_ROUTER_NODE}.sock"), "websocket": {"enabled": False}},
        "journal": {"backend": "postgres", "dsn": dsn, "path": str(workdir / "unused.sqlite3")},
        "cluster": {"node": "${MCPL_ROUTER_NODE}", "leaseTtl": LEASE},
        "health": {"enabled": True, "port": 0},
        "logging": {"level": "debug", "format": "json"},
    }
    path = workdir / "cluster.json"
    path.write_text(json.dumps(config))
    return path


async def serving(workdir: Path, node: str) -> bool:
    """Whether the node serves hosts itself (not forwarded, as a standby's socket is) with every
    server ready and every channel registered."""
    wanted = [(server_id, channel_id) for server_id, ids in CHANNELS.items() for channel_id in ids]
    return await daemon_serving(socket_of(workdir, node), servers=len(CHANNELS), channels=wanted, timeout=2, node=node)


class Cluster:
    def __init__(self, workdir: Path, config: Path, servers: dict[str, FixtureProcess], stack: AsyncExitStack) -> None:
        self.workdir = workdir
        self.config = config
        self.servers = servers
        self.stack = stack
        self.nodes: dict[str, DaemonProcess] = {}

    async def start(self, node: str) -> None:
        env = {**os.environ, "MCPL_ROUTER_NODE": node}
        self.nodes[node] = await self.stack.enter_async_context(daemon_process(self.config, self.workdir / f"{node}.log", env=env))
        await self.nodes[node].start()

    async def wait_serving(self, node: str, timeout: float = 30) -> None:
        async def up() -> bool:
            process = self.nodes[node].process
            if process is not None and process.poll() is not None:
                raise AssertionError(f"{node} exited ({process.returncode}): {self.log(node)[-2000:]}")
            return await serving(self.workdir, node)

        try:
            await wait_until(up, timeout=timeout, interval=0.05)
        except trio.TooSlowError:
            tail = "\n".join(self.log(node).splitlines()[-40:])
            raise AssertionError(f"{node} not serving; its log ends:\n{tail}") from None

    def sockets(self) -> list[str]:
        return [socket_of(self.workdir, node) for node in NODES]

    def log(self, node: str) -> str:
        return (self.workdir / f"{node}.log").read_text(errors="replace")


async def fixture_servers(stack: AsyncExitStack, workdir: Path) -> dict[str, FixtureProcess]:
    """Servers a, b and c as :data:`CHANNELS` says, each a process over TCP."""
    return {
        name: await stack.enter_async_context(
            FixtureProcess.start(transport="tcp", channels=ids, control_dir=workdir, server_name=name, **SERVER_OPTIONS.get(name, {}))
        )
        for name, ids in CHANNELS.items()
    }


@asynccontextmanager
async def cluster(workdir: Path, dsn: str) -> AsyncIterator[Cluster]:
    """Servers a, b and c, node n1 holding the links (every server ready), n2 a standby."""
    _stash.clear()
    async with AsyncExitStack() as stack:
        servers = await fixture_servers(stack, workdir)
        nodes = Cluster(workdir, cluster_config(workdir, servers, dsn), servers, stack)
        await nodes.start("n1")
        await nodes.wait_serving("n1")
        await nodes.start("n2")
        await wait_until(lambda: '"cluster.node.standby"' in nodes.log("n2"), timeout=20)
        yield nodes


# -- what the host does ------------------------------------------------------------------------


async def wakes_of(client: FailoverClient, text: str, agents: set[str], timeout: float = 15) -> dict[str, WakeNotice]:
    """The wakes for the message whose text is ``text``, one per agent in ``agents``."""
    found: dict[str, WakeNotice] = {}
    stash = _stash.setdefault(id(client), [])
    for wake in list(stash):
        if text in wake.message_text and wake.agent in agents:
            found[wake.agent] = wake
            stash.remove(wake)
    with trio.fail_after(timeout):
        while set(found) != agents:
            wake = await client.next_wake()
            if text in wake.message_text and wake.agent in agents:
                found[wake.agent] = wake
            else:
                stash.append(wake)
    return found


#: Wakes read while waiting for others, per client, for a later wakes_of.
_stash: dict[int, list[WakeNotice]] = {}


async def mention(server: FixtureProcess, channel: str, text: str) -> None:
    await server.incoming([{"channelId": channel, "text": text, "tags": ["chat:mention"]}])


async def posts(server: FixtureProcess) -> list[tuple[str, str]]:
    """(channel, text) of every publish the server got."""
    found = []
    for entry in await server.recorded("channels/publish"):
        params = entry["params"]
        content = params.get("content") or []
        text = "".join(block.get("text", "") for block in content if isinstance(block, dict))
        found.append((params["channelId"], text))
    return found


async def turn(
    client: FailoverClient, agent: str, rounds: list[str], *, wakes: list[int] | None = None, channel: Any = None,
    tools: Sequence[tuple[str, dict[str, Any]]] = (),
) -> dict[str, Any]:
    """One turn through the host API: opened (on wakes, or a channel), the tool calls made in
    it, each round's text (all but the last routed by turn/round), closed ``completed``."""
    params: dict[str, Any] = {"agent": agent, "wakes": wakes or []}
    if channel is not None:
        params["channel"] = channel
    opened = await client.call("turn/open", params)
    turn_id = opened["turnId"]
    results = []
    for index, (name, arguments) in enumerate(tools):
        results.append(await client.call("turn/tool", {"turnId": turn_id, "callId": f"c{index}", "name": name, "arguments": arguments}))
    routed = []
    for index, text in enumerate(rounds, start=1):
        await client.call("turn/text", {"turnId": turn_id, "round": index, "delta": text})
        if index < len(rounds):
            routed.append(await client.call("turn/round", {"turnId": turn_id, "round": index}))
    closed = await client.call("turn/close", {"turnId": turn_id, "outcome": "completed"})
    return {"opened": opened, "tools": results, "routed": routed, "closed": closed}


async def scenarios(nodes: Cluster, client: FailoverClient, tag: str) -> dict[str, Any]:
    """The seeds' routing scenarios, once, through the host API; what each came to, in a form
    that is the same on every node (a draft's id and the servers' registration order aside)."""
    a, b = nodes.servers["a"], nodes.servers["b"]
    seen: dict[str, Any] = {}
    # A bare shared name is refused with both candidates; a ref and a qualified name are one channel.
    refused = await client.call("channels/publish", {"agent": "kai", "channel": "general", "content": f"bare {tag}"})
    seen["publish bare"] = (refused["delivered"], refused.get("reason"), pairs(refused.get("candidates", [])))
    by_ref = await client.call("channels/publish", {"agent": "kai", "channel": {"serverId": "b", "channelId": "general"}, "content": f"ref {tag}"})
    seen["publish ref"] = (by_ref["delivered"], by_ref.get("serverId"), by_ref.get("shown"))
    qualified = await client.call("channels/publish", {"agent": "kai", "channel": "a:general", "content": f"qualified {tag}"})
    seen["publish qualified"] = (qualified["delivered"], qualified.get("serverId"), qualified.get("shown"))
    # Typing: a bare id fans out to each server's channel, a ref types there alone.
    fan = await client.call("channels/typing", {"channel": "general", "op": "start"})
    seen["typing bare"] = sorted((row["serverId"], row["sent"]) for row in fan["typing"])
    one = await client.call("channels/typing", {"channel": {"serverId": "a", "channelId": "general"}, "op": "stop"})
    seen["typing ref"] = sorted((row["serverId"], row["sent"]) for row in one["typing"])
    await client.call("channels/typing", {"channel": "general", "op": "stop"})
    # A message on b's general wakes every agent there, with its server.
    await mention(b, "general", f"hi all {tag}")
    woken = await wakes_of(client, f"hi all {tag}", {"kai", "ann", "nell"})
    seen["wakes"] = sorted((agent, w.channel.server_id, w.channel.shown) for agent, w in woken.items() if w.channel)
    # locus: the plain text goes back where the message came from.
    kai = await turn(client, "kai", [f"kai reply {tag}"], wakes=[woken["kai"].seq])
    seen["kai receipt"] = kai["closed"]["receipt"]["text"]
    # explicit: >>general within the turn is the turn's own channel (b's); >>a:general is a's.
    ann = await turn(client, "ann", [f">>general ann own {tag}", f">>a:general ann to a {tag}"], wakes=[woken["ann"].seq])
    seen["ann deliveries"] = sorted((d["serverId"], d["channelId"], d["outcome"]) for d in ann["closed"]["deliveries"])
    # named: nothing posted; the system line says so.
    nell = await turn(client, "nell", [f"nell thinks {tag}"], wakes=[woken["nell"].seq])
    seen["nell receipt"] = nell["closed"]["receipt"]["text"]
    seen["nell system"] = len(nell["opened"]["system"])
    for agent, wake in woken.items():
        await client.ack([wake.seq], agent=agent)
    # A shared bare target from a turn with no channel bounces, naming both; its draft resends by name.
    bounced = await turn(client, "ann", [f">>general bounced {tag}"], channel="general")
    seen["bounce channel"] = bounced["opened"]["channel"]
    [notice] = [n for n in bounced["closed"]["notices"] if "not delivered" in n]
    seen["bounce candidates"] = sorted(line for line in notice.splitlines() if line.startswith("- >>"))
    [draft] = bounced["closed"]["drafts"]
    seen["bounce draft"] = (draft["state"], draft["reason"])
    resent = await turn(client, "ann", [], channel={"serverId": "b", "channelId": "general"},
                        tools=[("drafts", {"action": "resend", "id": draft["id"], "channelId": "b:general"})])
    seen["resend"] = (resent["tools"][0].get("isError"), [(s["serverId"], s["outcome"]) for s in resent["tools"][0]["structuredContent"]["sent"]])
    # What reached each server, and nothing else.
    seen["a posts"] = [(channel, text.replace(tag, "#")) for channel, text in await posts(a) if tag in text]
    seen["b posts"] = [(channel, text.replace(tag, "#")) for channel, text in await posts(b) if tag in text]
    return seen


def pairs(refs: list[dict[str, str]]) -> list[tuple[str, str]]:
    return sorted((ref["serverId"], ref["channelId"]) for ref in refs)


#: What one daemon does with these scenarios (tests/integration/test_prose_modes.py and
#: test_host_publish.py show it on a single daemon): every node must do the same.
ONE_DAEMON: dict[str, Any] = {
    "publish bare": (False, "shared-id", [("a", "general"), ("b", "general")]),
    "publish ref": (True, "b", "b:general"),
    "publish qualified": (True, "a", "a:general"),
    "typing bare": [("a", True), ("b", True)],
    "typing ref": [("a", True)],
    "wakes": [("ann", "b", "b:general"), ("kai", "b", "b:general"), ("nell", "b", "b:general")],
    "kai receipt": "[delivered] plain speech → b:general",
    "ann deliveries": [("a", "general", "delivered"), ("b", "general", "delivered")],
    "nell receipt": "[delivered] nothing — 1 plain-speech segment(s) kept in your context, sent to no one"
                    " (only a send tool that names where it goes reaches anyone)",
    "nell system": 1,
    "bounce channel": None,
    "bounce candidates": ["- >>a:general", "- >>b:general"],
    "bounce draft": ("held", "bounced"),
    "resend": (False, [("b", "delivered")]),
    "a posts": [("general", "qualified #"), ("general", "ann to a #")],
    "b posts": [("general", "ref #"), ("general", "kai reply #"), ("general", "ann own #"), ("general", "bounced #")],
}


async def raw_status(socket: str) -> dict[str, Any]:
    async with RouterClient.connect_unix(socket, timeout=5) as probe:
        status: dict[str, Any] = await probe.call("status", {})
        return status


def agent_row(status: dict[str, Any], name: str) -> dict[str, Any]:
    rows: list[dict[str, Any]] = [row for row in status["agents"] if row["name"] == name]
    [row] = rows
    return row


async def set_up_state(nodes: Cluster, client: FailoverClient, *, host_socket: str | None = None) -> dict[str, Any]:
    """What must outlive the holder: channel decisions (a's lounge, registered closed, opened by
    kai, declined by ann),
    a tune-out (b's random), a held draft, an agent declared by a host that has left, with a
    wake waiting for it, and an unacked wake of an owned agent."""
    state: dict[str, Any] = {}
    done = await turn(client, "kai", [], channel={"serverId": "a", "channelId": "lounge"}, tools=[
        ("channel_open", {"channelId": "lounge"}),
        ("tune_out", {"channelId": "b:random"}),
    ])
    assert [r.get("isError") for r in done["tools"]] == [False, False], done["tools"]
    declined = await turn(client, "ann", [], tools=[("channel_decline", {"channelId": "lounge"})])
    assert declined["tools"][0].get("isError") is False, declined["tools"]
    bounced = await turn(client, "ann", [">>general kept for later"], channel="general")
    [draft] = bounced["closed"]["drafts"]
    state["draft"] = draft["id"]
    async with RouterClient.connect_unix(host_socket or socket_of(nodes.workdir, "n1")) as other:
        await other.hello("other-host", [{"name": "zed", "proseRouting": "explicit", "wake": {"channels": ["b:random"]}}])
    await mention(nodes.servers["b"], "random", "for zed")
    woken = await wakes_of(client, "for zed", {"ann", "nell"})
    await client.ack([woken["ann"].seq], agent="ann")
    state["nell unacked"] = woken["nell"].seq
    return state


async def check_state(nodes: Cluster, client: FailoverClient, node: str, tag: str) -> None:
    """The state :func:`set_up_state` made, as the node serving now has it."""
    socket = socket_of(nodes.workdir, node)

    async def zed_released() -> bool:
        # The other host closed its connection just now: the daemon hears of it as it reads
        # the socket's end, a moment later on a loaded machine (not at the close itself).
        return agent_row(await raw_status(socket), "zed")["host"] is None

    await wait_until(zed_released, timeout=10, interval=0.05)
    status = await raw_status(socket)
    assert [row["shown"] for row in agent_row(status, "kai")["tunedOut"]] == ["random"]
    zed = agent_row(status, "zed")
    assert (zed["proseRouting"], zed["host"]) == ("explicit", None) and zed["unackedWakes"] >= 1, zed
    rows = {(row["serverId"], row["channelId"]): row for row in (await client.call("channels/list", {}))["channels"]}
    assert rows[("a", "lounge")]["open"] is True
    # Each agent's own decision for a's lounge: kai's open, ann's decline.
    for agent, decided in (("kai", "open"), ("ann", "declined")):
        listed = await turn(client, agent, [], tools=[("channel_list", {})])
        [lounge] = [row for row in listed["tools"][0]["structuredContent"]["channels"] if (row["serverId"], row["channelId"]) == ("a", "lounge")]
        assert lounge["desired"] == decided, (agent, lounge)
    # A message on b's random while kai has it tuned out wakes ann and nell, never kai.
    await mention(nodes.servers["b"], "random", f"random {tag}")
    woken = await wakes_of(client, f"random {tag}", {"ann", "nell"})
    for agent, wake in woken.items():
        await client.ack([wake.seq], agent=agent)
    assert not [w for w in _stash.get(id(client), []) if w.agent == "kai" and "random" in w.message_text]


async def recorded_opens(server: FixtureProcess) -> list[tuple[int, str]]:
    return [(entry["epoch"], entry["params"]["channelId"]) for entry in await server.recorded("channels/open")]


async def test_after_a_kill_9_the_new_holder_routes_as_one_daemon_and_keeps_what_the_journal_holds(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    dsn = postgres.fresh_database(postgres_server, "cluster_scenarios_kill")
    with trio.fail_after(90):
        async with cluster(short_tmp, dsn) as nodes, FailoverClient.connect(nodes.sockets(), give_up_after=60) as client:
            await client.hello("host", AGENTS)
            assert await scenarios(nodes, client, "one") == ONE_DAEMON
            state = await set_up_state(nodes, client)
            await check_state(nodes, client, "n1", "one")
            b = nodes.servers["b"]
            # At the kill: kai's turn is open (typing, words not yet routed) and ann's resend of
            # her held draft is on its way to b, which holds its answer back.
            await b.configure(publish={"delayMs": 30_000})
            await mention(b, "general", "at the kill")
            woken = await wakes_of(client, "at the kill", {"kai", "ann", "nell"})
            kai_turn = await client.call("turn/open", {"agent": "kai", "wakes": [woken["kai"].seq]})
            await client.call("turn/text", {"turnId": kai_turn["turnId"], "round": 1, "delta": "words at the kill"})
            ann_turn = await client.call("turn/open", {"agent": "ann", "wakes": [woken["ann"].seq]})
            lost: list[BaseException] = []

            async def resend() -> None:
                try:
                    await client.call("turn/tool", {"turnId": ann_turn["turnId"], "callId": "r", "name": "drafts",
                                                    "arguments": {"action": "resend", "id": state["draft"], "channelId": "b:general"}})
                except ConnectionLost as exc:
                    lost.append(exc)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(resend)
                await wait_until(lambda: published(b, "kept for later"), timeout=10)
                nodes.nodes["n1"].kill9()
            assert len(lost) == 1  # the host is told the call's outcome is unknown
            assert await nodes.nodes["n1"].wait() == -signal.SIGKILL
            await b.configure(publish={"delayMs": 0})
            await nodes.wait_serving("n2")

            # A call about kai's turn, made on n2 as a raw call: the error says why n2 doesn't know it.
            with pytest.raises(RpcError) as unknown:
                await client.call("turn/text", {"turnId": kai_turn["turnId"], "round": 1, "delta": "more"})
            assert unknown.value.code == -32050 and "opened on another node of a cluster" in unknown.value.message
            # The wakes not acked come again from n2: the kill's, and nell's older one.
            again = await wakes_of(client, "at the kill", {"kai", "ann", "nell"})
            assert {agent: w.seq for agent, w in again.items()} == {agent: w.seq for agent, w in woken.items()}
            assert (await wakes_of(client, "for zed", {"nell"}))["nell"].seq == state["nell unacked"]
            await client.ack([again["nell"].seq, state["nell unacked"]], agent="nell")
            await check_state(nodes, client, "n2", "two")
            # The channel decision: a registered lounge closed again on n2's connection; n2 opened it.
            assert await recorded_opens(nodes.servers["a"]) == [(1, "lounge"), (2, "lounge")]
            # The draft whose resend was cut off: unconfirmed, so resending needs confirmDuplicate.
            retried = await turn(client, "ann", [], wakes=[again["ann"].seq], tools=[
                ("drafts", {"action": "resend", "id": state["draft"], "channelId": "b:general"}),
                ("drafts", {"action": "resend", "id": state["draft"], "channelId": "b:general", "confirmDuplicate": True}),
            ])
            assert [r.get("reason") for r in retried["tools"]] == ["confirm-duplicate-needed", None], retried["tools"]
            # The turn open at the kill: its words were never posted; its wake's new turn posts once.
            kai = await turn(client, "kai", ["kai after the kill"], wakes=[again["kai"].seq])
            assert kai["closed"]["receipt"]["text"] == "[delivered] plain speech → b:general"
            await client.ack([again["kai"].seq], agent="kai")
            await client.ack([again["ann"].seq], agent="ann")
            assert await scenarios(nodes, client, "two") == ONE_DAEMON
            texts = [text for _, text in await posts(b)]
            assert "words at the kill" not in texts and texts.count("kai after the kill") == 1
            # What an operator reads of the nodes from the database: n1 no longer holds anything.
            checked = await trio.run_process(
                [sys.executable, "-m", "mcpl_router", "journal", "check", "--config", str(nodes.config)],
                capture_stdout=True, env={**os.environ, "MCPL_ROUTER_NODE": "n2"},
            )
            [listed] = [line for line in checked.stdout.decode().splitlines() if line.strip().startswith("nodes:")]
            assert "n2 (holding, seen" in listed and "n1 (said holding" in listed and "holds nothing now" in listed, listed
            # zed, declared by a host that left before the kill (its spec as n2's status showed
            # it, from the journal), claimed on n2: the wakes kept for it come.
            async with RouterClient.connect_unix(socket_of(nodes.workdir, "n2")) as other:
                await other.hello("other-host", [{"name": "zed", "proseRouting": "explicit", "wake": {"channels": ["b:random"]}}])
                wake = await other.next_wake()  # the oldest it is owed
                assert (wake.agent, wake.message_text) == ("zed", "for zed")


async def published(server: FixtureProcess, text: str) -> bool:
    return any(text in posted for _, posted in await posts(server))


async def test_after_a_drain_the_new_holder_routes_as_one_daemon_and_the_open_turn_comes_again(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    dsn = postgres.fresh_database(postgres_server, "cluster_scenarios_drain")
    with trio.fail_after(60):
        async with cluster(short_tmp, dsn) as nodes, FailoverClient.connect(nodes.sockets(), give_up_after=60) as client:
            await client.hello("host", AGENTS)
            state = await set_up_state(nodes, client)
            await client.ack([state["nell unacked"]], agent="nell")
            await mention(nodes.servers["b"], "general", "at the drain")
            woken = await wakes_of(client, "at the drain", {"kai", "ann", "nell"})
            kai_turn = await client.call("turn/open", {"agent": "kai", "wakes": [woken["kai"].seq]})
            await client.call("turn/text", {"turnId": kai_turn["turnId"], "round": 1, "delta": "words at the drain"})
            n1 = nodes.nodes["n1"].process
            assert n1 is not None
            n1.send_signal(signal.SIGTERM)
            shutdown = await client.next_notification("daemon/shutdown")
            assert shutdown.params["reason"] == "signal SIGTERM"
            assert await nodes.nodes["n1"].wait() == 0
            await nodes.wait_serving("n2", timeout=10)
            # The drain aborted the open turn at once (its words neither posted nor drafted);
            # its wake, not acked, comes again from n2, and the turn is run there.
            again = await wakes_of(client, "at the drain", {"kai", "ann", "nell"})
            assert {agent: w.seq for agent, w in again.items()} == {agent: w.seq for agent, w in woken.items()}
            kai = await turn(client, "kai", ["kai after the drain"], wakes=[again["kai"].seq])
            assert kai["closed"]["receipt"]["text"] == "[delivered] plain speech → b:general"
            for agent, wake in again.items():
                await client.ack([wake.seq], agent=agent)
            texts = [text for _, text in await posts(nodes.servers["b"])]
            assert "words at the drain" not in texts and texts.count("kai after the drain") == 1
            await check_state(nodes, client, "n2", "two")
            assert await recorded_opens(nodes.servers["a"]) == [(1, "lounge"), (2, "lounge")]
            assert await scenarios(nodes, client, "two") == ONE_DAEMON


async def test_a_tune_out_keeps_its_channel_open_on_a_server_that_keeps_no_subscriptions_after_a_takeover(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    """c, as discord-mcpl, registers every channel closed on each connection and sends nothing
    from one the host hasn't opened there. kai's tune-out opened c's quiet on n1; on n2's
    connection it is closed again. A tuned-out channel stays open (docs/host-api.md, Tune-out),
    so the new holder opens it again, as it does a channel an agent opened: otherwise the
    tune-out, resumed from the journal, holds nothing more, and no agent hears quiet."""
    dsn = postgres.fresh_database(postgres_server, "cluster_scenarios_tuneout")
    with trio.fail_after(60):
        async with cluster(short_tmp, dsn) as nodes, FailoverClient.connect(nodes.sockets(), give_up_after=60) as client:
            await client.hello("host", AGENTS)
            done = await turn(client, "kai", [], tools=[("tune_out", {"channelId": "quiet"})])
            assert done["tools"][0].get("isError") is False, done["tools"]
            for tag in ("before", "after"):
                if tag == "after":
                    n1 = nodes.nodes["n1"].process
                    assert n1 is not None
                    n1.send_signal(signal.SIGTERM)
                    assert await nodes.nodes["n1"].wait() == 0
                    await nodes.wait_serving("n2", timeout=10)
                    with contextlib.suppress(trio.TooSlowError):  # the assertion below says what came
                        await wait_until(lambda: reopened(nodes.servers["c"]), timeout=5)
                answer = await nodes.servers["c"].incoming([{"channelId": "quiet", "text": f"quiet {tag}", "tags": ["chat:mention"]}])
                assert not answer.get("notSent"), (tag, answer, await recorded_opens(nodes.servers["c"]))
                woken = await wakes_of(client, f"quiet {tag}", {"ann", "nell"})
                for agent, wake in woken.items():
                    await client.ack([wake.seq], agent=agent)
            assert not [w for w in _stash.get(id(client), []) if w.agent == "kai"]
            assert await recorded_opens(nodes.servers["c"]) == [(1, "quiet"), (2, "quiet")]


async def reopened(server: FixtureProcess) -> bool:
    return (2, "quiet") in await recorded_opens(server)


async def test_a_tune_out_and_a_channel_decision_the_agent_was_told_of_survive_a_kill_9(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    """kai calls channel_open and tune_out while the journal's database is held still (as a slow
    commit, or the database's failover, would hold it): neither tool answers while its decision
    is not in the journal. Once the database moves, both answer; the holder is killed at once,
    and the new holder knows both: what an agent was told survives the takeover."""
    dsn = postgres.fresh_database(postgres_server, "cluster_scenarios_written_behind")
    with trio.fail_after(60):
        async with cluster(short_tmp, dsn) as nodes, FailoverClient.connect(nodes.sockets(), give_up_after=60) as client:
            await client.hello("host", AGENTS)
            opened = await client.call("turn/open", {"agent": "kai", "channel": {"serverId": "a", "channelId": "lounge"}})
            await trio.sleep(0.5)  # the hello's writes are committed
            results: list[dict[str, Any]] = []

            async def call_tools() -> None:
                for name, channel in (("channel_open", "lounge"), ("tune_out", "quiet")):
                    arguments = {"channelId": channel}
                    results.append(await client.call("turn/tool", {"turnId": opened["turnId"], "callId": name, "name": name, "arguments": arguments}))

            postgres_server.pause()
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(call_tools)
                    await trio.sleep(1.5)
                    assert results == []  # not answered while the journal can't have it
                    postgres_server.resume()
            finally:
                postgres_server.resume()
            assert [result.get("isError") for result in results] == [False, False], results
            nodes.nodes["n1"].kill9()
            assert await nodes.nodes["n1"].wait() == -signal.SIGKILL
            await nodes.wait_serving("n2")
            status = await raw_status(socket_of(nodes.workdir, "n2"))
            rows = {(row["serverId"], row["channelId"]): row for row in (await client.call("channels/list", {}))["channels"]}
            kept = ([row["shown"] for row in agent_row(status, "kai")["tunedOut"]], rows[("a", "lounge")]["open"])
            assert kept == (["quiet"], True), kept


async def test_the_default_channel_a_wake_set_holds_on_the_node_that_took_over(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    """kai was woken on b's general and answered; a later turn with no wake (a heartbeat) calls
    channel_publish with no channelId. One daemon posts it to b's general, the default that
    wake set; after a drain hands the links over, so does the new holder: each agent's default
    is set again at a start from its latest acked wake on a channel (before, it was refused
    ``no-default`` at every takeover, which in a cluster is every upgrade)."""
    dsn = postgres.fresh_database(postgres_server, "cluster_scenarios_default")
    with trio.fail_after(60):
        async with cluster(short_tmp, dsn) as nodes, FailoverClient.connect(nodes.sockets(), give_up_after=60) as client:
            await client.hello("host", AGENTS)
            await mention(nodes.servers["b"], "general", "sets the default")
            woken = await wakes_of(client, "sets the default", {"kai", "ann", "nell"})
            await turn(client, "kai", ["noted"], wakes=[woken["kai"].seq])
            for agent, wake in woken.items():
                await client.ack([wake.seq], agent=agent)
            outcomes = []
            for tag in ("before", "after"):
                if tag == "after":
                    n1 = nodes.nodes["n1"].process
                    assert n1 is not None
                    n1.send_signal(signal.SIGTERM)
                    assert await nodes.nodes["n1"].wait() == 0
                    await nodes.wait_serving("n2", timeout=10)
                beat = await turn(client, "kai", [], tools=[("channel_publish", {"text": f"heartbeat {tag}"})])
                result = beat["tools"][0]
                outcomes.append((result.get("reason"), (result.get("structuredContent") or {}).get("serverId")))
            assert outcomes == [(None, "b"), (None, "b")], outcomes
