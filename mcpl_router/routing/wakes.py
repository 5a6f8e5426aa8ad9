"""Wake policy: which agents an accepted inbound message or push wakes (pure; no I/O).

The default, for an agent whose policy gives nothing: it is woken by every message
**addressed** to it — tagged ``chat:addressed`` after the tag closure (so also ``chat:mention``,
``chat:reply``, ``chat:dm``), or arriving in a DM channel — and by every push. There is no
per-agent addressing on the wire yet, so "addressed to it" means addressed to the agents the
daemon serves: each agent with the default policy gets its own wake.

A policy widens and narrows that:

- ``channels``: every message or push in these channels wakes the agent, addressed or not
  (names are resolved to refs by the caller when the event is decided, so a name matching the
  same id on two servers listens to both; a qualified name ``server:id`` to one).
- ``servers``: every message or push from these servers wakes it.
- ``tags``: replaces the default ``["chat:addressed"]``: a message or push carrying a matching
  tag (after the closure; ``namespace:*`` matches any value) wakes it. ``[]`` turns off waking
  by tags, so only ``channels``/``servers`` (and DMs, when ``chat:addressed`` is listed) apply.
- pushes: a push wakes an agent whose policy names no ``channels`` and no ``servers`` (it listens
  everywhere); a scoped agent hears only pushes from its scope or with a matching tag.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Final

import attrs
import msgspec

from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.tags import ADDRESSED, any_tag_matches, tag_matches

REASON_MESSAGE: Final = "message"
REASON_PUSH: Final = "push"
DEFAULT_WAKE_TAGS: Final = (ADDRESSED,)


class Wake(msgspec.Struct, frozen=True):
    """One agent woken by one journaled inbound event.

    ``seq`` is the event's journal sequence (shared by every agent it woke); ``payload`` is the
    message or the push's params as received; ``tags`` are closure-expanded; ``addressed``
    says whether the event was addressed (``chat:addressed`` or a DM).

    A value: frozen, a msgspec Struct for the reason :class:`InboundEvent` is (one per woken
    agent of every message).
    """

    seq: int
    agent: str
    reason: str  # REASON_MESSAGE | REASON_PUSH
    channel: ChannelRef | None
    payload: object
    tags: tuple[str, ...]
    addressed: bool
    #: The server the event came from (a push may name no channel); "" where not known.
    server_id: str = ""

    @property
    def source_server(self) -> str:
        """The event's server: its channel's, else :attr:`server_id`."""
        return self.channel.server_id if self.channel is not None else self.server_id


@attrs.frozen
class InboundFacts:
    """What the policy reads of one inbound event."""

    kind: str  # REASON_MESSAGE | REASON_PUSH
    server_id: str
    channel: ChannelRef | None
    tags: tuple[str, ...]  # closure-expanded
    is_dm: bool = False

    @property
    def addressed(self) -> bool:
        return self.is_dm or ADDRESSED in self.tags


@attrs.frozen
class WakePolicy:
    """An agent's wake policy with channel names already resolved to refs.

    ``tags`` of ``None`` means the default (:data:`DEFAULT_WAKE_TAGS`).
    """

    channels: frozenset[ChannelRef] = frozenset()
    servers: frozenset[str] = frozenset()
    tags: tuple[str, ...] | None = None

    @property
    def scoped(self) -> bool:
        """Whether the policy limits the agent to some channels or servers."""
        return bool(self.channels or self.servers)

    @property
    def effective_tags(self) -> tuple[str, ...]:
        return DEFAULT_WAKE_TAGS if self.tags is None else self.tags


def wakes(policy: WakePolicy, facts: InboundFacts) -> bool:
    """Whether an event with ``facts`` wakes an agent with ``policy`` (see the module doc)."""
    if facts.channel is not None and facts.channel in policy.channels:
        return True
    if facts.server_id in policy.servers:
        return True
    tags = policy.effective_tags
    if any_tag_matches(tags, facts.tags):
        return True
    if facts.is_dm and any(tag_matches(pattern, ADDRESSED) for pattern in tags):
        return True
    return facts.kind == REASON_PUSH and not policy.scoped


def agents_woken(policies: Iterable[tuple[str, WakePolicy]], facts: InboundFacts) -> list[str]:
    """The names of the agents ``facts`` wakes, in the order given."""
    return [name for name, policy in policies if wakes(policy, facts)]


def resolve_policy(
    channel_names: Collection[str],
    servers: Collection[str],
    tags: Collection[str] | None,
    channels_named: Callable[[str], Iterable[ChannelRef]],
) -> WakePolicy:
    """A :class:`WakePolicy` with ``channel_names`` resolved by ``channels_named(name)``.

    Resolved at decision time: a channel registered later is heard from then on.
    """
    refs: set[ChannelRef] = set()
    for name in channel_names:
        refs.update(channels_named(name))
    return WakePolicy(frozenset(refs), frozenset(servers), None if tags is None else tuple(tags))
