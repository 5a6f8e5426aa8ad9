"""The JSON-RPC peer: one connection, requests both ways, reads and writes that never lose a message.

Both sides number their own requests, so ids collide: a message carrying ``result``/``error``
answers one of *our* requests (looked up in our pending table by our id); a message carrying
``method`` is *theirs*, answered with its id echoed verbatim (``0`` and strings included).

**Ordering.** Inbound requests and notifications are dispatched in arrival order *per lane*.
``lane_of`` names a message's lane (the host socket keys ``turn/*`` calls by their turn, so one
slow turn doesn't hold another's text); without it there is one lane, which MCPL links need (a
``channels/register`` must land before the ``channels/incoming`` that uses it). A lane's task
exists while it has work. Methods named in ``concurrent_methods`` run in their own task, for
handlers that wait a long time (a forwarded tool call). Answers to our own requests are resolved
inside the read loop, so a handler awaiting :meth:`Peer.request` never deadlocks it. A handler
may return a :class:`Deferred`: its lane moves on at once and the answer is sent when the
deferred work finishes (the journal's group commit answers ``accepted`` this way).

**Backpressure, never a drop.** Every queue is bounded (:class:`PeerLimits`). Inbound messages
queue in their lanes up to a bound for the whole connection (messages and bytes); when it, the
lane count, the concurrent slots or the deferred slots are full, the read loop waits for room:
the peer's sends back up into its socket, which is TCP's (or a pipe's) flow control. Nothing
inbound is ever discarded. Outgoing messages go through one bounded outbox drained by one
writer task, which joins queued messages into as few writes as the framing allows. A peer that
takes nothing we send (the outbox full and no write progressing) for ``stall_timeout`` seconds
is disconnected with a logged reason (``jsonrpc.peer.stalled``); what the daemon owed it
(wakes) stays in the journal. Replies to malformed lines are queued like any other message, so
a client that floods junk and never reads stops being read, and its memory stays bounded. A
graceful close, or the other side's EOF, gives what is queued ``close_flush`` seconds to go.

**No input stops a connection.** Any failure decoding or handling one message becomes an
error answer (or, for a notification, a logged event and a counter); the read loop goes on.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Awaitable, Callable, Collection, Hashable
from typing import Any, TypeVar

import attrs
import msgspec
import trio

from mcpl_router.jsonrpc.envelope import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
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
    describe_decode_failure,
    encode,
)
from mcpl_router.jsonrpc.framing import MessageStream, OversizedMessage
from mcpl_router.logs import get_logger

T = TypeVar("T")

# Closing may wait on the other side (a WebSocket close handshake) whose reader may already be
# cancelled; under a shield that wait must have its own end.
_CLOSE_TIMEOUT = 1.0
# The most one write joins: big enough that a burst is a handful of syscalls, small enough
# that the bytes held outside the outbox while a write blocks stay bounded.
_WRITE_BATCH_BYTES = 256 * 1024


@attrs.frozen
class PeerLimits:
    """The bounds of one connection's queues (see the module docstring for the policies)."""

    #: Inbound messages (and their bytes) queued across all lanes before the read loop waits.
    #: One lane may use all of it: a busy turn holds the others only once this is exhausted.
    inbound_messages: int = 4096
    inbound_bytes: int = 16 * 1024 * 1024
    #: Lanes with work at once before the read loop waits for one to finish.
    max_lanes: int = 64
    #: Concurrent-method handlers running at once.
    max_concurrent: int = 64
    #: Deferred answers outstanding at once.
    max_deferred: int = 1024
    #: Outgoing messages queued, and their bytes (a single larger message still goes alone).
    outbox_messages: int = 4096
    outbox_bytes: int = 8 * 1024 * 1024
    #: How long the peer may take nothing we send (the outbox full and no write making
    #: progress) before it is disconnected. A slow reader that keeps reading never trips it.
    stall_timeout: float = 30.0
    #: At a graceful close (or the other side's EOF), how long what is queued may take to go out.
    close_flush: float = 1.0


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
        except (msgspec.DecodeError, RecursionError) as exc:
            # The envelope skipped over the params without reading their strings: invalid
            # UTF-8 or runaway nesting surfaces here.
            detail = describe_decode_failure(bytes(raw), exc)
            raise RpcError(INVALID_PARAMS, f"Invalid params for {self.method}: {detail}", {"detail": detail}) from exc


@attrs.frozen
class Deferred:
    """A handler's answer that comes later: the lane moves on, the reply follows ``wait()``."""

    wait: Callable[[], Awaitable[Any]]


Handler = Callable[[Inbound], Awaitable[Any]]
LaneOf = Callable[[Inbound], Hashable]


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
    lanes: int
    inbound_queued: int
    requests_sent: int
    inbound_handled: int
    #: Times the read loop waited for room (a lane, a slot): backpressure on the other side.
    backpressure_waits: int
    skipped_lines: int
    malformed_messages: int
    oversized_messages: int
    handler_failures: int
    outbox_messages: int
    outbox_bytes: int
    #: The most bytes queued for this peer at once (what a peer that doesn't read costs).
    outbox_high_water_bytes: int
    #: Times a send waited because the outbox was full.
    outbox_waits: int
    #: 1 once the connection was closed because the peer stopped reading.
    stalled: int


@attrs.define(eq=False)
class _Lane:
    key: Hashable
    send: trio.MemorySendChannel[tuple[Inbound, int]]
    receive: trio.MemoryReceiveChannel[tuple[Inbound, int]]


class Peer:
    """One JSON-RPC 2.0 connection. Run :meth:`run` in a nursery; it returns when the stream ends.

    Args:
        stream: the framed transport.
        handler: awaited with each :class:`Inbound` request/notification; returns the result
            (or a :class:`Deferred`) or raises :class:`RpcError`. Any other exception answers
            -32603 and is logged with its traceback.
        request_timeout: the default deadline of :meth:`request`.
        concurrent_methods: methods handled in their own task rather than in their lane.
        lane_of: a message's lane key (order is kept within a lane); default: one lane.
        limits: queue bounds and the stall timeout.
        log_fields: fields on every log line (``server="a"``, ``connection=3``).
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
        lane_of: LaneOf | None = None,
        limits: PeerLimits | None = None,
        log_fields: dict[str, Any] | None = None,
        stamp: Callable[[], Any] | None = None,
    ) -> None:
        self._stream = stream
        self._handler = handler
        self._stamp = stamp
        self._lane_of = lane_of
        self.limits = limits or PeerLimits()
        self.request_timeout = request_timeout
        self._concurrent = frozenset(concurrent_methods)
        self._log = get_logger(**(log_fields or {}))
        self._next_id = 1
        self._pending: dict[int, _Waiter] = {}
        self._answer_hooks: dict[int, Callable[[Envelope], None]] = {}
        self._lanes: dict[Hashable, _Lane] = {}
        self._queued = 0
        self._queued_bytes = 0
        # Messages being handled right now (in lanes or their own tasks).
        self._handling = 0
        self._inbound_room = trio.Event()
        self._writer_done = False
        self._lane_slots = trio.Semaphore(self.limits.max_lanes)
        self._concurrent_slots = trio.Semaphore(self.limits.max_concurrent)
        self._deferred_slots = trio.Semaphore(self.limits.max_deferred)
        self._outbox: deque[bytes] = deque()
        self._outbox_bytes = 0
        self._writing_bytes = 0
        self._outbox_ready = trio.Event()
        self._outbox_room = trio.Event()
        self._closed = False
        self._close_reason = "connection closed"
        self._nursery: trio.Nursery | None = None
        self._counts = {
            "requests_sent": 0,
            "inbound_handled": 0,
            "backpressure_waits": 0,
            "skipped_lines": 0,
            "malformed_messages": 0,
            "oversized_messages": 0,
            "handler_failures": 0,
            "outbox_high_water_bytes": 0,
            "outbox_waits": 0,
            "stalled": 0,
        }

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def close_reason(self) -> str:
        return self._close_reason

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Read until the stream ends; then fail every pending request with :class:`PeerClosed`."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._write_loop)
                task_status.started()
                try:
                    await self._read_loop()
                    # EOF: the other side may still read what its last requests earned (a
                    # half-close). Bounded: a handler that takes longer is cancelled.
                    with trio.move_on_after(self.limits.close_flush):
                        await self._wait_quiet()
                finally:
                    # The connection is gone: handlers still running can't answer anyone.
                    nursery.cancel_scope.cancel()
        finally:
            self._mark_closed(self._close_reason)
            with trio.CancelScope(shield=True, deadline=trio.current_time() + _CLOSE_TIMEOUT):
                await self._stream.aclose()

    async def aclose(self, reason: str = "closed by us", *, flush: bool = True) -> None:
        """Close the connection; :meth:`run` returns soon after.

        With ``flush`` (a graceful close), what is already queued — a last notification —
        gets :attr:`PeerLimits.close_flush` seconds to go out first.
        """
        if flush and not self._closed and not self._writer_done:
            with trio.move_on_after(self.limits.close_flush):
                while (self._outbox or self._writing_bytes) and not self._closed:
                    await self._outbox_room.wait()
        self._mark_closed(reason)
        await self._stream.aclose()

    async def _wait_quiet(self) -> None:
        """Until no handler is running or queued and the outbox is empty."""
        while not self._closed and (self._queued or self._handling or self._outbox or self._writing_bytes or self._busy_tasks()):
            # A short poll, only at EOF and bounded by the caller: simpler than an event per kind.
            await trio.sleep(0.005)

    def _busy_tasks(self) -> int:
        limits = self.limits
        return (limits.max_concurrent - self._concurrent_slots.value) + (limits.max_deferred - self._deferred_slots.value)

    def _mark_closed(self, reason: str) -> None:
        if not self._closed:
            self._close_reason = reason
        self._closed = True
        self._fail_pending(PeerClosed(self._close_reason))
        # Wake every sender waiting for room: they see the connection is gone.
        self._outbox.clear()
        self._outbox_bytes = 0
        self._outbox_room.set()
        self._outbox_ready.set()

    def statistics(self) -> PeerStatistics:
        return PeerStatistics(
            pending_requests=len(self._pending),
            lanes=len(self._lanes),
            inbound_queued=self._queued,
            outbox_messages=len(self._outbox),
            outbox_bytes=self._outbox_bytes + self._writing_bytes,
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
        waiter = _Waiter()
        self._pending[request_id] = waiter
        if on_answer is not None:
            self._answer_hooks[request_id] = on_answer
        sent = False
        try:
            with trio.move_on_after(deadline) as scope:
                await self._enqueue(encode(RequestOut(id=request_id, method=method, params=msgspec.UNSET if params is None else params)))
                # Queued is as good as sent: from here the outcome is unknown until answered.
                sent = True
                self._counts["requests_sent"] += 1
                await waiter.done.wait()
                answer = waiter.answer
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
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
            raise RpcError(INVALID_PARAMS, f"Malformed result for {method}: {describe_decode_failure(bytes(raw), exc)}") from exc

    async def notify(self, method: str, params: Any = None) -> None:
        """Send a notification (no answer expected); waits while the outbox is full."""
        if self._closed:
            raise PeerClosed(self._close_reason)
        await self._enqueue(encode(NotificationOut(method=method, params=msgspec.UNSET if params is None else params)))

    def _has_room(self, size: int) -> bool:
        limits = self.limits
        if not self._outbox:
            return True  # one message, however large, always goes (the framing bounds it)
        return len(self._outbox) < limits.outbox_messages and self._outbox_bytes + size <= limits.outbox_bytes

    async def _enqueue(self, data: bytes) -> None:
        """Queue one encoded message for the writer, waiting (bounded) while the outbox is full."""
        # Every send is a checkpoint, taken before the message is queued: a cancelled sender
        # never leaves behind a message it believes unsent.
        await trio.lowlevel.checkpoint()
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
        self._outbox.append(data)
        self._outbox_bytes += len(data)
        total = self._outbox_bytes + self._writing_bytes
        if total > self._counts["outbox_high_water_bytes"]:
            self._counts["outbox_high_water_bytes"] = total
        self._outbox_ready.set()

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
                batch: list[bytes] = []
                size = 0
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
                    self._writing_bytes = 0
                    self._writer_done = True
                    self._mark_closed(f"connection closed while sending: {exc}")
                    return
                watchdog.deadline = math.inf
                self._writing_bytes = 0
                self._outbox_room.set()
                self._outbox_room = trio.Event()
        if watchdog.cancelled_caught:
            with trio.CancelScope(shield=True):
                await self._stall(f"not reading: a write made no progress for {stall:g}s")
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

    async def _reply(self, reply: ResultOut | ErrorOut) -> None:
        try:
            data = encode(reply)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            # A handler returned something JSON can't carry: a bug, answered as one.
            self._counts["handler_failures"] += 1
            self._log.error("jsonrpc.result.unencodable", id=reply.id, error=f"{type(exc).__name__}: {exc}")
            data = encode(ErrorOut(id=reply.id, error=ErrorObject(code=INTERNAL_ERROR, message="Internal error: the result could not be encoded")))
        try:
            await self._enqueue(data)
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
                await self._reply(ErrorOut(id=None, error=ErrorObject(code=INVALID_REQUEST, message=f"Invalid request: {exc}")))
                continue
            except (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError):
                return
            await self._on_message(data)
            # A checkpoint per message keeps one busy peer from starving its neighbours.
            await trio.lowlevel.checkpoint()

    async def _on_message(self, data: bytes) -> None:
        if self._stream.line_oriented and data.lstrip()[:1] not in (b"{", b"["):
            # Real servers print log lines on stdout: skip them, never drop the link for them.
            self._skip_line(data)
            return
        try:
            envelope = decode_envelope(data)
        except EnvelopeProblem as problem:
            if self._stream.line_oriented and (problem.error.code == PARSE_ERROR or data.lstrip()[:1] == b"["):
                # Not JSON at all (``[server] started``), or an array no MCPL peer sends: a log
                # line on a line-oriented stream. Skipped and logged, never answered.
                self._skip_line(data)
                return
            self._counts["malformed_messages"] += 1
            self._log.warning(
                "jsonrpc.message.malformed",
                code=problem.error.code,
                detail=problem.error.message,
                sample=data[:200].decode("utf-8", "replace"),
            )
            if problem.answerable:
                await self._reply(ErrorOut(id=problem.reply_id, error=problem.error.to_object()))
            return
        if envelope.method is msgspec.UNSET:
            self._on_answer(envelope)
            return
        is_notification = envelope.id is msgspec.UNSET
        inbound = Inbound(
            method=envelope.method,
            params=None if envelope.params is msgspec.UNSET else envelope.params,
            id=None if is_notification else envelope.id,
            is_notification=is_notification,
            stamp=self._stamp() if self._stamp is not None else None,
        )
        assert self._nursery is not None
        if inbound.method in self._concurrent:
            await self._acquire(self._concurrent_slots)
            self._nursery.start_soon(self._handle_concurrent, inbound)
            return
        size = len(data)
        if self._queued >= self.limits.inbound_messages or self._queued_bytes + size > self.limits.inbound_bytes:
            # Handlers are slower than the peer sends: stop reading until they catch up (the
            # peer's writes back up into its socket). Never a drop.
            self._counts["backpressure_waits"] += 1
            while self._queued and (
                self._queued >= self.limits.inbound_messages or self._queued_bytes + size > self.limits.inbound_bytes
            ):
                self._inbound_room = trio.Event()
                await self._inbound_room.wait()
        key = self._lane_key(inbound)
        lane = self._lanes.get(key)
        if lane is None:
            await self._acquire(self._lane_slots)
            # Unbounded by itself: the connection-wide count above is the bound.
            send, receive = trio.open_memory_channel[tuple[Inbound, int]](math.inf)
            lane = _Lane(key, send, receive)
            self._lanes[key] = lane
            self._nursery.start_soon(self._run_lane, lane)
        self._queued += 1
        self._queued_bytes += size
        lane.send.send_nowait((inbound, size))

    def _skip_line(self, data: bytes) -> None:
        self._counts["skipped_lines"] += 1
        self._log.info("jsonrpc.line.skipped", line=data[:500].decode("utf-8", "replace"))

    def _lane_key(self, inbound: Inbound) -> Hashable:
        if self._lane_of is None:
            return None
        try:
            return self._lane_of(inbound)
        except Exception:
            # A key we can't read puts the message in the shared lane; its handler answers.
            return None

    async def _acquire(self, slots: trio.Semaphore) -> None:
        try:
            slots.acquire_nowait()
        except trio.WouldBlock:
            self._counts["backpressure_waits"] += 1
            await slots.acquire()

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
        if waiter.done.is_set():
            self._log.warning("jsonrpc.response.unclaimed", id=answer_id)  # a duplicate answer
            return
        waiter.answer = envelope
        waiter.done.set()

    async def _run_lane(self, lane: _Lane) -> None:
        try:
            while True:
                try:
                    inbound, size = lane.receive.receive_nowait()
                except trio.WouldBlock:
                    if lane.key is None:
                        # The connection's own lane (all of a server link's messages) stays for
                        # the connection's life: no task to start per message.
                        inbound, size = await lane.receive.receive()
                    else:
                        # Idle: the lane ends. No await between the check and the removal, so
                        # the read loop never puts a message into a lane that is gone.
                        if self._lanes.get(lane.key) is lane:
                            del self._lanes[lane.key]
                        return
                self._queued -= 1
                self._queued_bytes -= size
                self._inbound_room.set()
                await self._handle(inbound)
        finally:
            self._lane_slots.release()

    async def _handle_concurrent(self, inbound: Inbound) -> None:
        try:
            await self._handle(inbound)
        finally:
            self._concurrent_slots.release()

    async def _handle(self, inbound: Inbound) -> None:
        self._counts["inbound_handled"] += 1
        self._handling += 1
        try:
            await self._handle_one(inbound)
        finally:
            self._handling -= 1

    async def _handle_one(self, inbound: Inbound) -> None:
        try:
            result = await self._handler(inbound)
        except Exception as exc:
            await self._answer_failure(inbound, exc)
            return
        if isinstance(result, Deferred):
            await self._acquire(self._deferred_slots)
            assert self._nursery is not None
            self._nursery.start_soon(self._finish_deferred, inbound, result)
            return
        if not inbound.is_notification:
            await self._reply(ResultOut(id=inbound.id, result=result))

    async def _finish_deferred(self, inbound: Inbound, deferred: Deferred) -> None:
        try:
            try:
                result = await deferred.wait()
            except Exception as exc:
                await self._answer_failure(inbound, exc)
                return
            if not inbound.is_notification:
                await self._reply(ResultOut(id=inbound.id, result=result))
        finally:
            self._deferred_slots.release()

    async def _answer_failure(self, inbound: Inbound, exc: Exception) -> None:
        if isinstance(exc, RpcError):
            if inbound.is_notification:
                self._log.warning("jsonrpc.notification.refused", method=inbound.method, code=exc.code, detail=exc.message)
                return
            await self._reply(ErrorOut(id=inbound.id, error=exc.to_object()))
            return
        self._counts["handler_failures"] += 1
        self._log.error("jsonrpc.handler.crashed", method=inbound.method, exc_info=exc)
        if not inbound.is_notification:
            await self._reply(
                ErrorOut(
                    id=inbound.id,
                    error=ErrorObject(code=INTERNAL_ERROR, message=f"Internal error handling {inbound.method}: {type(exc).__name__}"),
                )
            )

    def _fail_pending(self, error: BaseException) -> None:
        for waiter in list(self._pending.values()):
            if not waiter.done.is_set():
                waiter.answer = error
                waiter.done.set()


@attrs.define(eq=False)
class _Waiter:
    """One request of ours awaiting its answer (cheaper than a channel per request)."""

    done: trio.Event = attrs.field(factory=trio.Event)
    answer: Envelope | BaseException | None = None


__all__ = [
    "Deferred",
    "Handler",
    "Inbound",
    "LaneOf",
    "MethodTable",
    "PARSE_ERROR",
    "Peer",
    "PeerClosed",
    "PeerLimits",
    "PeerStatistics",
    "RequestTimeout",
]
