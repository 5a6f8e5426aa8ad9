"""The client's transports: the daemon's Unix socket (ndjson) and its WebSocket (``ws://``
or ``wss://``), each opened as a framed :class:`~mcpl_router.jsonrpc.MessageStream`.

``wss://`` verifies the daemon's certificate against the system's CAs by default (and its host
name); ``ca_file`` names another CA bundle (a self-signed deployment's), ``ssl_context`` replaces
the context altogether. Verification is never turned off here: a context that doesn't verify
must be built, and passed, on purpose.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import trio
import trio_websocket

from mcpl_router.jsonrpc import MessageStream, NdjsonStream, WebSocketMessageStream

__all__ = ["client_ssl_context", "open_unix_stream", "open_websocket_stream"]

_DEFAULT_PORTS = {"ws": 80, "wss": 443}


def client_ssl_context(ca_file: str | Path | None = None) -> ssl.SSLContext:
    """A TLS client context that verifies the server's certificate and host name:
    against ``ca_file`` when given, else the system's CAs."""
    return ssl.create_default_context(cafile=None if ca_file is None else str(ca_file))


@contextlib.asynccontextmanager
async def open_unix_stream(path: str | Path) -> AsyncIterator[MessageStream]:
    stream = await trio.open_unix_socket(str(path))
    try:
        yield NdjsonStream(stream, stream)
    finally:
        with trio.CancelScope(shield=True):
            await stream.aclose()


@contextlib.asynccontextmanager
async def open_websocket_stream(
    url: str,
    token: str | None,
    *,
    timeout: float,
    ssl_context: ssl.SSLContext | None = None,
    ca_file: str | Path | None = None,
) -> AsyncIterator[MessageStream]:
    """The daemon's WebSocket at ``url`` with a bearer token; closed on every path.

    Raises:
        ValueError: ``url`` is not ``ws://`` or ``wss://`` (or TLS options with ``ws://``).
        trio_websocket.ConnectionRejected: the daemon refused the handshake (401: wrong or
            missing token; its ``status_code`` says which HTTP status).
        ssl.SSLCertVerificationError: (``wss://``) the certificate did not verify.
    """
    parts = urlsplit(url)
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"{url!r} is not a ws:// or wss:// URL")
    secure = parts.scheme == "wss"
    if not secure and (ssl_context is not None or ca_file is not None):
        raise ValueError(f"{url!r} is ws://: ssl_context and ca_file are for wss:// URLs")
    default_port = _DEFAULT_PORTS[parts.scheme]
    port = parts.port or default_port
    resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host_header = parts.hostname if port == default_port else f"{parts.hostname}:{port}"
    headers = [] if token is None else [(b"Authorization", f"Bearer {token}".encode())]
    # Our own stream, not open_websocket_url: that one leaves the socket of a rejected
    # handshake open. This one is closed on every path.
    stream: trio.abc.Stream
    with trio.fail_after(timeout):
        if secure:
            context = ssl_context if ssl_context is not None else client_ssl_context(ca_file)
            tls = await trio.open_ssl_over_tcp_stream(parts.hostname, port, ssl_context=context, https_compatible=True)
            stream = tls
            try:
                await tls.do_handshake()
            except BaseException as exc:
                with trio.CancelScope(shield=True):
                    await trio.aclose_forcefully(tls)
                # trio reports a failed handshake as a broken stream; the TLS reason (a
                # certificate that didn't verify) is what the caller needs to see.
                if isinstance(exc, trio.BrokenResourceError) and isinstance(exc.__cause__, ssl.SSLError):
                    raise exc.__cause__ from None
                raise
        else:
            stream = await trio.open_tcp_stream(parts.hostname, port)
    failure: Exception | None = None
    try:
        async with trio.open_nursery() as nursery:
            with trio.fail_after(timeout):
                connection = await trio_websocket.wrap_client_stream(nursery, stream, host_header, resource, extra_headers=headers)
            try:
                yield WebSocketMessageStream(connection)
            except Exception as exc:
                failure = exc  # re-raised below, as raised: not inside an exception group
            finally:
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        rejected = group.subgroup((trio_websocket.ConnectionRejected, trio_websocket.HandshakeError))
        if rejected is not None and len(rejected.exceptions) == 1 and not isinstance(rejected.exceptions[0], BaseExceptionGroup):
            raise rejected.exceptions[0] from None
        raise
    finally:
        with trio.CancelScope(shield=True):
            await trio.aclose_forcefully(stream)
    if failure is not None:
        raise failure
