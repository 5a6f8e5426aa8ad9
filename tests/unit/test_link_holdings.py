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

import trio

from mcpl_router.cluster.database import NodeDatabase
from mcpl_router.cluster.links import LinkHoldings
from mcpl_router.config import RouterConfig, parse_config
from mcpl_router.store.backend import Connection
from mcpl_router.store.leases import ensure_cluster_tables
from mcpl_router.store.leases import renew
from mcpl_router.store.link_leases import links_view
from mcpl_router.testing import postgres
from mcpl_router.testing.control import wait_until

_T = TypeVar("_T")


def balanced_config(dsn: str, base_dir: Path) -> RouterConfig:
    servers = {name: {"url": "tcp://127.0.0.1:9"} for name in ("a", "b")}
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
        assert holdings.counts == {"linksTaken": 2, "linksLost": 0, "linksHandedOver": 1}
        assert sorted(holdings.held) == ["a"]
        rows = {str(row["server"]): row for row in await lookups.run(links_view)}
        assert float(str(rows["b"]["expiresIn"])) < 0 < float(str(rows["a"]["expiresIn"]))  # b released, a renewed
    finally:
        leases.close()
        lookups.close()
