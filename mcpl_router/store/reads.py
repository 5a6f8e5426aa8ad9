"""The journal's reads: a turn's or a replay page's in a worker thread, the others where called.

Reads that happen while the daemon serves (a turn's context, a page of backlog replayed to a
host), and the saved tune-outs read back at start-up, run in a worker thread on a connection of
their own (one at a time on SQLite; a bounded pool on PostgreSQL), so the trio thread never waits on the database. The synchronous reads are
for start-up, status, tests and tools, never a per-message path. Apart from the writer because
nothing here writes or waits for a commit: a read sees what was committed while the writer goes on.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgspec

from mcpl_router.store.backend import Connection, JournalBackend, Row
from mcpl_router.store.records import Delivery, SavedTuneOut, StoredDelivery, StoredEvent
from mcpl_router.store.schema import (
    SQL_DELIVERY,
    SQL_EVENT,
    SQL_LATEST_ACKED,
    SQL_TUNE_OUT_HELD,
    SQL_UNACKED_DELIVERIES,
)

__all__ = ["JournalReads"]


#: How many of an agent's latest acked wakes a start looks through for one on a channel.
LATEST_ACKED_LOOKED_AT: Final = 64


class JournalReads:
    """The reads; a part of :class:`~mcpl_router.store.journal.Journal`."""

    # The journal's, set when it opens.
    _backend: JournalBackend

    async def unacked_deliveries(self, agent: str, *, after_seq: int = 0, limit: int = 1000) -> list[StoredDelivery]:
        """``agent``'s unacked deliveries with their events, in seq order, at most ``limit``."""
        rows = await self._backend.read(lambda db: db.execute(SQL_UNACKED_DELIVERIES, (agent, after_seq, limit)).fetchall())
        return [_stored_delivery(row) for row in rows]

    async def delivery(self, seq: int, agent: str) -> StoredDelivery | None:
        """One delivery (acked or not) with its event."""
        return await self._backend.read(lambda db: _read_delivery(db, seq, agent))

    async def saved_tune_outs(self) -> list[SavedTuneOut]:
        """Every saved tune-out with the wakes it holds (read once, at start-up, in a thread)."""
        return await self._backend.read(_saved_tune_outs)

    # -- synchronous reads (start-up, status, tests; never per message) -------------------------

    def events(self, *, after_seq: int = 0, limit: int = 1000, unacked_only: bool = False) -> list[StoredEvent]:
        """Recorded events in seq order (not yet pruned); ``unacked_only``: those still owed to
        an agent. For tests and tools, not the daemon's per-message paths."""
        rows = self._backend.reader().execute(
            "SELECT seq, server, channel, kind, payload, received_at FROM inbound"
            f" WHERE seq > ?{' AND acked = 0' if unacked_only else ''} ORDER BY seq LIMIT ?",
            (after_seq, limit),
        ).fetchall()
        return [StoredEvent(seq, server, channel, kind, msgspec.json.decode(payload), at) for seq, server, channel, kind, payload, at in rows]

    def delivery_now(self, seq: int, agent: str) -> StoredDelivery | None:
        """:meth:`delivery` on the calling thread (tests)."""
        return _read_delivery(self._backend.reader(), seq, agent)

    async def latest_acked_channels(self, agents: Iterable[str]) -> dict[str, tuple[str, str, object]]:
        """Each agent's latest acked wake on a channel: (server, channel, payload), by agent;
        agents with none are left out. Read once at a start (an index walk per agent)."""
        names = list(agents)

        def read(db: Connection) -> dict[str, tuple[str, str, object]]:
            found: dict[str, tuple[str, str, object]] = {}
            for agent in names:
                # Newest first, a bounded few: a run of channel-less pushes ends the search.
                for (seq,) in db.execute(SQL_LATEST_ACKED, (agent, LATEST_ACKED_LOOKED_AT)).fetchall():
                    event = db.execute(SQL_EVENT, (seq,)).fetchone()
                    if event is not None and event[2] is not None:
                        found[agent] = (str(event[1]), str(event[2]), msgspec.json.decode(event[4]))
                        break
            return found

        return await self._backend.read(read)

    def saved_agents(self) -> dict[str, object]:
        """Every remembered host-declared agent's spec, by name (read at start)."""
        rows = self._backend.reader().execute("SELECT name, spec FROM agents ORDER BY name").fetchall()
        return {name: msgspec.json.decode(spec) for name, spec in rows}


def _stored_delivery(row: Row) -> StoredDelivery:
    agent, reason, tags, addressed, seq, server, channel, kind, payload, received_at = row
    return StoredDelivery(
        Delivery(agent, reason, tuple(msgspec.json.decode(tags)), bool(addressed)),
        StoredEvent(seq, server, channel, kind, msgspec.json.decode(payload), received_at),
    )


def _read_delivery(db: Connection, seq: int, agent: str) -> StoredDelivery | None:
    row = db.execute(SQL_DELIVERY, (agent, seq)).fetchone()
    event = db.execute(SQL_EVENT, (seq,)).fetchone()
    if row is None or event is None:
        return None
    reason, tags, addressed = row
    return _stored_delivery((agent, reason, tags, addressed, *event))


def _saved_tune_outs(db: Connection) -> list[SavedTuneOut]:
    rows = db.execute(
        "SELECT agent, server, channel, cadence, backlog_cap, max_wakes, duration, started_at, ends_at, wakes,"
        " handed_through, summary FROM tune_outs ORDER BY started_at"
    ).fetchall()
    saved = []
    for agent, server, channel, cadence, cap, max_wakes, duration, started_at, ends_at, wakes, through, summary in rows:
        held = tuple(seq for (seq,) in db.execute(SQL_TUNE_OUT_HELD, (agent, through, server, channel)))
        saved.append(SavedTuneOut(agent, server, channel, float(cadence), int(cap), max_wakes, duration, float(started_at),
                                  ends_at, int(wakes), int(through), summary, held))
    return saved
