"""What a crowd of host connections may cost, and what happens past it.

Bounds (``[host]``; docs/reliability.md's limits table):

- ``maxConnections`` per listener (the Unix socket, the WebSocket): one more is refused at once
  (a JSON-RPC error line on the Unix socket, HTTP 503 on the WebSocket), counted, and logged at
  most once a second; the connected are served on.
- ``maxBufferedBytes``: the bytes of unfinished messages held across all host connections. Over
  it, new connections are refused the same way; the connected finish their messages (each is
  bounded by the message size anyway).
- ``partialMessageTimeout``: a connection that holds part of a message this long without
  finishing it is closed (a slow-loris); ``helloTimeout``: one that has not said
  ``session/hello`` and sends nothing this long is closed. Both logged and counted.
- Out of file descriptors (EMFILE, ENFILE) on accept: one structured line a second at most,
  ``out of file descriptors: N open, limit M``, a counter, and a short pause before the next
  accept, instead of trio's traceback per attempt.
"""

from __future__ import annotations

import collections
import enum
import errno
import os
import resource
from typing import TYPE_CHECKING, Final

import trio

from mcpl_router.logs import get_logger

if TYPE_CHECKING:
    from mcpl_router.config.model import HostConfig

__all__ = ["HostAdmission", "PatientListener", "descriptor_use"]

#: Accept errors that say the process (or the system) is out of a resource, not that the
#: listener is broken: waited out, not raised.
_CAPACITY_ERRNOS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: The longest pause between accepts while out of descriptors (seconds).
_MAX_PAUSE: Final = 1.0
#: At most one log line of each kind per this many seconds.
_LOG_EVERY: Final = 1.0


class ConnectionRefusal(enum.StrEnum):
    """Why a host connection was refused at accept: the ``reason`` the host is told, and the
    label of the counter and the log line."""

    TOO_MANY = "too-many-connections"
    OVER_BUDGET = "buffered-bytes-over-budget"


class ConnectionTimeout(enum.StrEnum):
    """Why a host connection was closed for a deadline (the counter's label, the close's words)."""

    PARTIAL_MESSAGE = "partial-message-timeout"
    NO_HELLO = "no-hello"


def descriptor_use() -> tuple[int, int]:
    """(descriptors open now, the soft limit)."""
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = -1
    return open_now, resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class HostAdmission:
    """The host listeners' shared bounds and counters (one per daemon)."""

    def __init__(self, config: HostConfig) -> None:
        self.max_connections = config.max_connections
        self.max_buffered_bytes = config.max_buffered_bytes
        self.partial_message_timeout = config.partial_message_timeout
        self.hello_timeout = config.hello_timeout
        self._open: collections.Counter[str] = collections.Counter()
        #: Bytes of unfinished messages held across every host connection now.
        self.buffered = 0
        #: Connections refused or closed, by reason (``mcpl_router_host_connections_refused_total``,
        #: ``…_closed_total``); accepts paused for lack of descriptors.
        self.refused: collections.Counter[ConnectionRefusal] = collections.Counter()
        self.closed: collections.Counter[ConnectionTimeout] = collections.Counter()
        self.descriptor_pauses = 0
        self._streak = 0  # pauses since the last accept that worked: the backoff's exponent
        self._last_logged: dict[str, float] = {}
        self._log = get_logger()

    def admit(self, listener: str) -> ConnectionRefusal | None:
        """Take a slot on ``listener``; None when taken, else the refusal's reason (counted,
        logged at most once a second)."""
        reason: ConnectionRefusal | None = None
        if self._open[listener] >= self.max_connections:
            reason = ConnectionRefusal.TOO_MANY
        elif self.buffered >= self.max_buffered_bytes:
            reason = ConnectionRefusal.OVER_BUDGET
        if reason is None:
            self._open[listener] += 1
            return None
        self.refused[reason] += 1
        self._log_limited(
            f"refused-{reason}", "host.connection.refused", listener=listener, reason=reason,
            open=self._open[listener], max_connections=self.max_connections,
            buffered_bytes=self.buffered, max_buffered_bytes=self.max_buffered_bytes,
            refused=self.refused[reason],
        )
        return reason

    def release(self, listener: str) -> None:
        self._open[listener] -= 1

    def buffered_changed(self, delta: int) -> None:
        self.buffered += delta

    def closing(self, reason: ConnectionTimeout, **fields: object) -> None:
        """A connection closed for ``reason`` (a deadline): counted and logged."""
        self.closed[reason] += 1
        self._log.warning("host.connection.closed", reason=reason, **fields)

    def out_of_descriptors(self, exc: OSError) -> float:
        """An accept failed for lack of descriptors: counted, said once a second; how long to
        pause before the next accept."""
        self.descriptor_pauses += 1
        self._streak += 1
        open_now, limit = descriptor_use()
        self._log_limited(
            "descriptors", "host.accept.out_of_descriptors",
            error=f"out of file descriptors: {open_now} open, limit {limit}",
            errno=errno.errorcode.get(exc.errno or 0, str(exc.errno)), pauses=self.descriptor_pauses,
        )
        return float(min(_MAX_PAUSE, 0.05 * 2 ** min(self._streak, 5)))

    def accepted(self) -> None:
        """An accept worked: a lack of descriptors, if there was one, is over."""
        self._streak = 0

    def statistics(self) -> dict[str, object]:
        return {
            "open": dict(self._open),
            "bufferedBytes": self.buffered,
            "refused": {reason.value: count for reason, count in self.refused.items()},
            "closed": {reason.value: count for reason, count in self.closed.items()},
            "descriptorPauses": self.descriptor_pauses,
        }

    def _log_limited(self, key: str, event: str, **fields: object) -> None:
        now = trio.current_time()
        if now - self._last_logged.get(key, -_LOG_EVERY) >= _LOG_EVERY:
            self._last_logged[key] = now
            self._log.warning(event, **fields)


class PatientListener(trio.abc.Listener[trio.SocketStream]):
    """A socket listener whose ``accept`` waits out a lack of descriptors (counted and logged
    by ``admission``) instead of raising it, so ``trio.serve_listeners`` never logs a traceback
    per attempt."""

    def __init__(self, inner: trio.SocketListener, admission: HostAdmission) -> None:
        self._inner = inner
        self._admission = admission
        self.socket = inner.socket

    async def accept(self) -> trio.SocketStream:
        while True:
            try:
                stream = await self._inner.accept()
            except OSError as exc:
                if exc.errno not in _CAPACITY_ERRNOS:
                    raise
                await trio.sleep(self._admission.out_of_descriptors(exc))
                continue
            self._admission.accepted()
            return stream

    async def aclose(self) -> None:
        await self._inner.aclose()
