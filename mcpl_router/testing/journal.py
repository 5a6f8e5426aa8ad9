"""A journal with its writer running, for tests that use the journal without a daemon.

A :class:`JournalPlace` is where a test's journal lives, on either backend: a SQLite file,
or an empty PostgreSQL database of its own. The journal's contract tests take one per backend
(``tests/conftest.py``'s ``journal_place``), so one test holds each promise on both.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from mcpl_router.logs import get_logger
from mcpl_router.store.backend import Connection
from mcpl_router.store.journal import Journal
from mcpl_router.store.leases import LeaseFence


@attrs.frozen
class JournalPlace:
    """Where a test's journal is: ``path`` (SQLite) or ``dsn`` (PostgreSQL)."""

    path: Path | None = None
    dsn: str | None = None

    @property
    def backend(self) -> str:
        return "sqlite" if self.path is not None else "postgres"

    def open(self, *, fence: LeaseFence | None = None, **options: Any) -> Journal:
        """The journal there, opened (and locked) anew: a restart opens it again. ``fence``: a
        cluster node's lease, on PostgreSQL."""
        if self.path is not None:
            return Journal(self.path, **options)
        from mcpl_router.store.postgres_backend import PostgresBackend

        assert self.dsn is not None
        return Journal(PostgresBackend(self.dsn, get_logger(journal="test"), fence=fence), **options)

    @contextmanager
    def database(self) -> Iterator[Connection]:
        """A connection of the test's own to the journal's database (to look, or to break it)."""
        if self.path is not None:
            db = sqlite3.connect(str(self.path), isolation_level=None)
            try:
                yield db
            finally:
                db.close()
            return
        import psycopg

        from mcpl_router.store.postgres_backend import PgConnection

        assert self.dsn is not None
        conn = PgConnection(psycopg.connect(self.dsn, autocommit=True))
        try:
            yield conn
        finally:
            conn.close()


@asynccontextmanager
async def open_journal(where: Path | JournalPlace, **options: Any) -> AsyncIterator[Journal]:
    """Open ``where``, run its writer for the block, then stop it (what was queued is written) and close."""
    journal = where.open(**options) if isinstance(where, JournalPlace) else Journal(where, **options)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            yield journal
            nursery.cancel_scope.cancel()
    finally:
        journal.close()
