"""Open a framed connection to one MCPL server: spawn over stdio, dial TCP, or dial WebSocket.

Each call opens one transport *epoch*; the link opens a new one on every reconnect. Secrets
(a WebSocket token) go into the handshake header, or the ``?token=`` query connectome-host uses
(``tokenIn``), and never into a log line or an error text.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlencode, urlsplit, urlunsplit

import attrs
import trio
import trio_websocket

from mcpl_router.errors import leaf_exceptions
from mcpl_router.jsonrpc.framing import DEFAULT_MAX_MESSAGE_BYTES, MessageStream, NdjsonStream, WebSocketMessageStream
from mcpl_router.logs import get_logger

if TYPE_CHECKING:
    from mcpl_router.config import ServerConfig

# stdin close → this grace → SIGTERM → this grace → SIGKILL (DESIGN §3, Cancellation).
STDIO_EXIT_GRACE = 2.0
STDIO_TERM_GRACE = 3.0
WEBSOCKET_CONNECT_TIMEOUT = 10.0
# A blackholed address would otherwise hold the link in "connecting" for the kernel's SYN
# timeout (minutes).
TCP_CONNECT_TIMEOUT = 10.0
# A WebSocket close handshake waits for the peer's reply; after a cancel nobody reads it, and
# trio-websocket would wait 60 s under our shield. So every stream close has a short deadline.
_STREAM_CLOSE_GRACE = 1.0
_STDERR_LINE_LIMIT = 4000
#: The last stderr lines of a stdio child kept for ``status`` (why did it exit?).
STDERR_TAIL_LINES = 10


class TransportError(Exception):
    """The transport could not be opened; the message is safe to log (no secrets).

    ``status`` is the HTTP status of a refused WebSocket handshake, when there was one.
    """

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@attrs.define
class OpenTransport:
    stream: MessageStream
    #: For logs and status: the command's name, or the URL without credentials.
    description: str
    process: trio.Process | None = None
    #: The byte stream under a WebSocket: trio-websocket leaves it open when the server closed
    #: first and its reader was cancelled, so we close it ourselves.
    socket: trio.abc.AsyncResource | None = None
    #: A stdio child's last stderr lines, newest last (bounded).
    stderr_tail: collections.deque[str] = attrs.field(factory=lambda: collections.deque(maxlen=STDERR_TAIL_LINES))

    async def aclose(self) -> None:
        """Close the stream; for a child process, stop it politely, then firmly."""
        with trio.CancelScope(shield=True):
            with trio.move_on_after(_STREAM_CLOSE_GRACE):
                await self.stream.aclose()
            if self.socket is not None:
                await trio.aclose_forcefully(self.socket)
            if self.process is not None:
                await stop_process(self.process)


async def stop_process(process: trio.Process) -> None:
    """stdin is closed already (servers exit on EOF); then SIGTERM, then SIGKILL.

    Signals go to the child's whole process group (it was started in a session of its own), so
    a wrapper (``sh -c …``, ``npx …``) can't leave its own children running.
    """
    with trio.CancelScope(shield=True):
        with trio.move_on_after(STDIO_EXIT_GRACE):
            await process.wait()
            return
        _signal_group(process, signal.SIGTERM)
        with trio.move_on_after(STDIO_TERM_GRACE):
            await process.wait()
            return
        _signal_group(process, signal.SIGKILL)
        await process.wait()


def _signal_group(process: trio.Process, signum: int) -> None:
    if process.returncode is not None:
        return
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        # The group is gone (or was never ours): signal the child itself.
        try:
            process.send_signal(signum)
        except ProcessLookupError:
            pass


def child_environment(config: ServerConfig, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a stdio child gets (see :meth:`ServerConfig.spawn_env`)."""
    return config.spawn_env(os.environ if environ is None else environ)


def safe_url(url: str) -> str:
    """The URL without userinfo, query or fragment, which may carry a credential."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


async def open_transport(
    config: ServerConfig, nursery: trio.Nursery, *, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
) -> OpenTransport:
    """Open one epoch's transport. Background tasks (stderr pump, websocket reader) go in ``nursery``."""
    if config.transport == "stdio":
        return await _spawn_stdio(config, nursery, max_message_bytes)
    if config.transport == "tcp":
        return await _dial_tcp(config, max_message_bytes)
    if config.transport == "websocket":
        return await _dial_websocket(config, nursery, max_message_bytes)
    raise TransportError(f"unknown transport {config.transport!r}")


async def _spawn_stdio(config: ServerConfig, nursery: trio.Nursery, max_message_bytes: int) -> OpenTransport:
    command = config.command
    assert command is not None, "the config reader requires a command for a stdio server"
    argv = [command, *config.args]
    if config.cwd is not None and not config.cwd.is_dir():
        # Otherwise exec reports ENOENT and the message blames the command.
        raise TransportError(f"the working directory {str(config.cwd)!r} (mcplServers.{config.id}.cwd) does not exist")
    try:
        process = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_environment(config),
            cwd=config.cwd,
            # Our own process group, so a Ctrl-C in the terminal reaches the daemon, which then
            # stops the child in order, instead of every child dying at once mid-write.
            start_new_session=True,
        )
    except OSError as exc:
        raise TransportError(
            f"could not start {config.command!r} (mcplServers.{config.id}.command): {exc.strerror or exc}. "
            "Install it or give its full path (mcpl-router check-config checks this)"
        ) from exc
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    stream = NdjsonStream(process.stdin, process.stdout, max_message_bytes=max_message_bytes)
    transport = OpenTransport(stream=stream, description=os.path.basename(command), process=process)
    nursery.start_soon(_pump_stderr, process.stderr, config.id, transport.stderr_tail)
    return transport


async def _pump_stderr(stderr: trio.abc.ReceiveStream, server_id: str, tail: collections.deque[str]) -> None:
    """Log each stderr line of a child with its server id (stderr is the server's log), and
    keep the last few for ``status``."""
    log = get_logger(server=server_id)
    lines = NdjsonStream(None, stderr, max_message_bytes=_STDERR_LINE_LIMIT)
    while True:
        try:
            line = await lines.receive_message()
        except (trio.EndOfChannel, trio.ClosedResourceError, trio.BrokenResourceError):
            return
        except Exception as exc:  # an over-long line: note it and keep reading
            log.info("server.stderr.skipped", reason=str(exc))
            continue
        text = line.decode("utf-8", "replace")
        tail.append(text)
        log.info("server.stderr", line=text)


async def _dial_tcp(config: ServerConfig, max_message_bytes: int) -> OpenTransport:
    assert config.host is not None and config.port is not None, "the config reader requires host and port for tcp"
    try:
        with trio.fail_after(TCP_CONNECT_TIMEOUT):
            stream = await trio.open_tcp_stream(config.host, config.port)
    except trio.TooSlowError:
        raise TransportError(f"could not connect to tcp://{config.host}:{config.port}: no answer within {TCP_CONNECT_TIMEOUT:g}s") from None
    except OSError as exc:
        raise TransportError(f"could not connect to tcp://{config.host}:{config.port}: {exc.strerror or exc}") from exc
    return OpenTransport(
        stream=NdjsonStream(stream, stream, max_message_bytes=max_message_bytes),
        description=f"tcp://{config.host}:{config.port}",
    )


async def _dial_websocket(config: ServerConfig, nursery: trio.Nursery, max_message_bytes: int) -> OpenTransport:
    """Dial with the token in the header, or as ``?token=`` when ``tokenIn = "query"``.

    connectome-host sends a WebSocket server's token as ``?token=`` and the servers written for
    it read it there (``query`` is the default only in its mcpl-servers.json). With ``tokenIn =
    "header"`` (the default) the token is never in a URL. With ``"auto"`` the link passes the
    place it learned (see ``ServerLink``): the header, after a 401/403 the query once, and the
    header again for good if that is refused too, so a server that reads the header gets the
    token in a URL (its access logs) at most once.
    """
    place = "query" if config.token_in == "query" else "header"
    return await _dial_websocket_once(config, nursery, max_message_bytes, token_place=place if config.token else None)


async def _dial_websocket_once(
    config: ServerConfig, nursery: trio.Nursery, max_message_bytes: int, *, token_place: str | None
) -> OpenTransport:
    headers: list[tuple[bytes, bytes]] = []
    if config.token and token_place == "header":
        headers.append((config.token_header.encode(), f"Bearer {config.token}".encode()))
    assert config.url is not None, "the config reader requires a url for a websocket server"
    shown = safe_url(config.url)
    parts = urlsplit(config.url)
    secure = parts.scheme == "wss"
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if secure else 80)
    query = parts.query
    if config.token and token_place == "query":
        query = "&".join(q for q in (query, urlencode({"token": config.token})) if q)
    resource = (parts.path or "/") + (f"?{query}" if query else "")
    # We open the byte stream ourselves (rather than connect_websocket_url) so that a refused
    # handshake can't leak the socket: whatever goes wrong, we close what we opened.
    stream: trio.abc.Stream | None = None
    try:
        with trio.fail_after(WEBSOCKET_CONNECT_TIMEOUT):
            if secure:
                stream = await trio.open_ssl_over_tcp_stream(host, port)
            else:
                stream = await trio.open_tcp_stream(host, port)
            connection = await trio_websocket.wrap_client_stream(
                nursery,
                stream,
                host if parts.port is None else f"{host}:{port}",
                resource,
                extra_headers=headers,
                max_message_size=max_message_bytes,
                message_queue_size=64,
            )
    except BaseException as exc:
        if stream is not None:
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(stream)
        raise _websocket_failure(exc, shown) from None
    return OpenTransport(stream=WebSocketMessageStream(connection), description=shown, socket=stream)


def _websocket_failure(exc: BaseException, shown: str) -> BaseException:
    """A safe TransportError for a failed dial (no URL credentials), or ``exc`` if unrelated."""
    leaves = list(leaf_exceptions(exc))
    for leaf in leaves:
        if isinstance(leaf, trio.TooSlowError):
            return TransportError(f"websocket handshake with {shown} timed out after {WEBSOCKET_CONNECT_TIMEOUT:g}s")
        if isinstance(leaf, trio_websocket.HandshakeError):
            status = getattr(getattr(leaf, "response", None), "status_code", None)
            return TransportError(f"websocket handshake with {shown} refused (status {status})", status=status)
        if isinstance(leaf, trio_websocket.ConnectionRejected):
            return TransportError(f"websocket handshake with {shown} refused (status {leaf.status_code})", status=leaf.status_code)
        if isinstance(leaf, (OSError, trio.BrokenResourceError)):
            return TransportError(f"could not connect to {shown}: {getattr(leaf, 'strerror', None) or leaf}")
    return exc
