"""What each agent last decided for each channel (its *desired state*), and whether it has one open.

A channel's transport is shared: one ``channels/open`` opens it on its server for every agent
of the daemon. Whether an *agent* is in a channel is its own: kai opening ``a:general`` puts kai
there, not mo, who is still invited to join (the closed-channel invitation) though the
transport is open. Keyed by agent and :class:`~mcpl_router.routing.refs.ChannelRef`: two
servers' ``general`` are two decisions, and one agent's never shows for another. Pure.
"""

from __future__ import annotations

from typing import Final

import attrs

from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import ChannelEntry

__all__ = ["CLOSED", "DECLINED", "OPEN", "DesiredChannels"]

OPEN: Final = "open"
CLOSED: Final = "closed"
DECLINED: Final = "declined"


@attrs.define
class DesiredChannels:
    """Each agent's last decision per channel: ``open``, ``closed`` or ``declined``."""

    _states: dict[tuple[str, ChannelRef], str] = attrs.field(factory=dict, init=False)
    # The agents that decided each channel open: whether its transport is open only because
    # agents opened it (then it is theirs, not everyone's). Kept beside the states so the
    # question asked per message wake is two lookups, not a walk over every agent.
    _opened_by: dict[ChannelRef, set[str]] = attrs.field(factory=dict, init=False)
    # Every agent's decision per channel: what a registration of that channel is checked against.
    _by_ref: dict[ChannelRef, dict[str, str]] = attrs.field(factory=dict, init=False)
    #: Bumped by every decision: an answer read from the decisions (:meth:`has_open`) is
    #: valid while it stands, so one asked of every message wake can be kept.
    version: int = attrs.field(default=0, init=False)

    def get(self, agent: str, ref: ChannelRef) -> str | None:
        """``agent``'s last decision for ``ref``, or None if it made none."""
        return self._states.get((agent, ref))

    def decide(self, agent: str, ref: ChannelRef, state: str) -> None:
        """Record ``agent``'s decision for ``ref`` (it replaces the agent's previous one)."""
        self._states[(agent, ref)] = state
        self.version += 1
        self._by_ref.setdefault(ref, {})[agent] = state
        opened = self._opened_by.setdefault(ref, set())
        if state == OPEN:
            opened.add(agent)
        else:
            opened.discard(agent)
            if not opened:
                del self._opened_by[ref]

    def deciders(self, ref: ChannelRef) -> dict[str, str]:
        """Each agent's decision for ``ref`` (a copy; empty when no agent decided)."""
        return dict(self._by_ref.get(ref, {}))

    def wanted(self, ref: ChannelRef) -> bool | None:
        """What the agents' decisions want of ``ref``'s transport: open (True) while any agent
        decided it open; closed (False) when none did and one closed it; None (no say) when
        the decisions are declines only, or there are none (a decline keeps an agent out, not
        the channel shut)."""
        if self._opened_by.get(ref):
            return True
        return False if CLOSED in self._by_ref.get(ref, {}).values() else None

    def refs(self) -> list[ChannelRef]:
        """Every channel some agent decided something for."""
        return list(self._by_ref)

    def decisions(self) -> dict[tuple[str, ChannelRef], str]:
        """Every decision, by agent and channel (a copy)."""
        return dict(self._states)

    def has_open(self, agent: str, ref: ChannelRef, entry: ChannelEntry | None, *, home: ChannelRef | None = None) -> bool:
        """Whether ``agent`` is in channel ``ref`` (``entry``: the registry's, None if unregistered).

        - A conversation fork (``home``: its home) is in its home: it opens nothing, so it is
          never invited to (routing/fork_fence.py).
        - The agent's own decision, where it made one: ``open`` while the channel is open;
          ``closed`` or ``declined``: not in it, even while other agents keep it open.
        - No decision: the channel's open state as it stands, unless it is open only because
          agents opened it (registered closed, then opened by their ``channel_open``): that puts
          them in it, not this agent. Open as registered (``initiallyOpen``), or by a tune-out
          or a send, it is open for every agent that decided nothing.
        """
        if entry is None:
            return False
        if home is not None and home == ref:
            return True
        decided = self._states.get((agent, ref))
        if decided is not None:
            return decided == OPEN and entry.open
        return entry.open and (entry.descriptor.initially_open or ref not in self._opened_by)
