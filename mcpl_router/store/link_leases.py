"""Leases on single links: which node of a cluster holds each server's connection.

With ``cluster.links = "balanced"`` (docs/cluster.md) a server's connection is held by one node
under a row of ``cluster_links``, with an **epoch**, taken and renewed as the router's lease is
(store/leases.py): taken only when expired or released, each taking raising the epoch; renewed
by its holder while the epoch is its own. The router's journal writes are fenced by the
router's lease; what a link's lease fences is the bytes its holder's relay writes to the
server (checked against the local deadline before each write, :class:`LeaseFence`).

Every function here is synchronous and runs in a worker thread on a connection of its own.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Final

import attrs

from mcpl_router.store.leases import LINKS, LeaseTerm, acquire

if TYPE_CHECKING:
    from mcpl_router.store.backend import Connection

__all__ = ["LINK", "LinkHolder", "acquire_link", "link_holder", "links_view", "router_holds"]

#: A link lease's scope, as :class:`LeaseTerm` and the logs say it.
LINK: Final = "link"


@attrs.frozen
class LinkHolder:
    """Who holds a server's link now, and where its relay listens (None: it published none)."""

    server: str
    node: str
    epoch: int
    relay: str | None
    #: Seconds since the holder's last heartbeat (by the database's clock); None: no row.
    seen_ago: float | None = None


def acquire_link(db: Connection, server: str, node: str, ttl: float) -> tuple[LeaseTerm | None, float]:
    """Take ``server``'s link for ``node`` if no one holds it unexpired (as the router's lease
    is taken: :func:`~mcpl_router.store.leases.acquire`)."""
    return acquire(db, LINK, node, ttl, server=server)


def link_holder(db: Connection, server: str) -> LinkHolder | None:
    """The node holding ``server``'s link unexpired, with its relay's address; None if none."""
    row = db.execute(
        "SELECT l.node, l.epoch, n.info, extract(epoch FROM clock_timestamp() - n.seen_at)"
        " FROM cluster_links l LEFT JOIN cluster_nodes n ON n.node = l.node"
        " WHERE l.server = ? AND l.expires_at > clock_timestamp()",
        (server,),
    ).fetchone()
    if row is None:
        return None
    info = json.loads(str(row[2])) if row[2] is not None else {}
    relay = info.get("relay") if isinstance(info, dict) else None
    seen_ago = None if row[3] is None else float(str(row[3]))
    return LinkHolder(server, str(row[0]), int(row[1]), relay if isinstance(relay, str) else None, seen_ago)


def router_holds(db: Connection, node: str, epoch: int) -> bool:
    """True while ``node`` holds the router's lease with ``epoch``, unexpired: a relay serves
    that router only (a router that lost its lease is refused)."""
    row = db.execute(
        "SELECT 1 FROM cluster_leases WHERE scope = ? AND node = ? AND epoch = ? AND expires_at > clock_timestamp()",
        (LINKS, node, epoch),
    ).fetchone()
    return row is not None


def links_view(db: Connection) -> list[dict[str, object]]:
    """Every link lease as the database has it: holder, epoch, since, seconds left (negative:
    expired or released)."""
    return [
        {"server": server, "node": node, "epoch": int(epoch), "since": float(since), "expiresIn": round(float(left), 3)}
        for server, node, epoch, since, left in db.execute(
            "SELECT server, node, epoch, extract(epoch FROM acquired_at), extract(epoch FROM expires_at - clock_timestamp())"
            " FROM cluster_links ORDER BY server"
        ).fetchall()
    ]
