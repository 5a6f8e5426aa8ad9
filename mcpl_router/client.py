"""A Python client for the daemon's host socket: what hosts, the CLI and the tests use.

    async with RouterClient.connect_unix(path) as client:
        await client.hello("my-host", [{"name": "kai"}])
        async for wake in client.wakes():
            ...  # run the agent
            await client.ack([wake.seq])

Over the WebSocket: ``RouterClient.connect_websocket("ws://127.0.0.1:PORT/", token)``.

Notifications the daemon sends arrive in order on :attr:`RouterClient.notifications`, a bounded
memory channel; :meth:`RouterClient.wakes` yields the ``wake`` ones parsed and keeps the others
for :meth:`RouterClient.next_notification`. When the channel is full the client's read loop
waits (as TCP would); nothing is dropped.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import attrs
import msgspec
import trio
import trio_websocket

from mcpl_router.jsonrpc import METHOD_NOT_FOUND, Inbound, MessageStream, NdjsonStream, Peer, RpcError, WebSocketMessageStream
from mcpl_router.jsonrpc.peer import Deferred

#: Answers one of the daemon's requests (``inference/request``, ``model/info``): params → result.
RequestHandler = Callable[[Any], Awaitable[Any]]

# Above the daemon's wake window (1024 outstanding per connection) plus room for notices, so a
# host awaiting an answer while its wakes wait unread never stops its own read loop.
_NOTIFICATION_BUFFER = 4096


@attrs.frozen
class Notification:
    method: str
    params: Any


@attrs.frozen
class WakeChannel:
    """The channel a wake came from: its ref's two ids and the name the agent is shown."""

    server_id: str
    channel_id: str
    shown: str


@attrs.frozen
class WakeNotice:
    """A parsed ``wake`` notification. ``messages`` for a message wake, ``event`` for a push."""

    seq: int
    agent: str
    reason: str
    channel: WakeChannel | None
    tags: tuple[str, ...]
    addressed: bool
    messages: tuple[Any, ...] = ()
    event: Any = None

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> WakeNotice:
        channel = params.get("channel")
        return cls(
            seq=int(params["seq"]),
            agent=params["agent"],
            reason=params["reason"],
            channel=None
            if channel is None
            else WakeChannel(channel["serverId"], channel["channelId"], channel["shown"]),
            tags=tuple(params.get("tags") or ()),
            addressed=bool(params.get("addressed")),
            messages=tuple(params.get("messages") or ()),
            event=params.get("event"),
        )


class RouterClient:
    """One connection to the daemon. Use :meth:`connect_unix` or :meth:`connect_websocket`."""

    def __init__(
        self,
        peer: Peer,
        notifications: trio.MemoryReceiveChannel[Notification],
        request_handlers: dict[str, RequestHandler] | None = None,
    ) -> None:
        self._peer = peer
        self.notifications = notifications
        self._request_handlers = request_handlers if request_handlers is not None else {}
        # Notifications read past while looking for another kind, kept in arrival order.
        self._held: deque[Notification] = deque()

    @classmethod
    @contextlib.asynccontextmanager
    async def connect_unix(cls, path: str, *, timeout: float = 30.0) -> AsyncIterator[RouterClient]:
        """Connect to the daemon's Unix socket; the connection closes when the block ends."""
        stream = await trio.open_unix_socket(path)
        async with cls._running(NdjsonStream(stream, stream), timeout) as client:
            yield client

    @classmethod
    @contextlib.asynccontextmanager
    async def connect_websocket(
        cls, url: str, token: str | None, *, timeout: float = 30.0
    ) -> AsyncIterator[RouterClient]:
        """Connect to the daemon's WebSocket with a bearer token.

        Raises:
            trio_websocket.ConnectionRejected: the daemon refused the handshake (401: wrong or
                missing token; its ``status_code`` says which HTTP status).
        """
        headers = [] if token is None else [(b"Authorization", f"Bearer {token}".encode())]
        parts = urlsplit(url)
        if parts.scheme != "ws" or parts.hostname is None:
            raise ValueError(f"{url!r} is not a ws:// URL")
        port = parts.port or 80
        resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host_header = parts.hostname if port == 80 else f"{parts.hostname}:{port}"
        # Our own stream, not open_websocket_url: that one leaves the socket of a rejected
        # handshake open. This one is closed on every path.
        stream = await trio.open_tcp_stream(parts.hostname, port)
        failure: Exception | None = None
        try:
            async with trio.open_nursery() as nursery:
                with trio.fail_after(timeout):
                    connection = await trio_websocket.wrap_client_stream(
                        nursery, stream, host_header, resource, extra_headers=headers
                    )
                try:
                    async with cls._running(WebSocketMessageStream(connection), timeout) as client:
                        yield client
                except Exception as exc:
                    failure = exc  # re-raised below, as raised: not inside an exception group
                finally:
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            rejected = group.subgroup((trio_websocket.ConnectionRejected, trio_websocket.HandshakeError))
            if rejected is not None and len(rejected.exceptions) == 1 and not isinstance(rejected.exceptions[0], BaseExceptionGroup):
                raise rejected.exceptions[0] from None
            raise
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()
        if failure is not None:
            raise failure

    @classmethod
    @contextlib.asynccontextmanager
    async def _running(cls, stream: MessageStream, timeout: float) -> AsyncIterator[RouterClient]:
        send, receive = trio.open_memory_channel[Notification](_NOTIFICATION_BUFFER)
        handlers: dict[str, RequestHandler] = {}

        async def on_message(inbound: Inbound) -> Any:
            params = msgspec.json.decode(inbound.params) if inbound.params is not None else None
            if not inbound.is_notification:
                handler = handlers.get(inbound.method)
                if handler is None:
                    raise RpcError(METHOD_NOT_FOUND, f"Method not found: {inbound.method}")
                # Answered in a task of its own: notifications keep flowing while it runs.
                return Deferred(lambda: handler(params))
            await send.send(Notification(inbound.method, params))
            return None

        peer = Peer(stream, on_message, request_timeout=timeout)

        async def run_peer(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            # When the connection ends, iterating notifications (and wakes) ends too.
            async with send:
                await peer.run(task_status=task_status)

        failure: Exception | None = None
        async with trio.open_nursery() as nursery:
            await nursery.start(run_peer)
            try:
                yield cls(peer, receive, handlers)
            except Exception as exc:
                failure = exc  # re-raised below, as raised: not inside an exception group
            finally:
                await peer.aclose("client done")
                nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure

    def answer_requests(self, method: str, handler: RequestHandler) -> None:
        """Answer the daemon's ``method`` requests with ``handler(params)`` (its result, or the
        ``RpcError`` it raises). Without one, such a request is answered -32601.

        For server-initiated inference: ``inference/request`` (stream with
        ``notify("inference/chunk", {"requestId": ..., "chunk": {...}})`` before returning) and
        ``model/info`` (docs/host-api.md).
        """
        self._request_handlers[method] = handler

    async def notify(self, method: str, params: Any = None) -> None:
        """Send a notification (no answer): ``turn/text`` deltas go this way."""
        await self._peer.notify(method, params if params is not None else {})

    async def call(self, method: str, params: Any = None, *, timeout: float | None = None) -> Any:
        """Call a host API method; raises ``RpcError`` with the daemon's error."""
        return await self._peer.request(method, params if params is not None else {}, timeout=timeout)

    async def hello(
        self, host: str, agents: Sequence[Mapping[str, Any] | str], resume_from: int | None = None
    ) -> Any:
        """``session/hello``: claim ``agents`` (AgentSpec objects, or just names)."""
        params: dict[str, Any] = {
            "host": host,
            "agents": [{"name": agent} if isinstance(agent, str) else dict(agent) for agent in agents],
        }
        if resume_from is not None:
            params["resumeFrom"] = resume_from
        return await self.call("session/hello", params)

    async def ack(self, seqs: Sequence[int], *, agent: str | None = None) -> int:
        """``wake/ack``; returns how many deliveries were newly acked."""
        params: dict[str, Any] = {"seqs": list(seqs)}
        if agent is not None:
            params["agent"] = agent
        result = await self.call("wake/ack", params)
        return int(result["acked"])

    async def next_notification(self, method: str | None = None) -> Notification:
        """The next notification (of ``method``, when given); others stay queued in order."""
        for held in self._held:
            if method is None or held.method == method:
                self._held.remove(held)
                return held
        while True:
            notification = await self.notifications.receive()
            if method is None or notification.method == method:
                return notification
            self._held.append(notification)

    async def next_wake(self) -> WakeNotice:
        """The next ``wake`` notification, parsed."""
        notification = await self.next_notification("wake")
        return WakeNotice.from_params(notification.params)

    async def wakes(self) -> AsyncIterator[WakeNotice]:
        """Every ``wake`` notification, in arrival order (until the connection closes)."""
        while True:
            try:
                yield await self.next_wake()
            except trio.EndOfChannel:
                return
