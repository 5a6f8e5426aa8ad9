"""A standby's host listeners: each host connection forwarded, byte for byte, to the links' holder.

Hosts connect to any node (docs/cluster.md, *How hosts connect*). While a node is a standby,
:class:`HostProxy` listens on the node's own host addresses (``[host] unixSocket``, and the
WebSocket listener when one is configured), and joins each accepted connection to the same kind
of address of the node holding the links' lease, as that node's heartbeat row gives it
(``hostSocket``, ``websocket``: :func:`holder_in_view`). The holder's daemon serves the host as
if it had connected there itself: its token check, its limits, its wakes. Nothing forwarded is
read or changed here.

- **Refused**, when no node holds the lease or the holder's address can't be reached (its socket
  file gone, its process dead, its Unix socket on another machine): the host is told why and
  the connection closed. On the Unix socket, a JSON-RPC error ``-32000`` answering the host's
  first request (its id kept, so a client reads it as that call's error; ``data.reason``
  ``no-holder`` or ``holder-unreachable``); on the WebSocket, HTTP 503 with the same words.
  Counted (``refused`` in ``statistics()``) and logged as ``cluster.proxy.refused``, at most
  once a second per reason. ``FailoverClient`` takes such a refusal as a node that does not
  serve now and tries again (client/failover.py).
- **Closed both ways** when the holder's side ends (its daemon closed the session, its process
  died), when the holder changes (another node, or another epoch, in the view :func:`holder_in_view`
  reads; checked every ``recheck`` seconds), and when the standby phase ends (this node took the
  lease: its own daemon binds the same addresses next, after every listener here is closed and
  the socket file removed). A host's end of file is passed on as a half-close, as the daemon
  would have read it, so the answers its last requests earned still reach it.
- **Bounded**: ``host.maxConnections`` forwarded connections per listener (one more is refused as
  the daemon refuses it, ``too-many-connections``), and at most :data:`CHUNK` bytes in flight each
  way per connection: a side that does not read stops the pump, which stops reading the other
  side, and the kernel's socket buffers push back on the writer.
"""

from __future__ import annotations

import contextlib
import enum
import socket
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Final, TypeVar
from urllib.parse import urlsplit

import attrs
import msgspec
import trio

from mcpl_router.config import HostConfig
from mcpl_router.hosts.admission import HostAdmission, PatientListener
from mcpl_router.hosts.listener import SocketSetupError, open_unix_listener
from mcpl_router.jsonrpc.envelope import OVERLOADED
from mcpl_router.logs import get_logger
from mcpl_router.store.leases import LINKS

__all__ = ["CHUNK", "HolderAddress", "HostProxy", "ProxyRefusal", "holder_in_view", "splice"]

_T = TypeVar("_T")

#: The most bytes a forwarded connection holds in flight in each direction.
CHUNK: Final = 64 * 1024
#: How long connecting to the holder may take before the host is refused.
DIAL_TIMEOUT: Final = 5.0
#: How long a refused connection is given to send its first request (or its WebSocket handshake),
#: so the refusal can answer it; then it is answered without an id.
REFUSAL_READ_TIMEOUT: Final = 5.0
#: The most bytes read looking for that first request (or handshake).
REFUSAL_READ_LIMIT: Final = 64 * 1024
#: How long the refusal itself may take to send.
REFUSAL_SEND_TIMEOUT: Final = 1.0
_LOG_EVERY: Final = 1.0
#: Bind addresses that name every interface: the holder is dialled at its host name instead.
_WILDCARDS: Final = frozenset({"", "0.0.0.0", "::"})

# Why a forwarded connection ended (status's ``proxied.closed``, the ``cluster.proxy.closed`` line).
HOST_CLOSED: Final = "host-closed"
HOLDER_CLOSED: Final = "holder-closed"
HOLDER_CHANGED: Final = "holder-changed"
STANDBY_ENDED: Final = "standby-ended"


class ProxyRefusal(enum.StrEnum):
    """Why a standby refused a host connection (``data.reason``; docs/errors.md)."""

    NO_HOLDER = "no-holder"
    HOLDER_UNREACHABLE = "holder-unreachable"


@attrs.frozen
class HolderAddress:
    """Where the holder of the links' lease listens for hosts, as its last heartbeat said."""

    node: str
    epoch: int
    hostname: str | None
    host_socket: str | None
    websocket: str | None


def holder_in_view(view: Mapping[str, object], *, this_node: str) -> HolderAddress | None:
    """The links' holder in a node's cluster view (store/leases.py ``cluster_view``), or None
    when no node holds the lease now, or the view says this node does (a term that just ended,
    not yet seen by a heartbeat: forwarding to itself would be a loop)."""
    leases = view.get("leases")
    lease = next((row for row in (leases if isinstance(leases, list) else []) if isinstance(row, dict) and row.get("scope") == LINKS), None)
    if lease is None or float(lease.get("expiresIn", 0)) <= 0 or lease.get("node") == this_node:
        return None
    nodes = view.get("nodes")
    row = next((row for row in (nodes if isinstance(nodes, list) else []) if isinstance(row, dict) and row.get("node") == lease["node"]), {})
    info = row.get("info")
    info = info if isinstance(info, dict) else {}

    def text(key: str) -> str | None:
        value = info.get(key)
        return value if isinstance(value, str) and value else None

    return HolderAddress(str(lease["node"]), int(lease.get("epoch", 0)), text("hostname"), text("hostSocket"), text("websocket"))


async def splice(host: trio.abc.Stream, holder: trio.abc.Stream, *, chunk: int = CHUNK) -> str:
    """Copy bytes both ways until the connection ends; then close both streams.

    The holder's end of file (or a broken stream on either side) ends it both ways at once. The
    host's end of file is passed to the holder as a half-close, and the holder's answers still
    flow until it closes. Returns who ended it: :data:`HOST_CLOSED` or :data:`HOLDER_CLOSED`.
    """
    ended: list[str] = []

    async def pump(source: trio.abc.ReceiveStream, sink: trio.abc.SendStream, source_side: str, sink_side: str, done: trio.CancelScope) -> None:
        side = source_side  # whose failure ends the pump: the side being read, or written
        try:
            while data := await source.receive_some(chunk):
                side = sink_side
                await sink.send_all(data)
                side = source_side
            if source is host and isinstance(sink, trio.abc.HalfCloseableStream):
                side = sink_side
                await sink.send_eof()
                ended.append(HOST_CLOSED)
                return  # the holder's answers still flow; its close ends the rest
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        ended.append(side)
        done.cancel()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump, host, holder, HOST_CLOSED, HOLDER_CLOSED, nursery.cancel_scope)
            nursery.start_soon(pump, holder, host, HOLDER_CLOSED, HOST_CLOSED, nursery.cancel_scope)
    finally:
        await _close(host, holder)
    return ended[0]


async def _close(*resources: trio.abc.AsyncResource) -> None:
    """Close each at once, cancelled or not. (Under a cancelled scope, ``aclose_forcefully``
    closes its resource and then raises: the next would be left open.)"""
    with trio.CancelScope(shield=True):
        for resource in resources:
            await trio.aclose_forcefully(resource)


class _Unreachable(Exception):
    """The holder's address for this kind of connection can't be reached; the text says why."""


@attrs.define(eq=False)
class _Forwarded:
    """One connection being forwarded: to which holder, and how to end it."""

    holder: HolderAddress
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    closing: str | None = None


class _FirstRequest(msgspec.Struct):
    id: int | str | None = None


_first_request = msgspec.json.Decoder(_FirstRequest)


class HostProxy:
    """A standby's forwarding of host connections (module docstring). One per node, kept across
    its standby phases (its counters are the node's); ``holder`` returns the holder's address
    now, or None."""

    def __init__(self, node: str, holder: Callable[[], HolderAddress | None], *, recheck: float) -> None:
        self._node = node
        self._holder = holder
        self._recheck = recheck
        self._hostname = socket.gethostname()
        self._forwarded: set[_Forwarded] = set()
        #: What this node listens on now (never dialled: a stale view must not make a loop).
        self._own_socket: Path | None = None
        self._own_ports: frozenset[int] = frozenset()
        #: The addresses it listens on now: the socket's path, the WebSocket's ``ws://`` URL.
        self.listening: list[str] = []
        self.total = 0
        self.refused: Counter[str] = Counter()
        self.closed: Counter[str] = Counter()
        self._last_logged: dict[str, float] = {}
        self._log = get_logger()

    def statistics(self) -> dict[str, object]:
        """``status``'s ``cluster.proxied``: where it listens, connections forwarded now and in
        all, refusals and ends by reason."""
        return {"listening": list(self.listening), "open": len(self._forwarded), "total": self.total, "refused": dict(self.refused), "closed": dict(self.closed)}

    async def serve_during(self, host: HostConfig, standby: Callable[[], Awaitable[_T]]) -> _T:
        """Forward host connections while ``standby`` runs. When it returns, every listener is
        closed (the socket file removed) and every forwarded connection ended before its
        result is returned: the node's daemon may bind the same addresses then."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self._serve, host)
            result = await standby()
            nursery.cancel_scope.cancel()
        return result

    async def _serve(self, host: HostConfig, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # The daemon's own bounds: maxConnections per listener, accepts that wait out a lack of
        # descriptors. (maxBufferedBytes does not apply: nothing forwarded is buffered here.)
        admission = HostAdmission(host)
        async with trio.open_nursery() as nursery:
            if host.unix_socket is not None:
                await nursery.start(self._listen_unix, host.unix_socket, admission)
            if host.websocket is not None:
                await nursery.start(self._listen_websocket, host, admission)
            nursery.start_soon(self._close_on_holder_change)
            task_status.started()

    async def _listen_unix(self, path: Path, admission: HostAdmission, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            socket_path, listener = await open_unix_listener(path)
        except (SocketSetupError, OSError) as exc:
            self._not_listening("unix", str(path), exc)
            task_status.started()
            return
        self._own_socket = socket_path
        self.listening.append(str(socket_path))
        self._log.info("cluster.proxy.listening", transport="unix", path=str(socket_path))
        try:
            async with trio.open_nursery() as handlers:
                task_status.started()
                await trio.serve_listeners(partial(self._handle, "unix", admission), [PatientListener(listener, admission)], handler_nursery=handlers)
        finally:
            await _close(listener)
            socket_path.unlink(missing_ok=True)
            self._own_socket = None
            self.listening.remove(str(socket_path))

    async def _listen_websocket(self, host: HostConfig, admission: HostAdmission, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        websocket = host.websocket
        assert websocket is not None
        where = f"{websocket.bind}:{websocket.port}"
        if not websocket.loopback and not host.allow_non_loopback:
            # The daemon refuses to listen there (hosts/websocket.py): nor does its standby.
            self._not_listening("websocket", where, ValueError("not a loopback address and host.allowNonLoopback is false"))
            task_status.started()
            return
        try:
            listeners = await trio.open_tcp_listeners(websocket.port, host=websocket.bind)
        except OSError as exc:
            self._not_listening("websocket", where, exc)
            task_status.started()
            return
        self._own_ports = frozenset(listener.socket.getsockname()[1] for listener in listeners)
        bind = websocket.bind if ":" not in websocket.bind else f"[{websocket.bind}]"
        url = f"ws://{bind}:{listeners[0].socket.getsockname()[1]}{websocket.path}"
        self.listening.append(url)
        self._log.info("cluster.proxy.listening", transport="websocket", url=url)
        try:
            async with trio.open_nursery() as handlers:
                task_status.started()
                await trio.serve_listeners(
                    partial(self._handle, "websocket", admission), [PatientListener(listener, admission) for listener in listeners], handler_nursery=handlers
                )
        finally:
            await _close(*listeners)
            self._own_ports = frozenset()
            self.listening.remove(url)

    def _not_listening(self, transport: str, where: str, exc: BaseException) -> None:
        error = str(exc) if isinstance(exc, SocketSetupError) else f"{type(exc).__name__}: {exc}"
        self._log.error("cluster.proxy.not_listening", transport=transport, address=where, error=error,
                        effect="hosts connecting here are not forwarded to the holder while this node is a standby")

    async def _close_on_holder_change(self) -> None:
        while True:
            await trio.sleep(self._recheck)
            holder = self._holder()
            now = None if holder is None else (holder.node, holder.epoch)
            for forwarded in list(self._forwarded):
                if forwarded.closing is None and (forwarded.holder.node, forwarded.holder.epoch) != now:
                    forwarded.closing = HOLDER_CHANGED
                    forwarded.scope.cancel()

    # -- one connection ------------------------------------------------------------------------

    async def _handle(self, transport: str, admission: HostAdmission, stream: trio.SocketStream) -> None:
        refused = admission.admit(transport)  # counted and logged there, as the daemon's
        if refused is not None:
            self.refused[refused.value] += 1
            # Answered at once and closed, without reading: a flood past the bound holds no task.
            await self._send_refusal(transport, stream, None, refused, f"connection refused: {refused} (node {self._node} forwards at most host.maxConnections)")
            return
        try:
            await self._forward(transport, stream)
        finally:
            admission.release(transport)

    async def _forward(self, transport: str, stream: trio.SocketStream) -> None:
        holder = self._holder()
        if holder is None:
            await self._refuse(transport, stream, ProxyRefusal.NO_HOLDER, None,
                               f"node {self._node} is a standby and no node holds the links now; try another node")
            return
        try:
            upstream = await self._dial(transport, holder)
        except _Unreachable as exc:
            await self._refuse(transport, stream, ProxyRefusal.HOLDER_UNREACHABLE, holder,
                               f"node {self._node} is a standby; node {holder.node} holds the links, but {exc}; try another node")
            return
        forwarded = _Forwarded(holder)
        self._forwarded.add(forwarded)
        self.total += 1
        self._log.info("cluster.proxy.forwarding", transport=transport, holder=holder.node, epoch=holder.epoch, open=len(self._forwarded))
        ended = STANDBY_ENDED  # unless splice returns: cancelled from outside, this node took the lease or stops
        try:
            with forwarded.scope:
                ended = await splice(stream, upstream)
        finally:
            await _close(upstream)
            self._forwarded.discard(forwarded)
            why = forwarded.closing or ended
            self.closed[why] += 1
            self._log.info("cluster.proxy.closed", transport=transport, holder=holder.node, epoch=holder.epoch, reason=why)

    async def _dial(self, transport: str, holder: HolderAddress) -> trio.SocketStream:
        """A connection to the holder's address for ``transport``; :class:`_Unreachable` says why not."""
        if transport == "unix":
            path = holder.host_socket
            if path is None:
                raise _Unreachable("it has no Unix socket for hosts")
            if holder.hostname != self._hostname:
                raise _Unreachable(f"its Unix socket {path} is on {holder.hostname}, not on this machine ({self._hostname})")
            if self._own_socket is not None and Path(path) == self._own_socket:
                raise _Unreachable(f"its Unix socket {path} is this node's own")
            where, connect = path, partial(trio.open_unix_socket, path)
        else:
            url = holder.websocket
            if url is None:
                raise _Unreachable("it has no WebSocket listener for hosts (yet)")
            parts = urlsplit(url)
            address, port = parts.hostname or "", parts.port
            if port is None:
                raise _Unreachable(f"its WebSocket URL {url} names no port")
            if address in _WILDCARDS:
                address = holder.hostname or "127.0.0.1"
            if holder.hostname == self._hostname and port in self._own_ports:
                raise _Unreachable(f"its WebSocket {url} is this node's own")
            where, connect = url, partial(trio.open_tcp_stream, address, port)
        try:
            with trio.fail_after(DIAL_TIMEOUT):
                return await connect()
        except trio.TooSlowError:
            raise _Unreachable(f"{where} did not accept within {DIAL_TIMEOUT:g}s") from None
        except OSError as exc:
            raise _Unreachable(f"{where} can't be reached ({exc.strerror or exc})") from None

    async def _refuse(self, transport: str, stream: trio.SocketStream, reason: ProxyRefusal, holder: HolderAddress | None, text: str) -> None:
        self.refused[reason.value] += 1
        now = trio.current_time()
        if now - self._last_logged.get(reason.value, -_LOG_EVERY) >= _LOG_EVERY:
            self._last_logged[reason.value] = now
            self._log.warning("cluster.proxy.refused", transport=transport, reason=reason.value, holder=None if holder is None else holder.node,
                              error=text, refused=self.refused[reason.value])
        # The host's first request (or handshake) is read first, so the refusal answers it.
        request_id: int | str | None = None
        with trio.move_on_after(REFUSAL_READ_TIMEOUT), contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            if transport == "unix":
                request_id = _request_id(await _read_until(stream, b"\n"))
            else:
                await _read_until(stream, b"\r\n\r\n")
        await self._send_refusal(transport, stream, request_id, reason, text)

    async def _send_refusal(self, transport: str, stream: trio.SocketStream, request_id: int | str | None, reason: str, text: str) -> None:
        if transport == "unix":
            error = {"code": OVERLOADED, "message": text, "data": {"reason": str(reason), "node": self._node}}
            message = msgspec.json.encode({"jsonrpc": "2.0", "id": request_id, "error": error}) + b"\n"
        else:
            body = f"{text} (reason: {reason})\n".encode()
            message = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
                       + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        with trio.move_on_after(REFUSAL_SEND_TIMEOUT), contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await stream.send_all(message)
        await _close(stream)


async def _read_until(stream: trio.abc.ReceiveStream, end: bytes) -> bytes:
    """What arrives up to ``end`` (or :data:`REFUSAL_READ_LIMIT` bytes, or the end of file)."""
    buffer = bytearray()
    while end not in buffer and len(buffer) < REFUSAL_READ_LIMIT:
        data = await stream.receive_some(REFUSAL_READ_LIMIT - len(buffer))
        if not data:
            break
        buffer += data
    return bytes(buffer)


def _request_id(received: bytes) -> int | str | None:
    """The id of the JSON-RPC request on the first line, or None (none, a notification, not JSON)."""
    try:
        return _first_request.decode(received.split(b"\n", 1)[0]).id
    except (msgspec.MsgspecError, RecursionError):
        return None
