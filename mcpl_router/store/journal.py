"""The journal: inbound events committed before the server is told ``accepted``.

SQLite in WAL mode. A whole ``channels/incoming`` batch commits in one transaction. The
unique key (server, kind, dedup key) makes a re-sent message or event a duplicate: answered
``accepted`` again, never recorded (or woken) twice.

The calls are synchronous: a WAL commit with ``synchronous=NORMAL`` costs well under a
millisecond, cheaper than a thread hop, and keeps the journal on the task that owns the state.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import msgspec

_SCHEMA = """
CREATE TABLE IF NOT EXISTS inbound (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    server TEXT NOT NULL,
    channel TEXT,
    kind TEXT NOT NULL,
    dedup TEXT NOT NULL,
    payload BLOB NOT NULL,
    received_at REAL NOT NULL,
    acked INTEGER NOT NULL DEFAULT 0,
    UNIQUE (server, kind, dedup)
);
-- One row per agent an inbound event woke; written in the event's own transaction, so a wake
-- is durable before the server hears "accepted". Re-sent to the agent's owner until acked.
CREATE TABLE IF NOT EXISTS deliveries (
    agent TEXT NOT NULL,
    seq INTEGER NOT NULL REFERENCES inbound (seq),
    reason TEXT NOT NULL,
    tags BLOB NOT NULL,
    addressed INTEGER NOT NULL,
    acked INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (agent, seq)
);
CREATE INDEX IF NOT EXISTS deliveries_unacked ON deliveries (agent, acked, seq);
-- Agents hosts declared, so wakes for them are kept while their host is away (and across
-- restarts). Config agents are not stored: the config declares them at every start.
CREATE TABLE IF NOT EXISTS agents (
    name TEXT PRIMARY KEY,
    spec BLOB NOT NULL
);
-- channel_decline: an agent chose to stay out of a channel (server + id: a channel is a pair).
CREATE TABLE IF NOT EXISTS declines (
    agent TEXT NOT NULL,
    server TEXT NOT NULL,
    channel TEXT NOT NULL,
    declined_at REAL NOT NULL,
    PRIMARY KEY (agent, server, channel)
);
-- Drafts: plain speech held instead of posted (mcpl_router.routing.drafts), one row each,
-- rewritten whole on every change (an attempt is saved before its publish goes out).
CREATE TABLE IF NOT EXISTS drafts (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    created_at REAL NOT NULL,
    row BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS drafts_by_agent ON drafts (agent, created_at);
"""


@attrs.frozen
class InboundEvent:
    """One accepted inbound message or push, ready to be journaled."""

    server_id: str
    #: The channel's id on ``server_id``; together they are the channel's ref. None for a push
    #: that names no channel.
    channel_id: str | None
    kind: str  # "message" | "push"
    dedup_key: str
    payload: Any


@attrs.frozen
class Recorded:
    seq: int
    duplicate: bool


@attrs.frozen
class Delivery:
    """One agent woken by one event, as the journal keeps it."""

    agent: str
    reason: str
    tags: tuple[str, ...]
    addressed: bool


@attrs.frozen
class StoredDelivery:
    """An unacked delivery with its event, for re-sending."""

    delivery: Delivery
    event: StoredEvent


#: Decides, inside the event's transaction, which agents a newly recorded event wakes.
DeliveryRouter = Callable[[int, InboundEvent], Sequence[Delivery]]


@attrs.frozen
class StoredEvent:
    seq: int
    server_id: str
    channel_id: str | None
    kind: str
    payload: Any
    received_at: float


class Journal:
    """The daemon's journal file. Owned by the daemon; opened once, closed at shutdown."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._db = sqlite3.connect(str(path), isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit is on disk before we answer "accepted", across a power loss too
        # (NORMAL in WAL mode survives a process crash but may roll back on an OS crash).
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self._encoder = msgspec.json.Encoder()
        self.settle_interrupted_drafts()
        #: Set by the daemon (see :meth:`set_router`); None records events without deliveries.
        self._router: DeliveryRouter | None = None

    def set_router(self, router: DeliveryRouter | None) -> None:
        """Have :meth:`record_inbound` write each new event's deliveries in its transaction.

        ``router(seq, event)`` is called for every newly recorded event (never a duplicate),
        inside the transaction; if it raises, the whole batch rolls back and nothing is
        accepted.
        """
        self._router = router

    def record_inbound(self, events: list[InboundEvent]) -> list[Recorded]:
        """Commit a batch in one transaction; a duplicate gets the seq it was first given.

        With a router set (:meth:`set_router`), each new event's deliveries commit with it.
        """
        results: list[Recorded] = []
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for event in events:
                row = db.execute(
                    "SELECT seq FROM inbound WHERE server = ? AND kind = ? AND dedup = ?",
                    (event.server_id, event.kind, event.dedup_key),
                ).fetchone()
                if row is not None:
                    results.append(Recorded(seq=row[0], duplicate=True))
                    continue
                cursor = db.execute(
                    "INSERT INTO inbound (server, channel, kind, dedup, payload, received_at) VALUES (?, ?, ?, ?, ?, ?)",
                    (
                        event.server_id,
                        event.channel_id,
                        event.kind,
                        event.dedup_key,
                        self._encoder.encode(event.payload),
                        time.time(),
                    ),
                )
                seq = int(cursor.lastrowid or 0)
                if self._router is not None:
                    self._insert_deliveries(seq, self._router(seq, event))
                results.append(Recorded(seq=seq, duplicate=False))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return results

    def unacked(self, *, after_seq: int = 0, limit: int = 1000) -> list[StoredEvent]:
        rows = self._db.execute(
            "SELECT seq, server, channel, kind, payload, received_at FROM inbound"
            " WHERE acked = 0 AND seq > ? ORDER BY seq LIMIT ?",
            (after_seq, limit),
        ).fetchall()
        return [
            StoredEvent(seq, server, channel, kind, msgspec.json.decode(payload), received_at)
            for seq, server, channel, kind, payload, received_at in rows
        ]

    def get(self, seq: int) -> StoredEvent | None:
        """One journaled inbound event by its seq."""
        row = self._db.execute(
            "SELECT seq, server, channel, kind, payload, received_at FROM inbound WHERE seq = ?", (seq,)
        ).fetchone()
        if row is None:
            return None
        seq_, server, channel, kind, payload, received_at = row
        return StoredEvent(seq_, server, channel, kind, msgspec.json.decode(payload), received_at)

    def ack(self, seqs: list[int]) -> int:
        """Mark events delivered; returns how many were newly acked."""
        if not seqs:
            return 0
        cursor = self._db.executemany("UPDATE inbound SET acked = 1 WHERE seq = ? AND acked = 0", [(s,) for s in seqs])
        return cursor.rowcount

    def _insert_deliveries(self, seq: int, deliveries: Sequence[Delivery]) -> None:
        self._db.executemany(
            "INSERT OR IGNORE INTO deliveries (agent, seq, reason, tags, addressed) VALUES (?, ?, ?, ?, ?)",
            [(d.agent, seq, d.reason, self._encoder.encode(list(d.tags)), int(d.addressed)) for d in deliveries],
        )

    def unacked_count(self, agent: str) -> int:
        """How many of ``agent``'s wakes are not acked yet (for ``status``)."""
        row = self._db.execute("SELECT COUNT(*) FROM deliveries WHERE agent = ? AND acked = 0", (agent,)).fetchone()
        return int(row[0])

    def unacked_deliveries(self, agent: str, *, after_seq: int = 0, limit: int = 10000) -> list[StoredDelivery]:
        """``agent``'s unacked deliveries with their events, in seq order."""
        rows = self._db.execute(
            "SELECT d.agent, d.reason, d.tags, d.addressed,"
            " i.seq, i.server, i.channel, i.kind, i.payload, i.received_at"
            " FROM deliveries d JOIN inbound i ON i.seq = d.seq"
            " WHERE d.agent = ? AND d.acked = 0 AND d.seq > ? ORDER BY d.seq LIMIT ?",
            (agent, after_seq, limit),
        ).fetchall()
        return [
            StoredDelivery(
                Delivery(agent_, reason, tuple(msgspec.json.decode(tags)), bool(addressed)),
                StoredEvent(seq, server, channel, kind, msgspec.json.decode(payload), received_at),
            )
            for agent_, reason, tags, addressed, seq, server, channel, kind, payload, received_at in rows
        ]

    def delivery(self, seq: int, agent: str) -> StoredDelivery | None:
        """One delivery (acked or not) with its event."""
        row = self._db.execute(
            "SELECT reason, tags, addressed FROM deliveries WHERE seq = ? AND agent = ?", (seq, agent)
        ).fetchone()
        event = self.get(seq)
        if row is None or event is None:
            return None
        reason, tags, addressed = row
        return StoredDelivery(Delivery(agent, reason, tuple(msgspec.json.decode(tags)), bool(addressed)), event)

    def ack_deliveries(self, agents: Sequence[str], seqs: Sequence[int]) -> int:
        """Mark ``agents``' deliveries of ``seqs`` acked; returns how many were newly acked.

        An event whose every delivery is acked is marked acked too (see :meth:`unacked`).
        """
        if not agents or not seqs:
            return 0
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            pairs = [(seq, agent) for seq in seqs for agent in agents]
            newly = 0
            for pair in pairs:
                newly += db.execute("UPDATE deliveries SET acked = 1 WHERE seq = ? AND agent = ? AND acked = 0", pair).rowcount
            db.executemany(
                "UPDATE inbound SET acked = 1 WHERE seq = ? AND acked = 0"
                " AND NOT EXISTS (SELECT 1 FROM deliveries WHERE seq = inbound.seq AND acked = 0)",
                [(seq,) for seq in set(seqs)],
            )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return newly

    def save_agent(self, name: str, spec: Any) -> None:
        """Remember a host-declared agent's spec (plain JSON values)."""
        self._db.execute(
            "INSERT INTO agents (name, spec) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET spec = excluded.spec",
            (name, self._encoder.encode(spec)),
        )

    def saved_agents(self) -> dict[str, Any]:
        """Every remembered host-declared agent's spec, by name."""
        rows = self._db.execute("SELECT name, spec FROM agents ORDER BY name").fetchall()
        return {name: msgspec.json.decode(spec) for name, spec in rows}

    def save_draft(self, row: dict[str, Any]) -> None:
        """Insert or replace one draft (its :meth:`~mcpl_router.routing.drafts.Draft.row`)."""
        self._db.execute(
            "INSERT INTO drafts (id, agent, created_at, row) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (id) DO UPDATE SET row = excluded.row",
            (row["id"], row["agent"], float(row["createdAt"]), self._encoder.encode(row)),
        )

    def settle_interrupted_drafts(self) -> list[str]:
        """At open (daemon start): a draft whose last attempt is still ``sending`` was cut off
        by a stop or crash mid-publish; its outcome is unknown, so it becomes ``unconfirmed``
        (never stuck "being sent"; resending needs confirmDuplicate). The ids settled."""
        settled: list[str] = []
        for (raw,) in self._db.execute("SELECT row FROM drafts").fetchall():
            row = msgspec.json.decode(raw)
            attempts = row.get("attempts") or []
            if not attempts or attempts[-1].get("outcome") != "sending":
                continue
            attempts[-1] = {**attempts[-1], "outcome": "unknown", "reason": "interrupted"}
            row["attempts"] = attempts
            if row.get("state") == "held":
                row["state"] = "unconfirmed"
            self.save_draft(row)
            settled.append(row["id"])
        return settled

    def drafts_of(self, agent: str) -> list[dict[str, Any]]:
        """Every draft row of ``agent``, oldest first."""
        rows = self._db.execute("SELECT row FROM drafts WHERE agent = ? ORDER BY created_at, id", (agent,)).fetchall()
        return [msgspec.json.decode(row) for (row,) in rows]

    def draft(self, draft_id: str) -> dict[str, Any] | None:
        """One draft row by id."""
        row = self._db.execute("SELECT row FROM drafts WHERE id = ?", (draft_id,)).fetchone()
        return None if row is None else msgspec.json.decode(row[0])

    def woken_agents(self, seq: int) -> list[str]:
        """The agents the event ``seq`` woke (its deliveries), by name."""
        rows = self._db.execute("SELECT agent FROM deliveries WHERE seq = ? ORDER BY agent", (seq,)).fetchall()
        return [agent for (agent,) in rows]

    def record_decline(self, agent: str, server_id: str, channel_id: str) -> None:
        """Remember that ``agent`` declined channel ``channel_id`` of server ``server_id``."""
        self._db.execute(
            "INSERT INTO declines (agent, server, channel, declined_at) VALUES (?, ?, ?, ?)"
            " ON CONFLICT (agent, server, channel) DO UPDATE SET declined_at = excluded.declined_at",
            (agent, server_id, channel_id, time.time()),
        )

    def forget_decline(self, agent: str, server_id: str, channel_id: str) -> None:
        """Forget a decline (the agent opened the channel after all)."""
        self._db.execute(
            "DELETE FROM declines WHERE agent = ? AND server = ? AND channel = ?", (agent, server_id, channel_id)
        )

    def declines(self) -> list[tuple[str, str, str]]:
        """Every recorded decline as ``(agent, server, channel)``."""
        return [tuple(row) for row in self._db.execute("SELECT agent, server, channel FROM declines ORDER BY declined_at")]

    def last_seq(self) -> int:
        row = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM inbound").fetchone()
        return int(row[0])

    def close(self) -> None:
        self._db.close()
