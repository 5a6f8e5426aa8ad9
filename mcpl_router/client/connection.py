"""The connection: :class:`RouterClient`, one JSON-RPC connection to the daemon's host socket.

    async with RouterClient.connect_default() as client:      # or connect_unix / connect_websocket
        await client.hello("my-host", ["kai"])
        async for wake in client.wakes():
            async with client.turn(wake.agent, wakes=[wake.seq]) as turn:
                await turn.text("hello")
            await client.ack([wake.seq])

Every documented method has a typed call (results in :mod:`mcpl_router.client.results`);
:meth:`RouterClient.call` stays the untyped escape hatch (plain JSON values). Notifications wait
in a bounded :class:`~mcpl_router.client.buffer.NotificationBuffer` (its docstring is the
policy); daemon→host requests are answered by the handlers of
:mod:`mcpl_router.client.serving`.
"""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import msgspec
import trio

from mcpl_router.client.acks import AckBatcher
from mcpl_router.client.buffer import (
    DEFAULT_MAX_NOTIFICATIONS,
    DEFAULT_MAX_WAKES,
    BufferStatistics,
    Notification,
    NotificationBuffer,
)
from mcpl_router.client.results import (
    AckResult,
    ChannelRef,
    ChannelRow,
    ChannelsPage,
    Explanation,
    ReloadResult,
    HelloResult,
    PublishResult,
    ServersList,
    Status,
    TurnOpened,
    TypingResult,
)
from mcpl_router.client.serving import (
    INFERENCE_CANCEL,
    SERVED_METHODS,
    ForkSpawnHandler,
    HostRequests,
    InferenceHandler,
    ModelInfoHandler,
)
from mcpl_router.client.transport import open_unix_stream, open_websocket_stream
from mcpl_router.client.turn import Turn, turn_block
from mcpl_router.client.wakes import WakeNotice
from mcpl_router.config.paths import default_unix_socket_path
from mcpl_router.jsonrpc import Inbound, MessageStream, Peer

__all__ = ["ClientStatistics", "RouterClient"]

T = TypeVar("T")

#: A channel as the host API takes one: a name, or an exact ``{serverId, channelId}`` ref.
ChannelArg = str | ChannelRef | Mapping[str, str]


@attrs.frozen
class ClientStatistics:
    """The notification buffer's counters and the daemon→host requests answered."""

    notifications: BufferStatistics
    #: Daemon→host requests answered by a handler / failed in one / answered -32601, by method.
    requests_served: dict[str, int]
    requests_failed: dict[str, int]
    requests_unhandled: dict[str, int]
    chunks_sent: int
    #: Inferences the daemon gave up on (``inference/cancel``), their handlers cancelled.
    requests_cancelled: int = 0
    #: ``ack()`` calls, and the ``wake/ack`` requests that carried them (acks issued while one
    #: is in flight share the next).
    acks: int = 0
    ack_requests: int = 0


def _channel_param(channel: ChannelArg) -> str | dict[str, str]:
    if isinstance(channel, str):
        return channel
    if isinstance(channel, ChannelRef):
        return {"serverId": channel.server_id, "channelId": channel.channel_id}
    return {"serverId": channel["serverId"], "channelId": channel["channelId"]}


class RouterClient:
    """One connection to the daemon. Open it with :meth:`connect_unix`,
    :meth:`connect_default` or :meth:`connect_websocket`; it closes when the block ends."""

    def __init__(
        self,
        peer: Peer,
        notifications: NotificationBuffer,
        requests: HostRequests,
        ended: trio.Event | None = None,
        stream: MessageStream | None = None,
    ) -> None:
        self._peer = peer
        # What says when anything last arrived (both transports stamp it on every read).
        self._stream = stream
        # Set once the connection has ended (read loop done): what a failover waits on.
        self._ended = ended if ended is not None else trio.Event()
        #: Every notification not read yet, bounded per kind (see the buffer's policy).
        self.notifications = notifications
        self._requests = requests
        self._acks = AckBatcher(self._send_ack)

    # -- connecting ------------------------------------------------------------------------------

    @classmethod
    @contextlib.asynccontextmanager
    async def connect_unix(
        cls,
        path: str | Path,
        *,
        timeout: float = 30.0,
        max_wakes: int = DEFAULT_MAX_WAKES,
        max_notifications: int = DEFAULT_MAX_NOTIFICATIONS,
    ) -> AsyncIterator[RouterClient]:
        """Connect to the daemon's Unix socket at ``path``."""
        async with open_unix_stream(path) as stream:
            async with cls._running(stream, timeout, max_wakes, max_notifications) as client:
                yield client

    @classmethod
    @contextlib.asynccontextmanager
    async def connect_default(
        cls,
        *,
        environ: Mapping[str, str] | None = None,
        timeout: float = 30.0,
        max_wakes: int = DEFAULT_MAX_WAKES,
        max_notifications: int = DEFAULT_MAX_NOTIFICATIONS,
    ) -> AsyncIterator[RouterClient]:
        """Connect to the Unix socket a daemon with no ``host.unixSocket`` setting listens on:
        ``$XDG_RUNTIME_DIR/mcpl-router-<uid>/host.sock`` (``/tmp`` without that variable)."""
        path = cls.default_socket_path(environ)
        async with cls.connect_unix(path, timeout=timeout, max_wakes=max_wakes, max_notifications=max_notifications) as client:
            yield client

    @staticmethod
    def default_socket_path(environ: Mapping[str, str] | None = None) -> Path:
        """Where the daemon's host socket is by default (``environ``: ours unless given)."""
        return default_unix_socket_path(os.environ if environ is None else environ)

    @classmethod
    @contextlib.asynccontextmanager
    async def connect_websocket(
        cls,
        url: str,
        token: str | None,
        *,
        timeout: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
        ca_file: str | Path | None = None,
        max_wakes: int = DEFAULT_MAX_WAKES,
        max_notifications: int = DEFAULT_MAX_NOTIFICATIONS,
    ) -> AsyncIterator[RouterClient]:
        """Connect to the daemon's WebSocket (``ws://`` or ``wss://``) with a bearer token.

        ``wss://`` verifies the certificate (system CAs, or ``ca_file``; or your ``ssl_context``).

        Raises:
            trio_websocket.ConnectionRejected: the daemon refused the handshake (401: wrong or
                missing token; its ``status_code`` says which HTTP status).
            ssl.SSLCertVerificationError: the daemon's certificate did not verify.
        """
        async with open_websocket_stream(url, token, timeout=timeout, ssl_context=ssl_context, ca_file=ca_file) as stream:
            async with cls._running(stream, timeout, max_wakes, max_notifications) as client:
                yield client

    @classmethod
    @contextlib.asynccontextmanager
    async def connect_stream(
        cls,
        stream: MessageStream,
        *,
        timeout: float = 30.0,
        max_wakes: int = DEFAULT_MAX_WAKES,
        max_notifications: int = DEFAULT_MAX_NOTIFICATIONS,
    ) -> AsyncIterator[RouterClient]:
        """Run the client over a framed stream you opened (a test's memory stream, a tunnel)."""
        async with cls._running(stream, timeout, max_wakes, max_notifications) as client:
            yield client

    @classmethod
    @contextlib.asynccontextmanager
    async def _running(cls, stream: MessageStream, timeout: float, max_wakes: int, max_notifications: int) -> AsyncIterator[RouterClient]:
        buffer = NotificationBuffer(max_wakes=max_wakes, max_notifications=max_notifications)
        # ``peer`` is made below; a chunk is only ever sent once it runs.
        requests = HostRequests(lambda method, params: peer.notify(method, params))

        async def on_message(inbound: Inbound) -> Any:
            if not inbound.is_notification:
                return await requests(inbound)
            params = msgspec.json.decode(inbound.params) if inbound.params is not None else None
            if inbound.method == INFERENCE_CANCEL:
                requests.cancel(params)  # stops the handler; nothing for the host's reader
                return None
            await buffer.put(Notification(inbound.method, params))
            return None

        # Served requests run in their own tasks: a long inference never holds the wakes.
        peer = Peer(stream, on_message, request_timeout=timeout, concurrent_methods=SERVED_METHODS)

        async def run_peer(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            # When the connection ends, reading notifications (and wakes) ends too.
            try:
                await peer.run(task_status=task_status)
            finally:
                buffer.close()
                ended.set()

        ended = trio.Event()
        failure: Exception | None = None
        async with trio.open_nursery() as nursery:
            await nursery.start(run_peer)
            try:
                yield cls(peer, buffer, requests, ended, stream)
            except Exception as exc:
                failure = exc  # re-raised below, as raised: not inside an exception group
            finally:
                await peer.aclose("client done")
                nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure

    @property
    def is_closed(self) -> bool:
        """Whether the connection has ended (the daemon closed it, or it broke)."""
        return self._ended.is_set()

    async def wait_closed(self) -> None:
        """Until the connection has ended (the daemon closed it, or it broke)."""
        await self._ended.wait()

    async def aclose(self, reason: str = "closed by the host") -> None:
        """Close the connection now, without waiting for what is queued to go out: every call
        waiting for an answer raises ``PeerClosed(reason)``, and reading wakes ends. For a
        daemon that stopped answering (:class:`FailoverClient` then moves to the next node)."""
        await self._peer.aclose(reason, flush=False)

    @property
    def last_received(self) -> float | None:
        """When anything (an answer, a wake, any notification, part of one) last arrived from
        the daemon, on the trio clock; None for a stream that doesn't say (``connect_stream``'s)."""
        stamp = getattr(self._stream, "last_received", None)
        return stamp if isinstance(stamp, float) else None

    # -- calls -----------------------------------------------------------------------------------

    async def notify(self, method: str, params: Any = None) -> None:
        """Send a notification (no answer): ``turn/text`` deltas go this way."""
        await self._peer.notify(method, params if params is not None else {})

    async def call(self, method: str, params: Any = None, *, timeout: float | None = None) -> Any:
        """Call a host API method; the result as plain JSON values (the untyped escape hatch).

        Raises:
            RpcError: the daemon's error answer (``code``, ``message``, ``data``).
        """
        return await self._peer.request(method, params if params is not None else {}, timeout=timeout)

    async def request(self, method: str, params: Any, result_type: type[T], *, timeout: float | None = None) -> T:
        """Call ``method`` and decode its result into ``result_type`` (a Struct of ``results``).

        Raises:
            RpcError: the daemon's error answer, or a result that doesn't fit (-32602).
        """
        result: T = await self._peer.request(method, params, timeout=timeout, result_type=result_type)
        return result

    # -- sessions and wakes ----------------------------------------------------------------------

    async def hello(self, host: str, agents: Sequence[Mapping[str, Any] | str], resume_from: int | None = None) -> HelloResult:
        """``session/hello``: claim ``agents`` (AgentSpec objects, or just names).

        With handlers registered (:meth:`serve_inference`, :meth:`serve_model_info`) the hello
        declares ``serves: {inference: [...], modelInfo: [...]}`` for these agents, so the daemon
        forwards their servers' requests here (docs/host-api.md).
        """
        specs = [{"name": agent} if isinstance(agent, str) else dict(agent) for agent in agents]
        params: dict[str, object] = {"host": host, "agents": specs}
        if resume_from is not None:
            params["resumeFrom"] = resume_from
        serves = self._requests.serves_for([str(spec["name"]) for spec in specs])
        if serves:
            params["serves"] = serves
        return await self.request("session/hello", params, HelloResult)

    async def ack(self, seqs: Sequence[int], *, agent: str | None = None) -> int:
        """``wake/ack``: returns once ``seqs`` are acked (durable in the daemon's journal).

        With no ack (for the same ``agent`` argument) in flight it goes out at once, alone;
        acks issued while one is in flight share the next ``wake/ack`` (see
        :mod:`mcpl_router.client.acks`), so acking from tasks of your own costs one request a
        round trip. Returns the ``acked`` count (deliveries newly marked) of the request that
        carried ``seqs``: shared with the acks that went with them.

        Raises:
            RpcError: that request's error answer (every caller whose seqs it carried gets it).
        """
        return await self._acks.ack(seqs, agent)

    async def _send_ack(self, seqs: list[int], agent: str | None) -> int:
        params: dict[str, object] = {"seqs": seqs}
        if agent is not None:
            params["agent"] = agent
        result = await self.request("wake/ack", params, AckResult)
        return result.acked

    async def next_notification(self, method: str | None = None) -> Notification:
        """The next notification (of ``method``, when given); others stay held, in order.

        Raises:
            trio.EndOfChannel: the connection closed and nothing (of ``method``) is held.
        """
        return await self.notifications.receive(method)

    async def next_wake(self) -> WakeNotice:
        """The next ``wake`` notification, parsed."""
        notification = await self.notifications.receive("wake")
        return WakeNotice.from_params(notification.params)

    async def wakes(self) -> AsyncIterator[WakeNotice]:
        """Every ``wake`` notification, in arrival order (until the connection closes)."""
        while True:
            try:
                yield await self.next_wake()
            except trio.EndOfChannel:
                return

    # -- queries ---------------------------------------------------------------------------------

    async def status(self) -> Status:
        return await self.request("status", {}, Status)

    async def servers_list(self) -> ServersList:
        return await self.request("servers/list", {}, ServersList)

    async def channels_list(self, *, cursor: str | None = None, limit: int | None = None) -> ChannelsPage:
        """One page of ``channels/list``; see :meth:`all_channels` for every page."""
        params: dict[str, object] = {}
        if cursor is not None:
            params["cursor"] = cursor
        if limit is not None:
            params["limit"] = limit
        return await self.request("channels/list", params, ChannelsPage)

    async def all_channels(self, *, limit: int | None = None) -> list[ChannelRow]:
        """Every channel, following ``nextCursor`` to the end."""
        page = await self.channels_list(limit=limit)
        rows = list(page.channels)
        while page.next_cursor:
            page = await self.channels_list(cursor=page.next_cursor, limit=limit)
            rows.extend(page.channels)
        return rows

    async def reload(self) -> ReloadResult:
        """``daemon/reload``: re-read the daemon's config file and apply what can change live."""
        return await self.request("daemon/reload", {}, ReloadResult)

    async def explain(self, name: str, server_id: str | None = None) -> Explanation:
        params: dict[str, object] = {"name": name}
        if server_id is not None:
            params["serverId"] = server_id
        return await self.request("explain", params, Explanation)

    # -- posting and typing ----------------------------------------------------------------------

    async def publish(
        self, agent: str, channel: ChannelArg, content: str | Sequence[Mapping[str, Any]], *, thread_id: str | None = None
    ) -> PublishResult:
        """``channels/publish`` for one of this connection's agents."""
        params: dict[str, object] = {
            "agent": agent,
            "channel": _channel_param(channel),
            "content": content if isinstance(content, str) else [dict(block) for block in content],
        }
        if thread_id is not None:
            params["threadId"] = thread_id
        return await self.request("channels/publish", params, PublishResult)

    async def typing(self, channel: ChannelArg, op: str = "start") -> TypingResult:
        """``channels/typing``: the host's own typing (a bare id fans out over servers)."""
        return await self.request("channels/typing", {"channel": _channel_param(channel), "op": op}, TypingResult)

    # -- turns -----------------------------------------------------------------------------------

    async def open_turn(
        self, agent: str, *, wakes: Sequence[int] = (), channel: ChannelArg | None = None, subagent: bool = False
    ) -> TurnOpened:
        """``turn/open`` alone; :meth:`turn` is the usual way (it closes the turn too)."""
        params: dict[str, object] = {"agent": agent}
        if wakes:
            params["wakes"] = list(wakes)
        if channel is not None:
            params["channel"] = _channel_param(channel)
        if subagent:
            params["subagent"] = True
        return await self.request("turn/open", params, TurnOpened)

    @contextlib.asynccontextmanager
    async def turn(
        self, agent: str, *, wakes: Sequence[int] = (), channel: ChannelArg | None = None, subagent: bool = False
    ) -> AsyncIterator[Turn]:
        """Open a turn for the block: closed ``completed`` when it ends, ``aborted`` (and the
        exception re-raised) when it raises, unless :meth:`Turn.close` closed it first."""
        opened = await self.open_turn(agent, wakes=wakes, channel=channel, subagent=subagent)
        async with turn_block(Turn(self, agent, opened)) as turn:
            yield turn

    # -- daemon→host requests --------------------------------------------------------------------

    def serve_inference(self, handler: InferenceHandler | None) -> None:
        """Answer ``inference/request`` with ``handler`` (None: stop; -32601 then). Register
        before :meth:`hello`, which tells the daemon what this host serves."""
        self._requests.serve_inference(handler)

    def serve_model_info(self, handler: ModelInfoHandler | None) -> None:
        """Answer ``model/info`` with ``handler`` (plain or async; None: stop)."""
        self._requests.serve_model_info(handler)

    def serve_fork_spawn(self, handler: ForkSpawnHandler | None) -> None:
        """Answer ``fork/spawn`` with ``handler``: it declares the fork agent (``hello``) and
        returns (None answers ``{fork}``); see docs/forks.md."""
        self._requests.serve_fork_spawn(handler)

    async def send_chunk(self, request_id: str, chunk: Any) -> None:
        """``inference/chunk {requestId, chunk}``: part of a streamed inference's answer."""
        await self._requests.send_chunk(request_id, chunk)

    # -- counters --------------------------------------------------------------------------------

    def statistics(self) -> ClientStatistics:
        """The buffer's counters (``notifications.dropped``…), the requests served, the acks."""
        requests = self._requests
        return ClientStatistics(
            notifications=self.notifications.statistics(),
            requests_served=dict(requests.served),
            requests_failed=dict(requests.failed),
            requests_unhandled=dict(requests.unhandled),
            chunks_sent=requests.chunks_sent,
            requests_cancelled=requests.cancelled,
            acks=self._acks.statistics.acks,
            ack_requests=self._acks.statistics.requests,
        )
