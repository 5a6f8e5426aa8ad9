"""Wake gating: per-agent, ordered, first-match rules over admitted wakes (pure; no I/O).

A gate never **admits**: whether an event wakes an agent at all is the wake policy's decision
(:mod:`mcpl_router.routing.wakes`, over the grants the link enforced), taken before any gate
rule is read. A gate only decides *when* an admitted wake goes out: now (``always``), with the
agent's next wake that goes out (``defer``), once its source has been quiet for ``ms``
(``debounce``), or at most ``per`` wakes every ``seconds`` (``rate_limit``; past the limit,
held and batched into the next allowed wake). Tags are the server's claims: a rule over tags
may delay or batch, never wake.

A rule matches when every matcher it gives matches (a list matches when any entry does;
``tagsAll`` when every pattern matches some tag; ``tagsNone`` when no pattern matches any):

- ``tagsAny`` / ``tagsAll`` / ``tagsNone``: over the closure-expanded tags; a pattern is a tag,
  ``namespace:*`` (as in :func:`~mcpl_router.routing.tags.tag_matches`), or a glob.
- ``servers``: the event's source server.
- ``channels``: a ref ``{serverId, channelId}`` (that exact pair); a qualified name
  ``server:channel``, matched when decided against the registered pairs' ``serverId:channelId``
  only (:meth:`ChannelNames.channel_qualified <mcpl_router.routing.names.ChannelNames.channel_qualified>`):
  a name that is one pair's matches it, one that is no pair's or several's matches nothing, and
  it is never read as a bare id, which would mean whichever server registers it (discord's
  ids are ``discord:<guild>:<channel>``, colons and all); or a glob over qualified names
  (``a:*``, ``*:general``), matched against the event's ref as ``serverId:channelId``.
- ``kinds``: ``message`` or ``push``.

The first matching rule decides; none matching, the gate's ``default``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from fnmatch import fnmatchcase
from typing import Final

import attrs

from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.tags import tag_matches
from mcpl_router.routing.wakes import REASON_MESSAGE, REASON_PUSH

ALWAYS: Final = "always"
DEFER: Final = "defer"
DEBOUNCE: Final = "debounce"
RATE_LIMIT: Final = "rate_limit"
BEHAVIOURS: Final = (ALWAYS, DEFER, DEBOUNCE, RATE_LIMIT)
KINDS: Final = (REASON_MESSAGE, REASON_PUSH)
#: Wakes one agent's gate may hold in memory before it flushes early (see gate_batches).
DEFAULT_MAX_HELD: Final = 256
GLOB_CHARS: Final = frozenset("*?[")


def is_glob(text: str) -> bool:
    return any(char in GLOB_CHARS for char in text)


@attrs.frozen
class Behaviour:
    """What a matching rule does: ``kind`` is one of :data:`BEHAVIOURS`."""

    kind: str = ALWAYS
    #: debounce: the quiet time, in milliseconds.
    ms: int = 0
    #: rate_limit: at most ``per`` wakes every ``seconds``.
    per: int = 0
    seconds: float = 0.0

    @property
    def holds(self) -> bool:
        """Whether this behaviour may hold a wake back (anything but ``always``)."""
        return self.kind != ALWAYS

    def to_wire(self) -> str | dict[str, dict[str, float]]:
        if self.kind == DEBOUNCE:
            return {DEBOUNCE: {"ms": self.ms}}
        if self.kind == RATE_LIMIT:
            return {RATE_LIMIT: {"per": self.per, "seconds": self.seconds}}
        return self.kind


@attrs.frozen
class ChannelMatch:
    """One entry of a rule's ``channels``: exactly one of ``ref``, ``name`` or ``pattern``."""

    ref: ChannelRef | None = None
    name: str | None = None
    pattern: str | None = None

    def to_wire(self) -> dict[str, str] | str | None:
        if self.ref is not None:
            return self.ref.to_wire()
        return self.name if self.name is not None else self.pattern


@attrs.frozen
class GateRule:
    """One rule: its matchers (empty = any) and its behaviour."""

    behaviour: Behaviour
    tags_any: tuple[str, ...] = ()
    tags_all: tuple[str, ...] = ()
    tags_none: tuple[str, ...] = ()
    servers: tuple[str, ...] = ()
    channels: tuple[ChannelMatch, ...] = ()
    kinds: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, object]:
        wire: dict[str, object] = {}
        for key, value in (("tagsAny", self.tags_any), ("tagsAll", self.tags_all), ("tagsNone", self.tags_none),
                           ("servers", self.servers), ("kinds", self.kinds)):
            if value:
                wire[key] = list(value)
        if self.channels:
            wire["channels"] = [match.to_wire() for match in self.channels]
        wire["behaviour"] = self.behaviour.to_wire()
        return wire


@attrs.frozen
class WakeGateSpec:
    """An agent's wake gate as configured (``agents.<name>.wakeGate``) or declared in hello."""

    rules: tuple[GateRule, ...] = ()
    default: Behaviour = Behaviour()
    max_held: int = DEFAULT_MAX_HELD
    #: Whether anything may be held (else every wake goes out as it comes, as ungated): asked
    #: of every wake, so worked out once from the rules.
    active: bool = attrs.field(init=False, eq=False, repr=False)

    @active.default
    def _active(self) -> bool:
        return self.default.holds or any(rule.behaviour.holds for rule in self.rules)

    def to_wire(self) -> dict[str, object]:
        return {"rules": [rule.to_wire() for rule in self.rules], "default": self.default.to_wire(), "maxHeld": self.max_held}


@attrs.frozen
class GateFacts:
    """What a gate reads of one admitted wake."""

    kind: str  # REASON_MESSAGE | REASON_PUSH
    server_id: str
    channel: ChannelRef | None
    tags: tuple[str, ...]  # closure-expanded


@attrs.frozen
class ResolvedRule:
    """A rule with its qualified channel names resolved to refs (at a registry generation)."""

    index: int
    rule: GateRule
    refs: frozenset[ChannelRef] = frozenset()


@attrs.frozen
class Decision:
    """The behaviour for one wake, and which rule gave it (``None``: the default)."""

    behaviour: Behaviour
    rule: int | None


def resolve_rules(spec: WakeGateSpec, pair_named: Callable[[str], ChannelRef | None]) -> tuple[ResolvedRule, ...]:
    """``spec``'s rules with each qualified name resolved by ``pair_named``: the one registered
    pair whose ``serverId:channelId`` it is, else None, and the entry then matches nothing (the
    shell passes the resolver's qualified reading, never one that takes a bare id)."""
    resolved = []
    for index, rule in enumerate(spec.rules):
        refs = set()
        for match in rule.channels:
            if match.ref is not None:
                refs.add(match.ref)
            elif match.name is not None:
                ref = pair_named(match.name)
                if ref is not None:
                    refs.add(ref)
        resolved.append(ResolvedRule(index, rule, frozenset(refs)))
    return tuple(resolved)


def tag_pattern_matches(pattern: str, tag: str) -> bool:
    """A tag pattern: equal, ``namespace:*``, or a glob (``chat:a*``)."""
    return tag_matches(pattern, tag) or (is_glob(pattern) and fnmatchcase(tag, pattern))


def _any(patterns: Iterable[str], tags: Sequence[str]) -> bool:
    return any(tag_pattern_matches(pattern, tag) for pattern in patterns for tag in tags)


def rule_matches(resolved: ResolvedRule, facts: GateFacts) -> bool:
    """Whether every matcher ``resolved`` gives matches ``facts`` (see the module doc)."""
    rule = resolved.rule
    tags = facts.tags
    if rule.kinds and facts.kind not in rule.kinds:
        return False
    if rule.servers and facts.server_id not in rule.servers:
        return False
    if rule.channels and not _channel_matches(resolved, facts.channel):
        return False
    if rule.tags_any and not _any(rule.tags_any, tags):
        return False
    if rule.tags_all and not all(_any((pattern,), tags) for pattern in rule.tags_all):
        return False
    return not (rule.tags_none and _any(rule.tags_none, tags))


def _channel_matches(resolved: ResolvedRule, channel: ChannelRef | None) -> bool:
    if channel is None:
        return False
    if channel in resolved.refs:
        return True
    qualified = channel.qualified_name
    return any(match.pattern is not None and fnmatchcase(qualified, match.pattern) for match in resolved.rule.channels)


def decide(rules: Sequence[ResolvedRule], default: Behaviour, facts: GateFacts) -> Decision:
    """The first matching rule's behaviour, else ``default``."""
    for resolved in rules:
        if rule_matches(resolved, facts):
            return Decision(resolved.rule.behaviour, resolved.index)
    return Decision(default, None)
