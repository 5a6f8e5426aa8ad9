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
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)
        self._encoder = msgspec.json.Encoder()

    def record_inbound(self, events: list[InboundEvent]) -> list[Recorded]:
        """Commit a batch in one transaction; a duplicate gets the seq it was first given."""
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
                results.append(Recorded(seq=int(cursor.lastrowid or 0), duplicate=False))
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

    def last_seq(self) -> int:
        row = self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM inbound").fetchone()
        return int(row[0])

    def close(self) -> None:
        self._db.close()
