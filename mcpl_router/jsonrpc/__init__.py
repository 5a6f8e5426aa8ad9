"""JSON-RPC 2.0 on msgspec: envelopes, framing (ndjson and WebSocket), and the :class:`Peer`.

One layer serves both the server links and the host socket. Why not ``jsonrpcserver``:
``docs/decisions/0001-jsonrpc-on-msgspec.md``.
"""

from mcpl_router.jsonrpc.envelope import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    ErrorObject,
    RpcError,
)
from mcpl_router.jsonrpc.framing import (
    MessageStream,
    NdjsonStream,
    OversizedMessage,
    WebSocketMessageStream,
)
from mcpl_router.jsonrpc.peer import (
    Deferred,
    Inbound,
    MethodTable,
    Peer,
    PeerClosed,
    PeerLimits,
    RequestTimeout,
)

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "Deferred",
    "ErrorObject",
    "Inbound",
    "MessageStream",
    "MethodTable",
    "NdjsonStream",
    "OversizedMessage",
    "Peer",
    "PeerClosed",
    "PeerLimits",
    "RequestTimeout",
    "RpcError",
    "WebSocketMessageStream",
]
