"""Re-granting a connected server: its policy from config, a reload's new policy, a manifest change.

A server's grant policy comes from its config (:func:`policy_for`). When a reload changes it,
what the new policy takes away is withdrawn host-side at once (narrowing never waits for the
server), and the server is sent the new grant; what the new policy adds takes effect when its
receipt arrives, as at connect. When a server announces a new manifest (§17), it is fetched
again (at most every :data:`MANIFEST_REFETCH_INTERVAL`), checked against its revision, and the
grant narrowed to it, again host-side first. Either way the server is told the way it learned
its policy at connect: a Request, or the Notification for a server that takes only that.

Apart from the handshake (:mod:`mcpl_router.mcpl.handshake`), whose policy-answer handling it
reuses, because these change a grant already in force while the link keeps serving; the running
link only routes a manifest announcement here. The state it uses is the link's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs
import trio

from mcpl_router.logs import Logger
from mcpl_router.jsonrpc import METHOD_NOT_FOUND, Peer, PeerClosed, RequestTimeout, RpcError
from mcpl_router.jsonrpc.envelope import Envelope
from mcpl_router.mcpl.digest import DigestError, manifest_revision
from mcpl_router.config.read_inference import SERVER_INFERENCE_LEAVES
from mcpl_router.mcpl.grants import (
    DEFAULT_ENABLED_CAPABILITIES,
    Grant,
    GrantPolicy,
    compute_grant,
    narrow_on_manifest_change,
    path_matches,
)
from mcpl_router.mcpl.handshake import _POLICY_METHOD
from mcpl_router.mcpl.link_state import LinkState
from mcpl_router.mcpl.manifest import Manifest, ManifestError, diff_manifests, parse_manifest

if TYPE_CHECKING:
    from mcpl_router.config import ServerConfig

__all__ = ["MANIFEST_REFETCH_INTERVAL", "LinkRegrant", "policy_for"]

#: The least time between two manifest re-fetches, so a chatty server can't make us spin.
MANIFEST_REFETCH_INTERVAL = 1.0


def policy_for(config: ServerConfig) -> GrantPolicy:
    """The grant policy a server's config asks for (the daemon's defaults where it's silent).

    ``from_config`` drops an exact denial from the *default* allowlist rather than reading it
    as a malformed allow+deny pair: the operator only wrote the deny.

    Server-initiated inference (``inferenceRequest``, ``inferenceRequest.streaming``,
    ``modelInfo``) is the operator's ``inference`` table's to grant: without it those leaves are
    denied whatever the patterns say (``*`` included); with it they join the allowlist, except
    the ones ``disabledCapabilities`` names.
    """
    enabled = config.enabled_capabilities
    disabled = tuple(config.disabled_capabilities)
    if config.inference is None:
        enabled = None if enabled is None else tuple(p for p in enabled if p not in SERVER_INFERENCE_LEAVES)
        disabled += tuple(leaf for leaf in SERVER_INFERENCE_LEAVES if leaf not in disabled)
    else:
        base = DEFAULT_ENABLED_CAPABILITIES if enabled is None else enabled
        base = tuple(p for p in base if p not in disabled)
        added = tuple(leaf for leaf in SERVER_INFERENCE_LEAVES if leaf not in base and not any(path_matches(p, leaf) for p in disabled))
        enabled = base + added
    return GrantPolicy.from_config(
        enabled_capabilities=enabled,
        disabled_capabilities=disabled,
        enabled_feature_sets=config.enabled_feature_sets,
        disabled_feature_sets=config.disabled_feature_sets,
    )


class LinkRegrant:
    """Reloads and manifest changes; a part of :class:`~mcpl_router.mcpl.link.ServerLink`."""

    # The link's, set when it is made (and reset each epoch).
    config: ServerConfig
    policy: GrantPolicy
    _log: Logger
    state: LinkState
    grant: Grant
    manifest: Manifest | None
    legacy: bool
    _peer: Peer | None
    _notification_only: set[str]
    _epoch_nursery: trio.Nursery | None
    _policy_generation: int
    _manifest_dirty: bool
    _manifest_fetch_running: bool
    _last_manifest_fetch: float

    if TYPE_CHECKING:

        def _apply_grant(self, grant: Grant, *, host_side: bool) -> None: ...

        def _on_policy_answer(self, envelope: Envelope, granted: Grant, generation: int) -> None: ...

        def _map_legacy_vocabulary(self, manifest: Manifest) -> Manifest: ...

    # -- a reload's new policy ---------------------------------------------------------------

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
