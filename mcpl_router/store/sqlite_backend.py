"""The embedded journal: one SQLite file, locked, checked before it is trusted, watched while used.

SQLite in WAL mode with ``synchronous=FULL``: a commit is on disk before the journal says so.
The file is locked (``<journal>.lock``, holding the owner's pid): a second daemon on the same
file is refused at start with :class:`~mcpl_router.store.schema.JournalLocked`. The checks at
open, the marker and the file's identity are :mod:`~mcpl_router.store.integrity`'s. A disk
full at start opens the file read-only: the backlog is delivered, nothing new is accepted until
space comes back (:meth:`SqliteBackend.leave_read_only`).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

import trio

from mcpl_router.logs import Logger
from mcpl_router.store.backend import Connection, Dialect
from mcpl_router.store.integrity import FileIdentity, check_before_open, check_opened, disk_is_full, refusal_of, write_marker
from mcpl_router.store.schema import (
    SQL_ACK_DELIVERIES,
    SQL_ACK_EVENTS,
    SQL_FIND_DUPLICATES,
    SQL_LAST_SEQ_GIVEN,
    JournalRefused,
    is_current,
    lock,
    migrate,
)

__all__ = ["SQLITE", "SqliteBackend"]

_Read = TypeVar("_Read")


def _json_array(values: Sequence[object]) -> object:
    # SQLite walks a JSON array (json_each): one parameter, however many values.
    return json.dumps(list(values))


SQLITE = Dialect(
    name="sqlite",
    begin="BEGIN IMMEDIATE",
    find_duplicates=SQL_FIND_DUPLICATES,
    ack_deliveries=SQL_ACK_DELIVERIES,
    ack_events=SQL_ACK_EVENTS,
    last_seq_given=SQL_LAST_SEQ_GIVEN,
    # AUTOINCREMENT's sqlite_sequence follows an explicit seq by itself.
    set_last_seq_given=None,
    array=_json_array,
    integrity_errors=(sqlite3.IntegrityError,),
)


class SqliteBackend:
    """The journal's SQLite file (its directory is created 0700; the file is 0600).

    Opening it locks, checks and migrates it; raises
    :class:`~mcpl_router.store.schema.JournalRefused` or
    :class:`~mcpl_router.store.schema.JournalLocked`.
    """

    dialect = SQLITE

    def __init__(self, path: Path, log: Logger) -> None:
        self.path = path
        self.where = str(path)
        self._log = log
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as exc:
            raise refusal_of(self.path, exc) from None
        check_before_open(self.path)
        try:
            self._lock_file = lock(self.path)
        except OSError as exc:
            raise refusal_of(self.path, exc) from None
        #: Why the journal is open read-only (a full disk at start), or None: nothing new is
        #: accepted until space comes back; the backlog is read and delivered meanwhile.
        self.read_only: str | None = None
        try:
            try:
                self._db = self._connect()
            except sqlite3.OperationalError:
                if not disk_is_full(self.path):
                    raise
                self.read_only = (
                    f"the disk holding the journal {self.path} is full: nothing new is accepted until space is"
                    " freed (the backlog is delivered meanwhile)"
                )
                self._db = self._connect()
            check_opened(self._db, self.path)
            if self.read_only is not None and not is_current(self._db):
                raise JournalRefused(self.path, "needs migrating to this version's schema, and its disk is full.", "Free some space, then start again.")
            migrate(self._db, log)
            # The trio thread's own connection: reads for start-up, status and tests only.
            self._reader = self._connect()
            #: The file as opened: a path that names another file (or none) fails every commit.
            self.identity = FileIdentity.of(self.path)
        except JournalRefused:
            self._lock_file.close()
            raise
        except (sqlite3.Error, OSError) as exc:
            self._lock_file.close()
            raise refusal_of(self.path, exc) from None
        except BaseException:
            self._lock_file.close()
            raise
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(f"{self.path}{suffix}", 0o600)
        self._thread_reader: sqlite3.Connection | None = None
        # One read at a time: one connection serves them, and WAL lets it read beside the writer.
        self._read_limiter = trio.CapacityLimiter(1)

    def _connect(self) -> sqlite3.Connection:
        if self.read_only is not None:
            # Read as it stands, with no -shm to make (a full disk can't hold one). Complete:
            # a -wal left by a crash leaves its -shm too, and then the file opens writable.
            return sqlite3.connect(f"file:{quote(str(self.path))}?immutable=1", uri=True, isolation_level=None, check_same_thread=False)
        return self._connect_writable()

    def _connect_writable(self) -> sqlite3.Connection:
        db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
        # Set once, when the file is made: asked again on a full disk, it would fail a start that
        # only needs to read (the backlog can still be delivered).
        if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            db.execute("PRAGMA journal_mode=WAL")
        # FULL: a commit is on disk before we answer "accepted", across a power loss too
        # (NORMAL in WAL mode survives a process crash but may roll back on an OS crash).
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA busy_timeout=5000")
        # 64 MiB of page cache: the indexes a message touches stay in memory as the file grows.
        db.execute("PRAGMA cache_size=-65536")
        return db

    # -- connections ---------------------------------------------------------------------------

    def writer(self) -> Connection:
        return self._db

    def reader(self) -> Connection:
        return self._reader

    async def read(self, fn: Callable[[Connection], _Read]) -> _Read:
        def run() -> _Read:
            if self._thread_reader is None:
                self._thread_reader = self._connect()
            return fn(self._thread_reader)

        return await trio.to_thread.run_sync(run, limiter=self._read_limiter)

    def commit(self, db: Connection) -> None:
        db.execute("COMMIT")

    def check_fence(self, db: Connection) -> None:
        """A file is one daemon's (its lock): nothing to check."""

    def writer_failed(self) -> None:
        """SQLite rolled the transaction back; the connection stays good."""

    # -- the file ------------------------------------------------------------------------------

    def problem(self) -> str | None:
        # A removed or replaced file: what a commit writes no restart would read.
        return self.identity.problem()

    def _writable_again(self) -> sqlite3.Connection | None:
        """In a worker thread, while :attr:`read_only`: the writer's connection once the file
        opens writable again (space came back), or None while it still can't."""
        if self.read_only is None:
            return None
        try:
            db = self._connect_writable()
            db.execute("BEGIN IMMEDIATE")
            db.execute("ROLLBACK")
        except sqlite3.Error:
            return None
        return db

    async def leave_read_only(self) -> bool:
        """Open the journal writable again if the disk has room now; True when it did."""
        db = await trio.to_thread.run_sync(self._writable_again)
        if db is None:
            return False
        # The readers too: held the read limiter, so no read is in a thread meanwhile.
        async with self._read_limiter:
            self.read_only = None
            old = [self._db, self._reader, self._thread_reader]
            self._db = db
            self._reader = self._connect()
            self._thread_reader = None
            for connection in old:
                if connection is not None:
                    connection.close()
        return True

    def mark_held(self, last_seq: int) -> bool:
        """Write the marker that says this journal holds messages (store/integrity.py); a
        disk too full to write it keeps the previous one (False)."""
        try:
            write_marker(self.path, last_seq)
        except OSError as exc:
            self._log.warning("journal.marker.unwritten", error=f"{exc.strerror or exc}")
            return False
        return True

    def size_bytes(self) -> int | None:
        try:
            return os.stat(self.path).st_size
        except OSError:
            return None

    def close(self) -> None:
        for connection in (self._reader, self._thread_reader, self._db):
            if connection is not None:
                connection.close()
        self._lock_file.close()
