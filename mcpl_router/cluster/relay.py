"""A node's relay: the router reaches a server whose link another node holds.

With ``cluster.links = "balanced"`` (docs/cluster.md) the router (the node holding the router's
lease: hosts, routing, the journal) does not connect to a server itself. The node holding that
server's link lease does, and carries the server's messages to the router and back, unchanged.
The router's :class:`~mcpl_router.mcpl.link.ServerLink` runs over the relay exactly as over a
direct connection: its handshake, grants, requests and their answers are the server's own, so
a turn's publish is carried out by the link's holder with the same answer and receipt as on
one node, and the server never sees a second connection.

The relay protocol is newline-delimited JSON over TCP (loopback, or the nodes' network):

1. the router sends a hello: ``{"relay": 1, "server": id, "router": node, "routerEpoch": n,
   "token": …, "tokenIn": …}`` (the cluster's relay token, read by every node from the
   journal's database; where the router's link has learned to put a WebSocket token);
2. the holder answers ``{"ok": true, "endpoint": …, "lineOriented": …, "linkEpoch": n}`` once it
   has connected to the server, or ``{"ok": false, "error": why}`` and closes;
3. then every line is one of the server's messages, each way.

A holder relays a server only while it holds that server's link (each batch, both ways, is
checked against the link lease's local deadline) and only for the node that holds the router's
lease with the epoch it names (checked in the database at the hello, and again whenever the
router's lease changes hands: an older router's relay is closed). A newer hello for the same
server replaces the relay under way once its server connection is closed: one connection to the
server at a time. While the link is handed over, the router's new requests are answered
``-32001`` (not sent) and the answers to those under way are let through.
"""

from __future__ import annotations

import hmac
import json
from socket import gethostname
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

import attrs
import msgspec
import structlog
import trio

from mcpl_router.config import RouterConfig, ServerConfig
from mcpl_router.config.addresses import host_port
from mcpl_router.jsonrpc.fenced import FencedStream
from mcpl_router.jsonrpc.framing import DEFAULT_MAX_MESSAGE_BYTES, MessageStream, NdjsonStream, OversizedMessage
from mcpl_router.logs import get_logger
from mcpl_router.mcpl.link import describe_failure, expected_failure
from mcpl_router.mcpl.transports import OpenTransport, TransportError, open_transport
from mcpl_router.store.leases import LeaseFence
from mcpl_router.store.link_leases import LinkHolder

__all__ = ["HeldLink", "Relay", "dial_relay"]

RELAY_VERSION: Final = 1
#: The router's requests a relay keeps track of, unanswered, for a graceful hand-over.
PENDING_KEPT: Final = 1024
#: The JSON-RPC error a router's request gets when it came during its link's hand-over.
LINK_MOVING: Final = -32001
#: Batches waiting for the router's stream (the server's, and refusals during a hand-over).
_TO_ROUTER_QUEUE: Final = 4
#: Connections a relay serves at once beyond two a server (a router's, and its successor's).
MAX_SPARE_CONNECTIONS: Final = 8
#: How long a newer relay waits for the one it replaces to close its server connection (a stdio
#: child's graces, transports.py: 2 s + 3 s, and a margin).
CLOSE_WAIT: Final = 8.0
_WILDCARDS: Final = ("0.0.0.0", "::", "")
#: How long either side waits for the other's hello or its answer (the answer waits for the
#: server's connection: a WebSocket dial may take its own 10 s).
HELLO_TIMEOUT: Final = 5.0
ANSWER_TIMEOUT: Final = 15.0
#: At most this many messages already read go out in one write.
BATCH_MESSAGES: Final = 256


class _Hello(msgspec.Struct, frozen=True):
    relay: int
    server: str
    router: str
    routerEpoch: int  # noqa: N815 - the wire's spelling
    #: The cluster's relay token (store/leases.py ``relay_token``): only a node reads it.
    token: str = ""
    #: Where the router's link has learned to put a WebSocket token (``tokenIn = "auto"``).
    tokenIn: str | None = None  # noqa: N815


class _Head(msgspec.Struct):
    """What a hand-over reads of a message: whether it is a request (``method`` and ``id``) or
    an answer (``id`` alone)."""

    id: int | str | None = None
    method: str | None = None


def _head(message: bytes) -> _Head | None:
    try:
        return msgspec.json.decode(message, type=_Head)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None  # a batch, a log line: not a request of the router's to keep track of


@attrs.define(eq=False)
class HeldLink:
    """A server's link this node holds: its lease's fence, and the relay serving it (if any)."""

    fence: LeaseFence
    #: The relay under way for it, the router it serves, and set once its server connection
    #: is closed (a newer relay waits for it: one connection to the server at a time).
    relay_scope: trio.CancelScope | None = None
    router: tuple[str, int] | None = None
    relay_done: trio.Event | None = None
    relays: int = 0
    #: When this node took it (trio time): a link just taken is not moved for placement.
    taken_at: float = attrs.field(factory=trio.current_time)
    #: Why the link is being handed over (set while its relay finishes what is under way).
    closing: str | None = None
    #: This node's dials of the server failing in a row: since when (trio time), how many, the
    #: last error (a holder that can't reach its server hands the link on, cluster/links.py).
    unreachable_since: float | None = None
    unreachable: int = 0
    unreachable_error: str = ""

    def dialled(self, error: str | None) -> None:
        if error is None:
            self.unreachable_since, self.unreachable, self.unreachable_error = None, 0, ""
            return
        if self.unreachable_since is None:
            self.unreachable_since = trio.current_time()
        self.unreachable += 1
        self.unreachable_error = error
    #: The router's requests the server has not answered yet, this relay (their ids, as JSON
    #: text; oldest first, at most :data:`PENDING_KEPT`: a server that never answers some
    #: makes the router time them out, and the oldest are forgotten here).
    pending: dict[bytes, None] = attrs.field(factory=dict)

    def outgoing(self, batch: list[bytes]) -> tuple[list[bytes], list[bytes]]:
        """(what goes on to the server, what the router is answered at once). A hand-over
        under way sends the server no new request: each is answered an error saying it was
        not sent (a publish fails plainly, never "unconfirmed"); answers and notifications go."""
        forward: list[bytes] = []
        refused: list[bytes] = []
        for message in batch:
            if b'"method"' in message and b'"id"' in message:
                head = _head(message)
                if head is not None and head.method is not None and head.id is not None:
                    key = msgspec.json.encode(head.id)
                    if self.closing is not None:
                        refused.append(msgspec.json.encode({
                            "jsonrpc": "2.0", "id": head.id,
                            "error": {"code": LINK_MOVING, "message": f"not sent: {self.closing}; the link reconnects through its next holder",
                                      "data": {"reason": "link-moving"}},
                        }))
                        continue
                    if len(self.pending) >= PENDING_KEPT:
                        del self.pending[next(iter(self.pending))]
                    self.pending[key] = None
            forward.append(message)
        return forward, refused

    def answered(self, batch: list[bytes]) -> None:
        """The server's answers in ``batch``: the requests they answer are no longer pending."""
        if not self.pending:
            return
        for message in batch:
            if b'"result"' in message or b'"error"' in message:
                head = _head(message)
                if head is not None and head.method is None and head.id is not None:
                    self.pending.pop(msgspec.json.encode(head.id), None)

    def end_relay(self) -> None:
        if self.relay_scope is not None:
            self.relay_scope.cancel()


@attrs.define
class RelayCounts:
    served: int = 0
    refused: int = 0
    oversized: int = 0
    #: Times the server's messages waited for the router's stream (its queue full: the server's
    #: pump waits, the server's own connection takes the backpressure; nothing is dropped).
    backpressured: int = 0
    fromServer: int = 0  # noqa: N815 - status's spelling
    toServer: int = 0  # noqa: N815


class Relay:
    """Serves the router the links this node holds (``held``: server id → :class:`HeldLink`,
    kept by the node's link holding)."""

    def __init__(
        self,
        node: str,
        config: RouterConfig,
        held: Mapping[str, HeldLink],
        router_holds: Callable[[str, int], Awaitable[bool]],
        open_transport_fn: Callable[[ServerConfig, trio.Nursery], Awaitable[OpenTransport]] = open_transport,
    ) -> None:
        self.node = node
        self.config = config
        self._held = held
        self._router_holds = router_holds
        self._open_transport = open_transport_fn
        #: ``host:port`` the relay listens on, once it does (published in the node's row).
        self.address: str | None = None
        #: The cluster's relay token, read from the database before the relay listens.
        self.token = ""
        #: Why new relays are refused now (the node leaves), or None.
        self.refusing: str | None = None
        self.counts = RelayCounts()
        self._connections = 0
        self._log = get_logger(component="relay")

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        cluster = self.config.cluster
        assert cluster is not None
        listeners = await trio.open_tcp_listeners(cluster.relay_port, host=cluster.relay_bind)
        port = listeners[0].socket.getsockname()[1]
        advertised = cluster.relay_advertise or cluster.relay_bind
        if advertised in _WILDCARDS:
            advertised = gethostname()  # a wildcard is no address to dial
        self.address = host_port(advertised, port)
        self._log.info("cluster.relay.listening", address=self.address)
        task_status.started(self.address)
        await trio.serve_listeners(self._serve_one, listeners)

    def router_seen(self, epoch: int, unexpired: bool) -> None:
        """The database showed the router's lease at ``epoch`` (unexpired or not): relays that
        serve an older router end, and those of this epoch too once it has expired. A view read
        a moment ago can only show an older epoch than a relay that began since, never a newer
        one: so a stale view ends no relay it should not."""
        for server, held in self._held.items():
            if held.router is None:
                continue
            served = held.router[1]
            if served < epoch or (served == epoch and not unexpired):
                self._log.info("cluster.relay.superseded", server=server, router=held.router[0], router_epoch=served,
                               reason="the router's lease changed hands or ran out")
                held.end_relay()

    async def _serve_one(self, socket: trio.SocketStream) -> None:
        # One stream for the hello and the messages after it (nothing of theirs is lost in between).
        stream = NdjsonStream(socket, socket, max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES, skip_log_lines=False)
        self._connections += 1
        try:
            if self._connections > self.max_connections:
                # Each router dials a relay once a server: more is a router retrying against a
                # fault, or not a router. Refused, counted, said; never queued without bound.
                self.counts.refused += 1
                self._log.warning("cluster.relay.refused", reason="too many relay connections", limit=self.max_connections)
                with trio.move_on_after(1):
                    await _answer(stream, {"ok": False, "error": f"node {self.node}'s relay serves {self.max_connections} connections at most"})
                return
            await self._serve_hello(stream)
        except Exception as exc:
            # A fault serving one relay (the database unreachable at the hello, a server's
            # transport failing in a way of its own) ends that relay, never the listener.
            self._log.exception("cluster.relay.failed", error=f"{type(exc).__name__}: {exc}")
            with trio.move_on_after(1):
                await _answer(stream, {"ok": False, "error": f"node {self.node}'s relay failed: {type(exc).__name__}: {exc}"})
        finally:
            self._connections -= 1
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                await socket.aclose()

    @property
    def max_connections(self) -> int:
        return 2 * len(self.config.servers) + MAX_SPARE_CONNECTIONS

    async def _serve_hello(self, stream: NdjsonStream) -> None:
        hello = await self._read_hello(stream)
        if hello is None:
            return
        held = self._held.get(hello.server)
        refusal = await self._admit(hello, held)
        if refusal is None and held is not None:
            # One connection to the server at a time: the relay under way ends, and its server
            # connection is closed (a stdio child given its graces), before this one opens.
            while held.relay_scope is not None and held.relay_done is not None:
                done = held.relay_done
                held.end_relay()
                with trio.move_on_after(CLOSE_WAIT):
                    await done.wait()
                if not done.is_set():
                    refusal = f"node {self.node}'s earlier relay of server {hello.server} did not close within {CLOSE_WAIT:g}s"
                    break
            # Anything may have changed while this waited: checked again, with no wait after.
            if refusal is None:
                refusal = self._refusal(hello, self._held.get(hello.server), held)
        if refusal is not None or held is None:
            self.counts.refused += 1
            self._log.warning("cluster.relay.refused", server=hello.server, router=hello.router, reason=refusal)
            await _answer(stream, {"ok": False, "error": refusal})
            return
        done = held.relay_done = trio.Event()
        held.pending = {}  # what this relay's router asks
        with trio.CancelScope() as scope:
            held.relay_scope, held.router = scope, (hello.router, hello.routerEpoch)
            held.relays += 1
            try:
                with structlog.contextvars.bound_contextvars(server=hello.server, router=hello.router):
                    await self._relay(stream, hello, held)
            finally:
                done.set()
                if held.relay_scope is scope:  # not replaced by a newer router's relay
                    held.relay_scope = held.router = held.relay_done = None
        if scope.cancelled_caught:
            self._log.info("cluster.relay.ended", server=hello.server, reason="ended by this node (lease, router or drain)")

    async def _admit(self, hello: _Hello, held: HeldLink | None) -> str | None:
        """Why ``hello`` may not be served by ``held`` (None: it may, as far as can be known
        before the wait for an earlier relay), the router's lease checked in the database."""
        if not self.token or not hmac.compare_digest(hello.token.encode(), self.token.encode()):
            return "the relay token does not match: not a node of this cluster (it is read from the journal's database)"
        refusal = self._refusal(hello, held, held)
        if refusal is not None:
            return refusal
        # Bounded by the node's statement timeout (cluster/database.py): a database that stalls
        # fails the hello, answered as the relay's failure.
        holds = await self._router_holds(hello.router, hello.routerEpoch)
        if not holds:
            return f"node {hello.router} does not hold the router's lease with epoch {hello.routerEpoch}"
        return self._refusal(hello, self._held.get(hello.server), held)  # what changed during the check

    async def _read_hello(self, stream: NdjsonStream) -> _Hello | None:
        try:
            with trio.fail_after(HELLO_TIMEOUT):
                line = await stream.receive_message()
            return msgspec.json.decode(line, type=_Hello)
        except (trio.TooSlowError, trio.EndOfChannel, trio.BrokenResourceError, OversizedMessage,
                msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.counts.refused += 1
            self._log.warning("cluster.relay.bad_hello", error=f"{type(exc).__name__}: {exc}")
            with trio.move_on_after(1):
                await _answer(stream, {"ok": False, "error": f"not a relay hello: {type(exc).__name__}: {exc}"})
            return None

    def _refusal(self, hello: _Hello, held: HeldLink | None, first: HeldLink | None) -> str | None:
        """Why ``hello`` may not be served by ``held`` (what this node holds now), ``first``
        being what it held when the hello came: a link handed over meanwhile, even if taken
        again since, is another holding."""
        if self.refusing is not None:
            return self.refusing
        if held is not first:
            return f"node {self.node} handed server {hello.server}'s link over while the relay was being set up"
        if hello.relay != RELAY_VERSION:
            return f"relay version {hello.relay} is not this node's ({RELAY_VERSION})"
        if hello.server not in self.config.servers:
            return f"server {hello.server} is not in node {self.node}'s config"
        if held is None:
            return f"node {self.node} does not hold server {hello.server}'s link"
        loss = held.fence.refusal()
        if loss is not None:
            return loss
        if held.router is not None and held.router[1] > hello.routerEpoch:
            return f"a newer router (node {held.router[0]}, epoch {held.router[1]}) is served"
        return None

    async def _relay(self, router: NdjsonStream, hello: _Hello, held: HeldLink) -> None:
        server_config = self.config.servers[hello.server]
        if hello.tokenIn in ("header", "query") and server_config.token_in == "auto":
            # The router's link learned where this server takes its token (link.py): dialled so.
            server_config = attrs.evolve(server_config, token_in=hello.tokenIn)
        answered = False
        try:
            async with trio.open_nursery() as nursery:
                transport = await self._open_transport(server_config, nursery)
                held.dialled(None)
                try:
                    # Both ways are fenced by the link's lease: a holder resumed past it neither
                    # writes to the server nor hands the router what its old connection still says.
                    to_server = FencedStream(transport.stream, held.fence.refusal)
                    to_router = FencedStream(router, held.fence.refusal)
                    await _answer(router, {"ok": True, "endpoint": transport.description, "lineOriented": transport.stream.line_oriented,
                                           "linkEpoch": held.fence.term.epoch})
                    answered = True
                    self.counts.served += 1
                    self._log.info("cluster.relay.serving", endpoint=transport.description, link_epoch=held.fence.term.epoch)
                    # The router's stream has one writer, fed by both ways (the server's messages,
                    # and a hand-over's refusals); bounded: a slow router slows the server's pump.
                    to_router_send, to_router_receive = trio.open_memory_channel[list[bytes]](_TO_ROUTER_QUEUE)

                    async def from_server(batch: list[bytes]) -> None:
                        held.answered(batch)
                        if to_router_send.statistics().current_buffer_used >= _TO_ROUTER_QUEUE:
                            self.counts.backpressured += 1  # the router reads slower than the server sends
                        await to_router_send.send(batch)

                    async def to_server_or_refused(batch: list[bytes]) -> None:
                        forward, refused = held.outgoing(batch)
                        if refused:
                            await to_router_send.send(refused)
                        if forward:
                            await to_server.send_messages(forward)

                    async with trio.open_nursery() as pumps:
                        pumps.start_soon(self._write_router, to_router_receive, to_router, pumps.cancel_scope)
                        pumps.start_soon(self._pump, transport.stream, from_server, "fromServer", pumps.cancel_scope)
                        pumps.start_soon(self._pump, router, to_server_or_refused, "toServer", pumps.cancel_scope)
                finally:
                    await transport.aclose()
                    nursery.cancel_scope.cancel()
        except BaseException as exc:  # noqa: BLE001 - sorted here: the server's failure, or not ours to take
            failure = expected_failure(exc)
            if failure is None or isinstance(exc, trio.Cancelled):
                raise
            # A dial's failure (trio-websocket raises a refusal from its reader task, beside the
            # dial) is what a direct link would see and retry: said to the router, which retries
            # (with its token's place moved after a refusal, as on one node). After the answer,
            # the server's connection failing ends the relay, as a closed connection would.
            error = str(failure) if isinstance(failure, TransportError) else describe_failure(failure)
            status = failure.status if isinstance(failure, TransportError) else getattr(failure, "status_code", None)
            self._log.warning("cluster.relay.server_failed" if answered else "cluster.relay.server_unreachable", error=error, status=status)
            if not answered:
                if status is None:  # a refusal (401, 403) is the server's answer, not unreachability
                    held.dialled(error)
                await _answer(router, {"ok": False, "error": error, "status": status})

    async def _write_router(self, batches: trio.MemoryReceiveChannel[list[bytes]], router: MessageStream, both: trio.CancelScope) -> None:
        try:
            async for batch in batches:
                await router.send_messages(batch)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._log.info("cluster.relay.closed", direction="toRouter", reason=str(exc) or type(exc).__name__)
        finally:
            both.cancel()

    async def _pump(self, source: MessageStream, deliver: Callable[[list[bytes]], Awaitable[None]], direction: str,
                    both: trio.CancelScope) -> None:
        """Carry messages one way until either end closes; then both ways end. What arrived in
        one read goes out in one write (a flood costs a write a burst, not one a message)."""
        buffered = getattr(source, "message_buffered", None)
        try:
            while True:
                batch: list[bytes] = []
                try:
                    batch.append(_one_line(await source.receive_message()))
                    while buffered is not None and len(batch) < BATCH_MESSAGES and buffered():
                        batch.append(_one_line(await source.receive_message()))
                except OversizedMessage as exc:
                    # Discarded as a direct link discards it; counted and said here, where it was seen.
                    self.counts.oversized += 1
                    self._log.warning("cluster.relay.oversized", direction=direction, error=str(exc))
                if not batch:
                    continue
                await deliver(batch)
                if direction == "fromServer":
                    self.counts.fromServer += len(batch)
                else:
                    self.counts.toServer += len(batch)
        except (trio.EndOfChannel, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._log.info("cluster.relay.closed", direction=direction, reason=str(exc) or type(exc).__name__)
        finally:
            both.cancel()


def _one_line(message: bytes) -> bytes:
    """A raw newline in a JSON text is whitespace (strings escape theirs): a server's
    pretty-printed WebSocket message stays one line here, meaning the same."""
    return message.replace(b"\n", b" ") if b"\n" in message else message


async def _answer(stream: NdjsonStream, answer: dict[str, object]) -> None:
    try:
        await stream.send_message(json.dumps(answer).encode())
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def dial_relay(holder: LinkHolder, server: ServerConfig, *, router: str, router_epoch: int, token: str,
                     max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> tuple[OpenTransport, int]:
    """The router's side: a transport to ``server`` through the relay of the node holding its
    link. Raises :class:`TransportError` (the link retries with its backoff) when the holder
    can't be reached or refuses."""
    if holder.relay is None:
        raise TransportError(f"node {holder.node} holds server {server.id}'s link but published no relay address")
    host, _, port = holder.relay.rpartition(":")
    try:
        with trio.fail_after(HELLO_TIMEOUT):
            socket = await trio.open_tcp_stream(host.strip("[]"), int(port))
    except (OSError, ValueError, trio.TooSlowError) as exc:
        raise TransportError(f"node {holder.node}'s relay at {holder.relay} can't be reached: {type(exc).__name__}: {exc}") from None
    stream = NdjsonStream(socket, socket, max_message_bytes=max_message_bytes, skip_log_lines=False)
    try:
        hello = _Hello(relay=RELAY_VERSION, server=server.id, router=router, routerEpoch=router_epoch, token=token,
                       tokenIn=server.token_in if server.transport == "websocket" and server.token else None)
        await stream.send_message(msgspec.json.encode(hello))
        with trio.fail_after(ANSWER_TIMEOUT):
            answer = json.loads(await stream.receive_message())
    except (trio.TooSlowError, trio.EndOfChannel, trio.BrokenResourceError, OversizedMessage, ValueError) as exc:
        await trio.aclose_forcefully(socket)
        raise TransportError(f"node {holder.node}'s relay for server {server.id} did not answer: {type(exc).__name__}: {exc}") from None
    except BaseException:
        await trio.aclose_forcefully(socket)
        raise
    if not isinstance(answer, dict) or answer.get("ok") is not True:
        await trio.aclose_forcefully(socket)
        error = answer.get("error") if isinstance(answer, dict) else answer
        status = answer.get("status") if isinstance(answer, dict) else None
        raise TransportError(f"node {holder.node} did not relay server {server.id}: {error}",
                             status=status if isinstance(status, int) else None)
    stream.line_oriented = bool(answer.get("lineOriented", True))
    link_epoch = answer.get("linkEpoch")
    transport = OpenTransport(stream=stream, description=f"{answer.get('endpoint')} via node {holder.node}", socket=socket)
    return transport, link_epoch if isinstance(link_epoch, int) else holder.epoch
