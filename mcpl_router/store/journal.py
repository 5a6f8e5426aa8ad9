"""The journal: inbound events committed before the server is told ``accepted``, off the event loop.

On a SQLite file (the embedded default: :mod:`~mcpl_router.store.sqlite_backend`) or on
PostgreSQL (:mod:`~mcpl_router.store.postgres_backend`), with the same promises on both. All
writes go through one writer task (:meth:`Journal.run`) that takes whatever has queued up and
commits it in **one transaction** in a worker thread (group commit): inbound batches, acks,
drafts, declines. Each inbound batch learns its seqs only once the transaction holding it has
committed, so ``accepted`` is still answered only after the commit; everything that arrived
meanwhile shares the next one. The trio thread never waits on the database or fsync.

Every per-message statement is an indexed search (:mod:`mcpl_router.store.schema`; a test
asserts the query plans), and what was acked or settled is pruned after ``retention`` seconds, so the cost
of a message does not grow with the journal's history. Counts the daemon reads often (each
agent's unacked wakes, the last seq) and the drafts and declines the turn code reads are kept
in memory and written behind, in order, by the same writer.

A second daemon on the same journal is refused at start with :class:`JournalLocked` (a
file's lock; a PostgreSQL database's advisory lock).

:class:`Journal` is assembled from its parts, one module each: the writer task and its queue
(:mod:`~mcpl_router.store.writer`), pruning (:mod:`~mcpl_router.store.pruning`) and the reads
(:mod:`~mcpl_router.store.reads`); the values it takes and gives are in
:mod:`~mcpl_router.store.records`. This module opens the backend (which locks and migrates
it), loads what is kept in memory, keeps that state, and writes it behind; every name the journal's users
import is importable from here.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Final

import msgspec

from mcpl_router.config.model import JournalConfig
from mcpl_router.logs import get_logger
from mcpl_router.routing import texts
from mcpl_router.routing.drafts import DraftRow
from mcpl_router.store.backend import Connection, JournalBackend
from mcpl_router.store.leases import LeaseFence
from mcpl_router.store.pruning import DEFAULT_RETENTION, PRUNE_CHUNK, PRUNE_INTERVAL, JournalPruning
from mcpl_router.store.reads import JournalReads
from mcpl_router.store.records import (
    Delivery,
    EventKind,
    InboundEvent,
    JournalFailure,
    JournalStatistics,
    Recorded,
    SavedTuneOut,
    StoredDelivery,
    StoredEvent,
    content_digest,
)
from mcpl_router.store.schema import (
    SQL_ACK_ALL_OF,
    SQL_ADD_FORK_GENERATION,
    SQL_HAND_OVER,
    SQL_OWED_RANGE,
    SQL_FORGET_TUNE_OUT,
    SQL_RAISE_FORK_GENERATION,
    SQL_SAVE_DRAFT,
    SQL_SAVE_TUNE_OUT,
    SQL_TUNE_OUT_PROGRESS,
    SQL_TUNE_OUT_SUMMARY,
    JournalLocked,  # raised here (at open), so importable from here
    JournalRefused,
)
from mcpl_router.store.sqlite_backend import SqliteBackend
from mcpl_router.store.writer import MAX_BATCH_OPS, SHUTDOWN_COMMIT_TIMEOUT, WRITE_QUEUE, JournalWriter, _WriteOp

__all__ = [
    "DEFAULT_RETENTION",
    "MAX_BATCH_OPS",
    "PRUNE_CHUNK",
    "PRUNE_INTERVAL",
    "SHUTDOWN_COMMIT_TIMEOUT",
    "WRITE_QUEUE",
    "Delivery",
    "EventKind",
    "InboundEvent",
    "Journal",
    "JournalFailure",
    "JournalLocked",
    "JournalRefused",
    "JournalStatistics",
    "Recorded",
    "SavedTuneOut",
    "StoredDelivery",
    "StoredEvent",
    "content_digest",
]

_SETTLED_STATES: Final = frozenset({"delivered", "dismissed"})


def read_password(config: JournalConfig) -> str | None:
    """The database password from ``passwordFile`` (None when the DSN carries it, or none is needed).

    Raises:
        JournalRefused: the file can't be read (what to do in the message).
    """
    if config.password_file is None:
        return None
    try:
        return config.password_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise JournalRefused(
            config.described, f"its passwordFile {config.password_file} can't be read ({exc.strerror or exc}).",
            "Fix the file or its permissions, then start again.",
        ) from None


class Journal(JournalWriter, JournalPruning, JournalReads):
    """The daemon's journal. Opened once (and locked), written by :meth:`run`, closed last.

    Args:
        where: a SQLite file's path (the embedded default), or an opened backend
            (:class:`~mcpl_router.store.postgres_backend.PostgresBackend`).
        retention: seconds an acked event, or a settled draft, is kept before it is pruned. A
            server re-sending a message older than this is taken as a new message.
    """

    def __init__(self, where: str | Path | JournalBackend, *, retention: float = DEFAULT_RETENTION) -> None:
        self.retention = retention
        if isinstance(where, (str, Path)):
            path = Path(where)
            self._log = get_logger(journal=str(path))
            self._backend: JournalBackend = SqliteBackend(path, self._log)
        else:
            self._backend = where
            self._log = get_logger(journal=where.where)
        backend = self._backend
        #: The SQLite file, or None on a backend that is no file.
        self.path: Path | None = backend.path if isinstance(backend, SqliteBackend) else None
        self._dialect = backend.dialect
        self._encoder = msgspec.json.Encoder()
        self._init_writer()
        if backend.read_only is not None:
            self.failing = backend.read_only
            self._log.error("journal.read_only", reason=backend.read_only)
        self._closed = False
        try:
            self._load(backend.writer())
        except BaseException:
            backend.close()
            raise

    @classmethod
    def from_config(cls, config: JournalConfig, *, fence: LeaseFence | None = None) -> Journal:
        """The journal ``config`` names, opened: its SQLite file, or its PostgreSQL database
        (a cluster node's, with its lease's ``fence`` on every transaction).

        Raises :class:`JournalRefused` (with what to do) when it can't be opened or trusted,
        :class:`JournalLocked` when another daemon holds it.
        """
        if config.backend != "postgres":
            return cls(config.path, retention=config.retention)
        from mcpl_router.store.postgres_backend import PostgresBackend

        assert config.dsn is not None, "the config reader requires a dsn with backend = postgres"
        password = read_password(config)
        backend = PostgresBackend(config.dsn, get_logger(journal=config.described), password=password, fence=fence)
        return cls(backend, retention=config.retention)

    def _load(self, db: Connection) -> None:
        """What is kept in memory, read once at open; interrupted drafts settled."""
        self._last_seq = int(db.execute("SELECT COALESCE(MAX(seq), 0) FROM inbound").fetchone()[0])
        self._marked_seq = 0
        self.mark_held()
        self._unacked: Counter[str] = Counter(
            {str(agent): int(count) for agent, count in db.execute("SELECT agent, COUNT(*) FROM deliveries WHERE acked = 0 GROUP BY agent")}
        )
        self._declines: dict[tuple[str, str, str], float] = {
            (agent, server, channel): at
            for agent, server, channel, at in db.execute("SELECT agent, server, channel, declined_at FROM declines ORDER BY declined_at")
        }
        self._channel_decisions: dict[tuple[str, str, str], str] = {
            (agent, server, channel): state
            for agent, server, channel, state in db.execute(
                "SELECT agent, server, channel, state FROM channel_decisions ORDER BY decided_at"
            )
        }
        self._drafts: dict[str, DraftRow] = {}
        # Each agent's draft ids, oldest first: a turn reads its agent's drafts, not everyone's.
        self._agent_drafts: dict[str, dict[str, None]] = {}
        cutoff = time.time() - self.retention
        for raw, settled_at in db.execute("SELECT row, settled_at FROM drafts ORDER BY created_at, id").fetchall():
            if settled_at is not None and settled_at < cutoff:
                continue  # pruned at the writer's first pass
            row: DraftRow = msgspec.json.decode(raw)
            if settled_at is not None:
                row["settledAt"] = settled_at
            self._drafts[row["id"]] = row
            self._agent_drafts.setdefault(row["agent"], {})[row["id"]] = None
        self._settle_interrupted_drafts(db)

    @property
    def backend(self) -> str:
        """Which backend holds the journal: ``sqlite`` or ``postgres``."""
        return self._dialect.name

    @property
    def where(self) -> str:
        """Where the journal is (a path; a DSN without its password)."""
        return self._backend.where

    @property
    def read_only(self) -> str | None:
        """Why nothing new can be written (a full disk at start), or None."""
        return self._backend.read_only

    def size_bytes(self) -> int | None:
        """How big the journal is on disk, if its backend knows."""
        return self._backend.size_bytes()

    async def leave_read_only(self) -> bool:
        """Writable again if the disk has room now; True when it is."""
        if not await self._backend.leave_read_only():
            return False
        self._log.info("journal.writable_again")
        self.failing = None
        return True

    def mark_held(self) -> None:
        """Note that this journal holds messages (once it does): on a file, a start that then
        finds it gone or empty refuses instead of starting afresh (store/integrity.py)."""
        if self._last_seq <= 0 or self._marked_seq == self._last_seq:
            return
        if self._backend.mark_held(self._last_seq):
            self._marked_seq = self._last_seq

    # -- what is kept in memory (start-up, status; never a read of the file) -------------------

    def last_seq(self) -> int:
        """The newest committed seq (kept in memory)."""
        return self._last_seq

    def unacked_count(self, agent: str) -> int:
        """How many of ``agent``'s wakes are not acked yet (kept in memory)."""
        return self._unacked.get(agent, 0)

    def statistics(self) -> JournalStatistics:
        return JournalStatistics(
            last_seq=self._last_seq,
            queued_writes=self._queue_send.statistics().current_buffer_used + len(self._backlog),
            last_commit_seconds=self._last_commit_seconds,
            commit_seconds_buckets=self._commit_durations.cumulative(),
            commit_seconds_total=self._commit_durations.total_seconds,
            failing=self.failing,
            **self._stats,
        )

    # -- agents, declines, drafts (in memory, written behind in order) --------------------------

    def save_agent(self, name: str, spec: object) -> None:
        """Remember a host-declared agent's spec (plain JSON values)."""
        self._submit_nowait(
            _WriteOp(
                sql="INSERT INTO agents (name, spec) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET spec = excluded.spec",
                args=(name, self._encoder.encode(spec)),
            )
        )

    def record_channel_decision(self, agent: str, server_id: str, channel_id: str, state: str) -> None:
        """Remember ``agent``'s decision ``open`` or ``closed`` for a channel (it replaces a decline)."""
        key = (agent, server_id, channel_id)
        self._channel_decisions[key] = state
        if self._declines.pop(key, None) is not None:
            self._submit_nowait(_WriteOp(sql="DELETE FROM declines WHERE agent = ? AND server = ? AND channel = ?", args=key))
        self._submit_nowait(
            _WriteOp(
                sql="INSERT INTO channel_decisions (agent, server, channel, state, decided_at) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (agent, server, channel) DO UPDATE SET state = excluded.state, decided_at = excluded.decided_at",
                args=(*key, state, time.time()),
            )
        )

    def channel_decisions(self) -> list[tuple[str, str, str, str]]:
        """Every recorded ``open``/``closed`` decision as ``(agent, server, channel, state)``."""
        return [(*key, state) for key, state in self._channel_decisions.items()]

    def record_decline(self, agent: str, server_id: str, channel_id: str) -> None:
        """Remember that ``agent`` declined channel ``channel_id`` of server ``server_id`` (it
        replaces an open or closed decision)."""
        now = time.time()
        if self._channel_decisions.pop((agent, server_id, channel_id), None) is not None:
            self._submit_nowait(
                _WriteOp(sql="DELETE FROM channel_decisions WHERE agent = ? AND server = ? AND channel = ?",
                         args=(agent, server_id, channel_id))
            )
        self._declines.pop((agent, server_id, channel_id), None)
        self._declines[(agent, server_id, channel_id)] = now
        self._submit_nowait(
            _WriteOp(
                sql="INSERT INTO declines (agent, server, channel, declined_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (agent, server, channel) DO UPDATE SET declined_at = excluded.declined_at",
                args=(agent, server_id, channel_id, now),
            )
        )

    def forget_decline(self, agent: str, server_id: str, channel_id: str) -> None:
        """Forget a decline (the agent opened the channel after all)."""
        self._declines.pop((agent, server_id, channel_id), None)
        self._submit_nowait(
            _WriteOp(sql="DELETE FROM declines WHERE agent = ? AND server = ? AND channel = ?", args=(agent, server_id, channel_id))
        )

    def declines(self) -> list[tuple[str, str, str]]:
        """Every recorded decline as ``(agent, server, channel)``, oldest first."""
        return list(self._declines)

    def fork_generations(self) -> list[tuple[str, str, str, int]]:
        """Every conversation fork counter as ``(agent, server, channel, generation)`` (start-up)."""
        rows = self._backend.reader().execute("SELECT agent, server, channel, generation FROM fork_generations").fetchall()
        return [(str(a), str(s), str(c), int(g)) for a, s, c, g in rows]

    def raise_fork_generation(self, agent: str, server_id: str, channel_id: str, generation: int) -> None:
        """Raise one binding key's fork counter to ``generation`` (never lower it), written behind."""
        self._submit_nowait(_WriteOp(sql=SQL_RAISE_FORK_GENERATION, args=(generation, agent, server_id, channel_id, generation)))
        self._submit_nowait(_WriteOp(sql=SQL_ADD_FORK_GENERATION, args=(agent, server_id, channel_id, generation)))

    async def hand_over(self, from_agent: str, to_agent: str) -> tuple[int, int]:
        """Everything still owed to ``from_agent`` (a fork whose spawn failed) becomes
        ``to_agent``'s (its trunk); returns ``(first seq, how many)``, ``(0, 0)`` for nothing.

        Committed when it returns. The caller makes sure nothing new is written for
        ``from_agent`` meanwhile (a released fork's name is never decided again).
        """
        first, count = await self._backend.read(lambda db: db.execute(SQL_OWED_RANGE, (from_agent,)).fetchone())
        if not count:
            return 0, 0
        self._submit_nowait(_WriteOp(sql=SQL_HAND_OVER, args=(to_agent, from_agent, to_agent)))
        self._submit_nowait(_WriteOp(sql=SQL_ACK_ALL_OF, args=(from_agent,)))
        await self.flush()
        self._unacked.pop(from_agent, None)
        self._unacked[to_agent] += int(count)
        return int(first), int(count)

    # -- tune-outs (written behind; read back once, at start-up: JournalReads.saved_tune_outs) --

    def save_tune_out(self, saved: SavedTuneOut) -> None:
        """Make or replace one agent's tune-out of one channel (``held`` is not stored: it is
        read back from the deliveries)."""
        self._submit_nowait(
            _WriteOp(
                sql=SQL_SAVE_TUNE_OUT,
                args=(saved.agent, saved.server_id, saved.channel_id, saved.cadence, saved.backlog_cap, saved.max_wakes,
                      saved.duration, saved.started_at, saved.ends_at, saved.wakes, saved.handed_through, saved.summary),
            )
        )

    def save_tune_out_progress(
        self, agent: str, server_id: str, channel_id: str, *, wakes: int, handed_through: int, summary: str | None
    ) -> None:
        """A summary wake went out: its count, the newest seq it handed over, the summary left."""
        self._submit_nowait(_WriteOp(sql=SQL_TUNE_OUT_PROGRESS, args=(wakes, handed_through, summary, agent, server_id, channel_id)))

    def save_tune_out_summary(self, agent: str, server_id: str, channel_id: str, summary: str | None) -> None:
        """A delivered summary, kept for the tune-out's next summary wake."""
        self._submit_nowait(_WriteOp(sql=SQL_TUNE_OUT_SUMMARY, args=(summary, agent, server_id, channel_id)))

    def forget_tune_out(self, agent: str, server_id: str, channel_id: str) -> None:
        """A tune-out was cancelled or ended (or is not resumed): its row goes."""
        self._submit_nowait(_WriteOp(sql=SQL_FORGET_TUNE_OUT, args=(agent, server_id, channel_id)))

    def save_draft(self, row: DraftRow) -> None:
        """Insert or replace one draft (its :meth:`~mcpl_router.routing.drafts.Draft.row`).

        In memory at once; on disk at the next commit (:meth:`flush` waits for it).
        """
        previous = self._drafts.get(row["id"])
        settled_at = previous.get("settledAt") if previous is not None else None
        if row.get("state") in _SETTLED_STATES:
            settled_at = settled_at if isinstance(settled_at, (int, float)) else time.time()
        else:
            settled_at = None
        stored: DraftRow = {**row}
        if settled_at is not None:
            stored["settledAt"] = settled_at
        else:
            stored.pop("settledAt", None)
        self._drafts[row["id"]] = stored
        self._agent_drafts.setdefault(row["agent"], {})[row["id"]] = None
        self._submit_nowait(
            _WriteOp(
                sql=SQL_SAVE_DRAFT,
                args=(row["id"], row["agent"], float(row["createdAt"]), self._encoder.encode(stored), settled_at),
            )
        )

    def drafts_of(self, agent: str) -> list[DraftRow]:
        """Every kept draft row of ``agent``, oldest first."""
        ids = self._agent_drafts.get(agent, {})
        return sorted((self._drafts[draft_id] for draft_id in ids), key=lambda row: (float(row["createdAt"]), row["id"]))

    def draft(self, draft_id: str) -> DraftRow | None:
        """One draft row by id."""
        return self._drafts.get(draft_id)

    def _settle_interrupted_drafts(self, db: Connection) -> list[str]:
        """At open (daemon start): a draft whose last attempt is still ``sending`` was cut off
        by a stop or crash mid-publish; its outcome is unknown, so it becomes ``unconfirmed``
        (never stuck "being sent"; resending needs confirmDuplicate). The ids settled."""
        settled: list[str] = []
        for row in list(self._drafts.values()):
            attempts = row.get("attempts") or []
            if not attempts or attempts[-1].get("outcome") != "sending":
                continue
            attempts[-1] = {**attempts[-1], "outcome": "unknown", "reason": texts.Reason.INTERRUPTED}
            fixed: DraftRow = {**row, "attempts": attempts}
            if fixed.get("state") == "held":
                fixed["state"] = "unconfirmed"
            self._drafts[row["id"]] = fixed
            # Written now, synchronously: the writer isn't running yet.
            db.execute(
                SQL_SAVE_DRAFT,
                (fixed["id"], fixed["agent"], float(fixed["createdAt"]), self._encoder.encode(fixed), None),
            )
            settled.append(row["id"])
        return settled

    def close(self) -> None:
        """Close the connections (after :meth:`run` ended) and release the lock."""
        if self._closed:
            return
        self._closed = True
        self.mark_held()
        if self._backlog:
            self._log.error("journal.closed_with_unwritten", ops=len(self._backlog))
        self._backend.close()
