"""Host sessions through real processes: hello, agent ownership, grace release, wake routing,
and the server-state / channel-change notifications hosts get.

The daemon runs in this test's trio run; the MCPL servers are fixture processes over stdio; the
host is :class:`~mcpl_router.client.RouterClient` on the daemon's Unix socket.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router import host_notices
from mcpl_router.client import RouterClient, WakeNotice
from mcpl_router.config import parse_config
from mcpl_router.daemon import Daemon
from mcpl_router.jsonrpc import RpcError
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.testing.control import FixtureControl, wait_until

from .conftest import control_of, stdio_server, wait_channel, wait_ready

pytestmark = pytest.mark.integration


@asynccontextmanager
async def daemon_with(
    workdir: Path, servers: dict[str, dict[str, Any]], agents: dict[str, Any] | None = None
) -> AsyncIterator[Daemon]:
    data = {
        "mcplServers": servers,
        "host": {"unixSocket": str(workdir / "run" / "host.sock"), "websocket": {"enabled": False}},
        "journal": {"path": str(workdir / "journal.sqlite3")},
        "agents": agents or {},
    }
    daemon = Daemon(parse_config(data, source="<test>", base_dir=workdir))
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        try:
            yield daemon
        finally:
            daemon.request_shutdown()


@asynccontextmanager
async def two_servers(
    workdir: Path, agents: dict[str, Any] | None = None, channels: tuple[str, ...] = ()
) -> AsyncIterator[tuple[Daemon, FixtureControl, FixtureControl]]:
    servers = {name: stdio_server(workdir / f"{name}.control.json", channels=channels, grace=1) for name in ("a", "b")}
    async with daemon_with(workdir, servers, agents) as daemon:
        async with control_of(workdir / "a.control.json") as a, control_of(workdir / "b.control.json") as b:
            await wait_ready(daemon, "a")
            await wait_ready(daemon, "b")
            yield daemon, a, b


async def test_hello_ownership_second_claim_and_release_after_grace(short_tmp: Path) -> None:
    with trio.fail_after(40):
        async with two_servers(short_tmp, agents={"kai": {"proseRouting": "hybrid"}}) as (daemon, _a, _b):
            daemon.sessions.grace = 0.3
            socket = daemon.host_socket_path
            assert socket is not None
            async with RouterClient.connect_unix(socket) as first:
                hello = await first.hello("host-1", ["kai", {"name": "ora", "proseRouting": "named", "allowedTools": ["think"]}])
                assert hello.daemon_version
                assert {s.server_id for s in hello.servers} == {"a", "b"}
                agents = {agent.name: agent for agent in hello.agents}
                # A configured agent keeps its configured spec; a host's agent takes the host's.
                assert agents["kai"].prose_routing == "hybrid" and agents["kai"].configured is True
                assert agents["ora"].prose_routing == "named" and agents["ora"].allowed_tools == ["think"]
                assert isinstance(hello.wake_seq, int)
                spec = daemon.sessions.agent("ora")
                assert spec is not None and spec.allowed_tools == ("think",)
                owner = daemon.sessions.owner_of("kai")
                assert owner is not None and owner.session.host == "host-1"

                async with RouterClient.connect_unix(socket) as second:
                    with pytest.raises(RpcError) as refused:
                        await second.hello("host-2", ["kai"])
                    assert refused.value.code == -32010
                    assert "host-1" in refused.value.message
                    # All or nothing: the agent it could have had stays unclaimed.
                    with pytest.raises(RpcError):
                        await second.hello("host-2", ["zed", "ora"])
                    assert daemon.sessions.owner_of("zed") is None
                    with pytest.raises(RpcError) as unknown:
                        daemon.sessions.require_owner(owner, "nobody")
                    assert unknown.value.code == -32011

                    await first.call("status")  # still served
                    await _close(first)
                    # Within the grace only host-1 may reclaim; afterwards anyone may.
                    with pytest.raises(RpcError) as held:
                        await second.hello("host-2", ["kai"])
                    assert held.value.code == -32010 and "host-1" in held.value.message

                    async def claimed() -> bool:
                        try:
                            await second.hello("host-2", ["kai"])
                        except RpcError:
                            return False
                        return True

                    await wait_until(claimed, timeout=10)
                    new_owner = daemon.sessions.owner_of("kai")
                    assert new_owner is not None and new_owner.session.host == "host-2"
                    assert daemon.sessions.require_owner(new_owner, "kai").name == "kai"


async def test_same_host_reclaims_within_grace(short_tmp: Path) -> None:
    with trio.fail_after(40):
        async with two_servers(short_tmp) as (daemon, _a, _b):
            daemon.sessions.grace = 30
            socket = daemon.host_socket_path
            assert socket is not None
            async with RouterClient.connect_unix(socket) as first:
                await first.hello("host-1", ["kai"])
            await wait_until(lambda: daemon.sessions.owner_of("kai") is None)
            async with RouterClient.connect_unix(socket) as other:
                with pytest.raises(RpcError):
                    await other.hello("host-2", ["kai"])
            async with RouterClient.connect_unix(socket) as again:
                await again.hello("host-1", ["kai"])
                assert daemon.sessions.owner_of("kai") is not None


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
async def test_wake_on_b_general_names_b(short_tmp: Path, order: tuple[str, str]) -> None:
    with trio.fail_after(40):
        async with two_servers(short_tmp) as (daemon, a, b):
            controls = {"a": a, "b": b}
            for name in order:
                await controls[name].register(["general"])
                await wait_channel(daemon, name, "general")
            socket = daemon.host_socket_path
            assert socket is not None
            async with RouterClient.connect_unix(socket) as host:
                await host.hello("host", ["kai"])
                answer = await b.incoming([{"channelId": "general", "text": "hi kai", "tags": ["chat:mention"]}])
                assert answer["results"][0]["accepted"] is True
                wake = await host.next_wake()
                assert wake.channel is not None
                assert (wake.channel.server_id, wake.channel.channel_id, wake.channel.shown) == ("b", "general", "b:general")
                assert wake.reason == "message" and wake.agent == "kai"
                assert wake.tags == ("chat:mention", "chat:addressed") and wake.addressed
                assert wake.messages[0]["content"][0]["text"] == "hi kai"
                stored = await daemon.sessions.wake(wake.seq, "kai")
                assert stored is not None and stored.channel == ChannelRef("b", "general")
                assert await host.ack([wake.seq]) == 1


async def test_acks_issued_together_share_wake_ack_requests(short_tmp: Path) -> None:
    """A host acking each wake from a task of its own: the first ack goes out alone, the ones
    issued while it is in flight share the next ``wake/ack``; each caller gets its request's
    outcome (a count, or the refusal of an agent it does not own) and every wake is acked."""
    wakes = 20
    with trio.fail_after(40):
        async with two_servers(short_tmp, channels=("general",)) as (daemon, a, _b):
            await wait_channel(daemon, "a", "general")
            socket = daemon.host_socket_path
            assert socket is not None
            async with RouterClient.connect_unix(socket) as host:
                await host.hello("host", ["kai"])
                for n in range(wakes):
                    await a.incoming([{"channelId": "general", "text": f"kai {n}", "tags": ["chat:mention"]}])
                seqs = [(await host.next_wake()).seq for _ in range(wakes)]
                assert daemon.journal.unacked_count("kai") == wakes
                returned: dict[int, object] = {}

                async def ack(seq: int, agent: str | None = None) -> None:
                    try:
                        returned[seq] = await host.ack([seq], agent=agent)
                    except RpcError as exc:
                        returned[seq] = exc.code

                async with trio.open_nursery() as nursery:
                    for seq in seqs:
                        nursery.start_soon(ack, seq)
                    nursery.start_soon(ack, -1, "stranger")  # not this host's agent
                statistics = host.statistics()
                # 21 acks, 3 requests: the first alone, the 19 issued meanwhile together, and the
                # stranger's on its own (an agent argument never shares a request).
                assert (statistics.acks, statistics.ack_requests) == (wakes + 1, 3)
                assert returned.pop(-1) in (-32010, -32011)
                assert sorted(returned.values()) == [1] + [wakes - 1] * (wakes - 1)
                assert daemon.journal.unacked_count("kai") == 0


async def test_wake_routing_per_policy(short_tmp: Path) -> None:
    with trio.fail_after(40):
        async with two_servers(short_tmp, channels=("general",)) as (daemon, a, b):
            await wait_channel(daemon, "a", "general")
            await wait_channel(daemon, "b", "general")
            socket = daemon.host_socket_path
            assert socket is not None
            async with RouterClient.connect_unix(socket) as host:
                await host.hello(
                    "host",
                    [
                        "kai",  # default: addressed messages and pushes
                        {"name": "bee", "wake": {"channels": ["b:general"], "tags": []}},
                        {"name": "abe", "wake": {"servers": ["a"], "tags": ["chat:from-human"]}},
                    ],
                )
                await b.incoming([{"channelId": "general", "text": "ambient on b", "tags": ["chat:ambient"]}])
                await a.incoming([{"channelId": "general", "text": "reply on a", "tags": ["chat:reply"]}])
                await b.incoming([{"channelId": "general", "text": "human on b", "tags": ["chat:from-human"]}])
                await a.push("ev-1", origin={"source": "a"})
                await a.incoming([{"channelId": "general", "text": "plain on a"}])
                seen: list[WakeNotice] = []
                # ambient on b: bee (its channel) · reply on a: kai (addressed), abe (server a) ·
                # human on b: bee (channel), abe (tag) · push from a: kai (unscoped), abe (server
                # a) · plain on a: abe (server a). Eight wakes over five events.
                for _ in range(8):
                    seen.append(await host.next_wake())
                got = sorted((w.seq, w.agent) for w in seen)
                seqs = sorted({w.seq for w in seen})
                s1, s2, s3, s4, s5 = seqs
                assert got == sorted(
                    [(s1, "bee"), (s2, "kai"), (s2, "abe"), (s3, "bee"), (s3, "abe"), (s4, "kai"), (s4, "abe"), (s5, "abe")]
                )
                push = next(w for w in seen if w.seq == s4)
                assert push.reason == "push" and push.event["eventId"] == "ev-1" and push.channel is None
                # Wakes arrive in seq order.
                assert [w.seq for w in seen] == sorted(w.seq for w in seen)
                assert await host.ack(seqs) == 8


async def test_server_state_and_channel_notifications(short_tmp: Path) -> None:
    with trio.fail_after(40):
        async with two_servers(short_tmp) as (daemon, a, b):
            socket = daemon.host_socket_path
            assert socket is not None
            async with RouterClient.connect_unix(socket) as host, RouterClient.connect_unix(socket) as silent:
                await host.hello("host", [])
                await b.register(["general"])
                changed = await host.next_notification("channels/changed")
                assert changed.params == {"serverId": "b", "added": [{"serverId": "b", "channelId": "general"}], "removed": []}
                await b.withdraw(["general"])
                changed = await host.next_notification("channels/changed")
                assert changed.params["removed"] == [{"serverId": "b", "channelId": "general"}]
                await a.disconnect()  # stdio: the fixture exits; the daemon respawns it
                state = await host.next_notification("server/state")
                assert state.params["serverId"] == "a" and state.params["old"] == "ready"
                await wait_ready(daemon, "a", epoch=2)
                # A connection that never said hello is told nothing.
                assert silent.notifications.statistics().current_buffer_used == 0


async def test_notify_agent_and_broadcast_reach_the_right_connections(short_tmp: Path) -> None:
    with trio.fail_after(40):
        async with two_servers(short_tmp) as (daemon, _a, _b):
            socket = daemon.host_socket_path
            assert socket is not None
            sessions = daemon.sessions
            async with RouterClient.connect_unix(socket) as one, RouterClient.connect_unix(socket) as two:
                await one.hello("one", ["kai"])
                await two.hello("two", ["ora"])
                assert await sessions.notify_agent("kai", host_notices.WakeNotice({"agent": "kai", "text": "for kai"}))
                assert not await sessions.notify_agent("nobody", host_notices.WakeNotice({}))
                await sessions.broadcast(host_notices.ServerStateNotice("x", "connecting", "ready"))
                assert (await one.next_notification("wake")).params["text"] == "for kai"
                first = {"serverId": "x", "old": "connecting", "state": "ready"}
                assert (await one.next_notification("server/state")).params == first
                assert (await two.next_notification("server/state")).params == first
                # "two" got no wake: the next thing it is told is a later broadcast.
                await sessions.broadcast(host_notices.ServerStateNotice("x", "ready", "retrying"))
                assert (await two.next_notification()).params == {"serverId": "x", "old": "ready", "state": "retrying"}


async def _close(client: RouterClient) -> None:
    await client._peer.aclose("test closes the connection")
