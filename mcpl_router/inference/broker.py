"""Server-initiated inference: a server's ``inference/request`` and ``model/info``, forwarded to
the host that serves the agent the operator named for it, and the host's answer (and chunks) back.

Who may ask is the operator's (``mcplServers.<id>.inference``, which also puts the capability
leaves in the grant: :func:`mcpl_router.mcpl.regrant.policy_for`); who answers is the host's
(``session/hello``'s ``serves``, :class:`~mcpl_router.inference.serving.Serving`). The wire:

- daemon → host request ``inference/request {requestId, agent, serverId, stream, request}``,
  ``request`` being the server's params verbatim; the host's result goes back to the server
  verbatim;
- host → daemon notification ``inference/chunk {requestId, chunk}``: sent to the asking server
  alone, as MCPL ``inference/chunk`` with ``requestId`` = the server's own request id, only while
  the request is open, only from the connection that was asked, only when the server asked to
  stream and is granted ``inferenceRequest.streaming``; anything else is dropped, logged
  (``inference.chunk.dropped``) and counted;
- daemon → host request ``model/info {requestId, agent, serverId}`` → the MCPL result.

A request is refused (:mod:`~mcpl_router.inference.refusals`) when no host serves the agent, the
request is too large, the server has too many in flight or asked too often in the last minute;
it fails when its host disconnects, errs, or is not done within the server's ``timeout``. Each
outcome is counted (``mcpl_router_inference_requests_total``).
"""

from __future__ import annotations

import itertools
import math
import secrets
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Final, cast

import attrs
import msgspec
import trio

import mcpl_router.inference.refusals as refusals
from mcpl_router.inference.refusals import ChunkDrop, InferenceRefusal
from mcpl_router.inference.budget import InferenceBudget
from mcpl_router.inference.serving import INFERENCE, MODEL_INFO, Serving
from mcpl_router.jsonrpc import Inbound, Peer, PeerClosed, RequestTimeout, RpcError
from mcpl_router.jsonrpc.envelope import RequestId
from mcpl_router.jsonrpc.peer import Deferred
from mcpl_router.events import EventBus, HostClosed
from mcpl_router.logs import Logger, get_logger
from mcpl_router.mcpl.grants import Grant
from mcpl_router.mcpl.session import INFERENCE_STREAMING

if TYPE_CHECKING:
    from mcpl_router.config.model import InferencePolicy
    from mcpl_router.inference.ports import HostEnd
    from mcpl_router.mcpl.link import ServerLink
    from mcpl_router.inference.ports import InferenceCounts

__all__ = ["INFERENCE_METHODS", "ChunkParams", "InferenceBroker", "chunk_lane"]

#: The server → host methods this module answers, and which ``serves`` kind each needs.
INFERENCE_METHODS: Final = {"inference/request": INFERENCE, "model/info": MODEL_INFO}

#: The chunk counter's ``outcome`` for a chunk that went on (else a :class:`ChunkDrop`).
CHUNK_FORWARDED: Final = "forwarded"


class ChunkParams(msgspec.Struct, rename="camel"):
    """``inference/chunk`` from a host: which forwarded request, and the MCPL chunk's fields."""

    request_id: str
    chunk: dict[str, object]


class _StreamOf(msgspec.Struct):
    """The one field of a server's ``inference/request`` the daemon reads; the rest is verbatim."""

    stream: object = False


class _RequestIdOf(msgspec.Struct):
    requestId: str | None = None  # noqa: N815 - the wire's name


_request_id_of = msgspec.json.Decoder(_RequestIdOf)


def chunk_lane(inbound: Inbound) -> Hashable:
    """The host connection's lane for an ``inference/chunk``: one per forwarded request.

    The host's answer is resolved in the read loop the moment it arrives; its chunks wait in
    this lane. Waiting for the lane to drain before answering the server keeps "chunks, then the
    full response" (§11.4).
    """
    if inbound.params is None:
        return None
    try:
        request_id = _request_id_of.decode(inbound.params).requestId
    except (msgspec.MsgspecError, RecursionError):
        return None  # its handler answers (logs) the malformed params
    return None if request_id is None else _lane_key(request_id)


def _lane_key(request_id: str) -> Hashable:
    return ("inference", request_id)


@attrs.define(eq=False)
class _Pending:
    """One forwarded request, from its admission to its answer."""

    request_id: str
    method: str
    link: ServerLink
    epoch: int
    server_request_id: RequestId
    connection: HostEnd
    stream: bool
    chunks: int = 0


class InferenceBroker:
    """Forwards servers' inference requests to the hosts serving their agents.

    Args:
        owner_of: the connection owning an agent now (the sessions'), if any.
        metrics: counts each request's outcome and each chunk's.
        clock: the time for the per-minute window (trio's clock by default).
    """

    def __init__(
        self,
        *,
        owner_of: Callable[[str], HostEnd | None],
        metrics: InferenceCounts,
        clock: Callable[[], float] = trio.current_time,
        events: EventBus | None = None,
    ) -> None:
        self.serving = Serving(owner_of)
        self._metrics = metrics
        self._clock = clock
        self._budget = InferenceBudget()
        self._pending: dict[str, _Pending] = {}
        self._ids = itertools.count(1)
        self._salt = secrets.token_hex(4)
        self._log = get_logger()
        if events is not None:
            # The listener's connections are the HostEnds the owners are (hosts/listener.py).
            events.subscribe(HostClosed, lambda closed: self.connection_closed(cast("HostEnd", closed.connection)))

    def connection_closed(self, connection: HostEnd) -> None:
        """The connection's ``serves`` ends with it (its open requests fail as its peer closes)."""
        self.serving.forget(connection)

    def open_requests(self) -> int:
        return len(self._pending)

    # -- server → host -------------------------------------------------------------------------

    async def handle(self, link: ServerLink, inbound: Inbound) -> Deferred | None:
        """A server's admitted ``inference/request`` or ``model/info``: answered later (the link's
        lane moves on while the host thinks)."""
        kind = INFERENCE_METHODS[inbound.method]
        params = inbound.params if inbound.params is not None else msgspec.Raw(b"{}")
        stream = False
        if inbound.method == "inference/request":
            asked = inbound.decode_params(_StreamOf).stream
            grant = inbound.stamp if isinstance(inbound.stamp, Grant) else link.grant
            stream = asked is True and grant.allows(INFERENCE_STREAMING)
        else:
            await trio.lowlevel.checkpoint()
        if inbound.is_notification or inbound.id is None:
            # Nothing to answer, so nothing to ask for: a request the server can't read is waste.
            self._log.warning("inference.request.notification", server=link.server_id, method=inbound.method)
            self._metrics.inference_outcome(link.server_id, inbound.method, "notification")
            return None
        server_request_id = inbound.id
        return Deferred(lambda: self._forward(link, inbound.method, kind, params, server_request_id, stream))

    async def _forward(
        self, link: ServerLink, method: str, kind: str, params: msgspec.Raw, server_request_id: RequestId, stream: bool
    ) -> msgspec.Raw:
        server_id = link.server_id
        policy = link.config.inference
        if policy is None:
            # A reload took the table away after admission: as if never granted.
            self._log.info("inference.request.refused", server=server_id, method=method, reason="not-granted")
            self._metrics.inference_outcome(server_id, method, "not-granted")
            raise RpcError(-32002, f"Capability denied: {method} is not configured for this server.", {"capability": "inferenceRequest" if kind == INFERENCE else "modelInfo"})
        connection = self.serving.host_for(policy.agent, kind)
        self._check(method, server_id, policy, len(params), connection)
        assert connection is not None and connection.peer is not None
        now = self._clock()
        self._budget.start(server_id, policy.per_minute, now)
        request_id = f"ir-{next(self._ids)}-{self._salt}"
        pending = _Pending(request_id, method, link, link.epoch, server_request_id, connection, stream)
        self._pending[request_id] = pending
        log = self._log.bind(server=server_id, agent=policy.agent, request=request_id, method=method, connection=connection.id)
        log.info("inference.request.forwarded", stream=stream, bytes=len(params))
        host_params: dict[str, object] = {"requestId": request_id, "agent": policy.agent, "serverId": server_id}
        if method == "inference/request":
            host_params.update({"stream": stream, "request": params})
        peer = connection.peer
        # Until the host answers, giving up (the deadline, the server gone, shutdown) tells it to
        # stop: a host whose model hangs must not keep the daemon's abandoned requests running.
        abandoned: str | None = "cancelled"
        try:
            with trio.move_on_after(policy.timeout) as deadline:
                try:
                    answer: msgspec.Raw = await peer.request(method, host_params, timeout=math.inf, result_type=msgspec.Raw)
                    abandoned = None
                except PeerClosed:
                    abandoned = None
                    raise self._refused(InferenceRefusal.HOST_GONE, method, server_id, agent=policy.agent) from None
                except RequestTimeout:  # not armed (math.inf); kept for a peer that does
                    raise self._refused(InferenceRefusal.TIMEOUT, method, server_id, agent=policy.agent, timeout=policy.timeout) from None
                except RpcError as error:
                    abandoned = None
                    raise self._refused(
                        InferenceRefusal.HOST_ERROR, method, server_id, agent=policy.agent,
                        detail=error.message, hostCode=error.code,
                    ) from None
                # The chunks the host sent before its answer reach the server before it.
                await peer.wait_lane_drained(_lane_key(request_id))
            if deadline.cancelled_caught:
                abandoned = InferenceRefusal.TIMEOUT.value if abandoned is not None else None
                raise self._refused(InferenceRefusal.TIMEOUT, method, server_id, agent=policy.agent, timeout=policy.timeout)
            if not bytes(answer).lstrip().startswith(b"{"):
                raise self._refused(InferenceRefusal.HOST_ERROR, method, server_id, agent=policy.agent, detail="its answer was not a result object")
            log.info("inference.request.answered", chunks=pending.chunks, seconds=round(self._clock() - now, 3))
            self._metrics.inference_outcome(server_id, method, "answered")
            return answer
        finally:
            del self._pending[request_id]
            self._budget.finish(server_id)
            if abandoned is not None and not peer.closed:
                await _tell_cancelled(peer, request_id, abandoned, log)

    def _check(self, method: str, server_id: str, policy: InferencePolicy, size: int, connection: HostEnd | None) -> None:
        if size > policy.max_request_bytes:
            raise self._refused(InferenceRefusal.TOO_LARGE, method, server_id, size=size, limit=policy.max_request_bytes)
        if connection is None or connection.peer is None or connection.peer.closed:
            raise self._refused(InferenceRefusal.NO_HOST, method, server_id, agent=policy.agent)
        if self._budget.in_flight(server_id) >= policy.max_concurrent:
            raise self._refused(InferenceRefusal.TOO_MANY_CONCURRENT, method, server_id, limit=policy.max_concurrent)
        wait = self._budget.retry_after(server_id, policy.per_minute, self._clock())
        if wait is not None:
            raise self._refused(InferenceRefusal.RATE_LIMITED, method, server_id, limit=policy.per_minute, retryAfter=round(wait, 3))

    def _refused(self, reason: InferenceRefusal, method: str, server_id: str, **facts: object) -> RpcError:
        self._metrics.inference_outcome(server_id, method, reason)
        self._log.warning("inference.request.refused", server=server_id, method=method, reason=reason, **facts)
        return refusals.refusal(reason, method, **facts)

    # -- host → server -------------------------------------------------------------------------

    async def chunk(self, connection: HostEnd, params: ChunkParams) -> None:
        """A host's ``inference/chunk``: to the asking server alone, or dropped (logged, counted)."""
        pending = self._pending.get(params.request_id)
        if pending is None:
            return await self._drop(connection, params, ChunkDrop.UNKNOWN_REQUEST)
        if pending.connection is not connection:
            return await self._drop(connection, params, ChunkDrop.NOT_ASKED)
        if not pending.stream:
            return await self._drop(connection, params, ChunkDrop.NOT_STREAMING)
        link = pending.link
        if link.epoch != pending.epoch:
            return await self._drop(connection, params, ChunkDrop.SERVER_GONE)
        # The server knows its request by its own id: the host's routing id never reaches it.
        chunk = {key: value for key, value in params.chunk.items() if key != "requestId"}
        chunk["requestId"] = pending.server_request_id
        unsent = await link.session.inference_chunk(chunk)
        if unsent == "not-granted":
            return await self._drop(connection, params, ChunkDrop.NOT_STREAMING)
        if unsent is not None:
            return await self._drop(connection, params, ChunkDrop.SERVER_GONE)
        pending.chunks += 1
        self._metrics.inference_chunk(CHUNK_FORWARDED)
        return None

    async def _drop(self, connection: HostEnd, params: ChunkParams, reason: ChunkDrop) -> None:
        await trio.lowlevel.checkpoint()
        self._metrics.inference_chunk(reason)
        self._log.warning("inference.chunk.dropped", connection=connection.id, request=params.request_id, reason=reason)


#: The most telling a host to stop may take (it goes out after the request has ended).
CANCEL_NOTICE_TIMEOUT = 1.0


async def _tell_cancelled(peer: Peer, request_id: str, reason: str, log: Logger) -> None:
    """``inference/cancel {requestId, reason}`` to the host: the daemon no longer waits for it."""
    with trio.CancelScope(shield=True, deadline=trio.current_time() + CANCEL_NOTICE_TIMEOUT):
        try:
            await peer.notify("inference/cancel", {"requestId": request_id, "reason": reason})
        except PeerClosed:
            return
    log.info("inference.request.cancel_sent", reason=reason)
