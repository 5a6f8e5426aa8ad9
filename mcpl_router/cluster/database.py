"""A cluster node's own connection to the journal's database, apart from the daemon's.

The lease statements, the heartbeat and the lookups each have one (a slow lookup never
delays a renewal); each is used from one worker thread at a time and made again when it broke.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

import trio

from mcpl_router.store.backend import Connection
from mcpl_router.store.leases import LEASE_LOCK_TIMEOUT_MS
from mcpl_router.store.postgres_backend import PgConnection, connect

__all__ = ["NodeDatabase"]

_T = TypeVar("_T")

#: What the server lets one of a node's own statements run (leases, heartbeats, lookups).
NODE_STATEMENT_TIMEOUT_MS: Final = 5000


class NodeDatabase:
    """One connection of the node's own, used from one worker thread at a time and made
    again when it broke (the journal's writer and readers are the daemon's, apart)."""

    def __init__(self, dsn: str, password: str | None, purpose: str) -> None:
        self._dsn = dsn
        self._password = password
        self._purpose = purpose
        self._conn: PgConnection | None = None
        self._limiter = trio.CapacityLimiter(1)

    async def run(self, fn: Callable[[Connection], _T]) -> _T:
        def call() -> _T:
            if self._conn is None or self._conn.broken:
                if self._conn is not None:
                    self._conn.close()
                conn = connect(self._dsn, self._password, application_name=f"mcpl-router {self._purpose}")
                # A lease statement behind a lock (a commit under way) fails after this and is
                # tried again at the next poll, rather than waiting without bound.
                conn.execute(f"SET lock_timeout = {LEASE_LOCK_TIMEOUT_MS}")
                # Every statement of a node's own is a row or two (never a journal commit): one
                # the server has not finished after this is cancelled by it, so a relay's hello
                # or a poll waits a bounded while for a database that stalls.
                conn.execute(f"SET statement_timeout = {NODE_STATEMENT_TIMEOUT_MS}")
                self._conn = conn
            return fn(self._conn)

        return await trio.to_thread.run_sync(call, limiter=self._limiter)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
