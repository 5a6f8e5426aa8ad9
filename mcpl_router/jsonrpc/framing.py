"""Message framing over trio streams: newline-delimited JSON, and one message per WebSocket frame.

A :class:`MessageStream` moves whole messages (bytes). It knows nothing of JSON-RPC; the
:class:`~mcpl_router.jsonrpc.peer.Peer` decides what a message means.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import trio
import trio_websocket

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
_READ_CHUNK = 65536
# Writes go out at most this much at a time, each piece with the stall deadline of its own.
_WRITE_CHUNK = 65536


class OversizedMessage(Exception):
    """A message larger than the stream's limit arrived; it was discarded, the stream goes on."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"message of at least {size} bytes exceeds the {limit}-byte limit")
        self.size = size
        self.limit = limit


class MessageStream(Protocol):
    #: True where a message is a text line that real servers also use for log output (stdio,
    #: TCP): a line that doesn't start like JSON is a log line to skip, not a parse error.
    line_oriented: bool

    async def send_message(self, data: bytes) -> None: ...

    async def send_messages(self, messages: list[bytes], *, progress: Callable[[], None] | None = None) -> None:
        """Send several messages in order, in as few writes as the framing allows.

        ``progress`` is called each time a piece of at most 64 KiB has gone out: the caller's
        stall deadline measures progress, not the whole write (a slow reader that keeps
        reading never trips it).
        """
        ...

    async def receive_message(self) -> bytes:
        """The next message; raises :class:`trio.EndOfChannel` at EOF, :class:`OversizedMessage`."""
        ...

    async def aclose(self) -> None: ...


class NdjsonStream:
    """Newline-delimited JSON over a byte stream (a process's pipes, a TCP socket).

    Blank lines are skipped. A line longer than ``max_message_bytes`` is discarded as it streams
    in (memory stays bounded) and reported once as :class:`OversizedMessage`.
    """

    def __init__(
        self,
        send_stream: trio.abc.SendStream | None,
        receive_stream: trio.abc.ReceiveStream,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        skip_log_lines: bool = True,
        on_buffered: Callable[[int], None] | None = None,
    ) -> None:
        # Servers print log lines on stdout; hosts have no such excuse, so a host connection
        # turns this off and every non-JSON line is answered -32700.
        self.line_oriented = skip_log_lines
        self._send_stream = send_stream
        self._receive_stream = receive_stream
        self._max = max_message_bytes
        self._buffer = bytearray()
        self._discarding = False
        self._discarded = 0
        self._eof = False
        # Told how the bytes held for unfinished messages change (a budget across connections).
        self._on_buffered = on_buffered
        self._held = 0
        #: When the bytes of an unfinished message started to wait for their newline (trio
        #: time), or None when none waits: what a partial-message deadline reads.
        self.partial_since: float | None = None
        #: When anything last arrived (trio time).
        self.last_received = trio.current_time()

    def _holding(self) -> None:
        held = len(self._buffer)
        if self._on_buffered is not None and held != self._held:
            self._on_buffered(held - self._held)
        self._held = held
        if not held and not self._discarding:
            self.partial_since = None
        elif self.partial_since is None:
            self.partial_since = trio.current_time()

    async def send_message(self, data: bytes) -> None:
        if self._send_stream is None:
            raise trio.ClosedResourceError("this stream is receive-only")
        await self._send_stream.send_all(data + b"\n")

    async def send_messages(self, messages: list[bytes], *, progress: Callable[[], None] | None = None) -> None:
        if self._send_stream is None:
            raise trio.ClosedResourceError("this stream is receive-only")
        # Joined: a burst of small messages costs one syscall, not one each. Written in pieces,
        # each reported, so the caller's stall deadline measures progress, not the total.
        data = b"\n".join(messages) + b"\n"
        if len(data) <= _WRITE_CHUNK:
            await self._send_stream.send_all(data)
        else:
            view = memoryview(data)
            for start in range(0, len(view), _WRITE_CHUNK):
                await self._send_stream.send_all(view[start : start + _WRITE_CHUNK])
                if progress is not None:
                    progress()

    def message_buffered(self) -> bool:
        """True when a whole line is already here: :meth:`receive_message` returns it (or
        raises for it) without waiting for the peer. A relay batches what came in one read."""
        return not self._discarding and b"\n" in self._buffer

    async def receive_message(self) -> bytes:
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                if not self._buffer and len(line) > _READ_CHUNK:
                    # A large message is done: its capacity goes back, not kept per connection.
                    self._buffer = bytearray()
                self._holding()
                if self._discarding:
                    size = self._discarded + len(line)
                    self._discarding = False
                    self._discarded = 0
                    raise OversizedMessage(size, self._max)
                line = line.rstrip(b"\r")
                if len(line) > self._max:
                    raise OversizedMessage(len(line), self._max)
                if line.strip():
                    return line
                continue
            if len(self._buffer) > self._max:
                # Too long and still no newline: drop what we hold and keep dropping to the
                # newline, so one runaway message can't grow memory without bound.
                self._discarding = True
                self._discarded += len(self._buffer)
                self._buffer = bytearray()
                self._holding()
            if self._eof:
                if self._buffer.strip():
                    line = bytes(self._buffer).rstrip(b"\r")
                    self._buffer.clear()
                    return line
                raise trio.EndOfChannel
            chunk = await self._receive_stream.receive_some(_READ_CHUNK)
            self.last_received = trio.current_time()
            if not chunk:
                self._eof = True
                continue
            if self._discarding:
                newline = chunk.find(b"\n")
                if newline < 0:
                    self._discarded += len(chunk)
                    continue
                self._discarded += newline
                chunk = b"\n" + chunk[newline + 1 :]
                # The leading newline ends the discarded line; the branch above reports it.
            self._buffer += chunk
            self._holding()

    async def aclose(self) -> None:
        if self._held and self._on_buffered is not None:
            self._on_buffered(-self._held)
            self._held = 0
        self._buffer = bytearray()
        with trio.CancelScope(shield=True):
            if self._send_stream is not None:
                await self._send_stream.aclose()
            await self._receive_stream.aclose()


class WebSocketMessageStream:
    """One JSON-RPC message per WebSocket text frame (no newline).

    An oversized frame is refused by trio-websocket itself (close code 1009) before it is
    buffered: WebSocket has no way to skip one message and stay open, so the link reconnects.
    """

    line_oriented = False

    def __init__(self, connection: trio_websocket.WebSocketConnection) -> None:
        self._connection = connection
        #: A frame is whole or not there: no unfinished message is held here (trio-websocket
        #: bounds a frame by its max_message_size).
        self.partial_since: float | None = None
        #: When a message last arrived (trio time).
        self.last_received = trio.current_time()

    async def send_message(self, data: bytes) -> None:
        try:
            await self._connection.send_message(data.decode())
        except trio_websocket.ConnectionClosed as exc:
            raise trio.ClosedResourceError(f"websocket closed: {exc.reason}") from exc

    async def send_messages(self, messages: list[bytes], *, progress: Callable[[], None] | None = None) -> None:
        # WebSocket carries one message per frame: nothing to join, and a frame can't be split,
        # so progress is reported per frame (a frame of many pieces counts them all).
        for data in messages:
            await self.send_message(data)
            if progress is not None:
                for _ in range(1 + len(data) // _WRITE_CHUNK):
                    progress()

    async def receive_message(self) -> bytes:
        try:
            message = await self._connection.get_message()
        except trio_websocket.ConnectionClosed as exc:
            raise trio.EndOfChannel from exc
        self.last_received = trio.current_time()
        return message.encode() if isinstance(message, str) else message

    async def aclose(self) -> None:
        # The close handshake waits for the peer's reply, read by a task that may already be
        # cancelled: bound it, or a shielded close could wait for trio-websocket's 60 s.
        with trio.CancelScope(shield=True, deadline=trio.current_time() + 1.0):
            await self._connection.aclose()
