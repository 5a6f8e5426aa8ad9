"""A node's link leases (cluster/links.py) on a real PostgreSQL: what its renewals make of a
hand-over.

A node renews its links one after another, each a database round trip; a hand-over (a drain, a
pinned node back) may come while a pass is under way. The link handed over was released: the
pass must not then renew it, find it gone and call it lost (an error, ``linksLost``, which an
operator alerts on) as if another node had taken it from under this one.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import attrs
import pytest
import trio

from mcpl_router.cluster.database import NodeDatabase
from mcpl_router.cluster.links import LinkHoldings
from mcpl_router.config import RouterConfig, parse_config
from mcpl_router.store.backend import Connection
from mcpl_router.cluster.relay import dial_relay
from mcpl_router.mcpl.transports import TransportError
from mcpl_router.store.leases import LINKS, acquire, ensure_cluster_tables, heartbeat, relay_token, renew
from mcpl_router.store.link_leases import link_holder, links_view
from mcpl_router.testing import postgres
from mcpl_router.testing.control import wait_until

_T = TypeVar("_T")


def balanced_config(dsn: str, base_dir: Path, names: tuple[str, ...] = ("a", "b")) -> RouterConfig:
    servers = {name: {"url": "tcp://127.0.0.1:9"} for name in names}
    return parse_config(
        {"mcplServers": servers, "host": {"unixSocket": False, "websocket": {"enabled": False}},
         "journal": {"backend": "postgres", "dsn": dsn},
         "cluster": {"node": "n1", "leaseTtl": 1.0, "links": "balanced"}},
        source="<test>", base_dir=base_dir,
    )


class HandOverMidPass(NodeDatabase):
    """The node's lease connection; while server a's renewal is under way (the first time),
    server b is handed over, as a drain or a pinned node's return would."""

    holdings: LinkHoldings | None = None
    handed = False
    renewed: list[str]

    async def run(self, fn: Callable[[Connection], _T]) -> _T:
        if isinstance(fn, partial) and fn.func is renew:
            server = fn.keywords["term"].server
            self.renewed.append(server)
            if server == "a" and not self.handed:
                self.handed = True
                assert self.holdings is not None
                await self.holdings._hand_over("b", "it is pinned to node n2, which is live")
        return await super().run(fn)


async def test_a_link_handed_over_during_a_renewal_pass_is_released_not_lost(tmp_path: Path, postgres_server: postgres.Server) -> None:
    dsn = postgres.fresh_database(postgres_server, "link_holdings_pass")
    leases, lookups = HandOverMidPass(dsn, None, "leases"), NodeDatabase(dsn, None, "lookups")
    leases.renewed = []
    try:
        await lookups.run(ensure_cluster_tables)
        holdings = LinkHoldings("n1", balanced_config(dsn, tmp_path), leases=leases, lookups=lookups)
        leases.holdings = holdings
        for server in ("a", "b"):
            await holdings._take(server)
        assert sorted(holdings.held) == ["a", "b"]
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(holdings._renewals)
                # Until a's renewal comes again: the pass that met the hand-over is over.
                await wait_until(lambda: leases.renewed.count("a") >= 2, interval=0.05)
                nursery.cancel_scope.cancel()
        assert holdings.counts == {"linksTaken": 2, "linksLost": 0, "linksHandedOver": 1, "linksUnreachable": 0}
        assert sorted(holdings.held) == ["a"]
        rows = {str(row["server"]): row for row in await lookups.run(links_view)}
        assert float(str(rows["b"]["expiresIn"])) < 0 < float(str(rows["a"]["expiresIn"]))  # b released, a renewed
    finally:
        leases.close()
        lookups.close()


async def test_a_holder_that_cant_reach_its_server_hands_the_link_on_and_does_not_take_it_back(
    tmp_path: Path, postgres_server: postgres.Server
) -> None:
    dsn = postgres.fresh_database(postgres_server, "link_holdings_unreachable")
    leases, lookups = NodeDatabase(dsn, None, "leases"), NodeDatabase(dsn, None, "lookups")
    try:
        await lookups.run(ensure_cluster_tables)
        router, _ = await lookups.run(partial(acquire, scope=LINKS, node="r", ttl=60.0))
        assert router is not None
        config = balanced_config(dsn, tmp_path, ("a",))
        holdings = LinkHoldings("n1", config, leases=leases, lookups=lookups)
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:

                async def another_node() -> None:  # n2, live (it takes nothing: no process behind it)
                    while True:
                        await lookups.run(partial(heartbeat, node="n2", state="standby", info={}))
                        await trio.sleep(0.1)

                nursery.start_soon(another_node)
                await nursery.start(holdings.run)
                await wait_until(lambda: "a" in holdings.held, interval=0.05)
                holdings.relay.token = await lookups.run(relay_token)
                # The router dials a through n1's relay: server a's port refuses, each time.
                for _ in range(3):
                    row = await lookups.run(partial(link_holder, server="a"))
                    assert row is not None and row.node == "n1"
                    holder = attrs.evolve(row, relay=holdings.relay.address)  # n1 publishes it in its heartbeat, not run here
                    with pytest.raises(TransportError, match="did not relay server a: could not connect to tcp://127.0.0.1:9"):
                        await dial_relay(holder, config.servers["a"], router="r", router_epoch=router.epoch, token=holdings.relay.token)
                    await trio.sleep(1.05)
                await wait_until(lambda: holdings.counts["linksUnreachable"] == 1, interval=0.05)
                assert "a" not in holdings.held
                # Not taken back here for a while, though it is free and n1 the least loaded.
                await trio.sleep(1.0)
                assert "a" not in holdings.held
                nursery.cancel_scope.cancel()
    finally:
        leases.close()
        lookups.close()


async def test_balancing_holds_off_when_no_node_picks_up_what_it_moved(tmp_path: Path, postgres_server: postgres.Server) -> None:
    dsn = postgres.fresh_database(postgres_server, "link_holdings_balance_pause")
    leases, lookups = NodeDatabase(dsn, None, "leases"), NodeDatabase(dsn, None, "lookups")
    try:
        await lookups.run(ensure_cluster_tables)
        holdings = LinkHoldings("n1", balanced_config(dsn, tmp_path), leases=leases, lookups=lookups)
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:

                async def a_node_that_takes_nothing() -> None:  # n2: live, its links never taken
                    while True:
                        await lookups.run(partial(heartbeat, node="n2", state="standby", info={}))
                        await trio.sleep(0.1)

                nursery.start_soon(a_node_that_takes_nothing)
                await nursery.start(holdings.run)
                # n1 takes its share, then the other link once free too long, then moves one to
                # n2 for balance; no one takes it: n1 takes it back and stops moving links.
                await wait_until(lambda: holdings.counts["linksHandedOver"] >= 1 and sorted(holdings.held) == ["a", "b"],
                                 timeout=20, interval=0.05)
                handed = holdings.counts["linksHandedOver"]
                await trio.sleep(3.0)  # three leases: no move again
                assert holdings.counts["linksHandedOver"] == handed == 1 and sorted(holdings.held) == ["a", "b"]
                nursery.cancel_scope.cancel()
    finally:
        leases.close()
        lookups.close()
