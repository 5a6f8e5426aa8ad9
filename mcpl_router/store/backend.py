"""What the journal needs of the database under it: one interface, two backends.

:class:`~mcpl_router.store.journal.Journal` keeps its promises (commit before ``accepted``,
dedup, acks, pruning, the group commit off the trio thread) the same way on either backend; a
:class:`JournalBackend` gives it connections, the few statements whose text differs between
SQLite and PostgreSQL (:class:`Dialect`), and what only one of them has (a file's lock and
marker; a server's failover). The embedded default is a SQLite file
(:mod:`~mcpl_router.store.sqlite_backend`); a replicated store is PostgreSQL
(:mod:`~mcpl_router.store.postgres_backend`).

Every other statement (:mod:`~mcpl_router.store.schema`) is written once, in the SQL both
understand, with ``?`` placeholders (the PostgreSQL connection turns them into its own).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol, TypeAlias, TypeVar

import attrs

__all__ = ["Connection", "Cursor", "Dialect", "JournalBackend", "Row", "insert_rows"]

#: A row as a driver gives it (a tuple of the column values, typed by the statement).
Row: TypeAlias = Any
_Read = TypeVar("_Read")


class Cursor(Protocol):
    """What a statement's result is read through (sqlite3's and psycopg's cursors both are)."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Row: ...

    def fetchall(self) -> list[Row]: ...

    def __iter__(self) -> Iterator[Row]: ...


class Connection(Protocol):
    """A connection as the journal uses it: statements, and whether a transaction is open."""

    def execute(self, sql: str, parameters: Sequence[object] = (), /) -> Cursor: ...

    def executemany(self, sql: str, rows: Iterable[Sequence[object]], /) -> object: ...

    @property
    def in_transaction(self) -> bool: ...

    def close(self) -> None: ...


@attrs.frozen
class Dialect:
    """The statements whose text differs between the backends, and how a list is passed."""

    name: str
    #: Opens the writer's transaction (SQLite takes its write lock at once: ``BEGIN IMMEDIATE``).
    begin: str
    #: The latest row under each of many dedup keys (a list) of one server and kind.
    find_duplicates: str
    #: Ack an agent's deliveries of many seqs (a list).
    ack_deliveries: str
    #: Mark acked the events of many seqs (a list) that nobody is owed any more.
    ack_events: str
    #: The highest seq ever given (pruning may have deleted it): a commit numbers after it.
    last_seq_given: str
    #: Remember the highest seq given (None: the database does it itself).
    set_last_seq_given: str | None
    #: The driver's value for a list parameter of the statements above.
    array: Callable[[Sequence[object]], object]
    #: The errors a constraint violation raises.
    integrity_errors: tuple[type[Exception], ...]
    #: A commit's new events, and their deliveries, in one statement taking a list per column
    #: (what ``SQL_INSERT_EVENT_AT`` and ``SQL_INSERT_DELIVERY`` do row by row); None: row by row.
    insert_events_columns: str | None = None
    insert_deliveries_columns: str | None = None


def insert_rows(db: Connection, row_sql: str, columns_sql: str | None, rows: Sequence[Sequence[object]]) -> None:
    """``rows`` inserted by ``row_sql`` one by one, or by ``columns_sql`` at once (a list per column)."""
    if not rows:
        return
    if columns_sql is None:
        db.executemany(row_sql, rows)
    else:
        db.execute(columns_sql, [list(column) for column in zip(*rows, strict=True)])


class JournalBackend(Protocol):
    """A journal's database: its connections and what only it does."""

    dialect: Dialect
    #: Where the journal is, for logs, ``status`` and errors (a path; a DSN without its password).
    where: str
    #: Why nothing can be written now (a full disk at start), or None.
    read_only: str | None

    def writer(self) -> Connection:
        """The writer's connection (in a worker thread; made again if the last one broke)."""
        ...

    def reader(self) -> Connection:
        """A connection for the trio thread's reads (start-up, status, tests)."""
        ...

    async def read(self, fn: Callable[[Connection], _Read]) -> _Read:
        """Run ``fn`` on a reading connection in a worker thread (bounded, never the trio thread)."""
        ...

    def problem(self) -> str | None:
        """Before each commit, in a worker thread: why it must not be written (a removed file)."""
        ...

    def commit(self, db: Connection) -> None:
        """``COMMIT`` the open transaction; raise if it is not known to be durable."""
        ...

    def check_fence(self, db: Connection) -> None:
        """First in each of the writer's transactions: may this daemon still write? (A cluster
        node's lease, store/leases.py; a file has no fence.) Raises
        :class:`~mcpl_router.store.leases.LeaseLost` when it may not."""
        ...

    def writer_failed(self) -> None:
        """The last transaction failed: a connection that broke is made again next time."""
        ...

    async def leave_read_only(self) -> bool:
        """Writable again (space came back)? True when it is."""
        ...

    def mark_held(self, last_seq: int) -> bool:
        """Note that the journal holds messages up to ``last_seq``; True when written."""
        ...

    def size_bytes(self) -> int | None:
        """How big the journal is on disk, if the backend knows."""
        ...

    def close(self) -> None:
        ...
