"""The ``[health]`` HTTP listener: ``/healthz``, ``/readyz`` and ``/metrics``.

HTTP/1.1 by h11 (sans-I/O; it comes with trio-websocket) over trio's own TCP listeners: one
request per connection, answered and closed. It serves no secret, so it has no token; it is
bounded so a scraper gone wrong can't hurt the daemon: at most :data:`MAX_CONNECTIONS` at
once, :data:`REQUEST_TIMEOUT` to send a request, requests over 16 KiB refused. When every slot
is taken, the connection that has waited longest without sending a request is closed to make
room, so idle sockets can't starve the health check (a full house of busy ones is answered
503). See ``docs/decisions/0002-health-http-on-h11.md``.

- ``GET /healthz``: 200 ``ok`` while the daemon's event loop answers (liveness).
- ``GET /readyz``: 200 ``ready``, or 503 with one line per reason (a ``required`` server not
  ready, the journal failing, no server ready at all, shutting down).
- ``GET /metrics``: Prometheus text format, or OpenMetrics when the ``Accept`` header asks for
  it (see :mod:`mcpl_router.metrics`).
"""

from __future__ import annotations

import hmac
import json
import urllib.parse
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Protocol

import attrs
import h11
import trio

from mcpl_router.config import HealthConfig
from mcpl_router.config.addresses import is_loopback
from mcpl_router.errors import bind_failure, listen_refusal
from mcpl_router.logs import get_logger
from mcpl_router.status_page import render_status_page

if TYPE_CHECKING:
    from mcpl_router.mcpl.link import ServerLink

#: Connections served at once (idle ones make room for new ones; see the module docstring).
MAX_CONNECTIONS = 64
#: Time a client has to send its whole request (a probe sends it at once).
REQUEST_TIMEOUT = 2.0
#: Time to write the answer (a scraper that stops reading is dropped).
RESPONSE_TIMEOUT = 10.0
_MAX_REQUEST_BYTES = 16 * 1024


class StatusModel(Protocol):
    """The daemon's status model (``Daemon.status``): the page and /status.json read it."""

    def __call__(self, *, channels_page: int | None = ..., channels_filter: str = ...) -> dict[str, object]: ...


class MetricsPage(Protocol):
    """``/metrics``: the page and its Content-Type for what the scraper accepts
    (:class:`~mcpl_router.metrics.DaemonMetrics`)."""

    def exposition(self, accept: str | None) -> tuple[bytes, str]: ...


@attrs.frozen
class Readiness:
    """Whether the daemon is ready, and if not, every reason (one sentence each)."""

    problems: tuple[str, ...]

    @property
    def ready(self) -> bool:
        return not self.problems

    def text(self) -> str:
        if self.ready:
            return "ready\n"
        return "not ready:\n" + "".join(f"- {problem}\n" for problem in self.problems)


def readiness(
    *,
    draining: bool,
    journal_failing: str | None,
    links: Iterable[ServerLink],
    server_problem: Callable[[ServerLink], str | None],
) -> Readiness:
    """The daemon's readiness: what ``/readyz``, ``status`` and ``mcpl-router health`` report.

    Not ready while: shutting down; the journal's latest commit failed; a server marked
    ``required`` is not serving (not ready, or ready with every channel registration refused);
    or, when no server is marked required, none of the configured servers is serving.
    """
    problems: list[str] = []
    if draining:
        problems.append("the daemon is shutting down")
    if journal_failing is not None:
        problems.append(f"the journal is failing: {journal_failing}")
    links = list(links)
    serving = {link.server_id: server_problem(link) for link in links}
    required = [link for link in links if link.config.required]
    for link in required:
        problem = serving[link.server_id]
        if problem is not None:
            problems.append(f"server {link.server_id} (required) {problem}")
    if not required and links and all(problem is not None for problem in serving.values()):
        problems.append(
            f"no server is ready (0/{len(links)}): "
            + "; ".join(f"{server_id} {problem}" for server_id, problem in serving.items())
        )
    return Readiness(tuple(problems))


async def serve_health(
    health: HealthConfig,
    *,
    config_source: str,
    ready: Callable[[], Readiness],
    metrics: MetricsPage,
    status: StatusModel | None = None,
    page_token: str | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen until cancelled; ``task_status.started`` gets ``http://host:port`` (the real port).

    ``ready`` answers ``/readyz`` and ``metrics`` renders ``/metrics``, each asked per request;
    ``status`` the status page (``/``, ``/status``) and ``/status.json``. On a listener bound
    to an address other than loopback those two take the host token (``page_token``; none
    configured: they are refused), as ``Authorization: Bearer <token>`` or ``?token=``.

    Raises:
        StartupRefusal: the port is in use (or the bind can't be had), naming ``health.port``.
    """
    try:
        listeners = await trio.open_tcp_listeners(health.port, host=health.bind)
    except OSError as exc:
        failure = bind_failure(exc)
        raise listen_refusal(config_source, "health.port", health.bind, health.port, failure or exc) from None
    port = listeners[0].socket.getsockname()[1]
    host = health.bind if ":" not in health.bind else f"[{health.bind}]"
    url = f"http://{host}:{port}"
    log = get_logger()
    log.info("health.listening", url=url)
    slots = _Slots(trio.CapacityLimiter(MAX_CONNECTIONS))
    task_status.started(url)
    guarded = not is_loopback(health.bind)
    pages = _Pages(ready, metrics, status, page_token if guarded else None, guarded)
    await trio.serve_listeners(partial(_serve_connection, pages, slots), listeners)


@attrs.frozen
class _Pages:
    """What the two live pages read."""

    ready: Callable[[], Readiness]
    metrics: MetricsPage
    status: StatusModel | None = None
    #: The token the status page and /status.json take (a listener not on loopback).
    token: str | None = None
    guarded: bool = False


@attrs.define(eq=False)
class _Slots:
    """The connection bound, and the connections still waiting for their request (oldest first)."""

    limiter: trio.CapacityLimiter
    waiting: dict[int, trio.CancelScope] = attrs.field(factory=dict)
    next_id: int = 0

    async def acquire(self) -> bool:
        try:
            self.limiter.acquire_nowait()
            return True
        except trio.WouldBlock:
            pass
        if self.waiting:
            # Full: close the connection that has sent nothing for longest, and take its slot.
            oldest = next(iter(self.waiting))
            self.waiting.pop(oldest).cancel()
            with trio.move_on_after(1.0):
                await self.limiter.acquire()
                return True
        return False


async def _serve_connection(pages: _Pages, slots: _Slots, stream: trio.SocketStream) -> None:
    limiter = slots.limiter
    if not await slots.acquire():
        # Answered before reading the request (h11 won't answer one it hasn't read): raw bytes.
        body = b"busy: too many health connections\n"
        head = f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        with trio.move_on_after(RESPONSE_TIMEOUT):
            try:
                await stream.send_all(head.encode() + body)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        await trio.aclose_forcefully(stream)
        return
    try:
        await _serve_one(pages, stream, slots)
    finally:
        limiter.release()
        await trio.aclose_forcefully(stream)


async def _serve_one(pages: _Pages, stream: trio.SocketStream, slots: _Slots) -> None:
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_REQUEST_BYTES)
    request: h11.Request | None = None
    slot = slots.next_id
    slots.next_id += 1
    with trio.move_on_after(REQUEST_TIMEOUT) as waiting:
        slots.waiting[slot] = waiting
        try:
            while request is None:
                event = connection.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(8192)
                    connection.receive_data(data)
                    if not data and connection.their_state is not h11.DONE:
                        return  # the client went away
                elif isinstance(event, h11.Request):
                    request = event
                elif isinstance(event, h11.ConnectionClosed):
                    return
        except h11.RemoteProtocolError as exc:
            with trio.move_on_after(RESPONSE_TIMEOUT):
                try:
                    await _respond(connection, stream, exc.error_status_hint, b"bad request\n", head=False)
                except (h11.LocalProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
            return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            slots.waiting.pop(slot, None)
    if request is None:
        return  # too slow (or closed to make room): no answer
    method = request.method.decode("ascii", "replace").upper()
    path, _, query = request.target.decode("ascii", "replace").partition("?")
    accept = b", ".join(value for name, value in request.headers if name == b"accept").decode("latin-1")
    authorization = b"".join(value for name, value in request.headers if name == b"authorization").decode("latin-1")
    try:
        status, body, content_type = _route(pages, method, path, accept, query, authorization)
    except Exception:
        # A bug reading some part's state must not take the listener (and the daemon) down.
        get_logger().exception("health.request.crashed", path=path)
        status, body, content_type = 500, b"internal error: see the daemon's log (health.request.crashed)\n", "text/plain; charset=utf-8"
    with trio.move_on_after(RESPONSE_TIMEOUT):
        try:
            await _respond(connection, stream, status, body, head=method == "HEAD", content_type=content_type)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.LocalProtocolError):
            pass


def _route(pages: _Pages, method: str, path: str, accept: str, query: str = "", authorization: str = "") -> tuple[int, bytes, str]:
    text = "text/plain; charset=utf-8"
    if path in ("/", "/status", "/status.json") and pages.status is not None and method in ("GET", "HEAD"):
        return _status_route(pages, path, query, authorization)
    if method not in ("GET", "HEAD"):
        return 405, b"method not allowed: use GET\n", text
    if path == "/healthz":
        return 200, b"ok\n", text
    if path == "/readyz":
        state = pages.ready()
        return (200 if state.ready else 503), state.text().encode(), text
    if path == "/metrics":
        body, content_type = pages.metrics.exposition(accept)
        return 200, body, content_type
    return 404, b"not found: try /, /status.json, /healthz, /readyz or /metrics\n", text


def _status_route(pages: _Pages, path: str, query: str, authorization: str) -> tuple[int, bytes, str]:
    """The status page and its JSON; behind the host token on a listener not on loopback."""
    text = "text/plain; charset=utf-8"
    params = urllib.parse.parse_qs(query)
    if pages.guarded:
        if pages.token is None:
            return 403, b"forbidden: the status page on a listener not bound to loopback takes the host token, and none is configured (host.tokenFile)\n", text
        given = authorization.removeprefix("Bearer ").strip() if authorization.startswith("Bearer ") else (params.get("token") or [""])[0]
        if not hmac.compare_digest(given.encode(), pages.token.encode()):
            return 401, b"unauthorized: send Authorization: Bearer <host token>, or ?token=\n", text
    assert pages.status is not None
    page_number = (params.get("page") or [""])[0]
    # The page always lists channels (its first page by default); /status.json only when a page
    # is asked for, or the daemon has few (then it is exactly what status answers).
    asked = int(page_number) if page_number.isdigit() else (0 if path != "/status.json" else None)
    model = pages.status(channels_page=asked, channels_filter=(params.get("filter") or [""])[0][:200])
    if path == "/status.json":
        return 200, json.dumps(model).encode(), "application/json"
    return 200, render_status_page(model, base=path).encode(), "text/html; charset=utf-8"


async def _respond(
    connection: h11.Connection,
    stream: trio.SocketStream,
    status: int,
    body: bytes,
    *,
    head: bool,
    content_type: str = "text/plain; charset=utf-8",
) -> None:
    headers = [
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
        ("Cache-Control", "no-store"),
    ]
    out = connection.send(h11.Response(status_code=status, headers=headers, reason=b""))
    if not head and body:
        out = (out or b"") + (connection.send(h11.Data(data=body)) or b"")
    out = (out or b"") + (connection.send(h11.EndOfMessage()) or b"")
    await stream.send_all(out)
