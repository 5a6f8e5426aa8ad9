"""A cluster whose links are spread (``cluster.links = "balanced"``), driven from outside (issue 29).

Three ``mcpl-router run`` nodes on one PostgreSQL journal: ``n3`` holds the router's lease (it
started first) and serves the host; server ``a``'s link is pinned to ``n1``, ``b``'s and ``c``'s
to ``n2``. The router holds no server connection: it reaches each server through the relay of
the node holding its link. Every routing scenario of the seeds (tests/integration/
test_cluster_scenarios.py, where one node holds everything) must come out as one daemon's, and
the fixture servers must see one connection each, from the node holding their link.

The misrouting property over the same shape (tests/unit/test_misrouting_property.py end to
end): servers ``a`` and ``b`` on different link nodes register colliding ids, and seeded
random walks of host publishes and typing, and agents' turns speaking by ``>>`` lines and
``channel_publish``, are checked step by step against an oracle of the routing rule, from the
servers' own recordings. The split cluster's faults: test_cluster_split_faults.py.
"""

from __future__ import annotations

import collections
import json
import os
import random
import re
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import FailoverClient, RouterClient, RpcError, WakeNotice
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.testing import postgres
from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import FAST_RECONNECT, daemon_serving
from .test_cluster import health_page, log_events
from .test_cluster_scenarios import (
    AGENTS,
    posts,
    published,
    CHANNELS,
    ONE_DAEMON,
    SERVER_OPTIONS,
    Cluster,
    check_state,
    raw_status,
    scenarios,
    set_up_state,
    socket_of,
)

pytestmark = pytest.mark.integration

LEASE = 5.0
#: The node that starts first, and so holds the router's lease.
ROUTER = "n3"
#: Where each server's link belongs while its node is live.
PINS = {"a": "n1", "b": "n2", "c": "n2"}


class SplitNodes(Cluster):
    """The servers and the nodes of one split cluster, and what the tests read of them."""

    def process(self, node: str) -> trio.Process:
        process = self.nodes[node].process
        assert process is not None
        return process

    def socket(self, node: str) -> str:
        return socket_of(self.workdir, node)

    def events(self, node: str, event: str) -> list[dict[str, Any]]:
        """``node``'s log lines of ``event``, parsed."""
        return log_events(self.workdir / f"{node}.log", event)

    def tails(self, lines: int = 30) -> str:
        return json.dumps({node: self.log(node).splitlines()[-lines:] for node in self.nodes}, indent=1)


def split_config(workdir: Path, servers: dict[str, FixtureProcess], dsn: str, pins: dict[str, str]) -> Path:
    config = {
        "mcplServers": {name: {"url": server.listen_url, "reconnect": FAST_RECONNECT} for name, server in servers.items()},
        "host": {"unixSocket": str(workdir / "run" / "${MCPL_ROUTER_NODE}.sock"), "websocket": {"enabled": False}},
        "journal": {"backend": "postgres", "dsn": dsn, "path": str(workdir / "unused.sqlite3")},
        "cluster": {"node": "${MCPL_ROUTER_NODE}", "leaseTtl": LEASE, "links": "balanced", "pin": pins},
        "health": {"enabled": True, "port": 0},
        "logging": {"level": "debug", "format": "json"},
    }
    path = workdir / "cluster.json"
    path.write_text(json.dumps(config))
    return path


async def status_of(socket: str) -> dict[str, Any] | None:
    """The daemon's ``status`` on ``socket``; None when no daemon answers there (a node that
    holds no router's lease, or is gone)."""
    try:
        return await raw_status(socket)
    except Exception:
        return None


def holders(status: dict[str, Any]) -> dict[str, str]:
    """server → the node holding its link unexpired, as the router's status shows it."""
    return {row["server"]: row["node"] for row in status["cluster"]["links"] if row["expiresIn"] > 0}


async def reached_through(socket: str, server: str) -> str | None:
    """The node through whose relay the router on ``socket`` reaches ``server``, while that
    link is ready (None: not ready, or no router there)."""
    status = await status_of(socket)
    if status is None:
        return None
    [row] = [row for row in status["servers"] if row["serverId"] == server]
    endpoint = str(row.get("endpoint") or "")
    if row["state"] != "ready" or " via node " not in endpoint:
        return None
    return endpoint.rpartition(" via node ")[2]


async def serving_all(socket: str, channels: dict[str, list[str]]) -> bool:
    """A router serving hosts on ``socket``, every server ready with each of its channels registered."""
    wanted = [(server, channel) for server, ids in channels.items() for channel in ids]
    return await daemon_serving(socket, servers=len(channels), channels=wanted, timeout=2)


@asynccontextmanager
async def split_cluster(
    workdir: Path, dsn: str, *, channels: dict[str, list[str]], pins: dict[str, str],
    server_options: dict[str, dict[str, Any]] | None = None, link_nodes: tuple[str, ...] = ("n1", "n2"),
) -> AsyncIterator[SplitNodes]:
    """Fixture servers registering ``channels``; the router (n3) started first and serving, then
    ``link_nodes``; yields once each server's link is held where ``pins`` puts it and the router
    reaches it, ready, through that node's relay."""
    async with AsyncExitStack() as stack:
        servers = {
            name: await stack.enter_async_context(
                FixtureProcess.start(transport="tcp", channels=ids, control_dir=workdir, server_name=name,
                                     **(server_options or {}).get(name, {}))
            )
            for name, ids in channels.items()
        }
        nodes = SplitNodes(workdir, split_config(workdir, servers, dsn, pins), servers, stack)
        await nodes.start(ROUTER)
        await wait_until(lambda: serving_all(nodes.socket(ROUTER), channels), timeout=30, interval=0.1)
        for node in link_nodes:
            await nodes.start(node)

        async def placed() -> bool:
            status = await status_of(nodes.socket(ROUTER))
            if status is None or holders(status) != pins:
                return False
            through = [await reached_through(nodes.socket(ROUTER), server) for server in pins]
            return through == list(pins.values()) and await serving_all(nodes.socket(ROUTER), channels)

        try:
            await wait_until(placed, timeout=40, interval=0.2)
        except trio.TooSlowError:
            raise AssertionError(f"links not placed; the logs end: {nodes.tails()}") from None
        yield nodes


async def connections_of(server: FixtureProcess) -> int:
    """How many times the server was connected to (each connection's handshake is one)."""
    return len(await server.recorded("initialize"))


async def test_with_links_on_two_nodes_and_the_host_on_a_third_every_scenario_routes_as_one_daemon(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    dsn = postgres.fresh_database(postgres_server, "cluster_split")
    with trio.fail_after(120):
        async with split_cluster(short_tmp, dsn, channels=CHANNELS, pins=PINS, server_options=SERVER_OPTIONS) as nodes, \
                FailoverClient.connect([socket_of(short_tmp, "n3")], give_up_after=30) as client:
            await client.hello("host", AGENTS)
            connected = {name: await connections_of(server) for name, server in nodes.servers.items()}
            assert await scenarios(nodes, client, "split") == ONE_DAEMON
            await set_up_state(nodes, client, host_socket=socket_of(short_tmp, "n3"))
            await check_state(nodes, client, "n3", "split")
            status = await raw_status(socket_of(short_tmp, "n3"))
            # The router holds no link: each server's connection is its holder's, through a relay.
            endpoints = {row["serverId"]: row.get("endpoint") for row in status["servers"]}
            assert all(endpoint and endpoint.endswith(f"via node {PINS[server]}") for server, endpoint in endpoints.items()), endpoints
            assert holders(status) == PINS
            # All of it over the one connection each server had once its link was placed.
            assert {name: await connections_of(server) for name, server in nodes.servers.items()} == connected
            # A host may connect to a link node too: it forwards to the router (cluster/host_proxy.py).
            assert (await raw_status(socket_of(short_tmp, "n1")))["cluster"]["node"] == "n3"
            # What an operator reads: status (CLI) and /metrics say who holds which link.
            shown = await trio.run_process([sys.executable, "-m", "mcpl_router", "status", "--socket", socket_of(short_tmp, "n3")],
                                           capture_stdout=True)
            lines = [line.split() for line in shown.stdout.decode().splitlines()]
            assert {(row[1], row[4]) for row in lines if row[:1] == ["link"]} == {(server, node + ",") for server, node in PINS.items()}
            assert any(line[:3] == ["cluster:", "node", "n3"] and "router's" in line for line in lines), shown.stdout
            _, metrics = await health_page(short_tmp, "n1", "/metrics")
            assert 'mcpl_router_cluster_link_holder{node="n1",server="a"} 1.0' in metrics
            assert 'mcpl_router_cluster_links_taken_total{node="n1"}' in metrics


async def test_a_link_moved_while_a_publish_is_under_way_hands_over_once_the_server_answered(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    dsn = postgres.fresh_database(postgres_server, "cluster_split_move")
    with trio.fail_after(120):
        async with split_cluster(short_tmp, dsn, channels=CHANNELS, pins=PINS, server_options=SERVER_OPTIONS) as nodes, \
                RouterClient.connect_unix(socket_of(short_tmp, ROUTER)) as host:
            await host.hello("host", AGENTS)
            # n1 took a's link when the router handed it on; a link is moved for placement only
            # once held a lease (links.py SETTLE_LEASES): waited out, so the move comes at once.
            await trio.sleep(LEASE)
            a = nodes.servers["a"]
            await a.configure(publish={"delayMs": 800})  # the server takes a while to answer
            answers: list[dict[str, Any]] = []

            async def publish() -> None:
                answers.append(await host.call("channels/publish", {"agent": "kai", "channel": "a:general", "content": "while it moves"}))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(publish)
                await wait_until(lambda: published(a, "while it moves"), timeout=10, interval=0.02)
                # a's pin moves to n2 while the server has not answered yet: n1 hands the link over.
                config = json.loads(nodes.config.read_text())
                config["cluster"]["pin"]["a"] = "n2"
                nodes.config.write_text(json.dumps(config))
                for node in ("n1", "n2", "n3"):
                    nodes.process(node).send_signal(signal.SIGHUP)
            # The publish under way was answered by the server through n1, as on one daemon.
            [answer] = answers
            assert answer["delivered"] is True and answer.get("outcome", "delivered") == "delivered", answer
            await wait_until(lambda: _reached_through_is(short_tmp, "a", "n2"), timeout=30, interval=0.2)
            [moved] = nodes.events("n1", "cluster.link.handed_over")
            assert moved["server"] == "a" and moved["unanswered"] == 0, moved
            await a.configure(publish={"delayMs": 0})
            after = await host.call("channels/publish", {"agent": "kai", "channel": "a:general", "content": "after it moved"})
            assert after["delivered"] is True
            texts = [text for _, text in await posts(a)]
            assert texts.count("while it moves") == 1 and texts.count("after it moved") == 1


async def _reached_through_is(workdir: Path, server: str, node: str) -> bool:
    return await reached_through(socket_of(workdir, ROUTER), server) == node


async def test_a_server_added_by_a_reload_is_placed_and_one_removed_is_handed_over(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    dsn = postgres.fresh_database(postgres_server, "cluster_split_reload")
    with trio.fail_after(120):
        async with split_cluster(short_tmp, dsn, channels=CHANNELS, pins=PINS, server_options=SERVER_OPTIONS) as nodes:
            extra = await nodes.stack.enter_async_context(
                FixtureProcess.start(transport="tcp", channels=["extra"], control_dir=short_tmp, server_name="d")
            )
            config = json.loads(nodes.config.read_text())
            config["mcplServers"]["d"] = {"url": extra.listen_url, "reconnect": FAST_RECONNECT}
            del config["mcplServers"]["c"]
            del config["cluster"]["pin"]["c"]
            nodes.config.write_text(json.dumps(config))
            # One node reloaded, the others not yet: they place from different files, and say so.
            nodes.process("n1").send_signal(signal.SIGHUP)
            await wait_until(lambda: bool(nodes.events(ROUTER, "cluster.config.differs")), timeout=10, interval=0.1)
            assert nodes.events(ROUTER, "cluster.config.differs")[0]["nodes"] == ["n1"]
            for node in ("n2", "n3"):
                nodes.process(node).send_signal(signal.SIGHUP)

            async def replaced() -> bool:
                status = await raw_status(socket_of(short_tmp, ROUTER))
                ready = {row["serverId"] for row in status["servers"] if row["state"] == "ready"}
                return "d" in holders(status) and "c" not in holders(status) and ready == {"a", "b", "d"}

            try:
                await wait_until(replaced, timeout=30, interval=0.2)
            except trio.TooSlowError:
                status = await raw_status(socket_of(short_tmp, ROUTER))
                rows = [(row["serverId"], row["state"], row.get("lastError")) for row in status["servers"]]
                raise AssertionError(f"not replaced: links {status['cluster']['links']}, servers {rows}") from None
            # d, unpinned, is balanced: whichever live node asked first holds it, and the router
            # reaches it through that node.
            status = await raw_status(socket_of(short_tmp, ROUTER))
            assert await reached_through(socket_of(short_tmp, ROUTER), "d") == holders(status)["d"]
            assert '"cluster.link.handed_over"' in nodes.log("n2") and "no longer in the config" in nodes.log("n2")
            # c's row is gone once let go: status and journal check no longer list it.
            await wait_until(lambda: _without(short_tmp, "c"), timeout=10, interval=0.2)
            # Every node on the same file again: none differs.
            await wait_until(lambda: _agreeing(short_tmp), timeout=10, interval=0.2)


async def _agreeing(workdir: Path) -> bool:
    status = await raw_status(socket_of(workdir, ROUTER))
    return status["cluster"]["placementDiffers"] == []


async def _without(workdir: Path, server: str) -> bool:
    status = await raw_status(socket_of(workdir, ROUTER))
    return server not in [row["server"] for row in status["cluster"]["links"]]


# -- the misrouting property, over a split cluster ---------------------------------------------------
#
# tests/unit/test_misrouting_property.py's property, end to end: every utterance carries a unique
# marker, and after each step what the fixture servers recorded (their publishes and typing) is
# compared with a brute-force oracle of the routing rule. Here the channels stay put (the unit
# property moves them); what is new is that the router reaches each server through another
# node's relay, and every answer, refusal and candidate list comes through real processes.

#: Ids that collide: both servers have ``general``, ``room`` and ``x:y``; a's ``b:room`` is also
#: b's room's qualified name, b's ``a:general`` a's general's. ``sync`` is the walk's barrier.
WALK_CHANNELS = {
    "a": ["general", "room", "b:room", "x:y", "sync"],
    "b": ["general", "room", "a:general", "x:y", "sync"],
}
WALK_PINS = {"a": "n1", "b": "n2"}
REGISTERED = frozenset(ChannelRef(server, channel) for server, ids in WALK_CHANNELS.items() for channel in ids)
#: Every name the walk speaks by: shared ids, one server's ids, ids that are another channel's
#: qualified name, qualified names (with colons in the id), and names of nothing.
WALK_NAMES = ["general", "room", "b:room", "x:y", "a:general", "a:room", "b:general", "a:x:y", "b:x:y", "a:b:room",
              "b:a:general", "nowhere", "a:nowhere", "c:general"]
WALK_REFS = sorted(ref for ref in REGISTERED if ref.channel_id != "sync") + [ChannelRef("a", "nowhere"), ChannelRef("b", "b:room")]
WALKERS: list[dict[str, Any]] = [{"name": "ex", "proseRouting": "explicit"}, {"name": "lo", "proseRouting": "locus"}]
#: The CI's walks; ``MCPL_ROUTER_SPLIT_WALK_SEEDS=1,2,...`` and ``MCPL_ROUTER_SPLIT_WALK_STEPS``
#: for a longer run (a failure names its seed and its steps).
WALK_SEEDS = [int(seed) for seed in os.environ.get("MCPL_ROUTER_SPLIT_WALK_SEEDS", "11,12,13,14,15,16,17,18").split(",")]
WALK_STEPS = int(os.environ.get("MCPL_ROUTER_SPLIT_WALK_STEPS", "50"))
MARKER = re.compile(r"<s\d+m\d+>")


def named(name: str) -> set[ChannelRef]:
    """Every channel ``name`` answers to: by its id, or by its qualified name."""
    return {ref for ref in REGISTERED if name in (ref.channel_id, ref.qualified_name)}


def rule_for_name(name: str, own: Sequence[ChannelRef] = ()) -> ChannelRef | None:
    """The one channel a name means (in a turn whose own channel is ``own``), or None: refused.
    Within a turn the id of its own channel means that channel (refused if it is not registered);
    otherwise a name picks the one channel that answers to it, and none when two or none do."""
    mine = [ref for ref in own if ref.channel_id == name]
    if len(mine) == 1:
        return rule_for_ref(mine[0])
    found = named(name)
    return next(iter(found)) if len(found) == 1 else None


def rule_for_ref(ref: ChannelRef) -> ChannelRef | None:
    return ref if ref in REGISTERED else None


def rule_for_typing(name: str) -> set[ChannelRef]:
    """A host's typing by name: a bare id in every server's channel with it; a qualified name
    there alone; one channel's id and another's qualified name at once: refused."""
    by_id = {ref for ref in REGISTERED if ref.channel_id == name}
    by_qualified = {ref for ref in REGISTERED if ref.qualified_name == name}
    if by_id and by_qualified:
        return set()
    return by_qualified if by_qualified else by_id


def wire_ref(row: dict[str, Any] | None) -> ChannelRef | None:
    return None if row is None else ChannelRef(row["serverId"], row["channelId"])


class Walk:
    """One seeded walk through the split cluster: what it did, and where each marker must land."""

    def __init__(self, nodes: SplitNodes, host: RouterClient, seed: int) -> None:
        self.nodes = nodes
        self.host = host
        self.seed = seed
        self.random = random.Random(seed)
        self.count = 0
        #: marker → the channel it must reach (alone, once), or None: nowhere.
        self.expected: dict[str, ChannelRef | None] = {}
        self.done: list[str] = []
        self._stash: list[WakeNotice] = []
        #: What the walk met, for the figures printed (and a check that it met each case).
        self.met: collections.Counter[str] = collections.Counter()

    def marker(self) -> str:
        self.count += 1
        return f"<s{self.seed}m{self.count:03d}>"

    def target(self, trigger: ChannelRef | None = None) -> str | ChannelRef:
        """A name (two in three) or a ref (registered or not); in a turn with a trigger, its
        id one time in three (an id other servers have too, often)."""
        return self.random.choice(WALK_REFS) if self.random.random() < 1 / 3 else self.name(trigger)

    def name(self, trigger: ChannelRef | None = None) -> str:
        if trigger is not None and self.random.random() < 1 / 3:
            return trigger.channel_id
        return self.random.choice(WALK_NAMES)

    def fail(self, what: str) -> AssertionError:
        steps = "\n".join(f"  {step}" for step in self.done[-12:])
        return AssertionError(f"seed {self.seed}, step {len(self.done)}: {what}\nthe last steps:\n{steps}")

    # -- what the servers recorded -------------------------------------------------------------

    async def landed(self) -> dict[str, list[ChannelRef]]:
        """marker → every channel a publish carrying it reached, from the servers' recordings."""
        found: dict[str, list[ChannelRef]] = {}
        for server_id, server in self.nodes.servers.items():
            for entry in await server.recorded("channels/publish"):
                params = entry["params"]
                text = "".join(block.get("text", "") for block in params.get("content") or [] if isinstance(block, dict))
                for marker in MARKER.findall(text):
                    found.setdefault(marker, []).append(ChannelRef(server_id, params["channelId"]))
        return found

    async def check_posts(self) -> None:
        landed = await self.landed()
        for marker, expected in self.expected.items():
            wanted = [] if expected is None else [expected]
            if landed.get(marker, []) != wanted:
                raise self.fail(f"{marker} reached {sorted(map(str, landed.get(marker, [])))}, the rule names {list(map(str, wanted))}")
        strays = {marker for marker in landed if marker.startswith(f"<s{self.seed}m")} - set(self.expected)
        if strays:
            raise self.fail(f"posts of markers never expected: {sorted(strays)}")

    async def typing_marks(self) -> dict[str, int]:
        return {server_id: len(await server.recorded("channels/typing")) for server_id, server in self.nodes.servers.items()}

    async def typing_since(self, marks: dict[str, int]) -> list[tuple[ChannelRef, str]]:
        """Every typing indicator the servers got since ``marks``. A barrier first: a stop in
        each server's ``sync``, sent after the rest and so recorded after it (one connection,
        in order, through the relay); what came before it is all there was."""
        for server_id in self.nodes.servers:
            await self.host.call("channels/typing", {"channel": {"serverId": server_id, "channelId": "sync"}, "op": "stop"})
        seen: list[tuple[ChannelRef, str]] = []
        for server_id, server in self.nodes.servers.items():

            async def barrier(server: FixtureProcess = server, server_id: str = server_id) -> tuple[list[dict[str, Any]]] | None:
                entries = (await server.recorded("channels/typing"))[marks[server_id]:]
                ends = [index for index, entry in enumerate(entries) if entry["params"]["channelId"] == "sync"]
                return (entries[:ends[0]],) if ends else None

            [before] = await wait_until(barrier, timeout=10, interval=0.02)
            seen += [(ChannelRef(server_id, entry["params"]["channelId"]), entry["params"]["op"]) for entry in before]
        return seen

    async def wakes_for(self, text: str) -> dict[str, WakeNotice]:
        """Each walker's wake for the message ``text`` (a mention wakes both)."""
        found = {wake.agent: wake for wake in self._stash if text in wake.message_text}
        self._stash = [wake for wake in self._stash if text not in wake.message_text]
        with trio.fail_after(15):
            while set(found) != {walker["name"] for walker in WALKERS}:
                wake = await self.host.next_wake()
                if text in wake.message_text:
                    found[wake.agent] = wake
                else:
                    self._stash.append(wake)
        return found

    # -- the steps ------------------------------------------------------------------------------

    async def host_publish(self) -> None:
        target, marker = self.target(), self.marker()
        channel: Any = target.to_wire() if isinstance(target, ChannelRef) else target
        expected = rule_for_ref(target) if isinstance(target, ChannelRef) else rule_for_name(target)
        self.done.append(f"host publishes {marker} to {channel!r}: the rule names {expected}")
        answer = await self.host.call("channels/publish", {"agent": "lo", "channel": channel, "content": f"{marker} from the host"})
        self.expected[marker] = expected
        if expected is not None:
            if not answer["delivered"] or ChannelRef(answer["serverId"], answer["channelId"]) != expected:
                raise self.fail(f"host publish to {channel!r} answered {answer}, the rule names {expected}")
        elif answer["delivered"]:
            raise self.fail(f"host publish to {channel!r} answered {answer}: the rule refuses it")
        elif isinstance(target, str) and len(named(target)) > 1:
            self.met["a name of several refused, with its candidates"] += 1
            # Refused as naming several: every one of them offered, as refs.
            candidates = {wire_ref(row) for row in answer.get("candidates", [])}
            if candidates != named(target):
                raise self.fail(f"host publish to {target!r} offered {answer.get('candidates')}, the rule names {sorted(map(str, named(target)))}")
        await self.check_posts()

    async def host_typing(self) -> None:
        target = self.target()
        channel: Any = target.to_wire() if isinstance(target, ChannelRef) else target
        expected = ({target} & REGISTERED) if isinstance(target, ChannelRef) else rule_for_typing(target)
        self.done.append(f"host types in {channel!r}: the rule names {sorted(map(str, expected))}")
        marks = await self.typing_marks()
        try:
            answer = await self.host.call("channels/typing", {"channel": channel, "op": "start"})
        except RpcError as refused:
            if expected and not isinstance(target, ChannelRef):
                raise self.fail(f"host typing in {target!r} refused ({refused}), the rule names {sorted(map(str, expected))}") from None
            answer = None
        else:
            await self.host.call("channels/typing", {"channel": channel, "op": "stop"})
        self.met[f"host typing reaching {len(expected)} channel(s)"] += 1
        seen = await self.typing_since(marks)
        for op in ("start", "stop"):
            reached = sorted(str(ref) for ref, sent in seen if sent == op)
            wanted = sorted(str(ref) for ref in expected)
            if reached != wanted:
                raise self.fail(f"host typing {op} in {channel!r} reached {reached}, the rule names {wanted} (answered {answer})")

    async def turn(self) -> None:
        agent = self.random.choice(WALKERS)["name"]
        opening = self.random.choice(["wake", "wake", "name", "ref", "none"])
        marks = await self.typing_marks()
        params: dict[str, Any] = {"agent": agent}
        woken: dict[str, WakeNotice] = {}
        if opening == "wake":
            at = self.random.choice([ref for ref in WALK_REFS if ref in REGISTERED])
            text = f"wake {self.marker()}"
            await self.nodes.servers[at.server_id].incoming([{"channelId": at.channel_id, "text": text, "tags": ["chat:mention"]}])
            woken = await self.wakes_for(text)
            channel = woken[agent].channel
            if channel is None or ChannelRef(channel.server_id, channel.channel_id) != at:
                raise self.fail(f"a mention in {at} woke {agent} on {channel}")
            params["wakes"] = [woken[agent].seq]
            trigger: ChannelRef | None = at
        elif opening == "name":
            name = self.random.choice(WALK_NAMES)
            params["channel"] = name
            trigger = rule_for_name(name)
        elif opening == "ref":
            ref = self.random.choice(WALK_REFS)
            params["channel"] = ref.to_wire()
            trigger = ref  # that exact pair, registered or not (then nothing goes there)
        else:
            trigger = None
        self.done.append(f"{agent} opens a turn on {opening} {params.get('channel', '')}: the rule's trigger {trigger}")
        opened = await self.host.call("turn/open", params)
        turn_id = opened["turnId"]
        if wire_ref(opened.get("channel")) != trigger:
            raise self.fail(f"{agent}'s turn opened on {opened.get('channel')}, the rule names {trigger}")
        own = [] if trigger is None else [trigger]
        reached = set(own) & REGISTERED
        self.met[f"turns opened on {opening}"] += 1
        for number in range(1, self.random.randint(1, 3) + 1):
            kind = self.random.choice(["publish", "publish", "say", "target", "target"])
            marker = self.marker()
            expected: ChannelRef | None
            spoken: str | None = None  # the name the utterance went by, if any
            if kind == "publish":
                target = self.target(trigger)
                if isinstance(target, ChannelRef):
                    arguments = {"channelId": target.channel_id, "serverId": target.server_id, "content": f"{marker} published"}
                    expected = rule_for_ref(target)
                else:
                    spoken = target
                    arguments = {"channelId": target, "content": f"{marker} published"}
                    expected = rule_for_name(target, own)
                self.done.append(f"  round {number}: channel_publish {marker} {arguments}: the rule names {expected}")
                await self.host.call("turn/round", {"turnId": turn_id, "round": number, "toolCalls": [{"name": "channel_publish", "arguments": arguments}]})
                result = await self.host.call("turn/tool", {"turnId": turn_id, "callId": f"c{number}", "name": "channel_publish", "arguments": arguments})
                if bool(result.get("isError")) != (expected is None):
                    raise self.fail(f"channel_publish {arguments} answered {result}, the rule names {expected}")
            else:
                spoken = self.name(trigger)
                text = f"{marker} plain words" if kind == "say" else f">>{spoken} {marker} targeted"
                if agent == "lo":
                    # locus: plain text (a >> line too) goes back where the turn began
                    expected = None if trigger is None else rule_for_ref(trigger)
                else:
                    expected = None if kind == "say" else rule_for_name(spoken, own)
                self.done.append(f"  round {number}: {text!r}: the rule names {expected}")
                await self.host.call("turn/text", {"turnId": turn_id, "round": number, "delta": text})
                await self.host.call("turn/round", {"turnId": turn_id, "round": number})
            self.expected[marker] = expected
            self.met["utterances landing" if expected is not None else "utterances refused"] += 1
            if kind != "say" and trigger is not None and spoken == trigger.channel_id \
                    and expected == trigger and named(spoken) != {trigger} and (agent == "ex" or kind == "publish"):
                self.met["an id of several meaning the turn's own channel"] += 1
            if expected is not None:
                reached.add(expected)
            if agent == "ex" and kind == "target" and expected is not None:
                break  # the first target sticks: later plain text would follow it, not the rule
        await self.host.call("turn/close", {"turnId": turn_id, "outcome": "completed"})
        for walker, wake in woken.items():
            await self.host.ack([wake.seq], agent=walker)
        await self.check_posts()
        # The turn's typing: in its trigger (started at the open, stopped at the close), nowhere
        # but there and where its words went.
        seen = await self.typing_since(marks)
        strays = sorted(str(ref) for ref, _ in seen if ref not in reached)
        if strays:
            raise self.fail(f"{agent}'s turn typed in {strays}, outside its trigger and its words' channels {sorted(map(str, reached))}")
        in_trigger = [op for ref, op in seen if ref == trigger]
        if trigger in REGISTERED and (in_trigger[:1], in_trigger[-1:]) != (["start"], ["stop"]):
            raise self.fail(f"{agent}'s turn typed in its trigger {trigger}: {in_trigger}")

    async def run(self, steps: int) -> None:
        for _ in range(steps):
            step = self.random.choice([self.host_publish, self.host_typing, self.turn, self.turn])
            await step()


async def test_over_a_split_cluster_every_word_and_typing_indicator_reaches_the_server_the_rule_names(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    dsn = postgres.fresh_database(postgres_server, "cluster_split_walk")
    with trio.fail_after(240):
        async with split_cluster(short_tmp, dsn, channels=WALK_CHANNELS, pins=WALK_PINS) as nodes, \
                RouterClient.connect_unix(nodes.socket(ROUTER)) as host:
            await host.hello("host", WALKERS)
            met: collections.Counter[str] = collections.Counter()
            for seed in WALK_SEEDS:
                walk = Walk(nodes, host, seed)
                await walk.run(WALK_STEPS)
                met += walk.met
            # Every server was reached through its link's holder throughout, over one connection.
            for server, node in WALK_PINS.items():
                assert await reached_through(nodes.socket(ROUTER), server) == node
                assert await connections_of(nodes.servers[server]) == 2  # the router's first, then its holder's
    print(f"\nmisrouting walk over a split cluster: seeds {WALK_SEEDS}, {WALK_STEPS} steps each: {dict(sorted(met.items()))}")
    # The walk met every case the rule has (a seed list that stopped reaching one is changed).
    assert {"a name of several refused, with its candidates", "host typing reaching 2 channel(s)", "turns opened on wake",
            "an id of several meaning the turn's own channel", "utterances refused"} <= set(met), met
