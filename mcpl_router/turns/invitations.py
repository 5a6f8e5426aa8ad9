"""The closed-channel invitation a message wake carries: how to answer where the agent isn't.

Only for a message that addresses the agent in a channel that is registered and that *the
agent* doesn't have open. Decided per agent (:data:`HasOpen`, the channel lifecycle's
``has_open``): a channel's transport is shared, so kai having opened ``a:general`` keeps it
open for everyone, yet mo, who didn't, is still invited; and kai is still invited to
``b:general``, another channel with the same id. The first option is the agent's mode's way to
reach that channel alone (:meth:`~mcpl_router.routing.modes.ProseMode.invitation_reply`).

Asked of every message wake, and the same for every message of a channel until something it
reads changes: :meth:`Invitations.for_agent` keeps, per (agent, channel), whether the channel is
registered, the agent's mode and publish right (its spec, by identity: a hello, a reload or a
saved agent puts a new one in place) and the texts by author, while the registry's generation
stands; whether the agent has the channel open is the lifecycle's answer, itself kept until a
decision, a fork home or the registry changes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Final

import attrs

from mcpl_router.routing import rounds
from mcpl_router.routing.agents import AgentSpec, agent_may_call
from mcpl_router.routing.modes import ProseMode
from mcpl_router.routing.refs import ChannelRef

if TYPE_CHECKING:
    from mcpl_router.routing.router import Router
    from mcpl_router.routing.wakes import Wake

__all__ = ["HasOpen", "Invitations"]

#: Whether an agent has a registered channel open: ``(agent, ref) -> bool``
#: (``ChannelLifecycle.has_open``).
HasOpen = Callable[[str, ChannelRef], bool]

#: Rendered invitations kept (cleared whenever the registry changes); also the (agent,
#: channel) entries :meth:`Invitations.for_agent` keeps.
INVITATION_CACHE: Final = 1024
#: Texts kept per (agent, channel), one per author (let go when full: a busy channel's authors).
AUTHORS_KEPT: Final = 64


@attrs.define
class _Kept:
    """What an (agent, channel)'s invitation reads that changes only with the registry or the spec."""

    spec: AgentSpec
    registered: bool
    mode: ProseMode
    may_publish: bool
    texts: dict[str | None, str] = attrs.field(factory=dict)


def _author(payload: object) -> str | None:
    """The name (else the id) of the message's author, as the invitation names them."""
    # ``type(...) is dict`` first: what the wire decodes to, without the ABC's instance check.
    author = payload.get("author") if type(payload) is dict or isinstance(payload, Mapping) else None
    if type(author) is dict or (type(author) is not str and isinstance(author, Mapping)):
        author = author.get("name") or author.get("id")
    return author if type(author) is str or isinstance(author, str) else None


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
        self._kept: dict[tuple[str, ChannelRef], _Kept] = {}
        self._generation = -1

    def _transport_open(self, agent: str, ref: ChannelRef) -> bool:
        entry = self._router.registry.get(ref)
        return entry is not None and entry.open

    def _stand(self) -> None:
        """Let every kept value go when the registry moved (the caches' bounds are held where
        they grow)."""
        generation = self._router.registry.generation
        if generation != self._generation:
            self._cache.clear()
            self._kept.clear()
            self._generation = generation

    def _text(self, key: tuple[ProseMode, ChannelRef, str | None, bool]) -> str:
        text = self._cache.get(key)
        if text is None:
            if len(self._cache) >= INVITATION_CACHE:
                self._cache.clear()
            mode, ref, author, may_publish = key
            text = self._cache[key] = rounds.invitation_text(mode, self._router.names, ref, author, may_publish=may_publish)
        return text

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
        author = _author(wake.payload)
        self._stand()
        return self._text((mode, ref, author, may_publish))

    def for_agent(self, wake: Wake, spec: AgentSpec) -> str | None:
        """The invitation ``wake`` carries for its agent, whose spec is ``spec``, or None: as
        :meth:`invitation_for` in the spec's mode and publish right, kept per (agent, channel)."""
        ref = wake.channel
        if ref is None or not wake.addressed:
            return None
        if self._router.registry.generation != self._generation:
            self._stand()
        key = (wake.agent, ref)
        kept = self._kept.get(key)
        if kept is None or kept.spec is not spec:
            if len(self._kept) >= INVITATION_CACHE:
                self._kept.clear()
            kept = self._kept[key] = _Kept(spec, self._router.registry.is_registered(ref), spec.mode,
                                           agent_may_call(spec, "channel_publish"))
        # Asked every time: the lifecycle keeps its own answer, and knows when it changes (a
        # decision, a fork home), which this does not.
        if not kept.registered or self._has_open(wake.agent, ref):
            return None
        author = _author(wake.payload)
        text = kept.texts.get(author)
        if text is None:
            if len(kept.texts) >= AUTHORS_KEPT:
                kept.texts.clear()
            text = kept.texts[author] = rounds.invitation_text(kept.mode, self._router.names, ref, author,
                                                               may_publish=kept.may_publish)
        return text
