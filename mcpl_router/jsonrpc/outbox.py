"""The outbox: every message a peer sends, queued (bounded) and written by one writer task.

Senders (:meth:`~mcpl_router.jsonrpc.peer.Peer.request`, ``notify``, the answers to the other
side's requests) queue encoded messages here; one writer task drains them, joining what is
queued into as few writes as the framing allows (at most :data:`_WRITE_BATCH_BYTES` a write). A
full outbox makes senders wait, never drops: each wait ends when the writer moves a batch out,
so only a peer that takes nothing for the whole ``stall_timeout`` (the outbox full and no write
making progress) is disconnected (``jsonrpc.peer.stalled``). A slow reader that keeps reading
never trips it: the timeout covers each piece of a write, not the whole write.

Apart from the read side and the Peer because this is the one place bytes leave, with its own
bounds, task and failure (:class:`PeerClosed` for a sender on a closed connection); the Peer's
lifecycle only closes it and flushes it at a graceful close. The state it uses is the Peer's.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

import trio

from mcpl_router.logs import Logger
from mcpl_router.jsonrpc.framing import MessageStream
from mcpl_router.jsonrpc.limits import PeerLimits

__all__ = ["PeerClosed", "PeerOutbox"]

# The most one write joins: big enough that a burst is a handful of syscalls, small enough
# that the bytes held outside the outbox while a write blocks stay bounded.
_WRITE_BATCH_BYTES = 256 * 1024


class PeerClosed(Exception):
    """The connection closed before (or while) a request could be answered."""


class PeerOutbox:
    """The outbox and its writer task; a part of :class:`~mcpl_router.jsonrpc.peer.Peer`."""

    # The Peer's, set when it is made.
    limits: PeerLimits
    _stream: MessageStream
    _log: Logger
    _closed: bool
    _close_reason: str
    _counts: dict[str, int]
    _outbox: deque[bytes]
    _outbox_bytes: int
    #: Bytes taken by the write under way (out of the outbox, not yet written).
    _writing_bytes: int
    #: Set when a message is queued (the writer waits on it while the outbox is empty).
    _outbox_ready: trio.Event
    #: Set when the writer moves a batch out or a write ends (senders wait on it for room).
    _outbox_room: trio.Event
    _writer_done: bool

    if TYPE_CHECKING:

        async def aclose(self, reason: str = ..., *, flush: bool = ...) -> None: ...

        def _mark_closed(self, reason: str) -> None: ...

    def _has_room(self, size: int) -> bool:
        limits = self.limits
        if not self._outbox:
            return True  # one message, however large, always goes (the framing bounds it)
        return len(self._outbox) < limits.outbox_messages and self._outbox_bytes + size <= limits.outbox_bytes

    async def _enqueue(self, data: bytes) -> None:
        """Queue one encoded message for the writer, waiting (bounded) while the outbox is full."""
        # A cancelled sender raises here, before the message is queued: it never leaves behind
        # a message it believes unsent. Not a scheduling point while there is room: a turn
        # sends a dozen messages, and a yield for each was a tenth of its cost; a sender that
        # keeps sending fills the bounded outbox and waits below.
        await trio.lowlevel.checkpoint_if_cancelled()
        if not self._has_room(len(data)) and not self._closed:
            self._counts["outbox_waits"] += 1
            while not self._closed and not self._has_room(len(data)):
                # Each wait ends when the writer moves a batch out: only a peer that takes
                # nothing for the whole stall timeout counts as not reading.
                with trio.move_on_after(self.limits.stall_timeout) as scope:
                    await self._outbox_room.wait()
                if scope.cancelled_caught:
                    await self._stall(f"not reading: nothing it was sent went out for {self.limits.stall_timeout:g}s")
                    break
        if self._closed:
            raise PeerClosed(self._close_reason)
        self._queue(data)

    def _queue(self, data: bytes) -> None:
        self._outbox.append(data)
        self._outbox_bytes += len(data)
        self._outbox_ready.set()

    def _note_high_water(self) -> None:
        """The most the outbox held with the write under way (``outbox_high_water_bytes``).

        Read where that total is about to fall (a write ends, the outbox is dropped) and when
        asked: it only grows as messages are queued, so its peaks are there, and a message
        queued costs no comparison of its own."""
        total = self._outbox_bytes + self._writing_bytes
        if total > self._counts["outbox_high_water_bytes"]:
            self._counts["outbox_high_water_bytes"] = total

    def _enqueue_nowait(self, data: bytes) -> bool:
        """Queue one encoded message if there is room now (False: there isn't; nothing queued).

        For answers pushed from a commit on the trio thread: no task waits on them, so none
        is cancelled; a full outbox sends the caller back to :meth:`_enqueue` in a task.
        """
        if self._closed:
            raise PeerClosed(self._close_reason)
        if not self._has_room(len(data)):
            return False
        self._queue(data)
        return True

    async def _write_loop(self) -> None:
        try:
            await self._write_forever()
        finally:
            self._writer_done = True

    async def _write_forever(self) -> None:
        stall = self.limits.stall_timeout
        # One watchdog for the writer's life, not a scope per write: its deadline is the stall
        # timeout from the last progress while a write is under way, and never while idle.
        with trio.CancelScope() as watchdog:

            def progress() -> None:
                watchdog.deadline = trio.current_time() + stall

            while True:
                while not self._outbox:
                    if self._closed:
                        return
                    self._outbox_ready = trio.Event()
                    await self._outbox_ready.wait()
                if self._closed:
                    return
                batch: list[bytes]
                if self._outbox_bytes <= _WRITE_BATCH_BYTES:
                    # All of it in one write (the usual case): taken whole, not message by message.
                    batch, size = list(self._outbox), self._outbox_bytes
                    self._outbox.clear()
                else:
                    batch, size = [], 0
                    while self._outbox and (not batch or size + len(self._outbox[0]) <= _WRITE_BATCH_BYTES):
                        data = self._outbox.popleft()
                        batch.append(data)
                        size += len(data)
                self._outbox_bytes -= size
                self._writing_bytes = size
                self._outbox_room.set()
                self._outbox_room = trio.Event()
                progress()
                try:
                    await self._stream.send_messages(batch, progress=progress)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    self._note_high_water()
                    self._writing_bytes = 0
                    self._writer_done = True
                    self._mark_closed(f"connection closed while sending: {exc}")
                    return
                watchdog.deadline = math.inf
                self._note_high_water()
                self._writing_bytes = 0
                self._outbox_room.set()
                self._outbox_room = trio.Event()
        if watchdog.cancelled_caught:
            with trio.CancelScope(shield=True):
                await self._stall(f"not reading: a write made no progress for {stall:g}s")
            self._note_high_water()
            self._writing_bytes = 0

    async def _stall(self, reason: str) -> None:
        if self._closed:
            return
        self._counts["stalled"] = 1
        self._log.error(
            "jsonrpc.peer.stalled",
            reason=reason,
            queued_messages=len(self._outbox),
            queued_bytes=self._outbox_bytes + self._writing_bytes,
        )
        await self.aclose(f"disconnected: {reason}", flush=False)
