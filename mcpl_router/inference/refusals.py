"""What a server is told when its ``inference/request`` or ``model/info`` is not answered.

Each refusal is a JSON-RPC error with a stable ``data.reason`` (docs/errors.md) and a message
that says what was not done and what would work. A server not granted the capability never
gets here: the link refuses it -32002 at admission (``mcpl_router.mcpl.link``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

from mcpl_router.jsonrpc import RpcError

__all__ = [
    "HOST_ERROR",
    "HOST_GONE",
    "NO_HOST",
    "RATE_LIMITED",
    "TIMEOUT",
    "TOO_LARGE",
    "TOO_MANY_CONCURRENT",
    "ChunkDrop",
    "InferenceRefusal",
    "refusal",
]

#: No host connection serves the configured agent's model now.
NO_HOST: Final = -32060
#: The serving host's connection closed before it answered.
HOST_GONE: Final = -32061
#: The host did not answer within the server's ``inference.timeout``.
TIMEOUT: Final = -32062
#: The server already has ``inference.maxConcurrent`` requests in flight.
TOO_MANY_CONCURRENT: Final = -32063
#: The server asked more than ``inference.perMinute`` times in the last 60 s.
RATE_LIMITED: Final = -32064
#: The request's params are larger than ``inference.maxRequestBytes``.
TOO_LARGE: Final = -32065
#: The host answered with an error, or with something that is not a result object.
HOST_ERROR: Final = -32066


class InferenceRefusal(enum.StrEnum):
    """Why a server's ``inference/request`` or ``model/info`` was not answered: the value is the
    error's ``data.reason`` and the ``/metrics`` label, :func:`refusal` says it in words."""

    NO_HOST = "no-host"
    HOST_GONE = "host-gone"
    TIMEOUT = "timeout"
    TOO_MANY_CONCURRENT = "too-many-concurrent"
    RATE_LIMITED = "rate-limited"
    TOO_LARGE = "too-large"
    HOST_ERROR = "host-error"

    @property
    def code(self) -> int:
        """The JSON-RPC error code that carries this refusal."""
        return _CODES[self]


class ChunkDrop(enum.StrEnum):
    """Why a host's ``inference/chunk`` was dropped (logged, and the chunk counter's ``outcome``)."""

    UNKNOWN_REQUEST = "unknown-request"
    NOT_ASKED = "not-asked"
    NOT_STREAMING = "not-streaming"
    SERVER_GONE = "server-gone"


_CODES: Final[Mapping[InferenceRefusal, int]] = {
    InferenceRefusal.NO_HOST: NO_HOST,
    InferenceRefusal.HOST_GONE: HOST_GONE,
    InferenceRefusal.TIMEOUT: TIMEOUT,
    InferenceRefusal.TOO_MANY_CONCURRENT: TOO_MANY_CONCURRENT,
    InferenceRefusal.RATE_LIMITED: RATE_LIMITED,
    InferenceRefusal.TOO_LARGE: TOO_LARGE,
    InferenceRefusal.HOST_ERROR: HOST_ERROR,
}


def refusal(reason: InferenceRefusal, method: str, **facts: object) -> RpcError:
    """The error for refusing ``method`` for ``reason``, worded with ``facts``."""
    what = "No inference was run" if method == "inference/request" else "No model information was given"
    agent = facts.get("agent")
    if reason is InferenceRefusal.NO_HOST:
        text = (f"{what}: no host serves agent {agent!r}'s model now (the host that owns it has not "
                "declared it in session/hello's serves, or is not connected). Ask again once it is.")
    elif reason is InferenceRefusal.HOST_GONE:
        text = f"{what}: the host serving agent {agent!r} disconnected before it answered. Ask again later."
    elif reason is InferenceRefusal.TIMEOUT:
        text = f"{what}: the host serving agent {agent!r} did not answer within {facts['timeout']:g} s."
    elif reason is InferenceRefusal.TOO_MANY_CONCURRENT:
        text = (f"{what}: this server already has {facts['limit']} requests in flight (its maxConcurrent). "
                "Wait for one to finish.")
    elif reason is InferenceRefusal.RATE_LIMITED:
        text = (f"{what}: this server asked {facts['limit']} times in the last minute (its perMinute). "
                f"Ask again in {facts['retryAfter']:.1f} s.")
    elif reason is InferenceRefusal.TOO_LARGE:
        text = (f"{what}: the request is {facts['size']} bytes, over this server's maxRequestBytes "
                f"({facts['limit']}). Send less.")
    else:
        text = f"{what}: the host serving agent {agent!r} failed it ({facts.get('detail', 'no detail')})."
    return RpcError(reason.code, text, {"reason": reason.value, **facts})
