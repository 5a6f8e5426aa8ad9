"""A split cluster's faults (issue 29): the node holding a link, or the router, lost during a flood.

Three ``mcpl-router run`` nodes on one PostgreSQL journal with ``cluster.links = "balanced"``:
``n3`` holds the router's lease (it started first: hosts, routing, the journal), server ``a``'s
link is pinned to ``n1``, ``b``'s to ``n2``; the router reaches each server through the relay of
its link's holder. The fixture server ``a`` floods (re-sending what it never heard
``accepted``, as real servers do: tests/integration/test_journal_failover.py's ledger), and a
host on the router acks every wake.

- ``n1`` (holding ``a``'s link) ``kill -9``ed: another node holds the link within the lease plus
  a handshake; nothing accepted is lost, nothing woken again after its ack was answered, and
  the host's connection to the router never drops.
- ``n1`` stopped (SIGSTOP) past its lease, then resumed: another node took the link meanwhile
  and the router left the stopped node's relay by itself (it saw the link's epoch move on);
  the resumed node writes nothing more to the server, even on a server that keeps its old
  connection open (``--keep-replaced-hosts``), says ``cluster.link.lost`` and stays up.
- ``n1`` drained (SIGTERM): its link is released at once and taken within a poll.
- the router ``kill -9``ed: another node takes the router's lease and reaches the servers
  through the same relays, which serve the new router; nothing lost.
- the router ``kill -9``ed and ``n1`` stopped just before the new router dials it: the dial is
  given up once the link moves, not waited out.

The figures (times from the fault until the router's link is ready again) are printed
(``pytest -s``) for the closing note.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import FailoverClient, RouterClient
from mcpl_router.store.leases import LINKS
from mcpl_router.store.postgres_backend import connect
from mcpl_router.testing import postgres
from mcpl_router.testing.control import FixtureProcess, wait_until

from .test_cluster_split import LEASE, ROUTER, SplitNodes, holders, reached_through, serving_all, split_cluster, status_of
from .test_journal_failover import SENDERS, TOTAL, Ledger, check, read_and_ack, send_all

pytestmark = pytest.mark.integration

#: Where each server's link belongs while its node is live; each registers ``general``.
FAULT_PINS = {"a": "n1", "b": "n2"}
FAULT_CHANNELS = {"a": ["general"], "b": ["general"]}
NODES = (ROUTER, "n1", "n2")


@asynccontextmanager
async def flood_cluster(workdir: Path, dsn: str, *, keep_replaced_hosts: bool = False) -> AsyncIterator[SplitNodes]:
    """Servers a and b (``general`` each; ``keep_replaced_hosts``: a server that keeps an older
    host connection open when a newer one comes); n3 the router; a's link on n1, b's on n2."""
    options = {name: {"keep_replaced_hosts": keep_replaced_hosts} for name in FAULT_CHANNELS}
    async with split_cluster(workdir, dsn, channels=FAULT_CHANNELS, pins=FAULT_PINS, server_options=options) as nodes:
        yield nodes


async def serving(socket: str) -> bool:
    return await serving_all(socket, FAULT_CHANNELS)


async def router_host(socket: str, ledger: Ledger, *, task_status: trio.TaskStatus[RouterClient] = trio.TASK_STATUS_IGNORED) -> None:
    """A host on the router alone (no failover): a connection that dropped ends the test (its
    next wake raises); every wake is acked."""
    async with RouterClient.connect_unix(socket) as host:
        await host.hello("host", ["kai"])
        task_status.started(host)
        await read_and_ack(host, ledger)


async def flood_until_third(server: FixtureProcess, ledger: Ledger, senders: trio.Nursery) -> None:
    for index in range(SENDERS):
        senders.start_soon(send_all, server, ledger, list(range(index, TOTAL, SENDERS)))
    await wait_until(lambda: len(ledger.accepted) >= TOTAL // 3, timeout=60)


async def wait_woken(ledger: Ledger, nodes: SplitNodes, timeout: float = 90) -> None:
    every = {f"m-{n}" for n in range(TOTAL)}
    try:
        await wait_until(lambda: every <= {m for _, m in ledger.woken}, timeout=timeout)
    except trio.TooSlowError:
        missing = sorted(every - {m for _, m in ledger.woken})
        raise AssertionError(f"never woken: {missing[:20]} ({len(missing)}); logs: {nodes.tails()}") from None


async def still_connected(host: RouterClient) -> None:
    """The host's one connection to the router answers yet: it never dropped."""
    status = await host.call("status", {})
    assert status["cluster"]["node"] == ROUTER


async def link_moved(nodes: SplitNodes, server: str, away_from: str, *, timeout: float = 30) -> str:
    """Until the router reaches ``server`` through a node other than ``away_from``: that node."""

    async def moved() -> str | None:
        through = await reached_through(nodes.socket(ROUTER), server)
        return through if through not in (None, away_from) else None

    try:
        through: str = await wait_until(moved, timeout=timeout, interval=0.05)
    except trio.TooSlowError:
        raise AssertionError(f"the router never reached {server} through another node; logs: {nodes.tails()}") from None
    return through


def wall(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


async def test_the_node_holding_a_link_killed_during_a_flood_loses_nothing_and_the_host_stays(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    ledger = Ledger()
    dsn = postgres.fresh_database(postgres_server, "split_link_kill9")
    with trio.fail_after(240):
        async with flood_cluster(short_tmp, dsn) as nodes:
            async with trio.open_nursery() as nursery:
                host = await nursery.start(router_host, nodes.socket(ROUTER), ledger)
                async with trio.open_nursery() as senders:
                    await flood_until_third(nodes.servers["a"], ledger, senders)
                    accepted_before = len(ledger.accepted)
                    killed_at = time.monotonic()
                    nodes.nodes["n1"].kill9()
                    assert await nodes.nodes["n1"].wait() == -signal.SIGKILL
                    through = await link_moved(nodes, "a", "n1")
                    took = time.monotonic() - killed_at
                await wait_woken(ledger, nodes)
                await still_connected(host)
                nursery.cancel_scope.cancel()
            status = await status_of(nodes.socket(ROUTER))
            assert status is not None
    print(f"\nlink node kill -9: {accepted_before} accepted before; the router's link to a ready through {through}"
          f" {took:.2f} s after the kill (lease {LEASE:g} s); {len(ledger.woken)} wakes for {TOTAL} messages;"
          f" woken again after an answered ack: {len(ledger.woken_after_ack())}")
    check(ledger)
    assert through in ("n2", "n3")
    # The link changed hands once, to the node the router now goes through, and b never moved.
    assert holders(status) == {"a": through, "b": "n2"}, status["cluster"]["links"]
    # Taken once from n1's lease run out (the router took it first, alone, and handed it to n1).
    [n1_epoch] = [line["epoch"] for line in nodes.events("n1", "cluster.link.taken") if line["server"] == "a"]
    assert [line["epoch"] for line in nodes.events(through, "cluster.link.taken") if line["server"] == "a"][-1] == n1_epoch + 1


async def test_a_link_node_paused_past_its_lease_writes_nothing_more_to_the_server_when_it_resumes(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    ledger = Ledger()
    dsn = postgres.fresh_database(postgres_server, "split_link_pause")
    published: list[dict[str, Any]] = []
    with trio.fail_after(240):
        async with flood_cluster(short_tmp, dsn, keep_replaced_hosts=True) as nodes:
            a = nodes.servers["a"]
            n1 = nodes.process("n1")
            async with trio.open_nursery() as nursery:
                host = await nursery.start(router_host, nodes.socket(ROUTER), ledger)

                async def publish_while_paused() -> None:
                    # Sent by the router into n1's relay while n1 is stopped: it waits there,
                    # in n1's socket buffer, for n1 to run again.
                    published.append(await host.call("channels/publish", {
                        "agent": "kai", "channel": {"serverId": "a", "channelId": "general"}, "content": "said during the pause"}))

                async with trio.open_nursery() as senders:
                    await flood_until_third(a, ledger, senders)
                    paused_epoch = (await a.state())["epoch"]
                    paused_at = time.monotonic()
                    os.kill(n1.pid, signal.SIGSTOP)
                    try:
                        nursery.start_soon(publish_while_paused)
                        # The link is taken while n1 is stopped, and the router reaches it
                        # through the new holder: it left n1's stalled relay by itself.
                        through = await link_moved(nodes, "a", "n1")
                        took = time.monotonic() - paused_at
                        await trio.sleep(1)  # the flood goes on through the new holder
                    finally:
                        resumed_wall = time.time()
                        os.kill(n1.pid, signal.SIGCONT)
                    # n1 finds its link lease run out the moment it runs.
                    await wait_until(lambda: nodes.events("n1", "cluster.link.lost") != [], timeout=10)
                await wait_woken(ledger, nodes)
                await wait_until(lambda: published != [], timeout=30)
                await still_connected(host)
                nursery.cancel_scope.cancel()
            await trio.sleep(1)  # what n1 might still write after it resumed reaches the server
            recorded = await a.recorded()
            assert n1.poll() is None  # n1 stays up: a node that lost a link runs on
    # Which of n1's two guards stopped it first (a race of its tasks at the resume): a write
    # refused by the link lease's fence, or the renewals' check ending the relay.
    refused = [line for line in nodes.events("n1", "cluster.relay.closed") if str(line.get("reason", "")).startswith("not sent:")]
    print(f"\nlink node paused: the router's link to a ready through {through} {took:.2f} s after the pause"
          f" (lease {LEASE:g} s); after the resume n1 {'refused a write to a (fenced)' if refused else 'ended its relay first'};"
          f" the publish made during the pause: {published[0].get('reason') or published[0].get('delivered')}")
    check(ledger)
    # After the new holder connected, nothing more arrived on n1's connection (kept open by the
    # server): what the router had sent n1 while it was stopped was never written.
    new_epoch_began = min(wall(entry["at"]) for entry in recorded if entry["epoch"] > paused_epoch)
    late = [entry for entry in recorded if entry["epoch"] == paused_epoch and wall(entry["at"]) >= new_epoch_began]
    assert late == [], late
    assert not [entry for entry in recorded if entry["epoch"] == paused_epoch and wall(entry["at"]) >= resumed_wall]
    # No post twice. The one made during the pause waited in n1's socket (its answer: unconfirmed)
    # and was never written: n1 ran again only after its link lease had run out.
    texts = [("".join(block.get("text", "") for block in entry["params"].get("content", [])))
             for entry in recorded if entry["method"] == "channels/publish"]
    assert texts.count("said during the pause") == (1 if published[0].get("delivered") else 0), (texts, published)
    assert len(texts) == len(set(texts)), texts
    [lost] = [line for line in nodes.events("n1", "cluster.link.lost") if line["server"] == "a"]
    assert "ran out unrenewed" in lost["reason"], lost
    # The router closed n1's relay when it saw the link's epoch move on, not when n1 came back.
    superseded = [line for line in nodes.events(ROUTER, "cluster.link.relay_superseded") if line["server"] == "a"]
    assert superseded and wall(superseded[0]["timestamp"]) < resumed_wall, superseded


async def test_a_drained_link_node_hands_its_link_over_at_once(short_tmp: Path, postgres_server: postgres.Server) -> None:
    ledger = Ledger()
    dsn = postgres.fresh_database(postgres_server, "split_link_drain")
    with trio.fail_after(240):
        async with flood_cluster(short_tmp, dsn) as nodes:
            async with trio.open_nursery() as nursery:
                host = await nursery.start(router_host, nodes.socket(ROUTER), ledger)
                async with trio.open_nursery() as senders:
                    await flood_until_third(nodes.servers["a"], ledger, senders)
                    drained_at = time.monotonic()
                    nodes.process("n1").send_signal(signal.SIGTERM)
                    through = await link_moved(nodes, "a", "n1")
                    took = time.monotonic() - drained_at
                    assert await nodes.nodes["n1"].wait() == 0
                await wait_woken(ledger, nodes)
                await still_connected(host)
                nursery.cancel_scope.cancel()
    print(f"\nlink node drained: the router's link to a ready through {through} {took:.2f} s after SIGTERM (lease {LEASE:g} s)")
    check(ledger)
    [handed] = nodes.events("n1", "cluster.link.handed_over")
    assert (handed["server"], handed["released"]) == ("a", True), handed
    assert "draining" in handed["reason"], handed
    # Released, not waited out: the next holder took it under the next epoch, after the release
    # (the time it took is printed above, for docs/performance.md; tests assert no wall clock).
    [taken] = [line for line in nodes.events(through, "cluster.link.taken") if line["server"] == "a"][-1:]
    assert taken["epoch"] == handed["epoch"] + 1 and wall(taken["timestamp"]) >= wall(handed["timestamp"]), (taken, handed)


async def test_the_router_killed_in_a_split_cluster_is_taken_over_through_the_same_relays(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    ledger = Ledger()
    dsn = postgres.fresh_database(postgres_server, "split_router_kill9")

    async def failover_host(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with FailoverClient.connect([nodes.socket(node) for node in NODES], give_up_after=120) as host:
            await host.hello("host", ["kai"])
            task_status.started()
            await read_and_ack(host, ledger)

    with trio.fail_after(240):
        async with flood_cluster(short_tmp, dsn) as nodes:
            async with trio.open_nursery() as nursery:
                await nursery.start(failover_host)
                async with trio.open_nursery() as senders:
                    await flood_until_third(nodes.servers["a"], ledger, senders)
                    killed_at = time.monotonic()
                    nodes.nodes[ROUTER].kill9()
                    assert await nodes.nodes[ROUTER].wait() == -signal.SIGKILL

                    async def new_router() -> str | None:
                        for node in ("n1", "n2"):
                            if await serving(nodes.socket(node)):
                                return node
                        return None

                    router: str = await wait_until(new_router, timeout=60, interval=0.05)
                    took = time.monotonic() - killed_at
                await wait_woken(ledger, nodes)
                nursery.cancel_scope.cancel()
            status = await status_of(nodes.socket(router))
            assert status is not None
    print(f"\nrouter kill -9 in a split cluster: {router} serving {took:.2f} s after the kill (lease {LEASE:g} s);"
          f" {len(ledger.woken)} wakes for {TOTAL} messages; woken again after an answered ack: {len(ledger.woken_after_ack())}")
    check(ledger)
    # The links stayed where they were; the new router reaches each through its holder's relay.
    assert holders(status) == FAULT_PINS, status["cluster"]["links"]
    endpoints = {row["serverId"]: row["endpoint"] for row in status["servers"]}
    assert all(endpoints[server].endswith(f"via node {node}") for server, node in FAULT_PINS.items()), endpoints
    # Each relay served the dead router, then the new one.
    for server, node in FAULT_PINS.items():
        served = [line["router"] for line in nodes.events(node, "cluster.relay.serving") if line.get("server") == server]
        assert served[-1] == router and ROUTER in served, (node, served)
    assert [line["epoch"] for line in nodes.events(router, "cluster.lease.taken")] == [2]


def router_lease_left(dsn: str) -> float:
    """Seconds the router's lease has left, by the database's clock (negative: run out)."""
    conn = connect(dsn, None)
    try:
        row = conn.execute("SELECT extract(epoch FROM expires_at - clock_timestamp()) FROM cluster_leases WHERE scope = ?",
                           (LINKS,)).fetchone()
        assert row is not None
        return float(row[0])
    finally:
        conn.close()


async def test_a_new_router_gives_up_a_paused_link_nodes_relay_once_the_link_moves(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    """The router killed, and n1 (holding a's link) stopped just before another node takes the
    router's lease: the new router's first dial of a's link goes to n1, whose kernel accepts the
    connection and never answers. Once the database shows a's link taken by another node, the
    dial is given up and the new holder dialled (before, it waited out the relay's 15 s answer
    timeout: the link was ready 12 s after it had moved, 20 s after the kill)."""
    dsn = postgres.fresh_database(postgres_server, "split_paused_relay")
    with trio.fail_after(120):
        async with flood_cluster(short_tmp, dsn) as nodes:
            n1 = nodes.process("n1")
            nodes.nodes[ROUTER].kill9()
            assert await nodes.nodes[ROUTER].wait() == -signal.SIGKILL

            # n1 stopped in the router's lease's last second: the new router (n2, the only
            # other node) takes it only after that, while n1's link lease lasts seconds more.
            async def in_its_last_second() -> bool:
                return 0 < await trio.to_thread.run_sync(router_lease_left, dsn) < 1.0

            await wait_until(in_its_last_second, timeout=10, interval=0.05)
            paused_at = time.monotonic()
            os.kill(n1.pid, signal.SIGSTOP)
            try:
                async def ready_through_n2() -> bool:
                    return await reached_through(nodes.socket("n2"), "a") == "n2"

                await wait_until(ready_through_n2, timeout=40, interval=0.1)
                took = time.monotonic() - paused_at
            finally:
                os.kill(n1.pid, signal.SIGCONT)
    print(f"\nrouter killed, a's link node paused: the new router's link to a ready through n2 {took:.2f} s after the pause (lease {LEASE:g} s)")
    [abandoned] = [line for line in nodes.events("n2", "cluster.link.dial_abandoned") if line["server"] == "a"]
    assert abandoned["holder"] == "n1", abandoned
    waited_out = [line for line in nodes.events("n2", "link.state") if "did not answer" in str(line.get("error"))]
    assert waited_out == [], waited_out
