"""The journal on PostgreSQL: the same promises on a replicated store.

psycopg 3's synchronous client, only ever in worker threads (its async API is asyncio's): the
writer's one connection commits the group commits, a bounded pool serves the reads, and one
more connection the trio thread's start-up and status reads. Every connection is in autocommit
mode with the writer's transactions opened and closed by the journal itself, as on SQLite.

What PostgreSQL asks of a journal that SQLite did not:

- **A commit is durable only when it says so.** With a synchronous standby, a commit whose
  wait for the standby is cancelled (the primary restarting, an operator's cancel) returns
  with only a warning, the row on the primary alone. :meth:`PostgresBackend.commit` takes that
  warning as a failure: the ops fail (no ``accepted``), the write-behind ones are retried, and a
  server's re-send finds the row and is recorded then (``JournalWriter._unconfirmed_row``). A
  commit has no timeout.
- **Seqs in commit order.** Each commit numbering events takes the one ``journal_meta`` row
  ``FOR UPDATE`` and numbers after its ``last_seq``: a commit that numbers later commits later,
  so a reader following seqs skips nothing (a ``bigserial`` alone gives no such order).
- **The primary lost.** A connection that breaks is made again at the next commit; with a
  multi-host DSN (``target_session_attrs=read-write``) that is whichever server takes writes
  now. Meanwhile commits fail (servers get a retryable error), write-behind ops wait in order.
- **One daemon per journal**: the writer holds an advisory lock, taken again on every new
  connection; a second daemon is refused at start (:class:`~mcpl_router.store.schema.JournalLocked`).
  A cluster's node (given a :class:`~mcpl_router.store.leases.LeaseFence`) takes it shared
  instead (the lease says which node writes; a single daemon is still kept out) and fences
  every transaction with its lease.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Final, TypeVar

import trio

from mcpl_router.config.addresses import dsn_without_password
from mcpl_router.logs import Logger
from mcpl_router.store.backend import Connection, Cursor, Dialect
from mcpl_router.store.leases import HOLDER_IDLE_IN_TRANSACTION_MS, LeaseFence
from mcpl_router.store.schema import JournalLocked, JournalRefused

if TYPE_CHECKING:
    import psycopg

__all__ = ["SCHEMA_VERSION", "CommitNotDurable", "PgConnection", "PostgresBackend", "inspect_postgres"]

_Read = TypeVar("_Read")

#: The PostgreSQL schema's version (its own line: the SQLite file's is schema.SCHEMA_VERSION).
SCHEMA_VERSION: Final = 1
#: Reads served at once by the pool (a turn's context, a replay page, start-up).
READ_POOL: Final = 4
#: The advisory lock a journal's writer holds (one daemon per journal database).
LOCK_KEY: Final = 0x6D63_706C_726F_7574  # "mcplrout"
#: What PostgreSQL warns when a commit's wait for its synchronous standby was cancelled.
SYNC_WAIT_CANCELLED: Final = "canceling wait for synchronous replication"
#: Seconds a connection attempt may take (unless the DSN says), so a dead host fails a commit
#: instead of hanging it; and TCP keepalives, so a primary that vanished is noticed.
CONNECT_DEFAULTS: Final = {"connect_timeout": "5", "keepalives": "1", "keepalives_idle": "5", "keepalives_interval": "2", "keepalives_count": "3"}

SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS journal_meta (
        id smallint PRIMARY KEY CHECK (id = 1),
        schema_version integer NOT NULL,
        -- The highest seq ever given (pruning may delete it): commits number after it.
        last_seq bigint NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS inbound (
        seq bigint PRIMARY KEY,
        server text NOT NULL,
        channel text,
        kind text NOT NULL,
        dedup text NOT NULL,
        digest bytea,
        payload bytea NOT NULL,
        received_at double precision NOT NULL,
        acked smallint NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX IF NOT EXISTS inbound_dedup ON inbound (server, kind, dedup, seq)",
    """CREATE TABLE IF NOT EXISTS deliveries (
        seq bigint NOT NULL,
        agent text NOT NULL,
        reason text NOT NULL,
        tags bytea NOT NULL,
        addressed smallint NOT NULL,
        acked smallint NOT NULL DEFAULT 0,
        PRIMARY KEY (seq, agent)
    )""",
    "CREATE INDEX IF NOT EXISTS deliveries_unacked ON deliveries (agent, acked, seq)",
    "CREATE TABLE IF NOT EXISTS agents (name text PRIMARY KEY, spec bytea NOT NULL)",
    """CREATE TABLE IF NOT EXISTS declines (
        agent text NOT NULL, server text NOT NULL, channel text NOT NULL,
        declined_at double precision NOT NULL,
        PRIMARY KEY (agent, server, channel)
    )""",
    """CREATE TABLE IF NOT EXISTS channel_decisions (
        agent text NOT NULL, server text NOT NULL, channel text NOT NULL,
        state text NOT NULL, decided_at double precision NOT NULL,
        PRIMARY KEY (agent, server, channel)
    )""",
    """CREATE TABLE IF NOT EXISTS drafts (
        id text PRIMARY KEY, agent text NOT NULL, created_at double precision NOT NULL,
        row bytea NOT NULL, settled_at double precision
    )""",
    "CREATE INDEX IF NOT EXISTS drafts_by_agent ON drafts (agent, created_at)",
    "CREATE INDEX IF NOT EXISTS drafts_settled ON drafts (settled_at)",
    """CREATE TABLE IF NOT EXISTS fork_generations (
        agent text NOT NULL, server text NOT NULL, channel text NOT NULL, generation bigint NOT NULL,
        PRIMARY KEY (agent, server, channel)
    )""",
    """CREATE TABLE IF NOT EXISTS tune_outs (
        agent text NOT NULL, server text NOT NULL, channel text NOT NULL,
        cadence double precision NOT NULL, backlog_cap bigint NOT NULL, max_wakes bigint,
        duration double precision, started_at double precision NOT NULL, ends_at double precision,
        wakes bigint NOT NULL DEFAULT 0, handed_through bigint NOT NULL DEFAULT 0, summary text,
        PRIMARY KEY (agent, server, channel)
    )""",
)


class CommitNotDurable(Exception):
    """A commit returned, but PostgreSQL did not say it is durable (its synchronous wait was
    cancelled): it counts as failed and is retried."""


def _array(values: Sequence[object]) -> object:
    return list(values)


def _integrity_errors() -> tuple[type[Exception], ...]:
    import psycopg

    return (psycopg.IntegrityError,)


def _dialect() -> Dialect:
    return Dialect(
        name="postgres",
        begin="BEGIN",
        find_duplicates=(
            "SELECT DISTINCT ON (dedup) dedup, seq, digest FROM inbound WHERE server = ? AND kind = ? AND dedup = ANY(?)"
            " ORDER BY dedup, seq DESC"
        ),
        ack_deliveries="UPDATE deliveries SET acked = 1 WHERE agent = ? AND acked = 0 AND seq = ANY(?)",
        ack_events=(
            "UPDATE inbound SET acked = 1 WHERE seq = ANY(?) AND acked = 0"
            " AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.seq = inbound.seq AND d.acked = 0)"
        ),
        # FOR UPDATE: the commit that numbers next waits for this one to end (seqs in commit order).
        last_seq_given="SELECT last_seq FROM journal_meta WHERE id = 1 FOR UPDATE",
        set_last_seq_given="UPDATE journal_meta SET last_seq = ? WHERE id = 1",
        array=_array,
        integrity_errors=_integrity_errors(),
        # One statement for a commit's rows: row by row (executemany) each row is a statement
        # of its own on the server, about 20 µs each.
        insert_events_columns=(
            "INSERT INTO inbound (seq, server, channel, kind, dedup, digest, payload, received_at, acked)"
            " SELECT * FROM unnest(?::bigint[], ?::text[], ?::text[], ?::text[], ?::text[], ?::bytea[], ?::bytea[],"
            " ?::double precision[], ?::smallint[])"
        ),
        insert_deliveries_columns=(
            "INSERT INTO deliveries (agent, seq, reason, tags, addressed)"
            " SELECT * FROM unnest(?::text[], ?::bigint[], ?::text[], ?::bytea[], ?::smallint[]) ON CONFLICT DO NOTHING"
        ),
    )


class PgConnection:
    """A psycopg connection as the journal uses one (:class:`~mcpl_router.store.backend.Connection`)."""

    def __init__(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        self.raw = conn
        #: Warnings PostgreSQL sent since the last COMMIT began.
        self.warnings: list[str] = []
        conn.add_notice_handler(self._notice)
        # Each statement's text with ``?`` turned into ``%b``, once (the statements are a fixed
        # set): every parameter goes in binary, so a list (a commit's column of 256 payloads)
        # goes without the text format's escaping of each element, which was half such a
        # commit's time in the writer's thread.
        self._statements: dict[str, bytes] = {}

    def _statement(self, sql: str) -> bytes:
        converted = self._statements.get(sql)
        if converted is None:
            converted = self._statements[sql] = sql.replace("%", "%%").replace("?", "%b").encode()
        return converted

    def _notice(self, diagnostic: psycopg.errors.Diagnostic) -> None:
        if diagnostic.severity_nonlocalized == "WARNING" and diagnostic.message_primary:
            self.warnings.append(diagnostic.message_primary)

    def execute(self, sql: str, parameters: Sequence[object] = (), /) -> Cursor:
        if not parameters:
            return self.raw.execute(sql.encode())  # no placeholders: the text as written
        return self.raw.execute(self._statement(sql), parameters, binary=True)

    def executemany(self, sql: str, rows: Iterable[Sequence[object]], /) -> object:
        rows = list(rows)
        if rows:
            with self.raw.cursor() as cursor:
                cursor.executemany(self._statement(sql), rows)
        return None

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        return self.raw.info.transaction_status in (TransactionStatus.INTRANS, TransactionStatus.INERROR)

    @property
    def broken(self) -> bool:
        return self.raw.closed or self.raw.broken

    def close(self) -> None:
        self.raw.close()


class PostgresBackend:
    """A journal in a PostgreSQL database: connected, locked and migrated when made.

    Args:
        dsn: libpq's connection string (a multi-host one with ``target_session_attrs=read-write``
            follows a failover).
        log: where connection losses and reconnections are said.
        password: given apart from the DSN (from a file), never logged.
        fence: a cluster node's lease: every transaction checks it first.
    """

    read_only: str | None = None

    def __init__(self, dsn: str, log: Logger, *, password: str | None = None, fence: LeaseFence | None = None) -> None:
        self.dialect = _dialect()
        self._fence = fence
        self._dsn = dsn
        self._password = password
        self.where = f"postgres: {dsn_without_password(dsn)}"
        self._log = log
        self._writer: PgConnection | None = None
        self._reader: PgConnection | None = None
        self._idle_readers: list[PgConnection] = []
        self._read_limiter = trio.CapacityLimiter(READ_POOL)
        try:
            writer = self.writer()
            self._migrate(writer)
        except JournalLocked:
            self.close()
            raise
        except Exception as exc:
            self.close()
            raise JournalRefused(self.where, f"could not be opened: {type(exc).__name__}: {exc}".rstrip(), "Check the DSN and that the database takes writes, then start again.") from None

    # -- connections ---------------------------------------------------------------------------

    def _connect(self) -> PgConnection:
        return connect(self._dsn, self._password)

    def writer(self) -> PgConnection:
        """The writer's connection, made (and locked) again if the last one broke."""
        if self._writer is not None and not self._writer.broken:
            return self._writer
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._log.warning("journal.postgres.reconnecting", where=self.where)
        conn = self._connect()
        try:
            # Shared for a cluster's node: its lease decides who writes.
            take = "SELECT pg_try_advisory_lock_shared(?)" if self._fence is not None else "SELECT pg_try_advisory_lock(?)"
            locked = conn.execute(take, (LOCK_KEY,)).fetchone()[0]
            if self._fence is not None:
                # Stopped mid-commit, this node must not hold the lease row's lock for as long
                # as it is stopped: the server ends such a transaction (store/leases.py).
                conn.execute(f"SET idle_in_transaction_session_timeout = {HOLDER_IDLE_IN_TRANSACTION_MS}")
            if not locked:
                holder = conn.execute(
                    "SELECT a.pid, a.application_name, a.client_addr FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
                    " WHERE l.locktype = 'advisory' AND l.granted AND (l.classid::bigint << 32) | l.objid::bigint = ? LIMIT 1",
                    (LOCK_KEY,),
                ).fetchone()
                who = "another daemon" if holder is None else f"another daemon ({holder[1] or 'a client'} from {holder[2] or 'a local socket'}, backend pid {holder[0]})"
                raise JournalLocked(
                    f"the journal {self.where} is in use by {who}; stop that daemon, or give this one its own database"
                )
        except BaseException:
            conn.close()
            raise
        self._writer = conn
        return conn

    def reader(self) -> PgConnection:
        if self._reader is None or self._reader.broken:
            if self._reader is not None:
                self._reader.close()
            self._reader = self._connect()
        return self._reader

    async def read(self, fn: Callable[[Connection], _Read]) -> _Read:
        def run() -> _Read:
            import psycopg

            pooled = bool(self._idle_readers)
            conn = self._idle_readers.pop() if pooled else self._connect()
            try:
                result = fn(conn)
            except psycopg.OperationalError:
                conn.close()
                if not pooled:
                    raise
                # A pooled connection that broke while idle (the primary went away): once more
                # on a new one, which finds whichever server takes connections now.
                conn = self._connect()
                try:
                    result = fn(conn)
                except BaseException:
                    conn.close()
                    raise
            except BaseException:
                if conn.broken:
                    conn.close()
                else:
                    self._idle_readers.append(conn)
                raise
            self._idle_readers.append(conn)
            return result

        # Bounded: at most READ_POOL reads at once, so at most that many reading connections.
        return await trio.to_thread.run_sync(run, limiter=self._read_limiter)

    def commit(self, db: Connection) -> None:
        assert isinstance(db, PgConnection), "a PostgreSQL journal commits on its own connections"
        db.warnings.clear()
        db.execute("COMMIT")
        cancelled = [warning for warning in db.warnings if SYNC_WAIT_CANCELLED in warning]
        if cancelled:
            raise CommitNotDurable(
                f"PostgreSQL warned '{cancelled[0]}': the commit may be on the primary alone, so it counts as failed and is retried"
            )

    def check_fence(self, db: Connection) -> None:
        if self._fence is not None:
            self._fence.check_in(db)

    def writer_failed(self) -> None:
        if self._writer is not None and self._writer.broken:
            self._writer.close()
            self._writer = None
            self._log.warning("journal.postgres.connection_lost", where=self.where)

    def _migrate(self, db: PgConnection) -> None:
        row = db.execute("SELECT to_regclass('journal_meta')").fetchone()
        if row[0] is not None:
            version = db.execute("SELECT schema_version FROM journal_meta WHERE id = 1").fetchone()
            if version is not None and int(version[0]) > SCHEMA_VERSION:
                raise JournalRefused(
                    self.where,
                    f"was written by a newer mcpl-router (schema version {version[0]}, this one reads {SCHEMA_VERSION}).",
                    "Run that version, or give this one its own database.",
                )
            if version is not None and int(version[0]) == SCHEMA_VERSION:
                return
        db.execute("BEGIN")
        try:
            for statement in SCHEMA:
                db.execute(statement)
            db.execute(
                "INSERT INTO journal_meta (id, schema_version, last_seq) VALUES (1, ?, 0)"
                " ON CONFLICT (id) DO UPDATE SET schema_version = excluded.schema_version",
                (SCHEMA_VERSION,),
            )
            self.commit(db)
        except BaseException:
            if db.in_transaction and not db.broken:
                db.execute("ROLLBACK")
            raise
        self._log.info("journal.postgres.schema", version=SCHEMA_VERSION, where=self.where)

    # -- what only a file has ------------------------------------------------------------------

    def problem(self) -> str | None:
        return None

    async def leave_read_only(self) -> bool:
        await trio.lowlevel.checkpoint()
        return True

    def mark_held(self, last_seq: int) -> bool:
        return True  # a database is not lost the way a file is: no marker

    def size_bytes(self) -> int | None:
        return None

    def close(self) -> None:
        for conn in (self._writer, self._reader, *self._idle_readers):
            if conn is not None:
                conn.close()
        self._writer = self._reader = None
        self._idle_readers.clear()



def connect(dsn: str, password: str | None, *, application_name: str = "mcpl-router") -> PgConnection:
    """A new autocommit connection to ``dsn`` with the journal's defaults (a connect timeout,
    TCP keepalives) where the DSN does not say otherwise."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    given = conninfo_to_dict(dsn)
    extra = {key: value for key, value in CONNECT_DEFAULTS.items() if key not in given}
    if password is not None:
        extra["password"] = password
    if "application_name" not in given:
        extra["application_name"] = application_name
    return PgConnection(psycopg.connect(make_conninfo(dsn, **extra), autocommit=True))


def inspect_postgres(dsn: str, *, password: str | None = None) -> list[str]:
    """``mcpl-router journal check`` on a PostgreSQL journal: can it be reached and written, is
    its schema one this version reads, and what it holds. Read-only and lock-free (a running
    daemon's journal can be checked).

    Raises:
        JournalRefused: what a start would refuse, said the same way.
    """
    import psycopg
    from psycopg.conninfo import make_conninfo

    where = f"postgres: {dsn_without_password(dsn)}"
    extra = {} if password is None else {"password": password}
    try:
        with psycopg.connect(make_conninfo(dsn, **extra), autocommit=True) as conn:
            read_only = conn.execute("SELECT pg_is_in_recovery()").fetchone()
            if conn.execute("SELECT to_regclass('journal_meta')").fetchone() == (None,):
                return [f"journal {where}: empty; the first start makes the journal's tables."]
            meta = conn.execute("SELECT schema_version, last_seq FROM journal_meta WHERE id = 1").fetchone()
            events = conn.execute("SELECT COUNT(*) FROM inbound").fetchone()
            unacked = conn.execute("SELECT COUNT(*) FROM deliveries WHERE acked = 0").fetchone()
            drafts = conn.execute("SELECT COUNT(*) FROM drafts WHERE settled_at IS NULL").fetchone()
            holder = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND (classid::bigint << 32) | objid::bigint = %s",
                (LOCK_KEY,),
            ).fetchone()
            cluster = _cluster_lines(conn)
    except psycopg.Error as exc:
        raise JournalRefused(where, f"can't be read: {type(exc).__name__}: {str(exc).strip()}", "Check the DSN and that the database is up.") from None
    if meta is None or int(meta[0]) > SCHEMA_VERSION:
        version = "none" if meta is None else meta[0]
        raise JournalRefused(where, f"has schema version {version}; this version reads {SCHEMA_VERSION}.", "Run the mcpl-router that wrote it.")
    assert events is not None and unacked is not None and drafts is not None and holder is not None and read_only is not None
    return [
        f"journal {where}: OK (schema {meta[0]}{'; this server is a standby: a daemon needs the primary' if read_only[0] else ''})",
        f"  events kept: {events[0]}, last seq given: {meta[1]}; wakes not acked: {unacked[0]}; live drafts: {drafts[0]}",
        f"  {'a daemon holds it now' if holder[0] else 'no daemon holds it now'}",
        *cluster,
    ]


def _cluster_lines(conn: psycopg.Connection[tuple[object, ...]]) -> list[str]:
    """A cluster's nodes on this journal (docs/cluster.md): who holds the links, who is there."""
    if conn.execute("SELECT to_regclass('cluster_leases')").fetchone() == (None,):
        return []
    leases = conn.execute(
        "SELECT node, epoch, expires_at > clock_timestamp() FROM cluster_leases WHERE scope = 'links'"
    ).fetchall()
    nodes = conn.execute(
        "SELECT node, state, extract(epoch FROM clock_timestamp() - seen_at) FROM cluster_nodes ORDER BY node"
    ).fetchall()
    lines = []
    holders: set[str] = set()
    for node, epoch, live in leases:
        lines.append(f"  cluster: node {node} {'holds' if live else 'held'} the links (epoch {epoch}{'' if live else ', expired'})")
        if live:
            holders.add(str(node))
    if conn.execute("SELECT to_regclass('cluster_links')").fetchone() != (None,):
        # links = "balanced": each server's link under a lease of its own.
        links = conn.execute(
            "SELECT server, node, epoch, expires_at > clock_timestamp() FROM cluster_links ORDER BY server"
        ).fetchall()
        if links:
            lines.append("  links: " + ", ".join(
                f"{server} on {node} (epoch {epoch})" if live else f"{server} free (last on {node}, epoch {epoch})"
                for server, node, epoch, live in links
            ))
    if nodes:
        lines.append("  nodes: " + ", ".join(_node_entry(str(node), str(state), float(str(ago)), holders) for node, state, ago in nodes))
    return lines


def _node_entry(node: str, state: str, ago: float, holders: set[str]) -> str:
    """One node as its last heartbeat left it. A row still saying ``holding`` (or
    ``draining``) while the lease is another node's, or nobody's, is a node that died or stopped
    holding: said as its last word, not as what it does now, so two nodes never both read as
    holding the links."""
    if state in ("holding", "draining") and node not in holders:
        return f"{node} (said {state} {ago:.1f}s ago; holds nothing now)"
    return f"{node} ({state}, seen {ago:.1f}s ago)"
