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
import time
from typing import TYPE_CHECKING, Final

import attrs

from mcpl_router.store.leases import LINKS, MARGIN, LeaseTerm

if TYPE_CHECKING:
    from mcpl_router.store.backend import Connection

__all__ = ["LINK", "LinkHolder", "acquire_link", "link_holder", "links_view", "release_link", "renew_link", "router_holds"]

#: A link lease's scope, as :class:`LeaseTerm` and the logs say it.
LINK: Final = "link"


@attrs.frozen
class LinkHolder:
    """Who holds a server's link now, and where its relay listens (None: it published none)."""

    server: str
    node: str
    epoch: int
    relay: str | None


def acquire_link(db: Connection, server: str, node: str, ttl: float) -> tuple[LeaseTerm | None, float]:
    """Take ``server``'s link for ``node`` if no one holds it unexpired; (the term or None, the
    local deadline it is good until), as :func:`~mcpl_router.store.leases.acquire`."""
    started = time.monotonic()
    row = db.execute(
        "INSERT INTO cluster_links AS l (server, node, epoch, acquired_at, expires_at)"
        " VALUES (?, ?, 1, clock_timestamp(), clock_timestamp() + make_interval(secs => ?))"
        " ON CONFLICT (server) DO UPDATE SET node = excluded.node, epoch = l.epoch + 1,"
        " acquired_at = excluded.acquired_at, expires_at = excluded.expires_at"
        " WHERE l.expires_at < clock_timestamp()"
        " RETURNING epoch, extract(epoch FROM acquired_at)",
        (server, node, ttl),
    ).fetchone()
    if row is None:
        return None, started
    return LeaseTerm(LINK, node, int(row[0]), float(row[1]), server=server), started + ttl * (1 - MARGIN)


def renew_link(db: Connection, term: LeaseTerm, ttl: float) -> float | None:
    """Extend ``term`` by ``ttl`` from now; the new local deadline, or None when the link is no
    longer this term's (expired, or taken by another node)."""
    started = time.monotonic()
    row = db.execute(
        "UPDATE cluster_links SET expires_at = clock_timestamp() + make_interval(secs => ?)"
        " WHERE server = ? AND node = ? AND epoch = ? AND expires_at > clock_timestamp() RETURNING 1",
        (ttl, term.server, term.node, term.epoch),
    ).fetchone()
    return None if row is None else started + ttl * (1 - MARGIN)


def release_link(db: Connection, term: LeaseTerm) -> bool:
    """Give ``term`` up now (a drain, or a hand-over to the node it belongs on): another node
    takes it at its next poll. False if it was not this term's any more."""
    row = db.execute(
        "UPDATE cluster_links SET expires_at = clock_timestamp() - interval '1 millisecond'"
        " WHERE server = ? AND node = ? AND epoch = ? RETURNING 1",
        (term.server, term.node, term.epoch),
    ).fetchone()
    return row is not None


def link_holder(db: Connection, server: str) -> LinkHolder | None:
    """The node holding ``server``'s link unexpired, with its relay's address; None if none."""
    row = db.execute(
        "SELECT l.node, l.epoch, n.info FROM cluster_links l LEFT JOIN cluster_nodes n ON n.node = l.node"
        " WHERE l.server = ? AND l.expires_at > clock_timestamp()",
        (server,),
    ).fetchone()
    if row is None:
        return None
    info = json.loads(str(row[2])) if row[2] is not None else {}
    relay = info.get("relay") if isinstance(info, dict) else None
    return LinkHolder(server, str(row[0]), int(row[1]), relay if isinstance(relay, str) else None)


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
