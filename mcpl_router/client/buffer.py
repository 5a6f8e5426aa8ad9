"""The client's notification buffer: bounded per kind, with counters.

**The policy.** What the daemon sends that is not an answer (``wake``, ``server/state``,
``channels/changed``, traces, notices) waits here until the host reads it. Two kinds, each with
its own bound:

- **Wakes are never dropped.** At most ``max_wakes`` (default 2048) wait. When that is full the
  client's read loop *waits* for the host to take one — backpressure, as TCP's, so nothing is
  lost. The daemon keeps at most 1024 wakes outstanding (sent, not acked) per connection
  (docs/host-api.md, *Delivery and flow control*), so with the default bound a conformant daemon
  never fills it: a host that reads only other notifications, or awaits a long call, never
  stalls its own read loop. Were it to fill (a host sitting on unread wakes past the window),
  the read loop's wait also holds the answers to the host's calls; the daemon, whose writes then
  back up, disconnects the host after ``host.stallTimeout`` and keeps every wake unacked in the
  journal for the next hello.
- **Other notifications are dropped oldest first.** At most ``max_notifications`` (default
  1024) wait. One more drops the oldest non-wake notification, counted (``dropped``, and by
  method in ``dropped_by_method``). They are news (a state change, a trace), each superseded by
  the next, so a host that only reads wakes keeps bounded memory and never blocks the daemon.

Order: :meth:`NotificationBuffer.receive` without a method returns the oldest of everything
held; with a method, the oldest of that method, leaving the others in order.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import AsyncIterator
from typing import Any, Final

import attrs
import trio

__all__ = ["DEFAULT_MAX_NOTIFICATIONS", "DEFAULT_MAX_WAKES", "BufferStatistics", "Notification", "NotificationBuffer"]

#: Twice the daemon's wake window (1024 outstanding per connection).
DEFAULT_MAX_WAKES: Final = 2048
DEFAULT_MAX_NOTIFICATIONS: Final = 1024

WAKE: Final = "wake"


@attrs.frozen
class Notification:
    """A notification the daemon sent: its method and its params (plain JSON values)."""

    method: str
    params: Any


@attrs.frozen
class BufferStatistics:
    """What the buffer holds now and what it has done; ``current_buffer_used`` is both kinds."""

    current_buffer_used: int
    wakes_buffered: int
    notifications_buffered: int
    max_wakes: int
    max_notifications: int
    wakes_received: int
    notifications_received: int
    dropped: int
    dropped_by_method: dict[str, int]
    #: Times the read loop waited for room for a wake (each is backpressure, not a loss).
    wake_waits: int


class NotificationBuffer:
    """Wakes and other notifications, each in arrival order, each bounded (module docstring)."""

    def __init__(self, *, max_wakes: int = DEFAULT_MAX_WAKES, max_notifications: int = DEFAULT_MAX_NOTIFICATIONS) -> None:
        if max_wakes < 1 or max_notifications < 1:
            raise ValueError("buffer bounds must be at least 1")
        self.max_wakes = max_wakes
        self.max_notifications = max_notifications
        # (arrival number, notification): the number orders the two kinds against each other.
        self._wakes: deque[tuple[int, Notification]] = deque()
        self._others: deque[tuple[int, Notification]] = deque()
        self._arrivals = itertools.count()
        self._changed = trio.Event()
        self._closed = False
        self._wakes_received = 0
        self._others_received = 0
        self._dropped: Counter[str] = Counter()
        self._wake_waits = 0

    # -- the read loop's side -------------------------------------------------------------------

    async def put(self, notification: Notification) -> None:
        """Hold ``notification``; for a wake, wait while ``max_wakes`` are held."""
        if notification.method == WAKE:
            while len(self._wakes) >= self.max_wakes and not self._closed:
                self._wake_waits += 1
                await self._wait_change()
            if self._closed:
                return
            self._wakes.append((next(self._arrivals), notification))
            self._wakes_received += 1
        else:
            if self._closed:
                return
            if len(self._others) >= self.max_notifications:
                _, dropped = self._others.popleft()
                self._dropped[dropped.method] += 1
            self._others.append((next(self._arrivals), notification))
            self._others_received += 1
        self._signal()

    def close(self) -> None:
        """The connection ended: what is held can still be read, then readers get EndOfChannel."""
        self._closed = True
        self._signal()

    # -- the host's side ---------------------------------------------------------------------------

    async def receive(self, method: str | None = None) -> Notification:
        """The oldest held notification (of ``method``, when given); waits for one.

        Raises:
            trio.EndOfChannel: the connection ended and nothing (of ``method``) is held.
        """
        while True:
            found = self._take(method)
            if found is not None:
                self._signal()  # room for a wake the read loop may be waiting to put
                return found
            if self._closed:
                raise trio.EndOfChannel
            await self._wait_change()

    def receive_nowait(self, method: str | None = None) -> Notification | None:
        """The oldest held notification (of ``method``), or None when there is none now."""
        found = self._take(method)
        if found is not None:
            self._signal()
        return found

    def __aiter__(self) -> AsyncIterator[Notification]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Notification]:
        while True:
            try:
                yield await self.receive()
            except trio.EndOfChannel:
                return

    def statistics(self) -> BufferStatistics:
        return BufferStatistics(
            current_buffer_used=len(self._wakes) + len(self._others),
            wakes_buffered=len(self._wakes),
            notifications_buffered=len(self._others),
            max_wakes=self.max_wakes,
            max_notifications=self.max_notifications,
            wakes_received=self._wakes_received,
            notifications_received=self._others_received,
            dropped=sum(self._dropped.values()),
            dropped_by_method=dict(self._dropped),
            wake_waits=self._wake_waits,
        )

    # -- inside ------------------------------------------------------------------------------------

    def _take(self, method: str | None) -> Notification | None:
        if method == WAKE:
            return self._wakes.popleft()[1] if self._wakes else None
        if method is None:
            if self._wakes and (not self._others or self._wakes[0][0] < self._others[0][0]):
                return self._wakes.popleft()[1]
            return self._others.popleft()[1] if self._others else None
        for index, (_, held) in enumerate(self._others):
            if held.method == method:
                del self._others[index]
                return held
        return None

    def _signal(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _wait_change(self) -> None:
        await self._changed.wait()
