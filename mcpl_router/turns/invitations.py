"""The closed-channel invitation a message wake carries: how to answer where the agent isn't.

Only for a message that addresses the agent in a channel that is registered and not open;
the first option is the agent's mode's way to reach that channel alone
(:meth:`~mcpl_router.routing.modes.ProseMode.invitation_reply`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from mcpl_router.routing import prose
from mcpl_router.routing.modes import ProseMode
from mcpl_router.routing.refs import ChannelRef

if TYPE_CHECKING:
    from mcpl_router.routing.router import Router
    from mcpl_router.routing.wakes import Wake

__all__ = ["Invitations"]

#: Rendered invitations kept (cleared whenever the registry changes).
INVITATION_CACHE: Final = 1024


class Invitations:
    """Renders invitations, one text per (mode, channel, author, may publish) while the
    registry stands, so a busy channel's wakes don't each render it anew."""

    def __init__(self, router: Router) -> None:
        self._router = router
        self._cache: dict[tuple[ProseMode, ChannelRef, str | None, bool], str] = {}
        self._generation = -1

    def invitation_for(self, wake: Wake, mode: ProseMode, *, may_publish: bool) -> str | None:
        """The invitation ``wake`` carries for an agent in ``mode``, or None."""
        ref = wake.channel
        if ref is None or not wake.addressed:
            return None
        registry = self._router.registry
        entry = registry.get(ref)
        if entry is None or entry.open:
            return None
        payload = wake.payload
        author = payload.get("author") if isinstance(payload, Mapping) else None
        if isinstance(author, Mapping):
            author = author.get("name") or author.get("id")
        author = author if isinstance(author, str) else None
        if registry.generation != self._generation or len(self._cache) >= INVITATION_CACHE:
            self._cache.clear()
            self._generation = registry.generation
        key = (mode, ref, author, may_publish)
        text = self._cache.get(key)
        if text is None:
            text = self._cache[key] = prose.invitation_text(mode, self._router.names, ref, author, may_publish=may_publish)
        return text
