"""HostConnection: one host's live connection to the daemon (Unix socket or WebSocket)."""

from __future__ import annotations

import itertools
import time

import attrs

from mcpl_router.jsonrpc import Peer, PeerClosed
from mcpl_router.logs import get_logger

_connection_ids = itertools.count(1)


@attrs.define(eq=False)
class HostSession:
    """What ``session/hello`` made of a connection: the host's name and the agents it owns."""

    host: str
    agents: set[str] = attrs.field(factory=set)


@attrs.define(eq=False)
class HostConnection:
    """A connection's identity and its way to send notifications to the host.

    ``session`` is set by ``session/hello`` (see :mod:`mcpl_router.hosts.sessions`).
    """

    transport: str
    id: int = attrs.field(factory=lambda: next(_connection_ids))
    peer: Peer | None = None
    session: HostSession | None = None
    #: Wall-clock time the connection was accepted.
    opened_at: float = attrs.field(factory=time.time)

    async def notify(self, method: str, params: object) -> bool:
        """Send a notification; False when the connection is gone (the caller keeps it pending)."""
        if self.peer is None or self.peer.closed:
            return False
        try:
            await self.peer.notify(method, params)
        except PeerClosed:
            get_logger(connection=self.id).info("host.notify.undeliverable", method=method)
            return False
        return True

    def notify_nowait(self, method: str, params: object) -> bool | None:
        """Queue a notification without waiting: True queued, False the connection is gone,
        None no room now (the caller waits with :meth:`notify`)."""
        if self.peer is None or self.peer.closed:
            return False
        try:
            return True if self.peer.notify_nowait(method, params) else None
        except PeerClosed:
            get_logger(connection=self.id).info("host.notify.undeliverable", method=method)
            return False
