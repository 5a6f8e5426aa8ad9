"""JSON-RPC 2.0 envelopes as msgspec Structs, decoded straight from bytes.

``params`` and ``result`` stay :class:`msgspec.Raw` in the envelope: the method's own typed
Struct decodes them later, so a bad field is reported as -32602 with its path, and the envelope
itself costs one pass over the bytes.
"""

from __future__ import annotations

import json
import sys

import msgspec

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# Implementation-defined server error, reserved: a full queue is backpressure now, never this
# refusal (docs/errors.md), but the code stays taken so no other meaning can reuse it.
OVERLOADED = -32000

RequestId = int | str


class ErrorObject(msgspec.Struct, omit_defaults=True):
    code: int
    message: str
    data: object = None


class Envelope(msgspec.Struct, omit_defaults=True):
    """Any JSON-RPC 2.0 message; which kind it is follows from the members present."""

    jsonrpc: str | msgspec.UnsetType = msgspec.UNSET
    id: int | str | None | msgspec.UnsetType = msgspec.UNSET
    method: str | msgspec.UnsetType = msgspec.UNSET
    params: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    result: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    error: ErrorObject | msgspec.UnsetType = msgspec.UNSET


# Outgoing shapes. ``jsonrpc`` must always be written, so these don't use ``omit_defaults``;
# an absent ``params`` is UNSET, which msgspec never writes.
class RequestOut(msgspec.Struct):
    id: RequestId
    method: str
    params: object = msgspec.UNSET
    jsonrpc: str = "2.0"


class NotificationOut(msgspec.Struct):
    method: str
    params: object = msgspec.UNSET
    jsonrpc: str = "2.0"


class ResultOut(msgspec.Struct):
    #: The request's id echoed back: ``null`` when the request's own id was ``null``.
    id: RequestId | None
    result: object
    jsonrpc: str = "2.0"


class ErrorOut(msgspec.Struct):
    # ``id`` is null when the request's id could not be read (JSON-RPC 2.0 §5).
    id: RequestId | None
    error: ErrorObject
    jsonrpc: str = "2.0"


class RpcError(Exception):
    """A JSON-RPC error: raised by a handler to answer with it, or by ``Peer.request`` on one."""

    def __init__(self, code: int, message: str, data: object = None) -> None:
        super().__init__(code, message, data)
        self.code = code
        self.message = message
        self.data = data

    def to_object(self) -> ErrorObject:
        return ErrorObject(code=self.code, message=self.message, data=self.data)

    def __str__(self) -> str:
        return f"JSON-RPC error {self.code}: {self.message}"


_envelope_decoder = msgspec.json.Decoder(Envelope)

#: JSON nested deeper than this is refused. The decoder recurses once per level, so the bound
#: is the interpreter's recursion limit less the stack already in use; the message says so.
MAX_NESTING_HINT = sys.getrecursionlimit() - 100
_TOO_DEEP = f"JSON nested too deeply (the limit is about {MAX_NESTING_HINT} levels of arrays and objects)."


def describe_decode_failure(data: bytes, exc: BaseException) -> str:
    """Say what is wrong with bytes the decoder refused, naming the field when it can.

    Only on the error path: finding the field re-reads the bytes leniently.
    """
    if isinstance(exc, RecursionError):
        return _TOO_DEEP
    if "UTF-8" in str(exc):
        path = _invalid_utf8_path(data)
        where = f" at {path}" if path else ""
        return f"invalid UTF-8{where} (JSON text must be UTF-8)."
    return str(exc)


def _invalid_utf8_path(data: bytes) -> str | None:
    # surrogateescape turns each bad byte into a lone surrogate that the stdlib JSON parser
    # carries through; the first string holding one is the field to name.
    try:
        value = json.loads(data.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError):
        return None

    def bad(text: str) -> bool:
        return any("\udc80" <= char <= "\udcff" for char in text)

    def walk(node: object, path: str) -> str | None:
        if isinstance(node, str):
            return path if bad(node) else None
        if isinstance(node, list):
            for index, item in enumerate(node):
                found = walk(item, f"{path}[{index}]")
                if found:
                    return found
        if isinstance(node, dict):
            for key, item in node.items():
                if bad(key):
                    return f"{path}.<key>" if path else "<key>"
                found = walk(item, f"{path}.{key}" if path else key)
                if found:
                    return found
        return None

    try:
        return walk(value, "")
    except RecursionError:
        return None
_encoder = msgspec.json.Encoder()
_UNSET = msgspec.UNSET


def encode(message: RequestOut | NotificationOut | ResultOut | ErrorOut) -> bytes:
    return _encoder.encode(message)


class EnvelopeProblem(Exception):
    """Bytes that are not a valid JSON-RPC 2.0 message; carries the error to answer with."""

    def __init__(self, error: RpcError, reply_id: RequestId | None, answerable: bool) -> None:
        super().__init__(error.message)
        self.error = error
        self.reply_id = reply_id
        # False for a malformed notification-shaped message: JSON-RPC forbids answering those.
        self.answerable = answerable


def decode_envelope(data: bytes) -> Envelope:
    """Decode one message, or raise :class:`EnvelopeProblem` naming the error to answer."""
    try:
        envelope = _envelope_decoder.decode(data)
    except msgspec.ValidationError as exc:
        # Valid JSON of the wrong shape: an invalid request. Answer with its id when readable.
        stripped = data.lstrip()
        if stripped[:1] == b"[":
            raise EnvelopeProblem(
                RpcError(INVALID_REQUEST, "Batch requests are not supported; send one message at a time."),
                None,
                True,
            ) from exc
        raise EnvelopeProblem(
            RpcError(INVALID_REQUEST, f"Invalid request: {exc}"), _salvage_id(data), True
        ) from exc
    except msgspec.DecodeError as exc:
        raise EnvelopeProblem(RpcError(PARSE_ERROR, f"Parse error: {exc}"), None, True) from exc
    except RecursionError as exc:
        raise EnvelopeProblem(
            RpcError(INVALID_REQUEST, f"Invalid request: {_TOO_DEEP}"), None, True
        ) from exc
    method, result, error = envelope.method, envelope.result, envelope.error
    if envelope.jsonrpc == "2.0" and (
        (result is _UNSET and error is _UNSET) if method is not _UNSET else ((result is _UNSET) is not (error is _UNSET))
    ):
        # Well formed (every message but a broken peer's): a method alone, or exactly one of a
        # result and an error. The checks below say what is wrong with the rest.
        return envelope
    if envelope.jsonrpc != "2.0":
        raise EnvelopeProblem(
            RpcError(INVALID_REQUEST, 'Invalid request: "jsonrpc" must be "2.0".'),
            envelope.id if isinstance(envelope.id, (int, str)) else None,
            envelope.id is not msgspec.UNSET or envelope.method is msgspec.UNSET,
        )
    has_method = envelope.method is not msgspec.UNSET
    has_outcome = envelope.result is not msgspec.UNSET or envelope.error is not msgspec.UNSET
    if has_method and has_outcome:
        raise EnvelopeProblem(
            RpcError(INVALID_REQUEST, "Invalid request: a message has either a method or a result/error, not both."),
            envelope.id if isinstance(envelope.id, (int, str)) else None,
            True,
        )
    if not has_method and not has_outcome:
        raise EnvelopeProblem(
            RpcError(INVALID_REQUEST, "Invalid request: no method, result or error."),
            envelope.id if isinstance(envelope.id, (int, str)) else None,
            True,
        )
    if envelope.result is not msgspec.UNSET and envelope.error is not msgspec.UNSET:
        raise EnvelopeProblem(
            RpcError(INVALID_REQUEST, "Invalid response: both result and error."), None, False
        )
    return envelope


def _salvage_id(data: bytes) -> RequestId | None:
    try:
        loose = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        return None
    if isinstance(loose, dict):
        candidate = loose.get("id")
        if isinstance(candidate, (int, str)) and not isinstance(candidate, bool):
            return candidate
    return None
