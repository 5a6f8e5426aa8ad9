"""Leases in the journal's database: which node of a cluster holds the links, and its fence.

A cluster is the daemons sharing one PostgreSQL journal (docs/cluster.md). One node at a time
holds the links (every server's connection) and writes the journal; it does so under a lease,
a row in ``cluster_leases`` with an **epoch**:

- **taken** only when no one holds it or its holder let it expire (``INSERT … ON CONFLICT DO
  UPDATE … WHERE expires_at < clock_timestamp()``): each taking raises the epoch by one;
- **renewed** by its holder while the epoch is still its own and the lease has not expired;
- **fenced**: every journal transaction of the holder first takes the row ``FOR SHARE`` where
  node, epoch and an unexpired ``expires_at`` are its own (:meth:`LeaseFence.check_in`). A
  commit so fenced finishes before any taking can (the taking's update waits for the share
  lock), and a node whose epoch is gone commits nothing: a paused node resumed after a
  takeover writes no row;
- **checked before bytes go to a server**: the holder keeps a local deadline, its renewal's
  start plus the lease less a margin (:meth:`LeaseFence.refusal`), on the monotonic clock,
  which runs on while a process is stopped. The database's expiry is never earlier than it.

Rows are replicated with the journal, so a holder stays the holder across a database failover
(an advisory lock would not). ``cluster_nodes`` says who is there: each node's row, renewed by
its heartbeat, read by ``status`` and ``/metrics``.

Every function here is synchronous and runs in a worker thread on a connection of its own.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import attrs

if TYPE_CHECKING:
    from mcpl_router.store.backend import Connection

__all__ = [
    "LINKS",
    "LeaseFence",
    "LeaseLost",
    "LeaseTerm",
    "acquire",
    "cluster_view",
    "ensure_cluster_tables",
    "forget_gone_nodes",
    "heartbeat",
    "leave",
    "relay_token",
    "release",
    "renew",
]

#: The one lease of this version: the right to hold every server link and write the journal.
LINKS: Final = "links"
#: The channel a release is announced on: standbys try to take the lease at once, not at their
#: next poll. Only a nudge: the table is the truth.
RELEASED_CHANNEL: Final = "mcpl_router_lease_released"

#: The transaction-scoped advisory lock the cluster's tables are made under (not the journal
#: writer's key: a standby makes them while the holder's writer holds that).
_TABLES_LOCK_KEY: Final = 0x6D63_706C_636C_7573  # "mcplclus"

CLUSTER_TABLES: Final = (
    """CREATE TABLE IF NOT EXISTS cluster_leases (
        scope text PRIMARY KEY,
        node text NOT NULL,
        epoch bigint NOT NULL,
        acquired_at timestamptz NOT NULL,
        expires_at timestamptz NOT NULL
    )""",
    # One row per server whose link is leased (``cluster.links = "balanced"``): who holds its
    # connection (store/link_leases.py).
    """CREATE TABLE IF NOT EXISTS cluster_links (
        server text PRIMARY KEY,
        node text NOT NULL,
        epoch bigint NOT NULL,
        acquired_at timestamptz NOT NULL,
        expires_at timestamptz NOT NULL
    )""",
    # The token a node's relay takes from the router (cluster/relay.py): made once, read by
    # every node from here, so only what can read the journal can use a relay.
    """CREATE TABLE IF NOT EXISTS cluster_relay_token (
        id smallint PRIMARY KEY CHECK (id = 1),
        token text NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS cluster_nodes (
        node text PRIMARY KEY,
        state text NOT NULL,
        started_at timestamptz NOT NULL,
        seen_at timestamptz NOT NULL,
        info text NOT NULL
    )""",
)


class LeaseLost(Exception):
    """This node's lease is gone (expired, or another node took it): it may not write the
    journal nor send to a server any more."""


@attrs.frozen
class LeaseTerm:
    """One holding of a lease: by whom, with which epoch, since when (the database's clock,
    seconds since the epoch)."""

    scope: str
    node: str
    epoch: int
    since: float
    #: The server whose link this lease is (``cluster_links``); None for the router's lease.
    server: str | None = None

    @property
    def what(self) -> str:
        """What the lease is on, for a sentence: "the links" or "server s1's link"."""
        return f"the {self.scope}" if self.server is None else f"server {self.server}'s link"


@attrs.define
class LeaseFence:
    """What a holder checks before a write leaves it: the journal's transactions in the
    database (:meth:`check_in`), a server's bytes against the local deadline (:meth:`refusal`).

    ``valid_until`` is on :func:`time.monotonic` (a stopped process's clock runs on); the
    renewal moves it forward (:meth:`renewed`) and a loss ends it (:meth:`lost`).
    """

    term: LeaseTerm
    valid_until: float
    #: Why the lease was lost, once it was.
    loss: str | None = None

    def refusal(self) -> str | None:
        """None while this node may send for the lease; else why not (one sentence)."""
        if self.loss is not None:
            return self.loss
        if time.monotonic() >= self.valid_until:
            return f"node {self.term.node}'s lease on {self.term.what} (epoch {self.term.epoch}) ran out unrenewed"
        return None

    def renewed(self, valid_until: float) -> None:
        if self.loss is None:
            self.valid_until = max(self.valid_until, valid_until)

    def lost(self, why: str) -> None:
        if self.loss is None:
            self.loss = why

    def check_in(self, db: Connection) -> None:
        """In the writer's open transaction, before it writes: the lease is still this node's.

        Raises:
            LeaseLost: the local deadline passed, or the row says another epoch or an expiry.
        """
        refusal = self.refusal()
        if refusal is None:
            row = db.execute(
                "SELECT 1 FROM cluster_leases WHERE scope = ? AND node = ? AND epoch = ? AND expires_at > clock_timestamp() FOR SHARE",
                (self.term.scope, self.term.node, self.term.epoch),
            ).fetchone()
            if row is not None:
                return
            refusal = f"node {self.term.node}'s lease on {self.term.what} (epoch {self.term.epoch}) is gone from the database"
            self.lost(refusal)
        raise LeaseLost(f"{refusal}: this node may not write the journal")


def ensure_cluster_tables(db: Connection) -> None:
    """Make the cluster's two tables if they are missing (idempotent; autocommit).

    One node at a time: nodes started together on a fresh database would otherwise race, two
    ``CREATE TABLE IF NOT EXISTS`` both finding the table missing and the second failing on the
    catalog's unique index (the node exiting at start)."""
    db.execute("BEGIN")
    try:
        db.execute("SELECT pg_advisory_xact_lock(?)", (_TABLES_LOCK_KEY,))
        for statement in CLUSTER_TABLES:
            db.execute(statement)
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:  # a broken connection is in none: nothing to roll back
            db.execute("ROLLBACK")
        raise


#: Where a lease's row is: the router's lease by its scope in ``cluster_leases``, a server's
#: link by the server's id in ``cluster_links`` (store/link_leases.py). Fixed identifiers only.
_ROWS: Final = {None: ("cluster_leases", "scope"), "link": ("cluster_links", "server")}


def _row_of(scope: str, server: str | None) -> tuple[str, str, str]:
    """(table, key column, key) of a lease."""
    table, column = _ROWS[None if server is None else "link"]
    return table, column, scope if server is None else server


def acquire(db: Connection, scope: str, node: str, ttl: float, *, server: str | None = None) -> tuple[LeaseTerm | None, float]:
    """Take ``scope`` (or ``server``'s link) for ``node`` if no one holds it unexpired; (the
    term or None, the local deadline it is good until). Not even its own unexpired lease is
    taken again: a node restarted at once waits it out, and two processes given one node name
    by mistake can't take it from each other in turn."""
    table, column, key = _row_of(scope, server)
    started = time.monotonic()
    row = db.execute(
        f"INSERT INTO {table} AS l ({column}, node, epoch, acquired_at, expires_at)"
        " VALUES (?, ?, 1, clock_timestamp(), clock_timestamp() + make_interval(secs => ?))"
        f" ON CONFLICT ({column}) DO UPDATE SET node = excluded.node, epoch = l.epoch + 1,"
        " acquired_at = excluded.acquired_at, expires_at = excluded.expires_at"
        " WHERE l.expires_at < clock_timestamp()"
        " RETURNING epoch, extract(epoch FROM acquired_at)",
        (key, node, ttl),
    ).fetchone()
    if row is None:
        return None, started
    return LeaseTerm(scope, node, int(row[0]), float(row[1]), server=server), started + ttl * (1 - MARGIN)


#: A holder's writer connection is ended by the server when it sits this long inside a
#: transaction (``idle_in_transaction_session_timeout``): a holder stopped mid-commit would
#: otherwise keep the lease row's share lock, and the takeover waiting on it, for as long as
#: it is stopped. A commit's statements follow each other within milliseconds.
HOLDER_IDLE_IN_TRANSACTION_MS: Final = 1000
#: What a node's own lease statements wait for a row lock at most (an acquire behind a commit
#: under way): a wait past it fails that attempt, and the next poll tries again.
LEASE_LOCK_TIMEOUT_MS: Final = 1000

#: The part of the lease a holder does not count on: its local deadline is its renewal's start
#: plus (1 − margin) × ttl, so it stops sending before the database could let another node in,
#: with room for the clocks' drift and a write already under way.
MARGIN: Final = 0.2


def renew(db: Connection, term: LeaseTerm, ttl: float) -> float | None:
    """Extend ``term`` by ``ttl`` from now; the new local deadline, or None when the lease is
    no longer this term's (expired or taken)."""
    table, column, key = _row_of(term.scope, term.server)
    started = time.monotonic()
    row = db.execute(
        f"UPDATE {table} SET expires_at = clock_timestamp() + make_interval(secs => ?)"
        f" WHERE {column} = ? AND node = ? AND epoch = ? AND expires_at > clock_timestamp() RETURNING 1",
        (ttl, key, term.node, term.epoch),
    ).fetchone()
    return None if row is None else started + ttl * (1 - MARGIN)


def release(db: Connection, term: LeaseTerm) -> bool:
    """Give ``term`` up now (a drain, after the journal's last commit; a link handed over):
    expired at once, and the router's announced, so a standby takes it without waiting out the
    lease. False if it was not ours."""
    table, column, key = _row_of(term.scope, term.server)
    row = db.execute(
        f"UPDATE {table} SET expires_at = clock_timestamp() - interval '1 millisecond'"
        f" WHERE {column} = ? AND node = ? AND epoch = ? RETURNING 1",
        (key, term.node, term.epoch),
    ).fetchone()
    if term.server is None:
        db.execute(f"NOTIFY {RELEASED_CHANNEL}")
    return row is not None


def relay_token(db: Connection) -> str:
    """The cluster's relay token, made at the first ask (256 random bits)."""
    db.execute("INSERT INTO cluster_relay_token (id, token) VALUES (1, ?) ON CONFLICT (id) DO NOTHING", (secrets.token_urlsafe(32),))
    row = db.execute("SELECT token FROM cluster_relay_token WHERE id = 1").fetchone()
    assert row is not None
    return str(row[0])


def heartbeat(db: Connection, node: str, state: str, info: Mapping[str, object], *, within: float = 0.0) -> dict[str, object] | None:
    """``node`` is here, in ``state`` (``standby``, ``holding``, ``draining``).

    Returns the row's last writer when it was another process (its ``pid`` or ``hostname``
    differ) that beat less than ``within`` seconds ago and did not stop: two processes given
    one node name, a configuration mistake the node says out loud. None otherwise.
    """
    before = db.execute(
        "SELECT info, state, extract(epoch FROM clock_timestamp() - seen_at) FROM cluster_nodes WHERE node = ?", (node,)
    ).fetchone()
    other: dict[str, object] | None = None
    if before is not None and before[1] != "stopped" and float(str(before[2])) < within:
        last = json.loads(str(before[0]))
        if isinstance(last, dict) and (last.get("pid"), last.get("hostname")) != (info.get("pid"), info.get("hostname")):
            other = last
    db.execute(
        "INSERT INTO cluster_nodes AS n (node, state, started_at, seen_at, info) VALUES (?, ?, clock_timestamp(), clock_timestamp(), ?)"
        " ON CONFLICT (node) DO UPDATE SET state = excluded.state, seen_at = excluded.seen_at, info = excluded.info",
        (node, state, json.dumps(dict(info), sort_keys=True)),
    )
    return other


#: A node row unseen this long is deleted at the next heartbeat of any node: a node renamed or
#: retired does not stay in ``status`` for ever.
FORGET_NODES_AFTER_S: Final = 24 * 3600


def forget_gone_nodes(db: Connection) -> int:
    """Delete the rows of nodes unseen for :data:`FORGET_NODES_AFTER_S`; how many."""
    cursor = db.execute(
        "DELETE FROM cluster_nodes WHERE seen_at < clock_timestamp() - make_interval(secs => ?)", (FORGET_NODES_AFTER_S,)
    )
    return max(0, cursor.rowcount)


def leave(db: Connection, node: str) -> None:
    """``node`` stopped on purpose: said in its row (kept, so ``status`` shows when it left)."""
    db.execute("UPDATE cluster_nodes SET state = 'stopped', seen_at = clock_timestamp() WHERE node = ?", (node,))


def cluster_view(db: Connection) -> dict[str, object]:
    """The nodes and the leases as the database has them, ages in seconds by its own clock."""
    nodes = [
        {"node": node, "state": state, "startedAt": float(started), "seenAgo": round(float(ago), 3), "info": json.loads(info)}
        for node, state, started, ago, info in db.execute(
            "SELECT node, state, extract(epoch FROM started_at), extract(epoch FROM clock_timestamp() - seen_at), info"
            " FROM cluster_nodes ORDER BY node"
        ).fetchall()
    ]
    leases = [
        {"scope": scope, "node": node, "epoch": int(epoch), "since": float(since), "expiresIn": round(float(left), 3)}
        for scope, node, epoch, since, left in db.execute(
            "SELECT scope, node, epoch, extract(epoch FROM acquired_at), extract(epoch FROM expires_at - clock_timestamp())"
            " FROM cluster_leases ORDER BY scope"
        ).fetchall()
    ]
    return {"nodes": nodes, "leases": leases}
