"""The handler's side of a peer: what a handler is given, what it may return, and a method table.

A :class:`~mcpl_router.jsonrpc.peer.Peer` calls one handler with each request or notification
the other side sent (an :class:`Inbound`); the handler returns the result, raises
:class:`~mcpl_router.jsonrpc.envelope.RpcError`, or returns a :class:`Deferred` whose answer
comes later. :class:`MethodTable` is the usual handler: method name to a function, the params
decoded into a typed Struct first. Apart from the peer because every module that serves methods
(the links, the host API, the test fixtures) uses these and none of them needs the peer's
queues, lanes or writer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar

import attrs
import msgspec
import trio

from mcpl_router.jsonrpc.envelope import INVALID_PARAMS, METHOD_NOT_FOUND, RequestId, RpcError, describe_decode_failure

__all__ = ["Deferred", "Deliver", "Handler", "Inbound", "LaneOf", "Later", "MethodTable"]

T = TypeVar("T")


class Inbound(msgspec.Struct, frozen=True):
    """A request or notification the other side sent us.

    A value, one per message read: a msgspec Struct, not attrs, for what a frozen attrs class's
    ``__init__`` costs on the hot path (docs/performance.md)."""

    method: str
    params: msgspec.Raw | None
    #: None for a notification; otherwise their id, echoed back verbatim.
    id: RequestId | None
    is_notification: bool
    #: What the peer's ``stamp`` hook returned as the message arrived (in the read loop, in
    #: byte order with the answers): e.g. the grant in force *at receipt*, for admission.
    stamp: object = None

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


#: How a pushed answer arrives: ``(result, None)`` or ``(None, the exception)``.
Deliver = Callable[[object, "Exception | None"], None]


class Later:
    """An answer pushed by whoever settles it (the journal's commit), on the trio thread.

    A :class:`Deferred` made with :meth:`Deferred.pushed` needs no task waiting for it: the
    peer subscribes and writes the reply as it is settled. Settled before anyone subscribed,
    it is kept and delivered at subscription. Settled once; later settles are ignored.
    """

    __slots__ = ("_deliver", "_error", "_result", "_settled")

    def __init__(self) -> None:
        self._deliver: Deliver | None = None
        self._settled = False
        self._result: object = None
        self._error: Exception | None = None

    def settle(self, result: object, error: Exception | None = None) -> None:
        if self._settled:
            return
        self._settled = True
        deliver, self._deliver = self._deliver, None
        if deliver is not None:
            deliver(result, error)
        else:
            self._result, self._error = result, error

    def subscribe(self, deliver: Deliver) -> None:
        if self._settled:
            result, error = self._result, self._error
            self._result = self._error = None
            deliver(result, error)
        else:
            self._deliver = deliver


class Deferred(msgspec.Struct, frozen=True):
    """A handler's answer that comes later: the lane moves on, the reply follows ``wait()``.

    Or, made with :meth:`pushed`, the answer is pushed to the peer when it is settled (no task
    per answer: the hot path's ``accepted``, answered by the thousand per commit).
    """

    wait: Callable[[], Awaitable[object]] | None = None
    #: The pushed form: subscribe a :data:`Deliver` (called once, on the trio thread).
    subscribe: Callable[[Deliver], None] | None = None

    @classmethod
    def pushed(cls, later: Later) -> Deferred:
        return cls(subscribe=later.subscribe)

    async def result(self) -> object:
        """Wait for the answer, in either form."""
        if self.wait is not None:
            return await self.wait()
        assert self.subscribe is not None
        done = trio.Event()
        box: list[tuple[object, Exception | None]] = []

        def answered(result: object, error: Exception | None) -> None:
            box.append((result, error))
            done.set()

        self.subscribe(answered)
        await done.wait()
        [(result, error)] = box
        if error is not None:
            raise error
        return result


Handler = Callable[[Inbound], Awaitable[object]]
LaneOf = Callable[[Inbound], Hashable]


@attrs.define
class _Method:
    handler: Callable[[Any, Inbound], Awaitable[object]]
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
        handler: Callable[[Any, Inbound], Awaitable[object]],
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

    async def __call__(self, inbound: Inbound) -> object:
        entry = self._methods.get(inbound.method)
        if entry is None:
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {inbound.method}")
        params = inbound.decode_params(entry.params_type) if entry.params_type is not None else inbound.params
        return await entry.handler(params, inbound)
