"""The host listener's WebSocket: one JSON-RPC message per text frame, bearer-token auth.

Loopback by default. The handshake must carry ``Authorization: Bearer <token>`` (see
:mod:`mcpl_router.hosts.auth`); a missing or wrong token is answered HTTP 401 and the
connection never reaches the API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import trio
import trio_websocket

from mcpl_router.config import WebSocketListenConfig
from mcpl_router.hosts.admission import PatientListener
from mcpl_router.hosts.auth import HostAuthError, bearer_matches, resolve_token
from mcpl_router.hosts.listener import serve_host_stream
from mcpl_router.jsonrpc import WebSocketMessageStream
from mcpl_router.jsonrpc.framing import DEFAULT_MAX_MESSAGE_BYTES
from mcpl_router.logs import get_logger

if TYPE_CHECKING:
    from mcpl_router.config import HostConfig
    from mcpl_router.hosts.services import HostServices

# Bounded so a client that never finishes its handshake or close can't hold a task for long.
_CONNECT_TIMEOUT = 10.0
_DISCONNECT_TIMEOUT = 5.0


def prepare_websocket(host: HostConfig, websocket: WebSocketListenConfig) -> str:
    """Check the bind and get the token, before anything listens.

    Raises:
        HostAuthError: a non-loopback bind without a token, or no usable token.
    """
    if not websocket.loopback and not host.allow_non_loopback:
        raise HostAuthError(
            f"host.websocket.bind {websocket.bind!r} is not a loopback address and host.allowNonLoopback "
            "is false: refusing to listen. Bind 127.0.0.1, or set allowNonLoopback and a token."
        )
    if not websocket.loopback and not (host.token or host.token_file):
        raise HostAuthError(
            f"host.websocket.bind {websocket.bind!r} is not a loopback address and no token is configured: "
            "refusing to listen. Give host.token or host.tokenFile."
        )
    return resolve_token(host, websocket)


async def serve_websocket(
    services: HostServices,
    websocket: WebSocketListenConfig,
    token: str,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen until cancelled; ``task_status.started`` gets the URL with the bound port."""
    log = get_logger(transport="websocket")

    async def handle(request: trio_websocket.WebSocketRequest) -> None:
        path = urlsplit(request.path).path
        if path != websocket.path:
            log.warning("host.websocket.rejected", reason="wrong path", path=path)
            await request.reject(404, body=f"not found: the host API is at {websocket.path}".encode())
            return
        if not bearer_matches(request.headers, token):
            # Never log what was offered: it may be a real credential.
            log.warning("host.websocket.rejected", reason="missing or wrong bearer token", status=401)
            await request.reject(401, body=b"unauthorized: send Authorization: Bearer <token> (see host.tokenFile)")
            return
        admission = services.admission
        refused = admission.admit("websocket")
        if refused is not None:
            await request.reject(503, body=f"busy: {refused} (host.maxConnections or host.maxBufferedBytes)".encode())
            return
        try:
            connection = await request.accept()
            await serve_host_stream(services, WebSocketMessageStream(connection), transport="websocket")
        finally:
            admission.release("websocket")

    listeners = await trio.open_tcp_listeners(websocket.port, host=websocket.bind)
    # Accepts wait out a lack of descriptors (hosts/admission.py) instead of logging a
    # traceback per attempt.
    server = trio_websocket.WebSocketServer(
        handle,
        [PatientListener(listener, services.admission) for listener in listeners],  # type: ignore[misc]
        max_message_size=DEFAULT_MAX_MESSAGE_BYTES,
        connect_timeout=_CONNECT_TIMEOUT,
        disconnect_timeout=_DISCONNECT_TIMEOUT,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        host = websocket.bind if ":" not in websocket.bind else f"[{websocket.bind}]"
        port = listeners[0].socket.getsockname()[1]
        url = f"ws://{host}:{port}{websocket.path}"
        log.info("host.websocket.listening", url=url)
        task_status.started(url)


__all__ = ["HostAuthError", "prepare_websocket", "serve_websocket"]
