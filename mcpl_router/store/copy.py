"""``mcpl-router journal copy``: a journal moved whole from one backend to another.

Everything a journal holds goes, row for row, in one transaction on the target: the events not
yet pruned with their deliveries (acked or not), the agents hosts declared, declines and the
agents' channel decisions, drafts, fork generations and tune-outs, and the highest seq ever given
(so the target never gives a seq the source gave). Both ends are opened as a daemon opens them:
locked (a daemon running on either is refused), checked and migrated to this version's schema.
A target that holds anything is refused: a copy never merges two histories or overwrites one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import attrs

from mcpl_router.logs import get_logger
from mcpl_router.store.backend import Connection, JournalBackend
from mcpl_router.store.schema import JournalRefused

__all__ = ["COPIED_TABLES", "CopyReport", "copy_journal", "open_backend"]

_PAIR_KEY: Final = ("agent", "server", "channel")
#: Each table a journal holds: its primary key's columns, then its other columns, in the order
#: they are copied.
COPIED_TABLES: Final = (
    ("inbound", ("seq",), ("server", "channel", "kind", "dedup", "digest", "payload", "received_at", "acked")),
    ("deliveries", ("seq", "agent"), ("reason", "tags", "addressed", "acked")),
    ("agents", ("name",), ("spec",)),
    ("declines", _PAIR_KEY, ("declined_at",)),
    ("channel_decisions", _PAIR_KEY, ("state", "decided_at")),
    ("drafts", ("id",), ("agent", "created_at", "row", "settled_at")),
    ("fork_generations", _PAIR_KEY, ("generation",)),
    ("tune_outs", _PAIR_KEY, ("cadence", "backlog_cap", "max_wakes", "duration", "started_at", "ends_at", "wakes",
                              "handed_through", "summary")),
)
#: Rows read and written at a time (a journal may hold millions of events).
COPY_CHUNK: Final = 2000


@attrs.frozen
class CopyReport:
    """What a copy moved: rows per table, the unacked deliveries among them, the last seq given."""

    source: str
    target: str
    rows: dict[str, int]
    unacked: int
    last_seq: int

    def lines(self) -> list[str]:
        counts = ", ".join(f"{table} {count}" for table, count in self.rows.items())
        return [
            f"copied the journal {self.source}",
            f"    to {self.target}",
            f"  rows: {counts}",
            f"  unacked wakes: {self.unacked}; last seq given: {self.last_seq} (the target numbers after it)",
        ]


def open_backend(spec: str) -> JournalBackend:
    """``sqlite:PATH`` or ``postgres:DSN``, opened (locked, checked, migrated)."""
    kind, _, where = spec.partition(":")
    log = get_logger(journal=spec if kind == "sqlite" else kind)
    if kind == "sqlite" and where:
        from mcpl_router.store.sqlite_backend import SqliteBackend

        return SqliteBackend(Path(where), log)
    if kind in ("postgres", "postgresql") and where:
        from mcpl_router.store.postgres_backend import PostgresBackend

        return PostgresBackend(where, log)
    raise JournalRefused(spec, "is not a journal to copy.", "Write sqlite:PATH or postgres:DSN.")


@contextmanager
def _opened(spec: str) -> Iterator[JournalBackend]:
    backend = open_backend(spec)
    try:
        yield backend
    finally:
        backend.close()


def _holds_anything(db: Connection) -> str | None:
    for table, _key, _columns in COPIED_TABLES:
        if db.execute(f"SELECT 1 FROM {table} LIMIT 1").fetchone() is not None:  # noqa: S608 - our own table names
            return table
    return None


def copy_journal(source_spec: str, target_spec: str) -> CopyReport:
    """Copy the journal at ``source_spec`` into the empty one at ``target_spec``.

    Raises :class:`JournalRefused` (with what to do) when either can't be opened, or the
    target holds anything; :class:`~mcpl_router.store.schema.JournalLocked` when a daemon runs
    on either.
    """
    with _opened(source_spec) as source, _opened(target_spec) as target:
        read = source.reader()
        write = target.writer()
        held = _holds_anything(write)
        if held is not None:
            raise JournalRefused(
                target.where, f"already holds a journal (its {held} table has rows); a copy never overwrites one.",
                "Copy into an empty database or a new file.",
            )
        last_seq = int(read.execute(source.dialect.last_seq_given).fetchone()[0])
        unacked = int(read.execute("SELECT COUNT(*) FROM deliveries WHERE acked = 0").fetchone()[0])
        rows: dict[str, int] = {}
        write.execute(target.dialect.begin)
        try:
            for table, key, columns in COPIED_TABLES:
                rows[table] = _copy_table(read, write, table, key, columns)
            if target.dialect.set_last_seq_given is not None:
                write.execute(target.dialect.set_last_seq_given, (last_seq,))
            else:
                # SQLite numbers after AUTOINCREMENT's record: the source's last seq, not only its rows'.
                write.execute("DELETE FROM sqlite_sequence WHERE name = 'inbound'")
                write.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('inbound', ?)", (last_seq,))
            target.commit(write)
        except BaseException:
            if write.in_transaction:
                write.execute("ROLLBACK")
            raise
        return CopyReport(source.where, target.where, rows, unacked, last_seq)


def _copy_table(read: Connection, write: Connection, table: str, key: tuple[str, ...], others: tuple[str, ...]) -> int:
    columns = (*key, *others)
    names = ", ".join(columns)
    keys = ", ".join(key)
    insert = f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' for _ in columns)})"  # noqa: S608 - our own names
    # Pages by the primary key, each one an index search from where the last ended: memory and
    # time per page stay the same whatever the journal's size.
    first = f"SELECT {names} FROM {table} ORDER BY {keys} LIMIT {COPY_CHUNK}"  # noqa: S608 - our own names
    after = f"SELECT {names} FROM {table} WHERE ({keys}) > ({', '.join('?' for _ in key)}) ORDER BY {keys} LIMIT {COPY_CHUNK}"  # noqa: S608
    copied = 0
    last: tuple[object, ...] | None = None
    while True:
        cursor = read.execute(first) if last is None else read.execute(after, last)
        page = [tuple(bytes(value) if isinstance(value, memoryview) else value for value in row) for row in cursor.fetchall()]
        if not page:
            return copied
        write.executemany(insert, page)
        copied += len(page)
        last = page[-1][: len(key)]
