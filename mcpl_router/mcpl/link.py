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
"""

from __future__ import annotations

import collections
import enum
import random
import signal
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import msgspec
import trio

from mcpl_router.errors import first_leaf
from mcpl_router.jsonrpc import METHOD_NOT_FOUND, Inbound, Peer, PeerClosed, RequestTimeout, RpcError
from mcpl_router.jsonrpc.envelope import Envelope
from mcpl_router.jsonrpc.peer import PeerStatistics
from mcpl_router.logs import get_logger
from mcpl_router.mcpl.digest import DigestError, manifest_revision
from mcpl_router.mcpl.grants import Grant, GrantPolicy, compute_grant, narrow_on_manifest_change
from mcpl_router.mcpl.manifest import Manifest, ManifestError, diff_manifests, map_legacy_vocabulary, parse_manifest
from mcpl_router.mcpl.transports import OpenTransport, TransportError, open_transport

if TYPE_CHECKING:
    from mcpl_router.config import ServerConfig

MCP_PROTOCOL_VERSION = "2024-11-05"
CAPABILITY_DENIED = -32002

#: What the daemon, as a host, supports; sent in ``initialize``.
HOST_MCPL_CAPABILITIES: dict[str, Any] = {
    "version": "0.5",
    "pushEvents": True,
    "contextHooks": {"beforeInference": {"observe": True, "inject": {"system": True, "beforeUser": True, "afterUser": True}}},
    "inferenceLifecycle": True,
    "channels": {
        "register": True,
        "lifecycle": True,
        "publish": True,
        "incoming": True,
        "streaming": True,
        "acknowledge": True,
        "typing": True,
    },
    "featureSets": True,
}

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

#: The least time between two manifest re-fetches, so a chatty server can't make us spin.
MANIFEST_REFETCH_INTERVAL = 1.0
#: A connection that stayed ready this long resets the backoff.
STABLE_AFTER = 10.0
#: Handshake answers that mean "not with that credential": with ``tokenIn = "auto"`` the next
#: dial sends the token as ``?token=`` instead (connectome-host's way), once.
_AUTH_REFUSED = (401, 403)
#: The method whose Request form a server may refuse (-32601) while reading its Notification.
_POLICY_METHOD = "featureSets/update"


#: What :meth:`ServerLink.request_or_notify` returns when the method went as a Notification.
NOTIFIED: Any = enum.Enum("Notified", "NOTIFIED").NOTIFIED


class LinkState(enum.Enum):
    CONNECTING = "connecting"
    READY = "ready"
    RETRYING = "retrying"
    CLOSED = "closed"
    FAILED = "failed"


class LinkUnavailable(Exception):
    """The link is not ready (or not connected) for an outbound call."""


class CapabilityNotGranted(Exception):
    """We would send a message needing a capability this server's current grant lacks."""

    def __init__(self, server_id: str, capability: str) -> None:
        super().__init__(f"server {server_id!r} is not granted {capability}")
        self.server_id = server_id
        self.capability = capability


class LinkDelegate(Protocol):
    """What the daemon does with what a link hears. Implemented by the daemon's routing shell."""

    def link_state_changed(self, link: ServerLink, old: LinkState, new: LinkState) -> None: ...

    def link_epoch_ended(self, link: ServerLink) -> None:
        """The transport is gone: everything this server registered in that epoch is gone too."""
        ...

    async def handle_server_message(self, link: ServerLink, inbound: Inbound) -> Any:
        """An admitted inbound method (already checked against the grant). Raise RpcError."""
        ...


@attrs.frozen
class LinkStatus:
    """An immutable snapshot for ``servers/list``, ``status`` and the demo."""

    server_id: str
    state: str
    transport: str
    endpoint: str
    epoch: int
    attempts: int
    legacy: bool
    #: 0.4 name → the 0.5 leaf it was read as, for a legacy server that used one.
    legacy_mapping: dict[str, str]
    manifest_version: str | None
    grant: dict[str, Any]
    receipt: Any
    last_error: str | None
    since: float
    exit_code: int | None = None
    stderr_tail: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        return {
            "serverId": self.server_id,
            "state": self.state,
            "transport": self.transport,
            "endpoint": self.endpoint,
            "epoch": self.epoch,
            "attempts": self.attempts,
            "legacy": self.legacy,
            "legacyMapping": dict(self.legacy_mapping),
            "manifestVersion": self.manifest_version,
            "grant": {
                "granted": self.grant["granted"],
                "deniedCount": self.grant["denied_count"],
                "featureSetsEnabled": self.grant["feature_sets_enabled"],
                "featureSetsDisabled": self.grant["feature_sets_disabled"],
                "legacy": self.grant["legacy"],
            },
            "receipt": self.receipt,
            "lastError": self.last_error,
            "exitCode": self.exit_code,
            "stderr": list(self.stderr_tail),
        }


class _LegacyRefused(Exception):
    pass


class _PolicyRefused(Exception):
    def __init__(self, fallback: str) -> None:
        super().__init__(fallback)
        self.fallback = fallback


def policy_for(config: ServerConfig) -> GrantPolicy:
    """The grant policy a server's config asks for (the daemon's defaults where it's silent).

    ``from_config`` drops an exact denial from the *default* allowlist rather than reading it
    as a malformed allow+deny pair: the operator only wrote the deny.
    """
    return GrantPolicy.from_config(
        enabled_capabilities=config.enabled_capabilities,
        disabled_capabilities=config.disabled_capabilities,
        enabled_feature_sets=config.enabled_feature_sets,
        disabled_feature_sets=config.disabled_feature_sets,
    )


class ServerLink:
    """One configured server. Run :meth:`run` in the daemon's nursery; it reconnects forever."""

    def __init__(
        self,
        config: ServerConfig,
        delegate: LinkDelegate,
        *,
        rng: random.Random | None = None,
        open_transport_fn: Callable[[ServerConfig, trio.Nursery], Awaitable[OpenTransport]] = open_transport,
    ) -> None:
        self.config = config
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
        self.receipt: Any = None
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
        #: Counters ``/metrics`` reads: inbound refused at admission (by reason), publishes
        #: (by outcome and reason).
        self.admission_refused: collections.Counter[str] = collections.Counter()
        self.publishes: collections.Counter[tuple[str, str]] = collections.Counter()
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

    def _set_state(self, new: LinkState, **fields: Any) -> None:
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

    def _live_peer(self) -> Peer:
        if self._peer is None or self._peer.closed or self.state is not LinkState.READY:
            raise LinkUnavailable(f"server {self.server_id!r} is {self.state.value}")
        return self._peer

    def _check_capability(self, capability: str | None) -> None:
        if capability is None:
            return
        # "prefix.*" means any granted leaf beneath (context/beforeInference: any of its leaves).
        if capability.endswith(".*"):
            granted = self.grant.allows_any_under(capability[:-2])
        else:
            granted = self.grant.allows(capability)
        if not granted:
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
        peer = self._live_peer()
        self._check_capability(capability)
        return await peer.request(method, params, timeout=timeout, result_type=result_type)

    async def request_or_notify(self, method: str, params: Any, *, capability: str, timeout: float | None = None) -> Any:
        """Send ``method`` as a Request; the result, or :data:`NOTIFIED`.

        A server that takes ``method`` only as a Notification (mcpl-editor's ``channels/publish``)
        answers the Request -32601: it then gets the Notification, and in the rest of this epoch
        only that, without a refused Request first. Raises as :meth:`call` does otherwise.
        """
        if method not in self._notification_only:
            try:
                return await self.call(method, params, capability=capability, timeout=timeout)
            except RpcError as error:
                if error.code != METHOD_NOT_FOUND:
                    raise
                self._notification_only.add(method)
                self._log.info("link.notification_only", method=method, epoch=self.epoch)
        await self.send_notification(method, params, capability=capability)
        return NOTIFIED

    async def send_notification(self, method: str, params: Any = None, *, capability: str | None) -> None:
        """Send a notification needing ``capability`` (checked against the current grant first)."""
        peer = self._live_peer()
        self._check_capability(capability)
        await peer.notify(method, params)

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
                    expected = _expected_failure(exc)
                    if expected is not None:
                        # A child that died says more than the closed pipe it left.
                        exited = self._exited() if isinstance(expected, (PeerClosed, trio.BrokenResourceError)) else None
                        self.last_error = exited or _describe_failure(expected)
                        self._maybe_token_in_query(expected)
                    else:
                        # A bug in handling one server must not take the daemon (and every
                        # other server) down with it: log it whole and retry like any failure.
                        self._log.exception("link.crashed", epoch=self.epoch)
                        self.last_error = f"internal error: {type(exc).__name__}: {exc}"
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
                    peer = Peer(
                        transport.stream,
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

    # -- handshake ---------------------------------------------------------------------------

    async def _handshake(self, peer: Peer) -> None:
        answer = await peer.request(
            "initialize",
            {
                "protocolVersion": MCP_PROTOCOL_VERSION,
                "capabilities": {"experimental": {"mcpl": HOST_MCPL_CAPABILITIES}},
                "clientInfo": {"name": "mcpl-router", "version": _version()},
            },
        )
        capabilities = answer.get("capabilities") if isinstance(answer, dict) else None
        capabilities = capabilities if isinstance(capabilities, dict) else {}
        experimental = capabilities.get("experimental")
        raw_manifest = experimental.get("mcpl") if isinstance(experimental, dict) else None
        manifest = parse_manifest(raw_manifest, mcp_tools="tools" in capabilities)
        if manifest.problems:
            self._log.info("link.manifest.tolerated", problems=list(manifest.problems))
        legacy_why = _legacy_reason(manifest)
        if legacy_why is not None:
            if self.config.legacy == "deny":
                raise _LegacyRefused(f'legacy server refused by config (legacy = "deny"): {legacy_why}')
            manifest = self._map_legacy_vocabulary(manifest)
        self.manifest = manifest
        # A reload may change the policy while this handshake waits: the generation tells
        # the answer, and the end of the handshake, that the grant computed here is stale.
        generation = self._policy_generation
        granted = compute_grant(manifest, self.policy)
        # A legacy server acts right after "initialized" (mcpl-editor even waits for the answer
        # to its channels/register before reading our policy), so its host-side grant must be
        # in force before we send it: each message is admitted against the grant at receipt.
        if legacy_why is not None:
            self._enter_legacy(granted, why=legacy_why)
        elif self.config.legacy == "allow":
            # Operator says this server acts before its policy: admit against the host-side grant.
            self._apply_grant(granted, host_side=True)
        await peer.notify("notifications/initialized")
        try:
            await peer.request(
                _POLICY_METHOD,
                granted.to_update_params(),
                on_answer=lambda envelope: self._on_policy_answer(envelope, granted, generation),
            )
        except RpcError as error:
            if error.code != METHOD_NOT_FOUND:
                raise
            if self.config.legacy == "deny":
                raise _LegacyRefused('legacy server refused by config (legacy = "deny"): featureSets/update answered -32601') from None
            if legacy_why is None:
                # The read loop applied the host-side grant as the answer arrived; say so once.
                log = self._log.warning if self.config.legacy == "auto" else self._log.info
                log("link.legacy", reason="featureSets/update answered -32601", hint='set legacy = "allow" to silence, "deny" to refuse')
            # Servers that take the policy only as a Notification (mcpl-editor, src/mcpl.ts:219)
            # still learn which feature sets are enabled; the grant stays host-side. A reload
            # tells them the same way (send_policy).
            self._notification_only.add(_POLICY_METHOD)
            if self._policy_generation != generation:
                self._apply_grant(compute_grant(manifest, self.policy), host_side=True)
            await peer.notify(_POLICY_METHOD, self.grant.to_update_params())
            self._log.info("link.policy.notified", reason="featureSets/update answered -32601")
            return
        if isinstance(self.receipt, dict) and self.receipt.get("accepted") is False:
            fallback = self.receipt.get("fallback")
            if fallback == "mcp-only":
                self._apply_grant(
                    compute_grant(Manifest.empty(mcp_tools=granted.allows("tools")), self.policy), host_side=True
                )
                self._log.warning("link.policy.refused", fallback="mcp-only", receipt=self.receipt)
            else:
                raise _PolicyRefused(f"the server refused the policy (fallback {fallback!r})")
            return
        if self._policy_generation != generation and self._epoch_nursery is not None:
            # A reload changed the policy while the server held our first one: what it narrowed
            # is already withdrawn (the answer applied only within the new policy); now send
            # the server the new grant, so what it adds can take effect on its receipt. In the
            # background: readiness need not wait another round trip for a grant already safe.
            self._epoch_nursery.start_soon(self._send_current_policy, peer)

    def _within_policy(self, granted: Grant) -> Grant:
        """``granted`` ∩ what the current policy grants: a grant sent before a reload never
        brings back what the reload took away."""
        if self.manifest is None:
            return granted
        return narrow_on_manifest_change(granted, self.manifest, self.policy)

    def _on_policy_answer(self, envelope: Envelope, granted: Grant, generation: int) -> None:
        """Runs in the read loop as the receipt arrives, before the server's next message."""
        if envelope.error is not msgspec.UNSET:
            if envelope.error.code == METHOD_NOT_FOUND and self.config.legacy != "deny" and not self.legacy:
                # A legacy server (e.g. heartbeat-mcpl): the host-side grant applies from its
                # very next message. "deny" is refused by the link task.
                self.legacy = True
                self._apply_grant(self._within_policy(granted), host_side=True)
            return  # other errors fail the epoch in the link task
        if generation < self._answered_generation:
            # The answer to an older policy, after a newer one's: the newer grant stands.
            self._log.info("link.policy.receipt.stale", generation=generation, answered=self._answered_generation)
            return
        self._answered_generation = generation
        try:
            receipt = msgspec.json.decode(envelope.result) if envelope.result is not msgspec.UNSET else None
        except msgspec.DecodeError:
            receipt = None
        self.receipt = receipt
        if isinstance(receipt, dict) and receipt.get("accepted") is False:
            self._log.warning("link.policy.receipt", accepted=False, receipt=receipt)
            return
        # A receipt never widens the grant: we apply what we sent, within the current policy.
        self._apply_grant(self._within_policy(granted), host_side=False)
        if isinstance(receipt, dict) and receipt.get("mode") == "degraded":
            self._log.warning("link.policy.receipt", accepted=True, mode="degraded", unavailable=receipt.get("unavailableFeatures"), notes=receipt.get("notes"))
        else:
            self._log.info("link.policy.receipt", accepted=True, receipt=receipt)

    def _map_legacy_vocabulary(self, manifest: Manifest) -> Manifest:
        """Read a legacy server's 0.4 names as their 0.5 leaves, saying so (log + status)."""
        mapped, applied = map_legacy_vocabulary(manifest)
        if applied:
            self.legacy_mapping = applied
            self._log.info("link.legacy.mapped", mapping=applied, hint="0.4 names read as their 0.5 leaves")
        return mapped

    def _enter_legacy(self, granted: Grant, *, why: str) -> None:
        if self.config.legacy == "deny":
            raise _LegacyRefused(f"legacy server refused by config (legacy = \"deny\"): {why}")
        self.legacy = True
        if self.config.legacy == "auto":
            self._log.warning("link.legacy", reason=why, hint='set legacy = "allow" to silence, "deny" to refuse')
        else:
            self._log.info("link.legacy", reason=why)
        self._apply_grant(granted, host_side=True)

    def _apply_grant(self, grant: Grant, *, host_side: bool) -> None:
        # ``self.legacy`` is the one answer to "is this server legacy": the grant's flag only
        # mirrors it, so a policy answer (computed without it) can't flip it back.
        self.grant = attrs.evolve(grant, legacy=self.legacy)
        self._log.info("link.grant", host_side=host_side, **self.grant.summary())

    def regrant_host_side(self, config: ServerConfig) -> bool:
        """A reload changed this server's grant policy: withdraw, host-side and at once, what the
        new policy takes away (narrowing never waits for the server). True when the server is
        to be sent the new grant now (:meth:`send_policy`).

        Ready: what the new policy adds takes effect when the server's receipt arrives, as at
        connect (a legacy server acts without its policy: all of it applies host-side now).
        Mid-handshake: the handshake's policy answer applies only within the new policy, and the
        handshake then sends the new grant itself. Not connected: the next epoch computes it.
        """
        self.config = config
        self.policy = policy_for(config)
        self.policy.validate()
        self._policy_generation += 1
        if self._peer is None or self.manifest is None:
            self._log.info("link.regrant", state=self.state.value, sent=False, hint="the next connection uses the new policy")
            return False
        old = self.grant
        wanted = compute_grant(self.manifest, self.policy)
        if self.legacy:
            self._apply_grant(wanted, host_side=True)
        else:
            self._apply_grant(narrow_on_manifest_change(old, self.manifest, self.policy), host_side=True)
        ready = self.state is LinkState.READY
        self._log.info(
            "link.regrant",
            state=self.state.value,
            revoked=sorted(old.effective - self.grant.effective),
            added=sorted(wanted.effective - old.effective),
            sent=ready,
        )
        return ready

    async def send_policy(self) -> None:
        """Send the server the grant its current policy gives (after :meth:`regrant_host_side`).

        Bounded by ``requestTimeout``; a failure is logged and leaves the narrowed grant.
        """
        peer = self._peer
        if peer is None or self.manifest is None or self.state is not LinkState.READY:
            return
        await self._send_current_policy(peer)

    async def regrant(self, config: ServerConfig) -> None:
        """:meth:`regrant_host_side`, then :meth:`send_policy` when the server is to be told."""
        if self.regrant_host_side(config):
            await self.send_policy()

    async def _send_current_policy(self, peer: Peer) -> None:
        assert self.manifest is not None
        generation = self._policy_generation
        wanted = compute_grant(self.manifest, self.policy)
        try:
            if _POLICY_METHOD not in self._notification_only:
                try:
                    await peer.request(
                        _POLICY_METHOD,
                        wanted.to_update_params(),
                        on_answer=lambda envelope: self._on_policy_answer(envelope, wanted, generation),
                    )
                    return
                except RpcError as error:
                    if error.code != METHOD_NOT_FOUND:
                        raise
                    self._notification_only.add(_POLICY_METHOD)
            # As at connect: a server that reads only the Notification (mcpl-editor) is told
            # which feature sets are enabled that way; its grant is host-side.
            await peer.notify(_POLICY_METHOD, self.grant.to_update_params())
            self._log.info("link.policy.notified", generation=generation)
        except (RpcError, RequestTimeout, PeerClosed, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self._log.warning("link.regrant.failed", error=str(exc))

    # -- inbound -----------------------------------------------------------------------------

    def _grant_at_receipt(self) -> Grant:
        return self.grant

    async def _dispatch(self, inbound: Inbound) -> Any:
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
            reason = "not granted" if grant.effective else "before the policy was in force"
            self.admission_refused["not-granted" if grant.effective else "before-policy"] += 1
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

    # -- manifest changes (§17) --------------------------------------------------------------

    def _on_manifest_changed(self) -> None:
        self._manifest_dirty = True
        if not self._manifest_fetch_running and self._epoch_nursery is not None:
            self._manifest_fetch_running = True
            self._epoch_nursery.start_soon(self._refetch_manifest)

    async def _refetch_manifest(self) -> None:
        try:
            while self._manifest_dirty:
                self._manifest_dirty = False
                wait = self._last_manifest_fetch + MANIFEST_REFETCH_INTERVAL - trio.current_time()
                if wait > 0:
                    await trio.sleep(wait)  # rate bound: announcements in between coalesce
                self._last_manifest_fetch = trio.current_time()
                await self._apply_manifest_change()
        finally:
            self._manifest_fetch_running = False

    async def _apply_manifest_change(self) -> None:
        peer = self._peer
        if peer is None or self.manifest is None:
            return
        try:
            raw = await peer.request("mcpl/manifest")
        except (RpcError, RequestTimeout, PeerClosed) as exc:
            self._log.warning("link.manifest.refetch_failed", error=str(exc))
            return
        if isinstance(raw, dict) and isinstance(raw.get("manifest"), dict):
            raw = raw["manifest"]  # tolerate a wrapped answer
        try:
            new_manifest = parse_manifest(raw)
        except ManifestError as exc:
            self._log.warning("link.manifest.invalid", error=str(exc))
            return
        if new_manifest.revision is not None:
            try:
                computed = manifest_revision(raw)
            except DigestError as exc:
                self._log.warning("link.manifest.invalid", error=f"{exc.code}: {exc}")
                return
            if computed != new_manifest.revision:
                self._log.warning("link.manifest.revision_mismatch", claimed=new_manifest.revision, computed=computed)
                return
        if self.legacy:
            new_manifest = self._map_legacy_vocabulary(new_manifest)
        diff = diff_manifests(self.manifest, new_manifest)
        old_grant = self.grant
        new_grant = narrow_on_manifest_change(old_grant, new_manifest, self.policy)
        # Removals first, host-side, before telling the server: narrowing never waits.
        self.grant = attrs.evolve(new_grant, legacy=self.legacy)
        self.manifest = new_manifest
        sent = False
        if new_grant.effective != old_grant.effective:
            # Told the way it learned its policy at connect, as a reload tells it: a Request, or
            # the Notification for a server that takes only that (mcpl-editor).
            try:
                if _POLICY_METHOD in self._notification_only:
                    await peer.notify(_POLICY_METHOD, self.grant.to_update_params())
                else:
                    await peer.request(_POLICY_METHOD, new_grant.to_update_params())
                sent = True
            except (RpcError, RequestTimeout, PeerClosed, trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                self._log.warning("link.manifest.policy_update_failed", error=str(exc))
        self._log.info(
            "link.manifest.changed",
            diff=diff.to_receipt(),
            revoked=sorted(old_grant.effective - new_grant.effective),
            not_granted=sorted(new_manifest.advertised - new_grant.effective),
            policy_sent=sent,
            revision=new_manifest.revision,
        )


def _legacy_reason(manifest: Manifest) -> str | None:
    """Why the manifest alone shows a legacy server (older version, 0.4 names), or None."""
    if manifest.is_legacy_version:
        return f"manifest version {manifest.version}"
    if manifest.legacy_names:
        return f"0.4 vocabulary ({', '.join(manifest.legacy_names)}) in a version {manifest.version!r} manifest"
    return None


_EXPECTED_FAILURES = (TransportError, PeerClosed, RequestTimeout, RpcError, ManifestError, trio.BrokenResourceError)


def _expected_failure(exc: BaseException) -> BaseException | None:
    """The first connection-level failure in ``exc`` (or in its group), or None for a bug."""
    # trio-websocket's reader raises its own errors (ConnectionRejected, …) in the nursery.
    return first_leaf(
        exc,
        lambda leaf: isinstance(leaf, _EXPECTED_FAILURES) or type(leaf).__module__.startswith("trio_websocket"),
    )


def _describe_failure(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    if status is not None:  # trio-websocket's ConnectionRejected: the server said no
        return f"websocket handshake refused (status {status})"
    return f"{type(exc).__name__}: {exc}"


def _version() -> str:
    from mcpl_router import __version__

    return __version__
