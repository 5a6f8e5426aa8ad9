"""The journal: inbound events committed before the server is told ``accepted``, off the event loop.

SQLite in WAL mode with ``synchronous=FULL``. All writes go through one writer task
(:meth:`Journal.run`) that takes whatever has queued up and commits it in **one transaction**
in a worker thread (group commit): inbound batches, acks, drafts, declines. Each inbound batch
learns its seqs only once the transaction holding it has committed, so ``accepted`` is still
answered only after the commit; everything that arrived meanwhile shares the next one. The
trio thread never waits on SQLite or fsync.

Every per-message statement is an indexed search (:mod:`mcpl_router.store.schema`; a test
asserts the query plans), and what was acked or settled is pruned after ``retention`` seconds, so the cost
of a message does not grow with the journal's history. Counts the daemon reads often (each
agent's unacked wakes, the last seq) and the drafts and declines the turn code reads are kept
in memory and written behind, in order, by the same writer.

The file is locked (``<journal>.lock``, holding the owner's pid): a second daemon on the same
journal is refused at start with :class:`JournalLocked`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
import msgspec
import trio

from mcpl_router.logs import get_logger
from mcpl_router.store.schema import (
    SQL_ACK_DELIVERY,
    SQL_ACK_EVENT,
    SQL_DELIVERY,
    SQL_EVENT,
    SQL_FIND_DUPLICATE,
    SQL_INSERT_DELIVERY,
    SQL_INSERT_EVENT,
    SQL_PRUNABLE_EVENTS,
    SQL_PRUNE_DELIVERIES,
    SQL_PRUNE_DRAFTS,
    SQL_PRUNE_EVENT,
    SQL_SAVE_DRAFT,
    SQL_UNACKED_DELIVERIES,
    JournalLocked,  # noqa: F401 - raised here (at open), so importable from here
    last_seq_before,
    lock,
    migrate,
)

#: Inbound batches (and other writes) that may wait for the writer before submitters wait.
WRITE_QUEUE: Final = 4096
#: The most operations one transaction takes.
MAX_BATCH_OPS: Final = 2048
#: Acked events (and their deliveries) older than this are pruned; so are settled drafts.
DEFAULT_RETENTION: Final = 24 * 3600.0
#: How often the writer prunes, and how many rows one pruning transaction takes.
PRUNE_INTERVAL: Final = 60.0
PRUNE_CHUNK: Final = 5000
#: How long the last commit at shutdown may take before the daemon exits without it.
SHUTDOWN_COMMIT_TIMEOUT: Final = 10.0

_SETTLED_STATES: Final = frozenset({"delivered", "dismissed"})


class JournalFailure(Exception):
    """A write could not be committed (disk full, I/O error); nothing of it was accepted."""


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
    #: What the message said (see :func:`content_digest`); a re-send under the same key with
    #: the same digest is a duplicate, a different one a new message. None: the whole payload's.
    digest: bytes | None = None


@attrs.frozen
class Delivery:
    """One agent woken by one event, as the journal keeps it."""

    agent: str
    reason: str
    tags: tuple[str, ...]
    addressed: bool


@attrs.frozen
class Recorded:
    seq: int
    duplicate: bool
    #: A different message under an id already seen (a server that restarted its counter).
    reused_id: bool = False


@attrs.frozen
class StoredEvent:
    seq: int
    server_id: str
    channel_id: str | None
    kind: str
    payload: Any
    received_at: float


@attrs.frozen
class StoredDelivery:
    """A delivery with its event, for re-sending."""

    delivery: Delivery
    event: StoredEvent


@attrs.frozen
class JournalStatistics:
    last_seq: int
    queued_writes: int
    commits: int
    #: Operations in the last commit, and the most one commit held.
    last_batch: int
    largest_batch: int
    #: Seconds the last commit took in its thread (fsync included).
    last_commit_seconds: float
    pruned_events: int
    pruned_drafts: int
    #: The last commit's error while it keeps failing; None when healthy.
    failing: str | None


def _one_per_agent(deliveries: Sequence[Delivery]) -> list[Delivery]:
    """An agent is woken once per event, however often a policy listed it (the first wins)."""
    seen: dict[str, Delivery] = {}
    for delivery in deliveries:
        seen.setdefault(delivery.agent, delivery)
    return list(seen.values())


def content_digest(payload: Any) -> bytes:
    """What a message or event said, for telling a re-send from a new message under an old id."""
    return hashlib.blake2b(msgspec.json.encode(payload, order="sorted"), digest_size=16).digest()


# -- the writer's operations ---------------------------------------------------------------------


@attrs.define(eq=False)
class _Op:
    done: trio.Event = attrs.field(factory=trio.Event)
    error: BaseException | None = None

    def apply(self, db: sqlite3.Connection, journal: Journal) -> None:
        raise NotImplementedError

    def committed(self, journal: Journal) -> None:
        """On the trio thread, in commit order, once the transaction holding this is durable."""

    async def wait(self) -> None:
        await self.done.wait()
        if self.error is not None:
            raise JournalFailure(str(self.error)) from self.error


@attrs.define(eq=False)
class _InboundOp(_Op):
    events: Sequence[tuple[InboundEvent, Sequence[Delivery]]] = ()
    on_committed: Callable[[list[Recorded]], None] | None = None
    results: list[Recorded] = attrs.field(factory=list)

    def apply(self, db: sqlite3.Connection, journal: Journal) -> None:
        now = time.time()
        encode = journal._encoder.encode
        for event, deliveries in self.events:
            digest = event.digest if event.digest is not None else content_digest(event.payload)
            row = db.execute(SQL_FIND_DUPLICATE, (event.server_id, event.kind, event.dedup_key)).fetchone()
            if row is not None and (row[1] is None or row[1] == digest):
                # A journal from before digests were kept counts a re-used id as a re-send.
                self.results.append(Recorded(seq=row[0], duplicate=True))
                continue
            cursor = db.execute(
                SQL_INSERT_EVENT,
                (event.server_id, event.channel_id, event.kind, event.dedup_key, digest, encode(event.payload), now,
                 # An event that woke nobody is owed to nobody: acked as it is written.
                 0 if deliveries else 1),
            )
            seq = int(cursor.lastrowid or 0)
            db.executemany(
                SQL_INSERT_DELIVERY,
                [(d.agent, seq, d.reason, encode(list(d.tags)), int(d.addressed)) for d in _one_per_agent(deliveries)],
            )
            self.results.append(Recorded(seq=seq, duplicate=False, reused_id=row is not None))

    def committed(self, journal: Journal) -> None:
        for (_event, deliveries), recorded in zip(self.events, self.results, strict=True):
            if not recorded.duplicate:
                journal._last_seq = max(journal._last_seq, recorded.seq)
                for delivery in _one_per_agent(deliveries):
                    journal._unacked[delivery.agent] += 1
        if self.on_committed is not None:
            self.on_committed(self.results)


@attrs.define(eq=False)
class _AckOp(_Op):
    agents: Sequence[str] = ()
    seqs: Sequence[int] = ()
    newly: Counter[str] = attrs.field(factory=Counter)

    def apply(self, db: sqlite3.Connection, journal: Journal) -> None:
        for agent in self.agents:
            for seq in self.seqs:
                self.newly[agent] += db.execute(SQL_ACK_DELIVERY, (agent, seq)).rowcount
        db.executemany(SQL_ACK_EVENT, [(seq, seq) for seq in set(self.seqs)])

    def committed(self, journal: Journal) -> None:
        for agent, count in self.newly.items():
            journal._unacked[agent] = max(0, journal._unacked[agent] - count)


@attrs.define(eq=False)
class _WriteOp(_Op):
    """A write-behind statement (drafts, declines, agents): in order, no caller waits on it."""

    sql: str = ""
    args: tuple[Any, ...] = ()

    def apply(self, db: sqlite3.Connection, journal: Journal) -> None:
        db.execute(self.sql, self.args)


@attrs.define(eq=False)
class _BarrierOp(_Op):
    """Nothing to write: done once everything queued before it has committed."""

    def apply(self, db: sqlite3.Connection, journal: Journal) -> None:
        return None


# -- the journal ---------------------------------------------------------------------------------


class Journal:
    """The daemon's journal file. Opened once (and locked), written by :meth:`run`, closed last.

    Args:
        path: the SQLite file (its directory is created 0700; the file is 0600).
        retention: seconds an acked event, or a settled draft, is kept before it is pruned. A
            server re-sending a message older than this is taken as a new message.
    """

    def __init__(self, path: str | Path, *, retention: float = DEFAULT_RETENTION) -> None:
        self.path = Path(path)
        self.retention = retention
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._log = get_logger(journal=str(self.path))
        self._lock_file = lock(self.path)
        try:
            self._db = self._connect()
            migrate(self._db, self._log)
            # The trio thread's own connection: reads for start-up, status and tests only.
            self._reader = self._connect()
        except BaseException:
            self._lock_file.close()
            raise
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(f"{self.path}{suffix}", 0o600)
        self._encoder = msgspec.json.Encoder()
        self._thread_reader: sqlite3.Connection | None = None
        self._read_limiter = trio.CapacityLimiter(1)
        self._queue_send, self._queue_receive = trio.open_memory_channel[_Op](WRITE_QUEUE)
        self._backlog: deque[_Op] = deque()
        self._running = False
        self._stopped = False
        self._closed = False
        self._stats = {"commits": 0, "last_batch": 0, "largest_batch": 0, "pruned_events": 0, "pruned_drafts": 0}
        self._last_commit_seconds = 0.0
        self.failing: str | None = None
        db = self._db
        self._last_seq = int(db.execute("SELECT COALESCE(MAX(seq), 0) FROM inbound").fetchone()[0])
        self._unacked: Counter[str] = Counter(
            dict(db.execute("SELECT agent, COUNT(*) FROM deliveries WHERE acked = 0 GROUP BY agent").fetchall())
        )
        self._declines: dict[tuple[str, str, str], float] = {
            (agent, server, channel): at
            for agent, server, channel, at in db.execute("SELECT agent, server, channel, declined_at FROM declines ORDER BY declined_at")
        }
        self._drafts: dict[str, dict[str, Any]] = {}
        # Each agent's draft ids, oldest first: a turn reads its agent's drafts, not everyone's.
        self._agent_drafts: dict[str, dict[str, None]] = {}
        cutoff = time.time() - retention
        for raw, settled_at in db.execute("SELECT row, settled_at FROM drafts ORDER BY created_at, id").fetchall():
            if settled_at is not None and settled_at < cutoff:
                continue  # pruned at the writer's first pass
            row = msgspec.json.decode(raw)
            if settled_at is not None:
                row["settledAt"] = settled_at
            self._drafts[row["id"]] = row
            self._agent_drafts.setdefault(row["agent"], {})[row["id"]] = None
        self._settle_interrupted_drafts()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit is on disk before we answer "accepted", across a power loss too
        # (NORMAL in WAL mode survives a process crash but may roll back on an OS crash).
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA busy_timeout=5000")
        # 64 MiB of page cache: the indexes a message touches stay in memory as the file grows.
        db.execute("PRAGMA cache_size=-65536")
        return db

    # -- the writer --------------------------------------------------------------------------

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
        retry_delay = 0.0
        try:
            while True:
                batch: list[_Op] = []
                if not self._backlog:
                    with trio.move_on_at(next_prune):
                        batch.append(await self._queue_receive.receive())
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
            await trio.to_thread.run_sync(self._commit_in_thread, batch, abandon_on_cancel=abandon_on_cancel)
        except trio.Cancelled:
            self.failing = "the commit did not finish before the shutdown deadline"
            self._log.error("journal.commit.abandoned", ops=len(batch))
            raise
        except Exception as exc:  # sqlite3.Error, OSError: the whole transaction rolled back
            self.failing = f"{type(exc).__name__}: {exc}"
            self._log.error("journal.commit.failed", ops=len(batch), error=self.failing)
            for op in batch:
                if isinstance(op, _WriteOp):
                    op.error = None
                    kept.append(op)
                else:
                    op.error = exc
            if kept:
                # A barrier queued after a write-behind op that didn't commit fails too, so a
                # flush never says "on disk" of something that isn't (it is in the same batch).
                self._log.warning("journal.write_behind.retrying", ops=len(kept))
        else:
            if self.failing is not None:
                self._log.info("journal.commit.recovered")
            self.failing = None
        self._last_commit_seconds = time.perf_counter() - started
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
            op.done.set()
        return kept

    def _commit_in_thread(self, batch: list[_Op]) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            for op in batch:
                # Each op in its own savepoint: one op's failure is its own, not the batch's.
                db.execute("SAVEPOINT op")
                try:
                    op.apply(db, self)
                except sqlite3.IntegrityError as exc:
                    db.execute("ROLLBACK TO op")
                    op.error = exc
                db.execute("RELEASE op")
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

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
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            last = last_seq_before(db, cutoff)
            seqs = [(seq,) for (seq,) in db.execute(SQL_PRUNABLE_EVENTS, (last, PRUNE_CHUNK)).fetchall()]
            db.executemany(SQL_PRUNE_DELIVERIES, seqs)
            db.executemany(SQL_PRUNE_EVENT, seqs)
            drafts = db.execute(SQL_PRUNE_DRAFTS, (cutoff,)).rowcount
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        return len(seqs), drafts

    async def _submit(self, op: _Op) -> _Op:
        if self._closed or self._stopped:
            raise JournalFailure("the journal is closed (the daemon is stopping)")
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
    ) -> Callable[[], Any]:
        """Queue a batch (each event with the agents it wakes) for the next group commit.

        Returns ``wait``: awaiting it gives the batch's :class:`Recorded` list once it is
        durable, or raises :class:`JournalFailure`. ``on_committed`` is called with the same
        list on the trio thread right after the commit, in commit order across batches (wakes
        go out from there, in seq order). Waits only while the write queue is full.
        """
        op = await self._submit(_InboundOp(events=events, on_committed=on_committed))
        assert isinstance(op, _InboundOp)

        async def wait() -> list[Recorded]:
            await op.wait()
            return op.results

        return wait

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

    async def submit_ack(self, agents: Sequence[str], seqs: Sequence[int]) -> Callable[[], Awaitable[int]]:
        """Queue an ack for the next group commit; ``wait()`` gives how many were newly acked
        once it is durable (or raises :class:`JournalFailure`)."""
        if not agents or not seqs:
            await trio.lowlevel.checkpoint()

            async def nothing() -> int:
                return 0

            return nothing
        op = await self._submit(_AckOp(agents=list(agents), seqs=list(seqs)))
        assert isinstance(op, _AckOp)

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

    # -- reads in a thread (per turn, per replay page) ------------------------------------------

    async def _read(self, fn: Callable[[sqlite3.Connection], Any]) -> Any:
        def run() -> Any:
            if self._thread_reader is None:
                self._thread_reader = self._connect()
            return fn(self._thread_reader)

        return await trio.to_thread.run_sync(run, limiter=self._read_limiter)

    async def unacked_deliveries(self, agent: str, *, after_seq: int = 0, limit: int = 1000) -> list[StoredDelivery]:
        """``agent``'s unacked deliveries with their events, in seq order, at most ``limit``."""
        rows = await self._read(lambda db: db.execute(SQL_UNACKED_DELIVERIES, (agent, after_seq, limit)).fetchall())
        return [_stored_delivery(row) for row in rows]

    async def delivery(self, seq: int, agent: str) -> StoredDelivery | None:
        """One delivery (acked or not) with its event."""
        return await self._read(lambda db: _read_delivery(db, seq, agent))

    # -- synchronous reads (start-up, status, tests; never per message) -------------------------

    def last_seq(self) -> int:
        """The newest committed seq (kept in memory)."""
        return self._last_seq

    def unacked_count(self, agent: str) -> int:
        """How many of ``agent``'s wakes are not acked yet (kept in memory)."""
        return self._unacked.get(agent, 0)

    def events(self, *, after_seq: int = 0, limit: int = 1000, unacked_only: bool = False) -> list[StoredEvent]:
        """Recorded events in seq order (not yet pruned); ``unacked_only``: those still owed to
        an agent. For tests and tools, not the daemon's per-message paths."""
        rows = self._reader.execute(
            "SELECT seq, server, channel, kind, payload, received_at FROM inbound"
            f" WHERE seq > ?{' AND acked = 0' if unacked_only else ''} ORDER BY seq LIMIT ?",
            (after_seq, limit),
        ).fetchall()
        return [StoredEvent(seq, server, channel, kind, msgspec.json.decode(payload), at) for seq, server, channel, kind, payload, at in rows]

    def delivery_now(self, seq: int, agent: str) -> StoredDelivery | None:
        """:meth:`delivery` on the calling thread (tests)."""
        return _read_delivery(self._reader, seq, agent)

    def statistics(self) -> JournalStatistics:
        return JournalStatistics(
            last_seq=self._last_seq,
            queued_writes=self._queue_send.statistics().current_buffer_used + len(self._backlog),
            last_commit_seconds=self._last_commit_seconds,
            failing=self.failing,
            **self._stats,
        )

    # -- agents, declines, drafts (in memory, written behind in order) --------------------------

    def save_agent(self, name: str, spec: Any) -> None:
        """Remember a host-declared agent's spec (plain JSON values)."""
        self._submit_nowait(
            _WriteOp(
                sql="INSERT INTO agents (name, spec) VALUES (?, ?) ON CONFLICT (name) DO UPDATE SET spec = excluded.spec",
                args=(name, self._encoder.encode(spec)),
            )
        )

    def saved_agents(self) -> dict[str, Any]:
        """Every remembered host-declared agent's spec, by name (read at start)."""
        rows = self._reader.execute("SELECT name, spec FROM agents ORDER BY name").fetchall()
        return {name: msgspec.json.decode(spec) for name, spec in rows}

    def record_decline(self, agent: str, server_id: str, channel_id: str) -> None:
        """Remember that ``agent`` declined channel ``channel_id`` of server ``server_id``."""
        now = time.time()
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

    def save_draft(self, row: dict[str, Any]) -> None:
        """Insert or replace one draft (its :meth:`~mcpl_router.routing.drafts.Draft.row`).

        In memory at once; on disk at the next commit (:meth:`flush` waits for it).
        """
        previous = self._drafts.get(row["id"])
        settled_at = previous.get("settledAt") if previous is not None else None
        if row.get("state") in _SETTLED_STATES:
            settled_at = settled_at if isinstance(settled_at, (int, float)) else time.time()
        else:
            settled_at = None
        stored = {**row, "settledAt": settled_at} if settled_at is not None else {k: v for k, v in row.items() if k != "settledAt"}
        self._drafts[row["id"]] = stored
        self._agent_drafts.setdefault(row["agent"], {})[row["id"]] = None
        self._submit_nowait(
            _WriteOp(
                sql=SQL_SAVE_DRAFT,
                args=(row["id"], row["agent"], float(row["createdAt"]), self._encoder.encode(stored), settled_at),
            )
        )

    def drafts_of(self, agent: str) -> list[dict[str, Any]]:
        """Every kept draft row of ``agent``, oldest first."""
        ids = self._agent_drafts.get(agent, {})
        return sorted((self._drafts[draft_id] for draft_id in ids), key=lambda row: (float(row["createdAt"]), row["id"]))

    def draft(self, draft_id: str) -> dict[str, Any] | None:
        """One draft row by id."""
        return self._drafts.get(draft_id)

    def _settle_interrupted_drafts(self) -> list[str]:
        """At open (daemon start): a draft whose last attempt is still ``sending`` was cut off
        by a stop or crash mid-publish; its outcome is unknown, so it becomes ``unconfirmed``
        (never stuck "being sent"; resending needs confirmDuplicate). The ids settled."""
        settled: list[str] = []
        for row in list(self._drafts.values()):
            attempts = row.get("attempts") or []
            if not attempts or attempts[-1].get("outcome") != "sending":
                continue
            attempts[-1] = {**attempts[-1], "outcome": "unknown", "reason": "interrupted"}
            fixed = {**row, "attempts": attempts}
            if fixed.get("state") == "held":
                fixed["state"] = "unconfirmed"
            self._drafts[row["id"]] = fixed
            # Written now, synchronously: the writer isn't running yet.
            self._db.execute(
                SQL_SAVE_DRAFT,
                (fixed["id"], fixed["agent"], float(fixed["createdAt"]), self._encoder.encode(fixed), None),
            )
            settled.append(row["id"])
        return settled

    def close(self) -> None:
        """Close the files (after :meth:`run` ended) and release the lock."""
        if self._closed:
            return
        self._closed = True
        if self._backlog:
            self._log.error("journal.closed_with_unwritten", ops=len(self._backlog))
        for connection in (self._reader, self._thread_reader, self._db):
            if connection is not None:
                connection.close()
        self._lock_file.close()


def _stored_delivery(row: tuple[Any, ...]) -> StoredDelivery:
    agent, reason, tags, addressed, seq, server, channel, kind, payload, received_at = row
    return StoredDelivery(
        Delivery(agent, reason, tuple(msgspec.json.decode(tags)), bool(addressed)),
        StoredEvent(seq, server, channel, kind, msgspec.json.decode(payload), received_at),
    )


def _read_delivery(db: sqlite3.Connection, seq: int, agent: str) -> StoredDelivery | None:
    row = db.execute(SQL_DELIVERY, (agent, seq)).fetchone()
    event = db.execute(SQL_EVENT, (seq,)).fetchone()
    if row is None or event is None:
        return None
    reason, tags, addressed = row
    return _stored_delivery((agent, reason, tags, addressed, *event))
