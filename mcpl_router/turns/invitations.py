"""The closed-channel invitation a message wake carries: how to answer where the agent isn't.

Only for a message that addresses the agent in a channel that is registered and that *the
agent* doesn't have open. Decided per agent (:data:`HasOpen`, the channel lifecycle's
``has_open``): a channel's transport is shared, so kai having opened ``a:general`` keeps it
open for everyone, yet mo, who didn't, is still invited; and kai is still invited to
``b:general``, another channel with the same id. The first option is the agent's mode's way to
reach that channel alone (:meth:`~mcpl_router.routing.modes.ProseMode.invitation_reply`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

from mcpl_router.routing import rounds
from mcpl_router.routing.modes import ProseMode
from mcpl_router.routing.refs import ChannelRef

if TYPE_CHECKING:
    from mcpl_router.routing.router import Router
    from mcpl_router.routing.wakes import Wake

__all__ = ["HasOpen", "Invitations"]

#: Whether an agent has a registered channel open: ``(agent, ref) -> bool``
#: (``ChannelLifecycle.has_open``).
HasOpen = Callable[[str, ChannelRef], bool]

#: Rendered invitations kept (cleared whenever the registry changes).
INVITATION_CACHE: Final = 1024


class Invitations:
    """Renders invitations, one text per (mode, channel, author, may publish) while the
    registry stands, so a busy channel's wakes don't each render it anew.

    Args:
        router: the registry and the names an invitation shows.
        has_open: whether an agent has a channel open by its own decisions (the daemon gives
            ``ChannelLifecycle.has_open``); without it, the channel's shared open state.
    """

    def __init__(self, router: Router, has_open: HasOpen | None = None) -> None:
        self._router = router
        self._has_open: HasOpen = has_open if has_open is not None else self._transport_open
        self._cache: dict[tuple[ProseMode, ChannelRef, str | None, bool], str] = {}
        self._generation = -1

    def _transport_open(self, agent: str, ref: ChannelRef) -> bool:
        entry = self._router.registry.get(ref)
        return entry is not None and entry.open

    def invitation_for(self, wake: Wake, mode: ProseMode, *, may_publish: bool) -> str | None:
        """The invitation ``wake`` carries for an agent in ``mode``, or None."""
        ref = wake.channel
        if ref is None or not wake.addressed:
            return None
        registry = self._router.registry
        # Asked before the cache, every time: whether this agent has it open changes with its
        # own tool calls, not the registry's generation. The cached text names no agent.
        if not registry.is_registered(ref) or self._has_open(wake.agent, ref):
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
            text = self._cache[key] = rounds.invitation_text(mode, self._router.names, ref, author, may_publish=may_publish)
        return text
