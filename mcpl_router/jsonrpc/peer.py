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

The peer is assembled from its parts, one module each: what a handler is given and returns
(:mod:`~mcpl_router.jsonrpc.handlers`), the bounds and counters
(:mod:`~mcpl_router.jsonrpc.limits`), the read side with its lanes
(:mod:`~mcpl_router.jsonrpc.lanes`) and the outbox with its writer
(:mod:`~mcpl_router.jsonrpc.outbox`). This module holds the connection's lifecycle and our own
requests (each awaiting its answer); every name the peer's users import is importable from here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Collection, Hashable
from typing import Any, TypeVar

import attrs
import msgspec
import trio

from mcpl_router.jsonrpc.envelope import (
    INVALID_PARAMS,
    PARSE_ERROR,
    Envelope,
    NotificationOut,
    RequestOut,
    RpcError,
    describe_decode_failure,
    encode,
)
from mcpl_router.jsonrpc.framing import MessageStream
from mcpl_router.jsonrpc.handlers import Deferred, Handler, Inbound, LaneOf, MethodTable
from mcpl_router.jsonrpc.lanes import PeerLanes, _Lane
from mcpl_router.jsonrpc.limits import PeerLimits, PeerStatistics
from mcpl_router.jsonrpc.outbox import PeerClosed, PeerOutbox
from mcpl_router.logs import get_logger

T = TypeVar("T")

# Closing may wait on the other side (a WebSocket close handshake) whose reader may already be
# cancelled; under a shield that wait must have its own end.
_CLOSE_TIMEOUT = 1.0
#: A request's deadline that fires this long (seconds) after it was due means the process did
#: not run meanwhile (SIGSTOP, a starved machine): an answer may already be in the socket.
PAUSE_SUSPECTED_AFTER = 0.25
#: How long the read loop then gets to read that answer before the request is a timeout.
LATE_ANSWER_GRACE = 1.0


class RequestTimeout(Exception):
    """No answer within the deadline. ``sent`` says whether the request left: an unknown outcome."""

    def __init__(self, method: str, timeout: float, *, sent: bool) -> None:
        super().__init__(f"{method}: no answer within {timeout:g}s")
        self.method = method
        self.timeout = timeout
        self.sent = sent


class Peer(PeerLanes, PeerOutbox):
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
        log_fields: dict[str, object] | None = None,
        stamp: Callable[[], object] | None = None,
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
        self._handed_since_yield = False
        self._answered_since_yield = False
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
            "late_answers": 0,
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
        self._note_high_water()
        self._outbox.clear()
        self._outbox_bytes = 0
        self._outbox_room.set()
        self._outbox_ready.set()

    def statistics(self) -> PeerStatistics:
        self._note_high_water()
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
        params: object = None,
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
            if scope.cancelled_caught:
                late = trio.current_time() - scope.deadline
                if not (sent and late > PAUSE_SUSPECTED_AFTER and await self._late_answer(waiter, method, late)):
                    raise RequestTimeout(method, deadline, sent=sent)
            answer = waiter.answer
        finally:
            self._pending.pop(request_id, None)
            self._answer_hooks.pop(request_id, None)
        if isinstance(answer, BaseException):
            raise answer
        # Set before ``done`` fires, and ``done`` is the only way out of the wait but a timeout.
        assert answer is not None
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

    async def notify(self, method: str, params: object = None) -> None:
        """Send a notification (no answer expected); waits while the outbox is full."""
        if self._closed:
            raise PeerClosed(self._close_reason)
        await self._enqueue(encode(NotificationOut(method=method, params=msgspec.UNSET if params is None else params)))

    def notify_nowait(self, method: str, params: object = None) -> bool:
        """Queue a notification if the outbox has room now; False if it hasn't (nothing queued).

        For a sender with a burst to go (a host's wakes): no scheduler round trip per message;
        it falls back to :meth:`notify` to wait for room, so the outbox's bound holds.
        """
        if self._closed:
            raise PeerClosed(self._close_reason)
        return self._enqueue_nowait(encode(NotificationOut(method=method, params=msgspec.UNSET if params is None else params)))

    async def _late_answer(self, waiter: _Waiter, method: str, late: float) -> bool:
        """Whether an answer already on its way arrives after all, once the read loop runs.

        The deadline fired ``late`` seconds after it was due: this process did not run for
        that long (stopped, or starved), and an answer the peer sent in time may be waiting in
        the socket, unread. The read loop gets a short grace to read it, so a paused daemon
        doesn't turn an answered request into an unknown outcome.
        """
        with trio.move_on_after(LATE_ANSWER_GRACE):
            await waiter.done.wait()
        if waiter.answer is None:
            return False
        self._counts["late_answers"] += 1
        self._log.info("jsonrpc.request.answered_after_a_pause", method=method, deadline_missed_by=round(late, 3))
        return True

    # -- answers to our requests (resolved in the read loop, as they arrive) ---------------

    def _on_answer(self, envelope: Envelope) -> None:
        answer_id = envelope.id
        # Ours are ints: an answer naming anything else (a string, a bool, none) is no one's.
        if not isinstance(answer_id, int) or isinstance(answer_id, bool):
            self._log.warning("jsonrpc.response.unmatched", id=None if isinstance(answer_id, msgspec.UnsetType) else answer_id)
            return
        waiter = self._pending.get(answer_id)
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
