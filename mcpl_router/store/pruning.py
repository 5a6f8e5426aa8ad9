"""Pruning: acked events and settled drafts go after ``retention``, so history never slows a message.

Acked events (with their deliveries) and delivered or dismissed drafts older than the journal's
``retention`` are deleted, :data:`PRUNE_CHUNK` rows per transaction. The writer task
(:mod:`mcpl_router.store.writer`) runs one chunk per pass between its commits, every
:data:`PRUNE_INTERVAL` (at once again while more remains), so a large backlog never holds up an
``accepted``. Apart from the writer because what may be pruned, and how the in-memory drafts
follow the file, is a policy of its own; the writer only decides when.
"""

from __future__ import annotations

import time
from typing import Final

import trio

from mcpl_router.logs import Logger
from mcpl_router.routing.drafts import DraftRow
from mcpl_router.store.backend import Dialect, JournalBackend
from mcpl_router.store.schema import (
    SQL_PRUNABLE_EVENTS,
    SQL_PRUNE_DELIVERIES,
    SQL_PRUNE_DRAFTS,
    SQL_PRUNE_EVENT,
    last_seq_before,
)

__all__ = ["DEFAULT_RETENTION", "PRUNE_CHUNK", "PRUNE_INTERVAL", "JournalPruning"]

#: Acked events (and their deliveries) older than this are pruned; so are settled drafts.
DEFAULT_RETENTION: Final = 24 * 3600.0
#: How often the writer prunes, and how many rows one pruning transaction takes.
PRUNE_INTERVAL: Final = 60.0
PRUNE_CHUNK: Final = 5000


class JournalPruning:
    """Pruning past retention; a part of :class:`~mcpl_router.store.journal.Journal`."""

    # The journal's, set when it opens.
    retention: float
    _backend: JournalBackend
    _dialect: Dialect
    _log: Logger
    _stats: dict[str, int]
    _drafts: dict[str, DraftRow]
    _agent_drafts: dict[str, dict[str, None]]

    async def _prune_chunk_now(self) -> bool:
        """Prune one chunk of what is past retention; True when more remains."""
        try:
            events, drafts = await trio.to_thread.run_sync(self._prune_chunk, time.time() - self.retention)
        except Exception as exc:
            self._log.error("journal.prune.failed", error=f"{type(exc).__name__}: {exc}")
            return False
        self._stats["pruned_events"] += events
        self._stats["pruned_drafts"] += drafts
        if events or drafts:
            self._log.info("journal.pruned", events=events, drafts=drafts)
        cutoff = time.time() - self.retention
        for draft_id, row in list(self._drafts.items()):
            settled_at = row.get("settledAt")
            if isinstance(settled_at, (int, float)) and settled_at < cutoff:
                del self._drafts[draft_id]
                self._agent_drafts.get(row["agent"], {}).pop(draft_id, None)
        return events >= PRUNE_CHUNK

    async def _prune(self) -> None:
        """Prune everything past retention now, a chunk at a time (tests and tools)."""
        while await self._prune_chunk_now():
            pass

    def _prune_chunk(self, cutoff: float) -> tuple[int, int]:
        db = self._backend.writer()
        db.execute(self._dialect.begin)
        try:
            last = last_seq_before(db, cutoff)
            seqs = [(seq,) for (seq,) in db.execute(SQL_PRUNABLE_EVENTS, (last, PRUNE_CHUNK)).fetchall()]
            db.executemany(SQL_PRUNE_DELIVERIES, seqs)
            db.executemany(SQL_PRUNE_EVENT, seqs)
            drafts = db.execute(SQL_PRUNE_DRAFTS, (cutoff,)).rowcount
            self._backend.commit(db)
        except BaseException:
            try:
                if db.in_transaction:
                    db.execute("ROLLBACK")
            except Exception:  # noqa: S110 - a connection that broke rolled back with it; the first error says why
                pass
            self._backend.writer_failed()
            raise
        return len(seqs), drafts
