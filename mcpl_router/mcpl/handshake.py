"""The handshake: what a server is told we support, how its manifest is read, how a grant is agreed.

Per transport epoch, once the transport is open: MCP ``initialize`` advertising our MCPL 0.5
support (:data:`HOST_MCPL_CAPABILITIES`); the manifest parsed whatever its shape, a legacy one
(version below 0.5, 0.4 names) read in 0.5 terms; ``notifications/initialized``; then the grant
(§5.4) sent with ``featureSets/update`` **as a Request**. The grant takes effect when the
receipt arrives, inside the peer's read loop (:meth:`LinkHandshake._on_policy_answer`), so it is
in force for the very next message the server sent; a receipt never widens it. A legacy server
gets its grant host-side before it can act, and one that takes the policy only as a
Notification is told that way.

Apart from the running link (:mod:`mcpl_router.mcpl.link`) because agreeing a grant is a
protocol of its own, with its legacy cases, that the reconnect loop only starts and awaits. The
state it uses is the link's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import msgspec
import trio

from mcpl_router.logs import Logger
from mcpl_router.jsonrpc import METHOD_NOT_FOUND, Peer, RpcError
from mcpl_router.jsonrpc.envelope import Envelope
from mcpl_router.mcpl.grants import Grant, GrantPolicy, compute_grant, narrow_on_manifest_change
from mcpl_router.mcpl.manifest import Manifest, map_legacy_vocabulary, parse_manifest

if TYPE_CHECKING:
    from mcpl_router.config import ServerConfig

__all__ = ["HOST_MCPL_CAPABILITIES", "MCP_PROTOCOL_VERSION", "LinkHandshake"]

MCP_PROTOCOL_VERSION = "2024-11-05"

#: What the daemon, as a host, supports; sent in ``initialize``.
HOST_MCPL_CAPABILITIES: dict[str, object] = {
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

#: The method whose Request form a server may refuse (-32601) while reading its Notification.
_POLICY_METHOD = "featureSets/update"


class _LegacyRefused(Exception):
    pass


class _PolicyRefused(Exception):
    def __init__(self, fallback: str) -> None:
        super().__init__(fallback)
        self.fallback = fallback


class LinkHandshake:
    """The handshake and the grant's agreement; a part of :class:`~mcpl_router.mcpl.link.ServerLink`."""

    # The link's, set when it is made (and reset each epoch).
    config: ServerConfig
    policy: GrantPolicy
    _log: Logger
    grant: Grant
    manifest: Manifest | None
    receipt: object
    legacy: bool
    legacy_mapping: dict[str, str]
    _notification_only: set[str]
    _epoch_nursery: trio.Nursery | None
    _policy_generation: int
    _answered_generation: int

    if TYPE_CHECKING:

        async def _send_current_policy(self, peer: Peer) -> None: ...

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


def _legacy_reason(manifest: Manifest) -> str | None:
    """Why the manifest alone shows a legacy server (older version, 0.4 names), or None."""
    if manifest.is_legacy_version:
        return f"manifest version {manifest.version}"
    if manifest.legacy_names:
        return f"0.4 vocabulary ({', '.join(manifest.legacy_names)}) in a version {manifest.version!r} manifest"
    return None


def _version() -> str:
    from mcpl_router import __version__

    return __version__
