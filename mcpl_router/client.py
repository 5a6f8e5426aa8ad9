"""A Python client for the daemon's host socket: what hosts, the CLI and the tests use.

    async with RouterClient.connect_unix(path) as client:
        status = await client.call("status")

Notifications the daemon sends (``server/state``, ``channels/changed``, …) arrive on
:attr:`RouterClient.notifications`, a bounded memory channel; when it is full the oldest
waiting notification is not dropped — the client's read loop waits, as TCP would.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import attrs
import trio

from mcpl_router.jsonrpc import Inbound, NdjsonStream, Peer


@attrs.frozen
class Notification:
    method: str
    params: Any


class RouterClient:
    def __init__(self, peer: Peer, notifications: trio.MemoryReceiveChannel[Notification]) -> None:
        self._peer = peer
        self.notifications = notifications

    @classmethod
    @contextlib.asynccontextmanager
    async def connect_unix(cls, path: str, *, timeout: float = 30.0) -> AsyncIterator[RouterClient]:
        """Connect to the daemon's Unix socket; the connection closes when the block ends."""
        stream = await trio.open_unix_socket(path)
        send, receive = trio.open_memory_channel[Notification](1024)

        async def on_message(inbound: Inbound) -> None:
            import msgspec

            params = msgspec.json.decode(inbound.params) if inbound.params is not None else None
            await send.send(Notification(inbound.method, params))

        peer = Peer(NdjsonStream(stream, stream), on_message, request_timeout=timeout)
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.run)
            try:
                yield cls(peer, receive)
            finally:
                await peer.aclose("client done")
                nursery.cancel_scope.cancel()

    async def call(self, method: str, params: Any = None, *, timeout: float | None = None) -> Any:
        """Call a host API method; raises ``RpcError`` with the daemon's error."""
        return await self._peer.request(method, params if params is not None else {}, timeout=timeout)
