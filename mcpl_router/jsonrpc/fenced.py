"""A message stream that asks before each write whether this process may still send.

A cluster node sends to a server only while it holds the links' lease (store/leases.py). The
lease is checked in the last place before bytes leave, each batch of the writer task: a node
stopped (SIGSTOP, a long pause) past its lease and resumed finds it run out there, and what it
had queued is never written. The stream breaks instead (the link sees a closed connection, and
its pending requests fail with the reason): nothing is dropped silently.

The window that remains is a pause between this check and the write's system call: microseconds
of a batch, against a lease whose local deadline ends a margin before the database's
(docs/cluster.md, the failure windows).
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from mcpl_router.jsonrpc.framing import MessageStream

__all__ = ["FencedStream"]


class FencedStream:
    """``inner``, with ``refusal()`` asked before each write: a reason (not None) breaks it."""

    def __init__(self, inner: MessageStream, refusal: Callable[[], str | None]) -> None:
        self._inner = inner
        self._refusal = refusal
        self.line_oriented = inner.line_oriented
        #: Writes refused (the lease was gone when they were due).
        self.refused = 0

    def _check(self) -> None:
        reason = self._refusal()
        if reason is not None:
            self.refused += 1
            raise trio.BrokenResourceError(f"not sent: {reason}")

    async def send_message(self, data: bytes) -> None:
        self._check()
        await self._inner.send_message(data)

    async def send_messages(self, messages: list[bytes], *, progress: Callable[[], None] | None = None) -> None:
        self._check()
        await self._inner.send_messages(messages, progress=progress)

    async def receive_message(self) -> bytes:
        return await self._inner.receive_message()

    async def aclose(self) -> None:
        await self._inner.aclose()
