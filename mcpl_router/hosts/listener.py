"""The host listener's Unix socket: ndjson JSON-RPC, the socket 0600 inside a 0700 directory.

Filesystem permissions are the Unix socket's authentication: only the daemon's user can reach
it. A stale socket file (left by a crash) is removed at start; a live one is refused, so two
daemons never share a socket.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Hashable
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import trio

from mcpl_router.config.preflight import socket_directory_problem
from mcpl_router.config.read_daemon_sections import UNIX_SOCKET_MAX_BYTES
from mcpl_router.hosts.admission import ConnectionTimeout, PatientListener
from mcpl_router.hosts.api import host_methods
from mcpl_router.hosts.connection import HostConnection
from mcpl_router.inference import chunk_lane
from mcpl_router.jsonrpc import Inbound, MessageStream, NdjsonStream, Peer, PeerLimits
from mcpl_router.logs import get_logger

if TYPE_CHECKING:
    from mcpl_router.hosts.services import HostServices


class SocketSetupError(Exception):
    """The Unix socket can't be set up safely; the message says what to fix."""


def prepare_socket_path(path: str | os.PathLike[str]) -> Path:
    """Create the socket's directory 0700 (or check an existing one), remove a stale socket."""
    socket_path = Path(path)
    # Checked before the directory is made (a path that can't be made is said, not raised as
    # an OSError) and again after (the directory we found may not be the one now there).
    for _ in range(2):
        problem = socket_directory_problem(socket_path)
        if problem is not None:
            raise SocketSetupError(f"host.unixSocket {socket_path}: " + " ".join(problem))
        socket_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if socket_path.exists() or socket_path.is_symlink():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(socket_path))
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise
            socket_path.unlink(missing_ok=True)  # stale: nobody is listening
            get_logger().info("host.socket.stale_removed", path=str(socket_path))
        else:
            raise SocketSetupError(f"another daemon is listening on {socket_path}")
        finally:
            probe.close()
    return socket_path


async def serve_unix_socket(
    services: HostServices, path: str | os.PathLike[str], *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """Listen on ``path`` until cancelled; each connection is a host session."""
    socket_path, unix_listener = await open_unix_listener(path)
    listener = PatientListener(unix_listener, services.admission)
    log = get_logger(transport="unix")
    log.info("host.socket.listening", path=str(socket_path))
    try:
        async with trio.open_nursery() as nursery:
            task_status.started(str(socket_path))

            async def serve(stream: trio.SocketStream) -> None:
                await _serve_connection(services, stream)

            await trio.serve_listeners(serve, [listener], handler_nursery=nursery)
    finally:
        socket_path.unlink(missing_ok=True)


async def open_unix_listener(path: str | os.PathLike[str]) -> tuple[Path, trio.SocketListener]:
    """Prepare ``path`` (:func:`prepare_socket_path`) and listen there, the socket 0600.

    The daemon's host listener and a cluster standby's forwarding listener (cluster/host_proxy.py)
    bind the same address the same way. The caller closes the listener and removes the file.
    """
    socket_path = prepare_socket_path(path)
    listener_socket = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    try:
        await _bind_listening(listener_socket, socket_path)
    except BaseException:
        listener_socket.close()
        raise
    return socket_path, trio.SocketListener(listener_socket)


async def _bind_listening(listener_socket: trio.socket.SocketType, socket_path: Path) -> None:
    """Bind and listen so that ``socket_path`` never exists without accepting.

    The socket is bound and listening under a private name first, then hard-linked into place:
    a host that sees the file can connect (no refused window between bind and listen), and a
    second daemon that raced us to the path fails on the link rather than taking it over.
    """
    private = socket_path.with_name(f".{socket_path.name}.{os.getpid()}")
    direct = len(os.fsencode(str(private))) > UNIX_SOCKET_MAX_BYTES  # too long to stage: bind in place
    bound = socket_path if direct else private
    if not direct:
        private.unlink(missing_ok=True)  # left by an earlier process with our pid
    old_umask = os.umask(0o177)  # the socket file is created 0600, never briefly wider
    try:
        await listener_socket.bind(str(bound))
    finally:
        os.umask(old_umask)
    try:
        os.chmod(bound, 0o600)
        listener_socket.listen(64)
        if not direct:
            try:
                os.link(private, socket_path)
            except FileExistsError:
                raise SocketSetupError(f"another daemon is listening on {socket_path}") from None
    finally:
        if not direct:
            private.unlink(missing_ok=True)


async def _serve_connection(services: HostServices, stream: trio.SocketStream) -> None:
    admission = services.admission
    refused = admission.admit("unix")
    if refused is not None:
        # Said on the wire before the close, so a host sees why (its request has no id yet).
        line = msgspec.json.encode(
            {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": f"connection refused: {refused} (the daemon is at its host.maxConnections or host.maxBufferedBytes)", "data": {"reason": refused.value}}}
        )
        with trio.move_on_after(1.0):
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await stream.send_all(line + b"\n")
        await trio.aclose_forcefully(stream)
        return
    try:
        framed = NdjsonStream(stream, stream, skip_log_lines=False, on_buffered=admission.buffered_changed)
        await serve_host_stream(services, framed, transport="unix")
    finally:
        admission.release("unix")


class _TurnOf(msgspec.Struct):
    turnId: str | None = None  # noqa: N815 - the wire's name


_turn_of = msgspec.json.Decoder(_TurnOf)


def host_lane(inbound: Inbound) -> Hashable:
    """A host message's ordering lane: its turn for ``turn/*`` calls, else the connection's.

    Order is kept where it carries meaning (a turn's text before its round's end), so one
    agent's slow ``turn/round`` doesn't hold another agent's text on the same connection (until
    the connection's inbound bound is reached: docs/host-api.md, *Delivery and flow control*).
    """
    if inbound.method == "inference/chunk":
        return chunk_lane(inbound)  # one lane per forwarded request: its chunks in order
    if inbound.params is None or not inbound.method.startswith("turn/"):
        return None
    try:
        turn_id = _turn_of.decode(inbound.params).turnId
    except (msgspec.MsgspecError, RecursionError):
        return None  # its handler answers -32602
    return None if turn_id is None else ("turn", turn_id)


async def serve_host_stream(services: HostServices, stream: MessageStream, *, transport: str) -> None:
    """Serve one host connection on a framed stream until it closes."""
    connection = HostConnection(transport=transport)
    methods = host_methods(services, connection)
    peer = Peer(
        stream,
        methods,
        concurrent_methods=methods.concurrent_methods,
        lane_of=host_lane,
        limits=PeerLimits(stall_timeout=services.stall_timeout),
        log_fields={"transport": transport, "connection": connection.id},
    )
    connection.peer = peer
    hooks = services.hooks
    try:
        hooks.opened(connection)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_keep_deadlines, services, connection, stream, peer)
            await peer.run()
            nursery.cancel_scope.cancel()
    finally:
        hooks.closed(connection)


async def _keep_deadlines(services: HostServices, connection: HostConnection, stream: MessageStream, peer: Peer) -> None:
    """Close a connection holding part of a message too long, or silent without a hello."""
    admission = services.admission
    while not peer.closed:
        await trio.sleep(min(1.0, admission.partial_message_timeout, admission.hello_timeout))
        now = trio.current_time()
        partial_since: float | None = getattr(stream, "partial_since", None)
        last_received: float = getattr(stream, "last_received", now)
        reason: ConnectionTimeout | None = None
        if partial_since is not None and now - partial_since > admission.partial_message_timeout:
            reason, waited = ConnectionTimeout.PARTIAL_MESSAGE, now - partial_since
        elif connection.session is None and now - last_received > admission.hello_timeout and not peer.statistics().lanes:
            reason, waited = ConnectionTimeout.NO_HELLO, now - last_received
        if reason is not None:
            admission.closing(reason, connection=connection.id, transport=connection.transport, waited=round(waited, 3))
            await peer.aclose(f"closed: {reason}")
            return
