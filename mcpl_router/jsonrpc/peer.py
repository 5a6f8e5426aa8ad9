"""The JSON-RPC peer: one connection, requests both ways, a read loop that never waits on handlers.

Both sides number their own requests, so ids collide: a message carrying ``result``/``error``
answers one of *our* requests (looked up in our pending table by our id); a message carrying
``method`` is *theirs*, answered with its id echoed verbatim (``0`` and strings included).

Inbound requests and notifications are dispatched **in arrival order** by one dispatcher task,
because order carries meaning on MCPL links (a ``channels/register`` must land before the
``channels/incoming`` that uses it). Methods named in ``concurrent_methods`` run in their own task
instead, for handlers that wait a long time (a forwarded tool call). Responses to our requests
are resolved inside the read loop, so a handler awaiting ``request()`` can never deadlock it.

Backpressure policy: the ordered inbound queue holds ``inbound_queue_size`` messages. When it
is full the read loop does not wait (waiting could deadlock a handler that awaits one of our
requests): a request is answered -32000 "overloaded" and a notification is dropped with a
``jsonrpc.inbound.dropped`` log line; both are counted in :meth:`Peer.statistics`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection
from typing import Any, TypeVar

import attrs
import msgspec
import trio

from mcpl_router.jsonrpc.envelope import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    OVERLOADED,
    PARSE_ERROR,
    Envelope,
    EnvelopeProblem,
    ErrorObject,
    ErrorOut,
    NotificationOut,
    RequestId,
    RequestOut,
    ResultOut,
    RpcError,
    decode_envelope,
    encode,
)
from mcpl_router.jsonrpc.framing import MessageStream, OversizedMessage
from mcpl_router.logs import get_logger

T = TypeVar("T")

# So a wedged transport can't hold a sender (and so the whole link) forever.
_WRITE_TIMEOUT = 10.0
# Closing may wait on the other side (a WebSocket close handshake) whose reader may already be
# cancelled; under a shield that wait must have its own end.
_CLOSE_TIMEOUT = 1.0


class PeerClosed(Exception):
    """The connection closed before (or while) a request could be answered."""


class RequestTimeout(Exception):
    """No answer within the deadline. ``sent`` says whether the request left: an unknown outcome."""

    def __init__(self, method: str, timeout: float, *, sent: bool) -> None:
        super().__init__(f"{method}: no answer within {timeout:g}s")
        self.method = method
        self.timeout = timeout
        self.sent = sent


@attrs.frozen
class Inbound:
    """A request or notification the other side sent us."""

    method: str
    params: msgspec.Raw | None
    #: None for a notification; otherwise their id, echoed back verbatim.
    id: RequestId | None
    is_notification: bool
    #: What the peer's ``stamp`` hook returned as the message arrived (in the read loop, in
    #: byte order with the answers): e.g. the grant in force *at receipt*, for admission.
    stamp: Any = None

    def decode_params(self, params_type: type[T]) -> T:
        """Decode the params into ``params_type``, or raise -32602 naming the bad field's path."""
        raw = self.params if self.params is not None else b"{}"
        try:
            return msgspec.json.decode(raw, type=params_type)
        except msgspec.ValidationError as exc:
            raise RpcError(INVALID_PARAMS, f"Invalid params for {self.method}: {exc}", {"detail": str(exc)}) from exc
        except msgspec.DecodeError as exc:  # pragma: no cover - the envelope already parsed it
            raise RpcError(INVALID_PARAMS, f"Invalid params for {self.method}: {exc}") from exc


Handler = Callable[[Inbound], Awaitable[Any]]


@attrs.define
class _Method:
    handler: Callable[[Any, Inbound], Awaitable[Any]]
    params_type: type | None
    concurrent: bool


class MethodTable:
    """Method name → handler, with the params decoded into a typed Struct before the call.

    Unknown methods answer -32601; params that don't fit the Struct answer -32602 with the path.
    """

    def __init__(self) -> None:
        self._methods: dict[str, _Method] = {}

    def add(
        self,
        method: str,
        handler: Callable[[Any, Inbound], Awaitable[Any]],
        params_type: type | None = None,
        *,
        concurrent: bool = False,
    ) -> None:
        self._methods[method] = _Method(handler, params_type, concurrent)

    def __contains__(self, method: str) -> bool:
        return method in self._methods

    @property
    def concurrent_methods(self) -> frozenset[str]:
        return frozenset(name for name, m in self._methods.items() if m.concurrent)

    async def __call__(self, inbound: Inbound) -> Any:
        entry = self._methods.get(inbound.method)
        if entry is None:
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {inbound.method}")
        params = inbound.decode_params(entry.params_type) if entry.params_type is not None else inbound.params
        return await entry.handler(params, inbound)


@attrs.frozen
class PeerStatistics:
    pending_requests: int
    inbound_queued: int
    requests_sent: int
    inbound_handled: int
    overloaded_requests: int
    dropped_notifications: int
    skipped_lines: int
    malformed_messages: int
    oversized_messages: int


class Peer:
    """One JSON-RPC 2.0 connection. Run :meth:`run` in a nursery; it returns when the stream ends.

    Args:
        stream: the framed transport.
        handler: awaited with each :class:`Inbound` request/notification; returns the result or
            raises :class:`RpcError`. Any other exception answers -32603 and is logged.
        name: a label for logs (``server="a"`` style fields go in ``log_fields``).
        request_timeout: the default deadline of :meth:`request`.
        concurrent_methods: methods handled in their own task rather than in arrival order.
        stamp: called in the read loop for each inbound request/notification as it arrives;
            its value rides on :attr:`Inbound.stamp` (admission against the grant at receipt).
    """

    def __init__(
        self,
        stream: MessageStream,
        handler: Handler,
        *,
        request_timeout: float = 30.0,
        concurrent_methods: Collection[str] = (),
        inbound_queue_size: int = 256,
        log_fields: dict[str, Any] | None = None,
        stamp: Callable[[], Any] | None = None,
    ) -> None:
        self._stream = stream
        self._handler = handler
        self._stamp = stamp
        self.request_timeout = request_timeout
        self._concurrent = frozenset(concurrent_methods)
        self._log = get_logger(**(log_fields or {}))
        self._next_id = 1
        self._pending: dict[int, trio.MemorySendChannel[Envelope | BaseException]] = {}
        self._answer_hooks: dict[int, Callable[[Envelope], None]] = {}
        self._send_lock = trio.Lock()
        self._inbound_send, self._inbound_receive = trio.open_memory_channel[Inbound](inbound_queue_size)
        self._closed = False
        self._close_reason = "connection closed"
        self._nursery: trio.Nursery | None = None
        self._counts = {
            "requests_sent": 0,
            "inbound_handled": 0,
            "overloaded_requests": 0,
            "dropped_notifications": 0,
            "skipped_lines": 0,
            "malformed_messages": 0,
            "oversized_messages": 0,
        }

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read until the stream ends; then fail every pending request with :class:`PeerClosed`."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._dispatch_in_order)
                task_status.started()
                try:
                    await self._read_loop()
                finally:
                    # The connection is gone: handlers still running can't answer anyone.
                    nursery.cancel_scope.cancel()
        finally:
            self._closed = True
            self._fail_pending(PeerClosed(self._close_reason))
            with trio.CancelScope(shield=True, deadline=trio.current_time() + _CLOSE_TIMEOUT):
                await self._stream.aclose()

    async def aclose(self, reason: str = "closed by us") -> None:
        """Close the connection; :meth:`run` returns soon after."""
        self._close_reason = reason
        self._closed = True
        self._fail_pending(PeerClosed(reason))
        await self._stream.aclose()

    def statistics(self) -> PeerStatistics:
        stats = self._inbound_receive.statistics()
        return PeerStatistics(
            pending_requests=len(self._pending),
            inbound_queued=stats.current_buffer_used,
            **self._counts,
        )

    # -- outgoing ----------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        params: Any = None,
        *,
        timeout: float | None = None,
        result_type: type[T] | None = None,
        on_answer: Callable[[Envelope], None] | None = None,
    ) -> Any:
        """Send a request and wait for its answer.

        Returns the decoded result (into ``result_type`` when given, else plain JSON values).
        ``on_answer``, when given, is called inside the read loop the moment the answer arrives,
        before any later inbound message is dispatched: a grant that takes effect on its receipt
        is in force for the very next message the other side sent.
        Raises :class:`RpcError` for an error answer (or a result that doesn't fit
        ``result_type``), :class:`RequestTimeout` past the deadline, :class:`PeerClosed` if the
        connection ends first.
        """
        if self._closed:
            raise PeerClosed(self._close_reason)
        deadline = self.request_timeout if timeout is None else timeout
        request_id = self._next_id
        self._next_id += 1
        answer_send, answer_receive = trio.open_memory_channel[Envelope | BaseException](1)
        self._pending[request_id] = answer_send
        if on_answer is not None:
            self._answer_hooks[request_id] = on_answer
        sent = False
        try:
            with trio.move_on_after(deadline) as scope:
                await self._send(RequestOut(id=request_id, method=method, params=msgspec.UNSET if params is None else params))
                sent = True
                self._counts["requests_sent"] += 1
                answer = await answer_receive.receive()
            if scope.cancelled_caught:
                raise RequestTimeout(method, deadline, sent=sent)
        finally:
            self._pending.pop(request_id, None)
            self._answer_hooks.pop(request_id, None)
        if isinstance(answer, BaseException):
            raise answer
        if answer.error is not msgspec.UNSET:
            error = answer.error
            raise RpcError(error.code, error.message, error.data)
        raw = answer.result if answer.result is not msgspec.UNSET else msgspec.Raw(b"null")
        try:
            if result_type is None:
                return msgspec.json.decode(raw)
            return msgspec.json.decode(raw, type=result_type)
        except msgspec.ValidationError as exc:
            raise RpcError(INVALID_PARAMS, f"Malformed result for {method}: {exc}") from exc

    async def notify(self, method: str, params: Any = None) -> None:
        """Send a notification (no answer expected)."""
        if self._closed:
            raise PeerClosed(self._close_reason)
        await self._send(NotificationOut(method=method, params=msgspec.UNSET if params is None else params))

    async def _send(self, message: RequestOut | NotificationOut | ResultOut | ErrorOut) -> None:
        data = encode(message)
        try:
            with trio.fail_after(_WRITE_TIMEOUT):
                async with self._send_lock:
                    await self._stream.send_message(data)
        except trio.TooSlowError:
            self._log.error("jsonrpc.write.timeout", timeout=_WRITE_TIMEOUT)
            self._close_reason = "write timed out"
            await self.aclose("write timed out")
            raise PeerClosed("write timed out") from None
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._closed = True
            raise PeerClosed(f"connection closed while sending: {exc}") from exc

    async def _reply(self, reply: ResultOut | ErrorOut) -> None:
        try:
            await self._send(reply)
        except PeerClosed:
            self._log.info("jsonrpc.reply.undeliverable", id=reply.id)

    # -- incoming ----------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        while True:
            try:
                data = await self._stream.receive_message()
            except OversizedMessage as exc:
                self._counts["oversized_messages"] += 1
                self._log.warning("jsonrpc.message.oversized", size=exc.size, limit=exc.limit)
                # Spawned, never awaited here: a peer that isn't reading must not stop our reads.
                self._spawn_reply(ErrorOut(id=None, error=ErrorObject(code=-32600, message=f"Invalid request: {exc}")))
                continue
            except (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError):
                return
            self._on_message(data)
            # A checkpoint per message keeps one busy peer from starving its neighbours.
            await trio.lowlevel.checkpoint()

    def _on_message(self, data: bytes) -> None:
        if self._stream.line_oriented and _is_log_line(data):
            # Real servers print log lines on stdout: skip them, never answer them (an answer
            # lands on the server's stdin as garbage), never drop the link for them.
            self._counts["skipped_lines"] += 1
            self._log.info("jsonrpc.line.skipped", line=data[:500].decode("utf-8", "replace"))
            return
        try:
            envelope = decode_envelope(data)
        except EnvelopeProblem as problem:
            self._counts["malformed_messages"] += 1
            self._log.warning(
                "jsonrpc.message.malformed",
                code=problem.error.code,
                detail=problem.error.message,
                sample=data[:200].decode("utf-8", "replace"),
            )
            if problem.answerable:
                self._spawn_reply(ErrorOut(id=problem.reply_id, error=problem.error.to_object()))
            return
        if envelope.method is msgspec.UNSET:
            self._on_answer(envelope)
            return
        is_notification = envelope.id is msgspec.UNSET
        request_id = None if is_notification else envelope.id
        inbound = Inbound(
            method=envelope.method,
            params=None if envelope.params is msgspec.UNSET else envelope.params,
            id=request_id,
            is_notification=is_notification,
            stamp=self._stamp() if self._stamp is not None else None,
        )
        assert self._nursery is not None
        if inbound.method in self._concurrent:
            self._nursery.start_soon(self._handle, inbound)
            return
        try:
            self._inbound_send.send_nowait(inbound)
        except trio.WouldBlock:
            if inbound.is_notification:
                self._counts["dropped_notifications"] += 1
                self._log.error("jsonrpc.inbound.dropped", method=inbound.method, reason="inbound queue full")
            else:
                self._counts["overloaded_requests"] += 1
                self._log.warning("jsonrpc.inbound.overloaded", method=inbound.method)
                self._spawn_reply(
                    ErrorOut(
                        id=inbound.id,
                        error=ErrorObject(code=OVERLOADED, message="Overloaded: too many requests in flight; retry later."),
                    )
                )

    def _on_answer(self, envelope: Envelope) -> None:
        answer_id = envelope.id
        waiter = self._pending.get(answer_id) if isinstance(answer_id, int) and not isinstance(answer_id, bool) else None
        if waiter is None:
            self._log.warning("jsonrpc.response.unmatched", id=answer_id)
            return
        hook = self._answer_hooks.pop(answer_id, None)
        if hook is not None:
            try:
                hook(envelope)
            except Exception:
                self._log.exception("jsonrpc.answer_hook.crashed", id=answer_id)
        try:
            waiter.send_nowait(envelope)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            # A duplicate answer, or the requester gave up (deadline) a moment ago.
            self._log.warning("jsonrpc.response.unclaimed", id=answer_id)

    def _spawn_reply(self, reply: ResultOut | ErrorOut) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(self._reply, reply)

    async def _dispatch_in_order(self) -> None:
        async for inbound in self._inbound_receive:
            await self._handle(inbound)

    async def _handle(self, inbound: Inbound) -> None:
        self._counts["inbound_handled"] += 1
        try:
            result = await self._handler(inbound)
        except RpcError as error:
            if inbound.is_notification:
                self._log.warning(
                    "jsonrpc.notification.refused", method=inbound.method, code=error.code, detail=error.message
                )
                return
            await self._reply(ErrorOut(id=inbound.id, error=error.to_object()))
            return
        except Exception as exc:
            self._log.exception("jsonrpc.handler.crashed", method=inbound.method)
            if not inbound.is_notification:
                await self._reply(
                    ErrorOut(
                        id=inbound.id,
                        error=ErrorObject(code=INTERNAL_ERROR, message=f"Internal error handling {inbound.method}: {type(exc).__name__}"),
                    )
                )
            return
        if not inbound.is_notification:
            await self._reply(ResultOut(id=inbound.id, result=result))

    def _fail_pending(self, error: BaseException) -> None:
        for waiter in list(self._pending.values()):
            try:
                waiter.send_nowait(error)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass


def _is_log_line(line: bytes) -> bool:
    """True for a stdout line that is no JSON-RPC message at all: text, not JSON.

    A line starting with ``{`` is taken as a message (a broken one is answered -32700). One
    starting with ``[`` is a batch only if it is JSON: discord-mcpl logs
    ``[discord-mcpl] Client initialized (MCPL mode)`` on stdout, which is a log line.
    """
    first = line.lstrip()[:1]
    if first == b"{":
        return False
    if first != b"[":
        return True
    try:
        msgspec.json.decode(line)
    except msgspec.DecodeError:
        return True
    return False


__all__ = [
    "Handler",
    "Inbound",
    "MethodTable",
    "PARSE_ERROR",
    "Peer",
    "PeerClosed",
    "PeerStatistics",
    "RequestTimeout",
]
