"""The journal's writer: one task committing what has queued up in one transaction, off the trio thread.

Every write goes through here (group commit): inbound batches, acks, drafts, declines, agents.
Each is an operation (``_Op``) queued for :meth:`JournalWriter.run`, which takes what has queued
up (at most :data:`MAX_BATCH_OPS`) and applies it in one ``BEGIN`` … ``COMMIT`` in a
worker thread, each operation in a savepoint of its own so one's failure stays its own. An
operation's ``committed`` runs afterwards on the trio thread, in commit order: an inbound batch
learns its seqs only then, so ``accepted`` is answered only once it is durable, and everything
that arrived meanwhile shares the next commit. The trio thread never waits on SQLite or fsync.

Apart from :class:`~mcpl_router.store.journal.Journal` because the queue, its bounds, the
retry of write-behind operations after a failed commit and the last commit at shutdown are one
mechanism with rules of their own; the journal's other parts only hand it operations (awaited
ones through ``submit_*``, write-behind ones through ``_submit_nowait``). The state it uses is
the journal's (:meth:`JournalWriter._init_writer` sets its own part).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, ClassVar, Final

import attrs
import msgspec
import trio

from mcpl_router.logs import Logger
from mcpl_router.store.backend import Connection, Dialect, JournalBackend, insert_rows
from mcpl_router.store.leases import LeaseLost
from mcpl_router.store.pruning import PRUNE_INTERVAL
from mcpl_router.store.records import CommitDurations, Delivery, InboundEvent, JournalFailure, Recorded, content_digest
from mcpl_router.store.schema import (
    SQL_ANY_DELIVERY_ACKED,
    SQL_FIND_DUPLICATE,
    SQL_INSERT_DELIVERY,
    SQL_INSERT_EVENT_AT,
    SQL_RENUMBER_DELIVERIES,
    SQL_RENUMBER_EVENT,
)

__all__ = ["MAX_BATCH_OPS", "SHUTDOWN_COMMIT_TIMEOUT", "WRITE_QUEUE", "JournalWriter"]

#: Inbound batches (and other writes) that may wait for the writer before submitters wait.
WRITE_QUEUE: Final = 4096
#: The most operations one transaction takes.
MAX_BATCH_OPS: Final = 2048
#: How long the last commit at shutdown may take before the daemon exits without it.
SHUTDOWN_COMMIT_TIMEOUT: Final = 10.0
#: Events remembered from commits that failed (their rows may be there all the same): past
#: this many, the oldest are forgotten (logged); a re-send of one is then a plain duplicate.
UNCONFIRMED_KEPT: Final = 65536


def _one_per_agent(deliveries: Sequence[Delivery]) -> list[Delivery]:
    """An agent is woken once per event, however often a policy listed it (the first wins)."""
    seen: dict[str, Delivery] = {}
    for delivery in deliveries:
        seen.setdefault(delivery.agent, delivery)
    return list(seen.values())


def _delivery_rows(seq: int, deliveries: Sequence[Delivery], encode: Callable[[object], bytes]) -> list[tuple[object, ...]]:
    return [(d.agent, seq, d.reason, encode(list(d.tags)), int(d.addressed)) for d in _one_per_agent(deliveries)]


def _taken_over(db: Connection, journal: JournalWriter, event: InboundEvent, seq: int) -> bool:
    """Whether the row ``seq`` found under ``event``'s key is one this commit records: written by
    a commit of this daemon that failed (its outcome unknown: see ``_unconfirmed_row``), with no
    delivery of it acked yet (a replay may have sent it, and a host acked it: then it is had)."""
    return journal._unconfirmed_row(event, seq) and db.execute(SQL_ANY_DELIVERY_ACKED, (seq,)).fetchone() is None


def _renumber(db: Connection, old: int, new: int, deliveries: Sequence[Delivery], now: float, encode: Callable[[object], bytes]) -> None:
    """A row a failed commit left, recorded now under the seq this commit gives it: seqs follow
    commit order, so a host's outbox, which never takes a seq at or below one it sent, takes it."""
    db.execute(SQL_RENUMBER_EVENT, (new, now, old))
    db.execute(SQL_RENUMBER_DELIVERIES, (new, old))
    db.executemany(SQL_INSERT_DELIVERY, _delivery_rows(new, deliveries, encode))


# -- the writer's operations ---------------------------------------------------------------------


class _Unisolated(Exception):
    """An op run outside a savepoint failed on a constraint: the batch is tried again isolated."""


@attrs.define(eq=False)
class _Op:
    error: BaseException | None = None
    #: Told once the op is settled (None: durable; else the failure), on the trio thread right
    #: after ``committed``: an answer pushed from here needs no task waiting on the op.
    on_done: Callable[[JournalFailure | None], None] | None = None
    #: Whether the op runs in a savepoint of its own on the first try. The hot ops (inbound,
    #: acks) never meet a constraint, and two statements per op were a fifth of the thread's
    #: work: they run bare, and should one fail after all the batch is tried again with every
    #: op in its savepoint (``apply`` starts from scratch each time).
    isolated: ClassVar[bool] = True
    #: Committed, or failed for good.
    settled: bool = attrs.field(default=False, init=False)
    # Made only when someone waits: most inbound ops are answered through ``on_done``, and an
    # event per message that nobody waits on was a tenth of the commit's callbacks.
    _waiter: trio.Event | None = attrs.field(default=None, init=False)

    def apply(self, db: Connection, journal: JournalWriter) -> None:
        raise NotImplementedError

    def committed(self, journal: JournalWriter) -> None:
        """On the trio thread, in commit order, once the transaction holding this is durable."""

    def settle(self) -> None:
        self.settled = True
        if self._waiter is not None:
            self._waiter.set()

    async def wait(self) -> None:
        if self.settled:
            await trio.lowlevel.checkpoint()
        else:
            if self._waiter is None:
                self._waiter = trio.Event()
            await self._waiter.wait()
        if self.error is not None:
            raise JournalFailure(str(self.error)) from self.error


@attrs.define(eq=False)
class _InboundOp(_Op):
    events: Sequence[tuple[InboundEvent, Sequence[Delivery]]] = ()
    on_committed: Callable[[list[Recorded]], None] | None = None
    results: list[Recorded] = attrs.field(factory=list)
    #: Seqs this op found written by a failed commit and recorded now.
    recorded_again: list[int] = attrs.field(factory=list)
    isolated: ClassVar[bool] = False

    def apply(self, db: Connection, journal: JournalWriter) -> None:
        now = time.time()
        encode = journal._encoder.encode
        dialect = journal._dialect
        self.results = []
        self.recorded_again = []
        for event, deliveries in self.events:
            digest = event.digest if event.digest is not None else content_digest(event.payload)
            row = db.execute(SQL_FIND_DUPLICATE, (event.server_id, event.kind, event.dedup_key)).fetchone()
            if row is not None and (row[1] is None or bytes(row[1]) == digest):
                # A journal from before digests were kept counts a re-used id as a re-send.
                if not _taken_over(db, journal, event, int(row[0])):
                    self.results.append(Recorded(seq=int(row[0]), duplicate=True))
                    continue
                seq = int(db.execute(dialect.last_seq_given).fetchone()[0]) + 1
                _renumber(db, int(row[0]), seq, deliveries, now, encode)
                if dialect.set_last_seq_given is not None:
                    db.execute(dialect.set_last_seq_given, (seq,))
                self.results.append(Recorded(seq=seq, duplicate=False))
                self.recorded_again.append(seq)
                continue
            seq = int(db.execute(dialect.last_seq_given).fetchone()[0]) + 1
            db.execute(
                SQL_INSERT_EVENT_AT,
                (seq, event.server_id, event.channel_id, event.kind, event.dedup_key, digest, encode(event.payload), now,
                 # An event that woke nobody is owed to nobody: acked as it is written.
                 0 if deliveries else 1),
            )
            if dialect.set_last_seq_given is not None:
                db.execute(dialect.set_last_seq_given, (seq,))
            db.executemany(SQL_INSERT_DELIVERY, _delivery_rows(seq, deliveries, encode))
            self.results.append(Recorded(seq=seq, duplicate=False, reused_id=row is not None))

    @staticmethod
    def apply_together(ops: Sequence[_InboundOp], db: Connection, journal: JournalWriter) -> None:
        """A commit's inbound ops at once: what :meth:`apply` does for each, in a handful of
        statements for the whole group instead of three per event (each a trip through the
        GIL the trio thread holds): one duplicate lookup per server and kind, the events
        numbered after the last seq given, and two ``executemany``. An event sees the ones
        before it in the group, as it would in the file.
        """
        now = time.time()
        encode = journal._encoder.encode
        dialect = journal._dialect
        keys: dict[tuple[str, str], set[str]] = {}
        for op in ops:
            op.results = []
            op.recorded_again = []
            for event, _ in op.events:
                keys.setdefault((event.server_id, event.kind), set()).add(event.dedup_key)
        latest: dict[tuple[str, str, str], tuple[int, bytes | None]] = {}
        for (server, kind), dedups in keys.items():
            for dedup, seq, digest in db.execute(dialect.find_duplicates, (server, kind, dialect.array(sorted(dedups)))):
                latest[(server, kind, dedup)] = (int(seq), None if digest is None else bytes(digest))
        seq = int(db.execute(dialect.last_seq_given).fetchone()[0])
        given = seq
        # Seqs this transaction gives: a second event under one of their keys is a re-send.
        fresh: set[int] = set()
        events: list[tuple[object, ...]] = []
        deliveries_rows: list[tuple[object, ...]] = []
        for op in ops:
            for event, deliveries in op.events:
                digest = event.digest if event.digest is not None else content_digest(event.payload)
                key = (event.server_id, event.kind, event.dedup_key)
                prior = latest.get(key)
                if prior is not None and (prior[1] is None or prior[1] == digest):
                    if prior[0] in fresh or not _taken_over(db, journal, event, prior[0]):
                        op.results.append(Recorded(seq=prior[0], duplicate=True))
                        continue
                    seq += 1
                    fresh.add(seq)
                    _renumber(db, prior[0], seq, deliveries, now, encode)
                    latest[key] = (seq, digest)
                    op.results.append(Recorded(seq=seq, duplicate=False))
                    op.recorded_again.append(seq)
                    continue
                seq += 1
                fresh.add(seq)
                events.append((seq, event.server_id, event.channel_id, event.kind, event.dedup_key, digest,
                               encode(event.payload), now, 0 if deliveries else 1))
                deliveries_rows.extend(_delivery_rows(seq, deliveries, encode))
                latest[key] = (seq, digest)
                op.results.append(Recorded(seq=seq, duplicate=False, reused_id=prior is not None))
        insert_rows(db, SQL_INSERT_EVENT_AT, dialect.insert_events_columns, events)
        insert_rows(db, SQL_INSERT_DELIVERY, dialect.insert_deliveries_columns, deliveries_rows)
        if seq != given and dialect.set_last_seq_given is not None:
            db.execute(dialect.set_last_seq_given, (seq,))

    def committed(self, journal: JournalWriter) -> None:
        unconfirmed, unacked = journal._unconfirmed, journal._unacked
        for (event, deliveries), recorded in zip(self.events, self.results, strict=True):
            if unconfirmed:  # only after a failed commit: a key per event is built only then
                unconfirmed.pop(event.key, None)
            if not recorded.duplicate:
                if recorded.seq > journal._last_seq:
                    journal._last_seq = recorded.seq
                # One agent (most events) is once already: no pass to find its repeats.
                for delivery in deliveries if len(deliveries) == 1 else _one_per_agent(deliveries):
                    unacked[delivery.agent] += 1
        if self.recorded_again:
            journal._stats["recorded_again"] += len(self.recorded_again)
            journal._log.info("journal.recorded_again", seqs=self.recorded_again,
                              detail="written by a commit that had failed; its server re-sent it")
        if self.on_committed is not None:
            self.on_committed(self.results)


@attrs.define(eq=False)
class _AckOp(_Op):
    agents: Sequence[str] = ()
    seqs: Sequence[int] = ()
    newly: Counter[str] = attrs.field(factory=Counter)
    isolated: ClassVar[bool] = False

    def apply(self, db: Connection, journal: JournalWriter) -> None:
        # One statement per agent and one for the events, whatever the batch's size: the seqs
        # go in as one JSON array (SQLite walks it; each seq is a key lookup).
        self.newly = Counter()
        dialect = journal._dialect
        seqs = dialect.array(sorted(set(self.seqs)))
        for agent in self.agents:
            self.newly[agent] += db.execute(dialect.ack_deliveries, (agent, seqs)).rowcount
        db.execute(dialect.ack_events, (seqs,))

    def committed(self, journal: JournalWriter) -> None:
        for agent, count in self.newly.items():
            journal._unacked[agent] = max(0, journal._unacked[agent] - count)


def _fail(batch: list[_Op], exc: Exception) -> list[_Op]:
    """A commit of ``batch`` failed with ``exc``: the ops someone awaits fail with it; the
    write-behind ones are returned, to be tried again (nothing written behind is dropped)."""
    kept: list[_Op] = []
    for op in batch:
        if isinstance(op, _WriteOp):
            op.error = None
            kept.append(op)
        else:
            op.error = exc
    return kept


#: How often an idle writer checks that the journal's path still names its file (seconds).
IDENTITY_CHECK_INTERVAL: Final = 1.0


class JournalReadOnly(Exception):
    """The journal is open read-only (a full disk at start) and still can't be written."""


class JournalGone(Exception):
    """The journal's path no longer names the file the daemon opened (removed or replaced)."""

    def __init__(self, problem: str) -> None:
        super().__init__(
            f"{problem}; nothing more is accepted until the daemon is restarted on a journal file that is"
            " there (docs/operations.md, When the journal is damaged)"
        )


@attrs.define(eq=False)
class _WriteOp(_Op):
    """A write-behind statement (drafts, declines, agents): in order, no caller waits on it."""

    sql: str = ""
    args: tuple[object, ...] = ()

    def apply(self, db: Connection, journal: JournalWriter) -> None:
        db.execute(self.sql, self.args)


@attrs.define(eq=False)
class _BarrierOp(_Op):
    """Nothing to write: done once everything queued before it has committed."""

    isolated: ClassVar[bool] = False

    def apply(self, db: Connection, journal: JournalWriter) -> None:
        return None


# -- the writer task ------------------------------------------------------------------------------


class JournalWriter:
    """The writer task and its queue; a part of :class:`~mcpl_router.store.journal.Journal`."""

    # The journal's, set when it opens.
    _backend: JournalBackend
    _dialect: Dialect
    _log: Logger
    _encoder: msgspec.json.Encoder
    _closed: bool
    _last_seq: int
    _unacked: Counter[str]
    # The writer's own (:meth:`_init_writer`).
    _queue_send: trio.MemorySendChannel[_Op]
    _queue_receive: trio.MemoryReceiveChannel[_Op]
    _backlog: deque[_Op]
    _running: bool
    _stopped: bool
    _stats: dict[str, int]
    _last_commit_seconds: float
    _commit_durations: CommitDurations
    _marked_seq: int
    failing: str | None
    #: Events of commits that failed, by key, with the seq they were given (see _unconfirmed_row).
    _unconfirmed: dict[tuple[str, str, str], int]

    if TYPE_CHECKING:

        async def _prune_chunk_now(self) -> bool: ...

        def mark_held(self) -> None: ...

        async def leave_read_only(self) -> bool: ...

        @property
        def read_only(self) -> str | None: ...

    def _init_writer(self) -> None:
        """The queue (bounded: :data:`WRITE_QUEUE`), its overflow, and the writer's counters."""
        self._queue_send, self._queue_receive = trio.open_memory_channel[_Op](WRITE_QUEUE)
        self._backlog = deque()
        self._running = False
        self._stopped = False
        self._stats = {"commits": 0, "last_batch": 0, "largest_batch": 0, "pruned_events": 0, "pruned_drafts": 0,
                       "failed_commits": 0, "recorded_again": 0}
        self._last_commit_seconds = 0.0
        self._commit_durations = CommitDurations()
        self.failing = None
        self._unconfirmed = {}

    def _unconfirmed_row(self, event: InboundEvent, seq: int) -> bool:
        """Whether the row ``seq`` found under ``event``'s key was written by a commit of this
        daemon that failed (PostgreSQL: a cancelled wait for the standby, a connection lost
        at COMMIT): it is there, yet its server was not told ``accepted`` and no wake went, so
        the commit that finds it records it again, under a seq of its own, and its wakes go out
        then. Read in the writer's thread; changed only on the trio thread, between commits."""
        return self._unconfirmed.get(event.key) == seq

    def _remember_unconfirmed(self, batch: Sequence[_Op]) -> None:
        """A commit of ``batch`` failed: what its inbound ops numbered may be in the database."""
        for op in batch:
            if not isinstance(op, _InboundOp):
                continue
            for (event, _deliveries), recorded in zip(op.events, op.results, strict=False):
                if not recorded.duplicate:
                    self._unconfirmed[event.key] = recorded.seq
        excess = len(self._unconfirmed) - UNCONFIRMED_KEPT
        if excess > 0:
            for key in list(self._unconfirmed)[:excess]:
                del self._unconfirmed[key]
            self._log.warning("journal.unconfirmed.forgotten", events=excess, kept=UNCONFIRMED_KEPT)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Commit queued writes in groups until cancelled; prune every :data:`PRUNE_INTERVAL`.

        Pruning takes one chunk per pass, between commits, so queued writes never wait for a
        whole backlog of history to go. A failed commit fails the ops someone awaits (inbound,
        acks, barriers) and keeps the write-behind ones, in order, for the next try after a
        backoff: nothing written behind is dropped by a passing I/O error.
        """
        self._running = True
        task_status.started()
        next_prune = trio.current_time()
        next_look = trio.current_time() + IDENTITY_CHECK_INTERVAL
        retry_delay = 0.0
        try:
            while True:
                batch: list[_Op] = []
                if not self._backlog:
                    with trio.move_on_at(min(next_prune, next_look)):
                        batch.append(await self._queue_receive.receive())
                if trio.current_time() >= next_look:
                    # Idle too: a removed file shows in /readyz without waiting for a message.
                    next_look = trio.current_time() + IDENTITY_CHECK_INTERVAL
                    gone = await trio.to_thread.run_sync(self._backend.problem)
                    if gone is not None and self.failing is None:
                        self.failing = str(JournalGone(gone))
                        self._log.error("journal.file.gone", error=self.failing)
                    if self.read_only is not None:
                        await self.leave_read_only()
                while len(batch) < MAX_BATCH_OPS:
                    try:
                        batch.append(self._queue_receive.receive_nowait())
                    except trio.WouldBlock:
                        break
                # The overflow of write-behind ops came after everything in the queue.
                while self._backlog and len(batch) < MAX_BATCH_OPS:
                    batch.append(self._backlog.popleft())
                if batch:
                    # Shielded: a commit under way finishes and its callers are told, even at
                    # shutdown (the thread can't be stopped halfway anyway).
                    with trio.CancelScope(shield=True):
                        kept = await self._commit(batch)
                    if kept:
                        self._backlog.extendleft(reversed(kept))
                        retry_delay = min(5.0, max(0.05, retry_delay * 2))
                        await trio.sleep(retry_delay)
                    else:
                        retry_delay = 0.0
                if trio.current_time() >= next_prune:
                    with trio.CancelScope(shield=True):
                        more = await self._prune_chunk_now()
                    # More to prune: the next chunk comes right after the next commit.
                    next_prune = trio.current_time() + (0 if more else PRUNE_INTERVAL)
        finally:
            self._running = False
            self._stopped = True
            # What was queued when the daemon stopped is still written: drafts and acks saved
            # during the drain must not be lost to the shutdown. Bounded: a disk that hangs
            # must not hold the daemon's exit for ever (the thread is left behind, logged).
            with trio.CancelScope(shield=True, deadline=trio.current_time() + SHUTDOWN_COMMIT_TIMEOUT):
                remaining: list[_Op] = list(self._backlog)
                self._backlog.clear()
                while True:
                    try:
                        remaining.append(self._queue_receive.receive_nowait())
                    except trio.WouldBlock:
                        break
                if remaining:
                    kept = await self._commit(remaining, abandon_on_cancel=True)
                    if kept:
                        self._log.error("journal.unwritten_at_shutdown", ops=len(kept), error=self.failing)

    async def _commit(self, batch: list[_Op], *, abandon_on_cancel: bool = False) -> list[_Op]:
        """One transaction for ``batch``; returns the write-behind ops to try again (on failure)."""
        started = time.perf_counter()
        kept: list[_Op] = []
        try:
            if self.read_only is not None and not await self.leave_read_only():
                raise JournalReadOnly(self.read_only)
            await trio.to_thread.run_sync(self._commit_in_thread, batch, abandon_on_cancel=abandon_on_cancel)
        except trio.Cancelled:
            self.failing = "the commit did not finish before the shutdown deadline"
            self._log.error("journal.commit.abandoned", ops=len(batch))
            raise
        except (JournalGone, JournalReadOnly, LeaseLost) as exc:
            # Every commit from here fails the same way: said once, with what to do.
            if self.failing != str(exc):
                event = {JournalGone: "journal.file.gone", JournalReadOnly: "journal.read_only", LeaseLost: "journal.fenced"}[type(exc)]
                self._log.error(event, error=str(exc))
            self.failing = str(exc)
            kept = _fail(batch, exc)
        except Exception as exc:  # the database's error, OSError: the transaction rolled back, or its outcome is unknown
            self._backend.writer_failed()
            self._remember_unconfirmed(batch)
            self._stats["failed_commits"] += 1
            self.failing = f"{type(exc).__name__}: {exc}"
            self._log.error("journal.commit.failed", ops=len(batch), error=self.failing)
            kept = _fail(batch, exc)
            if kept:
                # A barrier queued after a write-behind op that didn't commit fails too, so a
                # flush never says "on disk" of something that isn't (it is in the same batch).
                self._log.warning("journal.write_behind.retrying", ops=len(kept))
        else:
            if self.failing is not None:
                self._log.info("journal.commit.recovered")
            self.failing = None
            if self._marked_seq == 0 and self._last_seq > 0:
                # The first messages this journal holds: from now a start that finds the file
                # gone or empty refuses (store/integrity.py). Once per file.
                await trio.to_thread.run_sync(self.mark_held)
        self._last_commit_seconds = time.perf_counter() - started
        self._commit_durations.observe(self._last_commit_seconds)
        self._stats["commits"] += 1
        self._stats["last_batch"] = len(batch)
        self._stats["largest_batch"] = max(self._stats["largest_batch"], len(batch))
        retried = {id(op) for op in kept}
        for op in batch:
            if id(op) in retried:
                continue
            if op.error is None:
                try:
                    op.committed(self)
                except Exception:
                    self._log.exception("journal.committed_callback.crashed", op=type(op).__name__)
            op.settle()
            if op.on_done is not None:
                failure = None if op.error is None else JournalFailure(str(op.error))
                try:
                    op.on_done(failure)
                except Exception:
                    self._log.exception("journal.done_callback.crashed", op=type(op).__name__)
        return kept

    def _commit_in_thread(self, batch: list[_Op]) -> None:
        # A removed or replaced file: what this commit writes no restart would read.
        gone = self._backend.problem()
        if gone is not None:
            raise JournalGone(gone)
        try:
            self._transaction(batch, isolate_all=False)
        except _Unisolated:
            # An op run bare met a constraint: the whole batch again, each op in a savepoint,
            # so its failure is its own, as it would have been.
            self._transaction(batch, isolate_all=True)

    def _transaction(self, batch: list[_Op], *, isolate_all: bool) -> None:
        db = self._backend.writer()
        integrity_errors = self._dialect.integrity_errors
        db.execute(self._dialect.begin)
        try:
            self._backend.check_fence(db)
            if not isolate_all:
                # The inbound ops first, together: none fails alone, and one that fails makes
                # the batch run again isolated, one op at a time in queue order. Their seqs
                # are given before anything else in the transaction writes, which only the
                # order of statements within one commit sees.
                inbound = [op for op in batch if isinstance(op, _InboundOp)]
                if inbound:
                    try:
                        _InboundOp.apply_together(inbound, db, self)
                    except integrity_errors as exc:
                        raise _Unisolated from exc
            for op in batch:
                op.error = None
                if not isolate_all and isinstance(op, _InboundOp):
                    continue
                if not (isolate_all or op.isolated):
                    try:
                        op.apply(db, self)
                    except integrity_errors as exc:
                        raise _Unisolated from exc
                    continue
                # Each op in its own savepoint: one op's failure is its own, not the batch's.
                db.execute("SAVEPOINT op")
                try:
                    op.apply(db, self)
                except integrity_errors as exc:
                    db.execute("ROLLBACK TO op")
                    op.error = exc
                db.execute("RELEASE op")
            self._backend.commit(db)
        except BaseException:
            try:
                if db.in_transaction:
                    db.execute("ROLLBACK")
            except Exception:  # noqa: S110 - a connection that broke rolled back with it; the first error says why
                pass
            raise


    async def _submit(self, op: _Op) -> _Op:
        if self._closed or self._stopped:
            raise JournalFailure("the journal is closed (the daemon is stopping)")
        # Queued without a trip through the scheduler while the queue has room (a memory
        # channel's send yields even then, once per inbound request); a cancelled submitter
        # still queues nothing. A full queue makes the submitter wait, as before.
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self._queue_send.send_nowait(op)
        except trio.WouldBlock:
            await self._queue_send.send(op)
        return op

    def _submit_nowait(self, op: _Op) -> None:
        """Queue a write-behind op; past the queue's bound it waits in an overflow kept in order.

        Write-behind callers can't wait (they change state with no await between check and
        change), so the overflow is unbounded by count but bounded by what they do: one draft,
        decline or agent per tool call or hello. It is logged and counted when used.
        """
        if self._closed or self._stopped:
            self._log.error("journal.write_after_close", op=type(op).__name__)
            return
        if not self._backlog:
            try:
                self._queue_send.send_nowait(op)
                return
            except trio.WouldBlock:
                self._log.warning("journal.queue.full", queued=WRITE_QUEUE)
        self._backlog.append(op)

    # -- inbound and acks (awaited: these answer servers and hosts) ----------------------------

    async def submit_inbound(
        self,
        events: Sequence[tuple[InboundEvent, Sequence[Delivery]]],
        on_committed: Callable[[list[Recorded]], None] | None = None,
        *,
        on_done: Callable[[JournalFailure | None], None] | None = None,
    ) -> Callable[[], Awaitable[list[Recorded]]]:
        """Queue a batch (each event with the agents it wakes) for the next group commit.

        Returns ``wait``: awaiting it gives the batch's :class:`Recorded` list once it is
        durable, or raises :class:`JournalFailure`. ``on_committed`` is called with the same
        list on the trio thread right after the commit, in commit order across batches (wakes
        go out from there, in seq order); ``on_done`` right after it, and also on a failure
        (with the :class:`JournalFailure`). Waits only while the write queue is full.
        """
        op = await self._submit(_InboundOp(events=events, on_committed=on_committed, on_done=on_done))
        assert isinstance(op, _InboundOp)

        async def wait() -> list[Recorded]:
            await op.wait()
            return op.results

        return wait

    def submit_inbound_nowait(
        self,
        events: Sequence[tuple[InboundEvent, Sequence[Delivery]]],
        on_committed: Callable[[list[Recorded]], None],
        on_done: Callable[[JournalFailure | None], None],
    ) -> bool:
        """:meth:`submit_inbound` for a caller told of the outcome only through its callbacks,
        queued at once if the write queue has room: True, queued; False, nothing queued (the
        queue is full: the caller waits with :meth:`submit_inbound`). No waiter and no task:
        the hot path's ``channels/incoming``, once a request.

        Raises:
            JournalFailure: the journal is closed (the daemon is stopping).
        """
        if self._closed or self._stopped:
            raise JournalFailure("the journal is closed (the daemon is stopping)")
        try:
            # A full queue wakes its waiting senders first as room comes, so nothing queued here
            # overtakes a submit that waits.
            self._queue_send.send_nowait(_InboundOp(events=events, on_committed=on_committed, on_done=on_done))
        except trio.WouldBlock:
            return False
        return True

    async def record_inbound(self, events: Sequence[tuple[InboundEvent, Sequence[Delivery]]]) -> list[Recorded]:
        """Record a batch and wait until it is durable (see :meth:`submit_inbound`)."""
        wait = await self.submit_inbound(events)
        return await wait()

    async def ack_deliveries(self, agents: Sequence[str], seqs: Sequence[int]) -> int:
        """Mark ``agents``' deliveries of ``seqs`` acked, durably; returns how many were newly acked.

        An event whose every delivery is acked is marked acked too (and pruned later).
        """
        wait = await self.submit_ack(agents, seqs)
        return await wait()

    async def submit_ack(
        self, agents: Sequence[str], seqs: Sequence[int], *, on_done: Callable[[JournalFailure | None], None] | None = None
    ) -> Callable[[], Awaitable[int]]:
        """Queue an ack for the next group commit; ``wait()`` gives how many were newly acked
        once it is durable (or raises :class:`JournalFailure`). ``on_done`` is called once, on
        the trio thread, when the commit has settled (None: durable; else the failure), with no
        task waiting: at once when there is nothing to ack or the ack can't be queued."""
        if not agents or not seqs:
            if on_done is not None:
                on_done(None)  # before the checkpoint: a cancelled caller is still told, once
            await trio.lowlevel.checkpoint()

            async def nothing() -> int:
                return 0

            return nothing
        op = _AckOp(agents=list(agents), seqs=list(seqs), on_done=on_done)
        try:
            await self._submit(op)
        except BaseException as exc:
            if on_done is not None:
                on_done(exc if isinstance(exc, JournalFailure) else JournalFailure("cancelled before it was queued"))
            raise

        async def wait() -> int:
            await op.wait()
            return sum(op.newly.values())

        return wait

    async def flush(self) -> None:
        """Wait until every write queued so far (write-behind ones too) has committed."""
        op = _BarrierOp()
        if self._backlog:
            self._backlog.append(op)  # after the overflow it must wait for
        else:
            await self._submit(op)
        await op.wait()
