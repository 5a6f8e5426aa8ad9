"""Daemon→host requests a host serves: ``inference/request`` and ``model/info``.

The daemon asks a host to run inference for an MCPL server (a server's ``inference/request``,
forwarded) or to say which model an agent runs. A host registers a handler for each it serves:

    async def infer(request: InferenceRequest) -> dict:
        for index, piece in enumerate(("Hel", "lo")):
            await request.send_chunk({"index": index, "delta": piece})   # inference/chunk
        return {"content": "Hello", "model": "my-model", "finishReason": "end_turn"}

    client.serve_inference(infer)
    client.serve_model_info(lambda request: {"id": "my-model", "vendor": "me"})
    await client.hello("my-host", ["kai"])    # declares serves: {"inference": ["kai"], "modelInfo": ["kai"]}

An ``inference/cancel`` from the daemon (it stopped waiting: the deadline, or the server gone)
cancels that request's handler.

A handler returns the MCPL result (a dict, or anything msgspec encodes); raising
:class:`~mcpl_router.jsonrpc.RpcError` answers with that error; any other exception answers
-32603 (and is logged). A method no handler serves is answered -32601. Each request runs in its
own task, so a long inference never holds the wakes and notices arriving meanwhile.
"""

from __future__ import annotations

import inspect
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import attrs
import msgspec
import trio

from mcpl_router.jsonrpc import METHOD_NOT_FOUND, Inbound, RpcError

__all__ = [
    "FORK_SPAWN",
    "ForkSpawnHandler",
    "ForkSpawnRequest",
    "INFERENCE_CHUNK",
    "INFERENCE_REQUEST",
    "MODEL_INFO",
    "SERVED_METHODS",
    "HostRequests",
    "InferenceHandler",
    "InferenceRequest",
    "ModelInfoHandler",
    "ModelInfoRequest",
]

INFERENCE_REQUEST: Final = "inference/request"
MODEL_INFO: Final = "model/info"
INFERENCE_CHUNK: Final = "inference/chunk"
#: The daemon gave up on an inference request (``{requestId, reason}``): stop working on it.
INFERENCE_CANCEL: Final = "inference/cancel"
#: The answer to a request the daemon cancelled (JSON-RPC's "request cancelled"; nobody reads it).
REQUEST_CANCELLED: Final = -32800
#: A conversation fork to make (docs/forks.md): answer once the fork agent is declared.
FORK_SPAWN: Final = "fork/spawn"
#: The daemon→host requests a client can serve (run in their own tasks by the peer).
SERVED_METHODS: Final = frozenset({INFERENCE_REQUEST, MODEL_INFO, FORK_SPAWN})

ChunkSender = Callable[[str, Any], Awaitable[None]]
#: Sends a notification on the connection (``Peer.notify``).
Notify = Callable[[str, Any], Awaitable[None]]


class _InferenceParams(msgspec.Struct, rename="camel"):
    request_id: str
    agent: str
    server_id: str | None = None
    stream: bool = False
    request: Any = None


class _ModelInfoParams(msgspec.Struct, rename="camel"):
    request_id: str
    agent: str
    server_id: str | None = None


@attrs.frozen
class InferenceRequest:
    """An ``inference/request`` from the daemon: run ``request`` (MCPL inference params) for
    ``agent`` on behalf of ``server_id``. With ``stream``, send chunks while working."""

    request_id: str
    agent: str
    server_id: str | None
    stream: bool
    request: Any
    _send: ChunkSender = attrs.field(repr=False, alias="send")

    async def send_chunk(self, chunk: Any) -> None:
        """``inference/chunk {requestId, chunk}`` for this request (before answering it)."""
        await self._send(self.request_id, chunk)


@attrs.frozen
class ModelInfoRequest:
    """A ``model/info`` from the daemon: which model ``agent`` runs (answer MCPL's model info)."""

    request_id: str
    agent: str
    server_id: str | None


class _ForkSpawnParams(msgspec.Struct, rename="camel"):
    agent: str
    fork: str
    home: dict[str, str]
    template: str
    generation: int = 0


@attrs.frozen
class ForkSpawnRequest:
    """A ``fork/spawn`` from the daemon: make agent ``fork`` from ``template`` for ``agent``'s
    conversation in ``home`` (``{serverId, channelId}``), declare it in ``session/hello`` on
    this connection, then answer."""

    agent: str
    fork: str
    home: dict[str, str]
    template: str
    generation: int


InferenceHandler = Callable[[InferenceRequest], Awaitable[Any]]
ForkSpawnHandler = Callable[[ForkSpawnRequest], Awaitable[Any]]
#: A model-info handler may be a plain function or a coroutine function.
ModelInfoHandler = Callable[[ModelInfoRequest], Any]


class HostRequests:
    """The handlers a client registered, and what answering with them has counted."""

    def __init__(self, notify: Notify) -> None:
        self._notify = notify
        self._inference: InferenceHandler | None = None
        self._model_info: ModelInfoHandler | None = None
        self._fork_spawn: ForkSpawnHandler | None = None
        self.served: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.unhandled: Counter[str] = Counter()
        self.chunks_sent = 0
        #: Each inference in progress, by requestId: ``inference/cancel`` stops its handler.
        self._running: dict[str, trio.CancelScope] = {}
        self.cancelled = 0

    def cancel(self, params: Any) -> bool:
        """``inference/cancel {requestId, reason}``: the daemon no longer waits for that request
        (its deadline passed, or its server went away): its handler is cancelled."""
        request_id = params.get("requestId") if isinstance(params, dict) else None
        scope = self._running.get(request_id) if isinstance(request_id, str) else None
        if scope is None:
            return False
        scope.cancel()
        self.cancelled += 1
        return True

    async def send_chunk(self, request_id: str, chunk: Any) -> None:
        """``inference/chunk {requestId, chunk}``: part of a streamed inference's answer."""
        await self._notify(INFERENCE_CHUNK, {"requestId": request_id, "chunk": chunk})
        self.chunks_sent += 1

    def serve_inference(self, handler: InferenceHandler | None) -> None:
        self._inference = handler

    def serve_model_info(self, handler: ModelInfoHandler | None) -> None:
        self._model_info = handler

    def serve_fork_spawn(self, handler: ForkSpawnHandler | None) -> None:
        self._fork_spawn = handler

    @property
    def serves(self) -> list[str]:
        """The methods served now."""
        served = []
        if self._inference is not None:
            served.append(INFERENCE_REQUEST)
        if self._model_info is not None:
            served.append(MODEL_INFO)
        if self._fork_spawn is not None:
            served.append(FORK_SPAWN)
        return served

    def serves_for(self, agents: Sequence[str]) -> dict[str, list[str]]:
        """``session/hello``'s ``serves`` for ``agents``: the agents whose model this host
        serves, per kind (``inference``, ``modelInfo``); empty when it serves nothing."""
        declared: dict[str, list[str]] = {}
        if self._inference is not None:
            declared["inference"] = list(agents)
        if self._model_info is not None:
            declared["modelInfo"] = list(agents)
        return declared

    async def __call__(self, inbound: Inbound) -> Any:
        """Answer one daemon→host request (the peer sends what this returns, or the error)."""
        method = inbound.method
        try:
            if method == INFERENCE_REQUEST and self._inference is not None:
                params = inbound.decode_params(_InferenceParams)
                request = InferenceRequest(
                    params.request_id, params.agent, params.server_id, params.stream, params.request, send=self.send_chunk
                )
                with trio.CancelScope() as scope:
                    self._running[params.request_id] = scope
                    try:
                        result = await self._inference(request)
                    finally:
                        self._running.pop(params.request_id, None)
                if scope.cancelled_caught:
                    raise RpcError(REQUEST_CANCELLED, f"Cancelled: the daemon stopped waiting for {params.request_id}.")
            elif method == MODEL_INFO and self._model_info is not None:
                info = inbound.decode_params(_ModelInfoParams)
                result = self._model_info(ModelInfoRequest(info.request_id, info.agent, info.server_id))
                if inspect.isawaitable(result):
                    result = await result
            elif method == FORK_SPAWN and self._fork_spawn is not None:
                spawn = inbound.decode_params(_ForkSpawnParams)
                result = await self._fork_spawn(ForkSpawnRequest(spawn.agent, spawn.fork, spawn.home, spawn.template, spawn.generation))
                result = {"fork": spawn.fork} if result is None else result
            else:
                self.unhandled[method] += 1
                raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method} (this host serves {', '.join(self.serves) or 'nothing'})")
        except RpcError:
            if method in self.serves:
                self.failed[method] += 1
            raise
        except Exception:
            self.failed[method] += 1
            raise
        self.served[method] += 1
        return result
