"""The read side of a peer: the read loop, the lanes, each inbound message handled and answered.

The read loop takes one message at a time. An answer to one of our requests is resolved at
once, inside the loop (:meth:`~mcpl_router.jsonrpc.peer.Peer._on_answer`), so a handler awaiting
a request never deadlocks it. A request or notification of theirs goes into its *lane* (named by
``lane_of``; one lane when there is none), whose task handles the lane's messages in arrival
order; a lane's task exists while the lane has work, except the connection's own lane (key
``None``), which lives as long as the connection. Methods named concurrent run in a task of
their own; a handler's :class:`~mcpl_router.jsonrpc.handlers.Deferred` answer is awaited in one,
and the lane moves on. Every queue and slot is bounded (:class:`PeerLimits`): when one is full
the read loop waits for room, so the other side's sends back up into its socket. Nothing
inbound is dropped, and no input stops the connection: a message that can't be decoded or
handled becomes an error answer, or for a notification a logged event and a counter.

Apart from the outbox and the Peer because ordering, backpressure and the failure-to-answer
rules are the read side's alone; it hands what it answers to the outbox (``_enqueue``). The
state it uses is the Peer's.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING

import attrs
import msgspec
import trio

from mcpl_router.logs import Logger
from mcpl_router.jsonrpc.envelope import (
    INTERNAL_ERROR,
    INVALID_REQUEST,
    PARSE_ERROR,
    Envelope,
    EnvelopeProblem,
    ErrorObject,
    ErrorOut,
    RequestId,
    ResultOut,
    RpcError,
    decode_envelope,
    encode,
)
from mcpl_router.jsonrpc.framing import MessageStream, OversizedMessage
from mcpl_router.jsonrpc.handlers import Deferred, Handler, Inbound, LaneOf
from mcpl_router.jsonrpc.limits import PeerLimits
from mcpl_router.jsonrpc.outbox import PeerClosed

__all__ = ["PeerLanes"]

#: Messages read between scheduling points when they come from the stream's buffer.
READS_PER_YIELD = 16


@attrs.define(eq=False)
class _Lane:
    key: Hashable
    #: Messages waiting, with their sizes. Unbounded by itself: the connection-wide count is
    #: the bound. A deque, not a memory channel: a lane is made per turn, and only the
    #: connection's own lane ever waits for more (on ``arrived``).
    waiting: collections.deque[tuple[Inbound, int]] = attrs.field(factory=collections.deque)
    arrived: trio.Event = attrs.field(factory=trio.Event)
    #: Set when the lane's task ends: everything put into it has been handled.
    ended: trio.Event = attrs.field(factory=trio.Event)

    def put(self, item: tuple[Inbound, int]) -> None:
        self.waiting.append(item)
        self.arrived.set()


class PeerLanes:
    """The read loop and the lanes; a part of :class:`~mcpl_router.jsonrpc.peer.Peer`."""

    # The Peer's, set when it is made.
    limits: PeerLimits
    _stream: MessageStream
    _handler: Handler
    _stamp: Callable[[], object] | None
    _lane_of: LaneOf | None
    _concurrent: frozenset[str]
    _log: Logger
    _counts: dict[str, int]
    _nursery: trio.Nursery | None
    _lanes: dict[Hashable, _Lane]
    #: Inbound messages (and their bytes) queued across the lanes, not yet handled.
    _queued: int
    _queued_bytes: int
    #: Messages being handled right now (in lanes or their own tasks).
    _handling: int
    #: A message was handed to a task since the read loop last yielded (that task hasn't run).
    _handed_since_yield: bool
    #: An answer was resolved since the read loop last yielded (its requester hasn't resumed).
    _answered_since_yield: bool
    #: Set when a lane takes a message out (the read loop waits on it while the bound is full).
    _inbound_room: trio.Event
    _lane_slots: trio.Semaphore
    _concurrent_slots: trio.Semaphore
    _deferred_slots: trio.Semaphore

    if TYPE_CHECKING:

        async def _enqueue(self, data: bytes) -> None: ...

        def _enqueue_nowait(self, data: bytes) -> bool: ...

        def _on_answer(self, envelope: Envelope) -> None: ...

    async def _reply(self, reply: ResultOut | ErrorOut) -> None:
        data = self._encode_reply(reply)
        try:
            await self._enqueue(data)
        except PeerClosed:
            self._log.info("jsonrpc.reply.undeliverable", id=reply.id)

    def _encode_reply(self, reply: ResultOut | ErrorOut) -> bytes:
        try:
            return encode(reply)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            # A handler returned something JSON can't carry: a bug, answered as one.
            self._counts["handler_failures"] += 1
            self._log.error("jsonrpc.result.unencodable", id=reply.id, error=f"{type(exc).__name__}: {exc}")
            return encode(ErrorOut(id=reply.id, error=ErrorObject(code=INTERNAL_ERROR, message="Internal error: the result could not be encoded")))

    async def wait_lane_drained(self, key: Hashable) -> None:
        """Wait until every message that arrived so far in lane ``key`` has been handled.

        For a request of ours whose answer must not overtake the notifications the other side
        sent before it (the read loop resolves answers at once, lanes handle in their tasks).
        Not for the connection's own lane (key ``None``), which never ends.
        """
        if key is None:
            raise ValueError("the connection's own lane never drains")
        lane = self._lanes.get(key)
        if lane is None:
            await trio.lowlevel.checkpoint()
            return
        await lane.ended.wait()

    # -- incoming ----------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        unyielded = 0
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
            # Messages already buffered are read without a scheduling point: one every
            # READS_PER_YIELD keeps one busy peer from starving its neighbours (a yield per
            # message cost a turn half a dozen trips through the scheduler).
            unyielded += 1
            if unyielded >= READS_PER_YIELD:
                unyielded = 0
                await self._yield_to_handlers()

    async def _yield_to_handlers(self) -> None:
        self._handed_since_yield = self._answered_since_yield = False
        await trio.lowlevel.checkpoint()

    async def _on_message(self, data: bytes) -> None:
        # A message starts with "{" (a peer writes no space before it): looked at first, so
        # a message pays nothing for the log lines this check is for.
        if data[:1] != b"{" and self._stream.line_oriented and data.lstrip()[:1] not in (b"{", b"["):
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
            if self._handed_since_yield:
                # An answer never overtakes what the peer sent before it: the tasks handed
                # those messages start before whoever awaits this answer runs.
                await self._yield_to_handlers()
            self._on_answer(envelope)
            self._answered_since_yield = True
            return
        request_id = envelope.id
        params = envelope.params
        if isinstance(request_id, msgspec.UnsetType):
            inbound = Inbound(envelope.method, None if params is msgspec.UNSET else params, None, True,
                              None if self._stamp is None else self._stamp())
        else:
            inbound = Inbound(envelope.method, None if params is msgspec.UNSET else params, request_id, False,
                              None if self._stamp is None else self._stamp())
        assert self._nursery is not None
        if self._answered_since_yield:
            # Nor does what the peer sent after an answer overtake it: whoever awaited the
            # answer resumes (and acts on it) before this message's handler starts.
            await self._yield_to_handlers()
        if inbound.method in self._concurrent:
            await self._acquire(self._concurrent_slots)
            self._nursery.start_soon(self._handle_concurrent, inbound)
            self._handed_since_yield = True
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
        # Without a lane_of (a server link's peer) every message is in the connection's own lane.
        key = None if self._lane_of is None else self._lane_key(inbound)
        lane = self._lanes.get(key)
        if lane is None:
            await self._acquire(self._lane_slots)
            lane = _Lane(key)
            self._lanes[key] = lane
            self._nursery.start_soon(self._run_lane, lane)
        self._queued += 1
        self._queued_bytes += size
        lane.put((inbound, size))
        self._handed_since_yield = True

    def _skip_line(self, data: bytes) -> None:
        self._counts["skipped_lines"] += 1
        self._log.info("jsonrpc.line.skipped", line=data[:500].decode("utf-8", "replace"))

    def _lane_key(self, inbound: Inbound) -> Hashable:
        # Asked only where the peer has a lane_of (a host's: a lane per turn).
        assert self._lane_of is not None
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

    async def _run_lane(self, lane: _Lane) -> None:
        try:
            while True:
                if not lane.waiting:
                    if lane.key is not None:
                        # Idle: the lane ends. No await between the check and the removal, so
                        # the read loop never puts a message into a lane that is gone.
                        if self._lanes.get(lane.key) is lane:
                            del self._lanes[lane.key]
                        return
                    # The connection's own lane (all of a server link's messages) stays for
                    # the connection's life: no task to start per message.
                    while not lane.waiting:
                        lane.arrived = trio.Event()
                        await lane.arrived.wait()
                inbound, size = lane.waiting.popleft()
                self._queued -= 1
                self._queued_bytes -= size
                self._inbound_room.set()
                await self._handle(inbound)
        finally:
            lane.ended.set()
            self._lane_slots.release()

    async def _handle_concurrent(self, inbound: Inbound) -> None:
        try:
            await self._handle(inbound)
        finally:
            self._concurrent_slots.release()

    async def _handle(self, inbound: Inbound) -> None:
        # One frame from the lane to the handler and back (this runs once a message).
        self._counts["inbound_handled"] += 1
        self._handling += 1
        try:
            try:
                result = await self._handler(inbound)
            except Exception as exc:
                await self._answer_failure(inbound, exc)
                return
            if isinstance(result, Deferred):
                try:
                    self._deferred_slots.acquire_nowait()
                except trio.WouldBlock:
                    await self._acquire(self._deferred_slots)
                if result.subscribe is not None:
                    # Pushed when settled: no task per answer; the slot is held until then.
                    result.subscribe(functools.partial(self._deferred_settled, inbound))
                    return
                assert self._nursery is not None
                self._nursery.start_soon(self._finish_deferred, inbound, result)
                return
            if not inbound.is_notification:
                await self._reply(ResultOut(id=inbound.id, result=result))
        finally:
            self._handling -= 1

    async def _finish_deferred(self, inbound: Inbound, deferred: Deferred) -> None:
        try:
            try:
                result = await deferred.result()
            except Exception as exc:
                await self._answer_failure(inbound, exc)
                return
            if not inbound.is_notification:
                await self._reply(ResultOut(id=inbound.id, result=result))
        finally:
            self._deferred_slots.release()

    def _deferred_settled(self, inbound: Inbound, result: object, error: Exception | None) -> None:
        """A pushed answer, on the trio thread: queued at once if the outbox has room, else
        by a task that waits for room. The deferred slot is held until the answer is queued,
        so the answers waiting for room stay within the deferred bound (and the lanes wait)."""
        reply: ResultOut | ErrorOut | None
        if error is not None:
            reply = self._failure_reply(inbound, error)
        else:
            reply = None if inbound.is_notification else ResultOut(id=inbound.id, result=result)
        if reply is None:
            self._deferred_slots.release()
            return
        data = self._encode_reply(reply)
        try:
            if self._enqueue_nowait(data):
                self._deferred_slots.release()
                return
        except PeerClosed:
            self._deferred_slots.release()
            self._log.info("jsonrpc.reply.undeliverable", id=reply.id)
            return
        if self._nursery is None:
            # The peer is not running (it stopped): nothing can carry the answer now.
            self._deferred_slots.release()
            self._log.warning("jsonrpc.reply.undeliverable", id=reply.id, why="peer-stopped")
            return
        self._nursery.start_soon(self._send_encoded, reply.id, data)

    async def _send_encoded(self, reply_id: RequestId | None, data: bytes) -> None:
        try:
            await self._enqueue(data)
        except PeerClosed:
            self._log.info("jsonrpc.reply.undeliverable", id=reply_id)
        finally:
            self._deferred_slots.release()

    async def _answer_failure(self, inbound: Inbound, exc: Exception) -> None:
        reply = self._failure_reply(inbound, exc)
        if reply is not None:
            await self._reply(reply)

    def _failure_reply(self, inbound: Inbound, exc: Exception) -> ErrorOut | None:
        """The error answer to ``inbound`` (None for a notification: logged instead)."""
        if isinstance(exc, RpcError):
            if inbound.is_notification:
                self._log.warning("jsonrpc.notification.refused", method=inbound.method, code=exc.code, detail=exc.message)
                return None
            return ErrorOut(id=inbound.id, error=exc.to_object())
        self._counts["handler_failures"] += 1
        self._log.error("jsonrpc.handler.crashed", method=inbound.method, exc_info=exc)
        if inbound.is_notification:
            return None
        return ErrorOut(
            id=inbound.id,
            error=ErrorObject(code=INTERNAL_ERROR, message=f"Internal error handling {inbound.method}: {type(exc).__name__}"),
        )
