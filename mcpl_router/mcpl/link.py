"""ServerLink: one configured MCPL server, from transport to grant to admission, reconnecting.

Per transport *epoch* (each connection or spawn):

1. open the transport; the grant is reset to nothing;
2. MCP ``initialize`` advertising our MCPL 0.5 support; parse the manifest whatever its shape;
3. ``notifications/initialized``;
4. compute the grant (§5.4) and send it with ``featureSets/update`` **as a Request**. The grant
   takes effect when the receipt arrives (inside the read loop, so it is in force for the very
   next message); a receipt never widens it;
5. ``ready``: every inbound method is admitted against the grant current at receipt.

Legacy servers (manifest ``version`` below 0.5, or -32601 to ``featureSets/update``) act before
or without a policy. ``legacy = "auto"`` accepts them with a warning and applies the grant
host-side as soon as they are known to be legacy; ``"allow"`` does the same silently and also
admits a 0.5 server's pre-policy traffic against the host-side grant (for servers like
mcpl-editor that register before any policy); ``"deny"`` refuses them (state ``failed``).

States: ``connecting`` → ``ready`` → (transport lost) ``retrying`` → ``connecting`` …;
``closed`` after shutdown; ``failed`` when retrying cannot help (legacy denied, the server
refused the policy with ``fallback: "close"``, attempts exhausted). Each transition is logged.

The link is assembled from its parts, one module each: what the rest of the daemon sees of it
(:mod:`~mcpl_router.mcpl.link_state`: states, status, delegate, refusals), the handshake and
the grant's agreement (:mod:`~mcpl_router.mcpl.handshake`), and re-granting a connected server
after a reload or a manifest change (:mod:`~mcpl_router.mcpl.regrant`). This module is the
running link: the reconnect loop and its epochs, outbound calls checked against the grant, and
the admission of every inbound method against the grant at receipt. Every name the link's users
import is importable from here.
"""

from __future__ import annotations

import errno
import collections
import random
import signal
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import trio

from mcpl_router.errors import first_leaf
from mcpl_router.jsonrpc import Inbound, Peer, PeerClosed, RequestTimeout, RpcError
from mcpl_router.jsonrpc.peer import PeerStatistics
from mcpl_router.jsonrpc.fenced import FencedStream
from mcpl_router.jsonrpc.framing import MessageStream
from mcpl_router.logs import get_logger
from mcpl_router.mcpl.session import ServerSession
from mcpl_router.mcpl.grants import Grant
from mcpl_router.mcpl.handshake import HOST_MCPL_CAPABILITIES, MCP_PROTOCOL_VERSION, LinkHandshake, _LegacyRefused, _PolicyRefused
from mcpl_router.mcpl.link_state import (
    NOTIFIED,
    CapabilityNotGranted,
    LinkState,
    LinkStatus,
    LinkUnavailable,
)
from mcpl_router.mcpl.manifest import Manifest, ManifestError
from mcpl_router.mcpl.regrant import MANIFEST_REFETCH_INTERVAL, LinkRegrant, policy_for
from mcpl_router.mcpl.transports import OpenTransport, TransportError, open_transport
from mcpl_router.routing import texts

if TYPE_CHECKING:
    from mcpl_router.config import ServerConfig

__all__ = [
    "CAPABILITY_DENIED",
    "HOST_MCPL_CAPABILITIES",
    "INBOUND_CAPABILITY",
    "MANIFEST_REFETCH_INTERVAL",
    "MCP_PROTOCOL_VERSION",
    "NOTIFIED",
    "STABLE_AFTER",
    "CapabilityNotGranted",
    "LinkDelegate",
    "LinkState",
    "LinkStatus",
    "LinkUnavailable",
    "ServerLink",
    "policy_for",
]

CAPABILITY_DENIED = -32002

#: Inbound (server → host) methods and the capability each needs (PROTOCOL.md §4).
INBOUND_CAPABILITY: dict[str, str] = {
    "push/event": "pushEvents",
    "channels/register": "channels.register",
    "channels/changed": "channels.register",
    "channels/list": "channels.register",
    "channels/incoming": "channels.incoming",
    "inference/request": "inferenceRequest",
    "model/info": "modelInfo",
}

#: A connection that stayed ready this long resets the backoff.
STABLE_AFTER = 10.0
#: Handshake answers that mean "not with that credential": with ``tokenIn = "auto"`` the next
#: dial sends the token as ``?token=`` instead (connectome-host's way), once.
_AUTH_REFUSED = (401, 403)


class LinkDelegate(Protocol):
    """What the daemon does with what a link hears. Implemented by the daemon's routing shell."""

    def link_state_changed(self, link: ServerLink, old: LinkState, new: LinkState) -> None: ...

    def link_epoch_ended(self, link: ServerLink) -> None:
        """The transport is gone: everything this server registered in that epoch is gone too."""
        ...

    def handle_server_message(self, link: ServerLink, inbound: Inbound, /) -> Awaitable[object]:
        """An admitted inbound method (already checked against the grant). Raise RpcError.

        A method or a property giving the handler itself (the daemon's: no layer of its own)."""
        ...



class ServerLink(LinkHandshake, LinkRegrant):
    """One configured server. Run :meth:`run` in the daemon's nursery; it reconnects forever."""

    def __init__(
        self,
        config: ServerConfig,
        delegate: LinkDelegate,
        *,
        rng: random.Random | None = None,
        open_transport_fn: Callable[[ServerConfig, trio.Nursery], Awaitable[OpenTransport]] = open_transport,
        outbound_fence: Callable[[], str | None] | None = None,
    ) -> None:
        self.config = config
        #: Asked before each write to the server (a cluster node's lease): a reason stops it.
        self._outbound_fence = outbound_fence
        self.server_id = config.id
        self.policy = policy_for(config)
        self.policy.validate()
        self._delegate = delegate
        self._rng = rng or random.Random()
        self._open_transport = open_transport_fn
        self._log = get_logger(server=config.id)
        self.state = LinkState.CONNECTING
        self.grant = Grant.nothing()
        self.manifest: Manifest | None = None
        self.receipt: object = None
        self.legacy = False
        self.legacy_mapping: dict[str, str] = {}
        #: Methods this epoch's server answered -32601 as Requests: sent as Notifications now.
        self._notification_only: set[str] = set()
        self.epoch = 0
        self.attempts = 0
        self.last_error: str | None = None
        #: A stdio child's exit code and last stderr lines, from the latest epoch that had one.
        self.exit_code: int | None = None
        self.stderr_tail: tuple[str, ...] = ()
        #: Inbound refused at admission, by reason: ``/metrics`` reads it (and the session's
        #: publishes, by outcome and reason).
        self.admission_refused: collections.Counter[texts.AdmissionRefusal] = collections.Counter()
        self._since = time.time()
        self._endpoint = ""
        self._peer: Peer | None = None
        self._manifest_dirty = False
        self._manifest_fetch_running = False
        self._last_manifest_fetch = -MANIFEST_REFETCH_INTERVAL
        self._epoch_nursery: trio.Nursery | None = None
        self._ready_event = trio.Event()
        self._ready_since: float | None = None
        self._epoch_exit = 0
        # Where a WebSocket token goes. Kept here, not in ``config``: a reload replaces the
        # config but must not forget what ``tokenIn = "auto"`` learned about this server.
        self._token_place = "query" if config.token_in == "query" else "header"
        #: ``auto`` only: the query was tried (after the header was refused), and whether a
        #: connection with it then came up.
        self._token_query_tried = False
        self._token_query_worked = False
        #: Bumped by every reload that changes this server's policy. A policy answer applies
        #: only within the policy current when it arrives, and an answer to an older policy
        #: than the newest one answered is ignored (two reloads' requests may cross).
        self._policy_generation = 0
        self._answered_generation = 0
        #: Every request and notification the turns, tools and broker send it (mcpl/session.py).
        self.session = ServerSession(self)

    @property
    def request_timeout(self) -> float:
        """The server's own ``requestTimeout`` (docs/config.md)."""
        return self.config.request_timeout

    # -- status ------------------------------------------------------------------------------

    def status(self) -> LinkStatus:
        return LinkStatus(
            server_id=self.server_id,
            state=self.state.value,
            transport=self.config.transport,
            endpoint=self._endpoint,
            epoch=self.epoch,
            attempts=self.attempts,
            legacy=self.legacy,
            legacy_mapping=dict(self.legacy_mapping),
            manifest_version=self.manifest.version if self.manifest else None,
            grant=self.grant.summary(),
            receipt=self.receipt,
            last_error=self.last_error,
            since=self._since,
            exit_code=self.exit_code,
            stderr_tail=self.stderr_tail,
        )

    def peer_statistics(self) -> PeerStatistics | None:
        """The current epoch's JSON-RPC counters (malformed, oversized, skipped lines…), if any."""
        return self._peer.statistics() if self._peer is not None else None

    async def wait_ready(self) -> None:
        """Block until the link is ready in its current epoch."""
        await self._ready_event.wait()

    def _set_state(self, new: LinkState, **fields: object) -> None:
        old = self.state
        if old is new:
            return
        self.state = new
        self._since = time.time()
        if new is LinkState.READY:
            self._ready_event.set()
        elif old is LinkState.READY:
            self._ready_event = trio.Event()
        log = self._log.warning if new in (LinkState.RETRYING, LinkState.FAILED) else self._log.info
        log("link.state", old=old.value, state=new.value, epoch=self.epoch, **fields)
        self._delegate.link_state_changed(self, old, new)

    # -- outbound ----------------------------------------------------------------------------

    def _peer_for(self, capability: str | None) -> Peer:
        """The peer to send on, if the link is ready and the current grant allows ``capability``.

        One call a send (every typing start, lifecycle, publish and hook of a turn asks it).
        """
        peer = self._peer
        if peer is None or peer.closed or self.state is not LinkState.READY:
            raise LinkUnavailable(f"server {self.server_id!r} is {self.state.value}")
        # A granted leaf, the common case, is one set lookup. "prefix.*" means any granted leaf
        # beneath (context/beforeInference: any of its leaves).
        if capability is None or capability in self.grant.effective:
            return peer
        if capability.endswith(".*") and self.grant.allows_any_under(capability[:-2]):
            return peer
        raise CapabilityNotGranted(self.server_id, capability)

    async def call(
        self,
        method: str,
        params: Any = None,
        *,
        capability: str | None,
        timeout: float | None = None,
        result_type: type | None = None,
    ) -> Any:
        """Send a request needing ``capability`` (checked against the current grant first)."""
        peer = self._peer_for(capability)
        return await peer.request(method, params, timeout=timeout, result_type=result_type)

    async def send_notification(self, method: str, params: Any = None, *, capability: str | None) -> None:
        """Send a notification needing ``capability`` (checked against the current grant first)."""
        peer = self._peer_for(capability)
        await peer.notify(method, params)

    def send_notification_nowait(self, method: str, params: Any = None, *, capability: str | None) -> bool:
        """Queue a notification needing ``capability`` if the outbox has room now; False when
        it hasn't (nothing queued: the caller awaits :meth:`send_notification`, with its own
        deadline). Raises as :meth:`send_notification` does. A turn's typing start and
        lifecycle go this way: no task or deadline scope for a send that never waits.
        """
        peer = self._peer_for(capability)
        return peer.notify_nowait(method, params)

    # -- the loop ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect, serve, and reconnect with backoff until cancelled or failed."""
        task_status.started()
        reconnect = self.config.reconnect
        try:
            while True:
                self.epoch += 1
                self.attempts += 1
                self._set_state(LinkState.CONNECTING, attempt=self.attempts)
                try:
                    await self._run_epoch()
                    self.last_error = self._exited() or "connection closed by the server"
                except (_LegacyRefused, _PolicyRefused) as exc:
                    self.last_error = str(exc)
                    self._set_state(LinkState.FAILED, reason=str(exc))
                    return
                except Exception as exc:
                    expected = expected_failure(exc)
                    if expected is not None:
                        # A child that died says more than the closed pipe it left.
                        exited = self._exited() if isinstance(expected, (PeerClosed, trio.BrokenResourceError)) else None
                        self.last_error = exited or describe_failure(expected)
                        self._maybe_token_in_query(expected)
                    else:
                        # A bug in handling one server must not take the daemon (and every
                        # other server) down with it: log it whole and retry like any failure.
                        self._log.exception("link.crashed", epoch=self.epoch)
                        self.last_error = f"internal error: {type(exc).__name__}: {exc}"
                except BaseExceptionGroup as group:
                    # trio-websocket's reader raises a refused dial (ConnectionRejected) beside a
                    # Cancelled of the epoch's own nursery. That is a connection failure like any
                    # other: taken as one, the Cancelled dropped. Were this link really being
                    # cancelled, the next checkpoint (the backoff sleep) raises it again.
                    failures, rest = group.split(lambda leaf: expected_failure(leaf) is not None)
                    if failures is None or (rest is not None and rest.split(trio.Cancelled)[1] is not None):
                        raise
                    expected = expected_failure(failures)
                    assert expected is not None
                    self.last_error = describe_failure(expected)
                    self._maybe_token_in_query(expected)
                if self._ready_since is not None and trio.current_time() - self._ready_since >= STABLE_AFTER:
                    self.attempts = 1
                if reconnect.max_attempts and self.attempts >= reconnect.max_attempts:
                    self._set_state(LinkState.FAILED, reason=f"gave up after {self.attempts} attempts: {self.last_error}")
                    return
                delay = self._backoff_delay()
                self._set_state(LinkState.RETRYING, error=self.last_error, retry_in=round(delay, 3))
                await trio.sleep(delay)
        finally:
            if self.state is not LinkState.FAILED:
                self._set_state(LinkState.CLOSED)

    def _maybe_token_in_query(self, failure: BaseException) -> None:
        """``tokenIn = "auto"`` after a 401/403: the header refused → try ``?token=`` once; the
        query refused too → back to the header for good, so a server that reads the header (and
        refuses a rotated token) gets the token in a URL, and so in its access log, once at most.
        """
        config = self.config
        if config.transport != "websocket" or not config.token or config.token_in != "auto":
            return
        if isinstance(failure, TransportError):
            status = failure.status
        else:  # trio-websocket's own errors (ConnectionRejected: ``status_code``)
            status = getattr(failure, "status_code", getattr(failure, "status", None))
        if status not in _AUTH_REFUSED:
            return
        if self._token_place == "header" and not self._token_query_tried:
            self._token_place = "query"
            self._token_query_tried = True
            self.attempts = 0  # not a failure of the server's: the next dial comes at once
            self._log.info("link.token.query", refused=status, hint='set tokenIn = "query" to start there')
        elif self._token_place == "query" and not self._token_query_worked:
            self._token_place = "header"
            self._log.warning(
                "link.token.refused",
                refused=status,
                places=["header", "query"],
                hint="the server refused the token in the header and in the query: check the token; "
                'dialling with the header from now on (set tokenIn = "header" or "query" to choose)',
            )

    def _dial_config(self) -> ServerConfig:
        """The config to dial with: the token where this link has learned to put it."""
        if self.config.transport != "websocket" or not self.config.token or self.config.token_in == self._token_place:
            return self.config
        return attrs.evolve(self.config, token_in=self._token_place)

    def _exited(self) -> str | None:
        """"exited with code N: <its last stderr line>" when this epoch's child has exited."""
        if self.exit_code is None or self._epoch_exit != self.epoch:
            return None
        last = next((line for line in reversed(self.stderr_tail) if line.strip()), None)
        if self.exit_code < 0:
            try:
                how = f"was killed by {signal.Signals(-self.exit_code).name}"
            except ValueError:
                how = f"was killed by signal {-self.exit_code}"
        else:
            how = f"exited with code {self.exit_code}"
        return f"the server {how}" + (f": {last.strip()}" if last else "")

    def _backoff_delay(self) -> float:
        reconnect = self.config.reconnect
        base = reconnect.initial_delay * reconnect.multiplier ** max(0, self.attempts - 1)
        base = min(base, reconnect.max_delay)
        spread = base * reconnect.jitter
        return max(0.0, base + self._rng.uniform(-spread, spread))

    async def _run_epoch(self) -> None:
        self.grant = Grant.nothing()  # every new transport epoch starts with nothing granted
        self.legacy = False
        self.legacy_mapping = {}
        self._notification_only = set()
        self.receipt = None
        self._ready_since = None
        transport: OpenTransport | None = None
        failure: Exception | None = None
        try:
            async with trio.open_nursery() as nursery:
                try:
                    self._epoch_nursery = nursery
                    transport = await self._open_transport(self._dial_config(), nursery)
                    self._endpoint = transport.description
                    stream: MessageStream = transport.stream
                    if self._outbound_fence is not None:
                        stream = FencedStream(stream, self._outbound_fence)
                    peer = Peer(
                        stream,
                        self._dispatch,
                        request_timeout=self.config.request_timeout,
                        log_fields={"server": self.server_id, "epoch": self.epoch},
                        # Each inbound message carries the grant in force as it arrived.
                        stamp=self._grant_at_receipt,
                    )
                    self._peer = peer
                    peer_done = trio.Event()

                    async def serve(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                        try:
                            await peer.run(task_status=task_status)
                        finally:
                            peer_done.set()

                    await nursery.start(serve)
                    await self._handshake(peer)
                    if self._token_place == "query":
                        self._token_query_worked = True  # a later refusal is a rotated token
                    self._ready_since = trio.current_time()
                    self._set_state(LinkState.READY, endpoint=self._endpoint, grant=self.grant.summary())
                    await peer_done.wait()
                    nursery.cancel_scope.cancel()
                except Exception as exc:
                    # Raised here rather than out of the nursery, so callers see the error itself
                    # and not an ExceptionGroup around it.
                    failure = exc
                    nursery.cancel_scope.cancel()
            if failure is not None:
                raise failure
        finally:
            self._peer = None
            self._epoch_nursery = None
            if transport is not None:
                with trio.CancelScope(shield=True):
                    await transport.aclose()
                    if transport.process is not None:
                        self._log.info("server.exited", returncode=transport.process.returncode, epoch=self.epoch)
                        self.exit_code = transport.process.returncode
                        self.stderr_tail = tuple(transport.stderr_tail)
                        self._epoch_exit = self.epoch
            self.grant = Grant.nothing()
            self._delegate.link_epoch_ended(self)

    # -- inbound -----------------------------------------------------------------------------

    def _grant_at_receipt(self) -> Grant:
        return self.grant

    async def _dispatch(self, inbound: Inbound) -> object:
        method = inbound.method
        if method == "mcpl/manifestChanged":
            self._on_manifest_changed()
            return {} if not inbound.is_notification else None
        if method == "ping":
            return {}
        capability = INBOUND_CAPABILITY.get(method)
        # Admission against the grant current at receipt (stamped in the read loop as the
        # message arrived), not when its turn in the ordered queue came; before the policy,
        # that grant is nothing.
        grant = inbound.stamp if isinstance(inbound.stamp, Grant) else self.grant
        if capability is not None and not grant.allows(capability):
            refusal = texts.AdmissionRefusal.NOT_GRANTED if grant.effective else texts.AdmissionRefusal.BEFORE_POLICY
            self.admission_refused[refusal] += 1
            reason = texts.admission_why(refusal)
            if inbound.is_notification:
                self._log.warning("link.admission.dropped", method=method, capability=capability, reason=reason)
                return None
            self._log.warning("link.admission.refused", method=method, capability=capability, reason=reason)
            raise RpcError(
                CAPABILITY_DENIED,
                f"Capability denied: {method} needs {capability}, which this host has not granted ({reason}).",
                {"capability": capability},
            )
        return await self._delegate.handle_server_message(self, inbound)


_EXPECTED_FAILURES = (TransportError, PeerClosed, RequestTimeout, RpcError, ManifestError, trio.BrokenResourceError)


def expected_failure(exc: BaseException) -> BaseException | None:
    """The first connection-level failure in ``exc`` (or in its group), or None for a bug."""
    # trio-websocket's reader raises its own errors (ConnectionRejected, …) in the nursery.
    return first_leaf(
        exc,
        lambda leaf: isinstance(leaf, _EXPECTED_FAILURES) or type(leaf).__module__.startswith("trio_websocket"),
    )


def describe_failure(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    if status is not None:  # trio-websocket's ConnectionRejected: the server said no
        return f"websocket handshake refused (status {status})"
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        # The daemon's own limit, not the server's fault: said so, by its name.
        which = "this process" if exc.errno == errno.EMFILE else "the system"
        return f"out of file descriptors ({errno.errorcode[exc.errno]}: {which} is at its limit; raise LimitNOFILE / ulimit -n)"
    return f"{type(exc).__name__}: {exc}"
