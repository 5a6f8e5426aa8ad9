"""Conversation forks, decided: which agent an inbound message for a forking agent wakes.

An agent with ``conversations`` (config ``agents.<name>.conversations``, or a hello's spec) may
have a **fork** per conversation: an agent its host makes from a template, homed on one
channel. For each inbound message that woke the agent, :meth:`ForkBook.decide` says one of:

- :class:`Existing`: the channel is bound to a fork (spawned, or being spawned): it goes there;
- :class:`Spawn`: no fork yet, and the kind's ``trigger`` rule lets this message start one;
- :class:`Unbound`: the agent itself (the trunk) takes it, with why.

Bindings are keyed by the agent and a :class:`~mcpl_router.routing.refs.ChannelRef`, never a
bare id: two servers' DMs on one id are two bindings, each with its own fork. A fork's name
carries its server (``<prefix><server>-<channel>-<generation>``), and each binding key has a
generation counter that only grows: a late spawn's bind never lowers it, so no name is proposed
twice. Pure: no I/O, no clocks (the shell passes ``now``); the shell (``hosts/forks.py``)
journals the counters and asks the host.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Final

import attrs

from mcpl_router.routing.refs import ChannelRef

#: A kind's rule: a message of it may always, only when addressed, or never (spawn / bind).
ALWAYS: Final = "always"
MENTION: Final = "mention"
NEVER: Final = "never"
RULES: Final = (ALWAYS, MENTION, NEVER)

#: The conversation kinds, as the config names them.
DM: Final = "dm"
GROUP_DM: Final = "groupDm"
CHANNEL: Final = "channel"
KINDS: Final = (DM, GROUP_DM, CHANNEL)
#: Descriptor types read as a group DM (MCPL leaves the word to the server).
GROUP_DM_TYPES: Final = frozenset({"group_dm", "groupDm", "group-dm", "group"})

DEFAULT_PREFIX: Final = "fork-"
DEFAULT_IDLE_TTL: Final = 1800.0
DEFAULT_CLOSURE_PROMPT: Final = (
    "This conversation has been quiet for a while and its fork is being released. "
    "Say anything you still need to say in it now; after this turn the fork ends."
)

PENDING: Final = "pending"
BOUND: Final = "bound"


@attrs.frozen
class KindRules:
    """One kind's rules: ``trigger`` (may a message start a fork) and ``bind`` (does a
    message in a channel already bound go to its fork, or to the trunk)."""

    trigger: str = NEVER
    bind: str = ALWAYS

    def to_wire(self) -> dict[str, str]:
        return {"trigger": self.trigger, "bind": self.bind}


#: Each kind's rules when not configured: a DM forks at once, a group DM on a mention, a channel never.
DEFAULT_RULES: Final = {DM: KindRules(ALWAYS, ALWAYS), GROUP_DM: KindRules(MENTION, ALWAYS), CHANNEL: KindRules(NEVER, ALWAYS)}


@attrs.frozen
class ConversationsSpec:
    """An agent's ``conversations``: the template its forks are made from, per-kind rules, the
    idle TTL (seconds), the closure prompt and the fork name prefix."""

    template: str
    rules: Mapping[str, KindRules] = attrs.field(factory=lambda: dict(DEFAULT_RULES))
    idle_ttl: float = DEFAULT_IDLE_TTL
    closure_prompt: str = DEFAULT_CLOSURE_PROMPT
    fork_prefix: str = DEFAULT_PREFIX

    def rules_for(self, kind: str) -> KindRules:
        return self.rules.get(kind, DEFAULT_RULES[kind])

    def to_wire(self) -> dict[str, object]:
        return {
            "template": self.template,
            **{kind: self.rules_for(kind).to_wire() for kind in KINDS},
            "idleTtl": self.idle_ttl,
            "closurePrompt": self.closure_prompt,
            "forkPrefix": self.fork_prefix,
        }


def kind_of(descriptor_type: str | None, is_dm: bool) -> str:
    """The conversation kind of a channel by its descriptor (an unknown channel: ``channel``)."""
    if is_dm:
        return DM
    if descriptor_type in GROUP_DM_TYPES:
        return GROUP_DM
    return CHANNEL


def _allows(rule: str, addressed: bool) -> bool:
    return rule == ALWAYS or (rule == MENTION and addressed)


_UNSAFE: Final = re.compile(r"\s")


def fork_name(prefix: str, ref: ChannelRef, generation: int) -> str:
    """``<prefix><server>-<channel>-<generation>`` (whitespace made ``_``: a name has none)."""
    return _UNSAFE.sub("_", f"{prefix}{ref.server_id}-{ref.channel_id}-{generation}")


# -- decisions -------------------------------------------------------------------------------


@attrs.frozen
class Existing:
    fork: str
    home: ChannelRef


@attrs.frozen
class Spawn:
    fork: str
    home: ChannelRef
    generation: int


@attrs.frozen
class Unbound:
    reason: str


Decision = Existing | Spawn | Unbound


@attrs.frozen
class WakeRoute:
    """Where one agent's wake by an event goes (:func:`route_wakes`): to ``recipient`` (the
    agent, or its fork), or to nobody (``None``: the agent is itself a fork, and a fork hears
    its home by this decision alone). ``spawn``: a fork to reserve, journal and ask the host
    for; ``touched``: a fork whose idle clock restarts."""

    agent: str
    recipient: str | None
    spawn: Spawn | None = None
    touched: str | None = None


def route_wakes(
    wanted: Iterable[tuple[str, bool]],
    *,
    ref: ChannelRef | None,
    kind: str,
    book: ForkBook,
    conversations_of: Callable[[str], ConversationsSpec | None],
) -> tuple[WakeRoute, ...]:
    """Who each of ``wanted`` (the policy's ``(agent, addressed)`` for one message; ``ref``
    None for a push) is woken as, with the forks' effects for the shell to carry out. Reads
    the book only: two agents spawning in one message get names apart, as if the first were
    reserved before the second was decided."""
    taken: dict[str, tuple[str, ChannelRef]] = {}
    routes: list[WakeRoute] = []
    for agent, addressed in wanted:
        if book.home_of(agent) is not None:
            routes.append(WakeRoute(agent, None))
            continue
        spec = conversations_of(agent)
        if spec is None or ref is None:
            routes.append(WakeRoute(agent, agent))
            continue
        decision = book.decide(agent, spec, ref, kind, addressed=addressed, taken=taken)
        if isinstance(decision, Spawn):
            taken[decision.fork] = (agent, ref)
            routes.append(WakeRoute(agent, decision.fork, spawn=decision))
        elif isinstance(decision, Existing):
            routes.append(WakeRoute(agent, decision.fork, touched=decision.fork))
        else:
            routes.append(WakeRoute(agent, agent))
    return tuple(routes)


@attrs.define
class Binding:
    """One conversation's fork: its agent (the trunk), home, name, generation and state."""

    agent: str
    home: ChannelRef
    fork: str
    generation: int
    state: str = PENDING
    last_message: float = 0.0


@attrs.frozen
class Release:
    """A binding let go (idle, or its spawn failed): the fork, its home, and why."""

    binding: Binding
    reason: str


class ForkBook:
    """Every forking agent's bindings and generation counters (mutated in trio tasks only).

    Args:
        generations: the journaled counters, ``{(agent, ref): generation}``.
    """

    def __init__(self, generations: Mapping[tuple[str, ChannelRef], int] | None = None) -> None:
        self._generations: dict[tuple[str, ChannelRef], int] = dict(generations or {})
        self._bindings: dict[tuple[str, ChannelRef], Binding] = {}
        self._forks: dict[str, Binding] = {}
        #: Each (agent, home)'s newest fork name, and back: a released fork stays fenced to its
        #: home and is woken by nothing but the decision. A name is one string joined from the
        #: server and channel ids, so two homes can spell alike ("a-b" + "c" and "a" + "b-c"),
        #: and two agents with one prefix fork alike: a name another (agent, home) holds is never
        #: proposed (see :meth:`decide`), so each name means one home. Only the newest name per
        #: (agent, home) is kept, so this grows with the homes, not with every spawn: an older
        #: generation was released before a newer one was reserved.
        self._newest: dict[tuple[str, ChannelRef], str] = {}
        self._homes: dict[str, tuple[str, ChannelRef]] = {}

    # -- reading -------------------------------------------------------------------------------

    def generation(self, agent: str, ref: ChannelRef) -> int:
        """The highest generation used for this binding key (0: none yet)."""
        return self._generations.get((agent, ref), 0)

    def binding(self, agent: str, ref: ChannelRef) -> Binding | None:
        return self._bindings.get((agent, ref))

    def fork(self, name: str) -> Binding | None:
        """The binding whose fork is ``name`` (a fork agent's home), or None."""
        return self._forks.get(name)

    def any_forks(self) -> bool:
        """Whether any fork has a home (bound, pending or released): none, in a deployment whose
        agents never fork. Every binding's fork has one (``reserve`` remembers it), and a home,
        once had, is only ever replaced: while this is False, no channel is bound either."""
        return bool(self._homes)

    def home_of(self, name: str) -> ChannelRef | None:
        """The home of fork ``name`` (bound, pending or released), or None for no fork."""
        owner = self._homes.get(name)
        return None if owner is None else owner[1]

    def remember(self, agent: str, name: str, home: ChannelRef) -> None:
        """``(agent, home)``'s newest fork name (the journal's counters, at start-up), fenced to
        its home; the name it had before is let go."""
        if self._homes.get(name, (agent, home)) != (agent, home):
            return  # held by another (agent, home): a name means one home
        previous = self._newest.get((agent, home))
        if previous is not None and previous != name:
            del self._homes[previous]
        self._newest[(agent, home)] = name
        self._homes[name] = (agent, home)

    def bindings(self) -> list[Binding]:
        return list(self._bindings.values())

    def decide(self, agent: str, spec: ConversationsSpec, ref: ChannelRef, kind: str, *, addressed: bool,
               taken: Mapping[str, tuple[str, ChannelRef]] | None = None) -> Decision:
        """Where a message for ``agent`` in ``ref`` (of ``kind``) goes. Reads only. ``taken``:
        fork names a plan already gives other (agent, home)s, not reserved yet."""
        taken = taken or {}
        rules = spec.rules_for(kind)
        bound = self._bindings.get((agent, ref))
        if bound is not None:
            if _allows(rules.bind, addressed):
                return Existing(bound.fork, bound.home)
            return Unbound(f"{kind} bind rule {rules.bind!r}: not addressed")
        if not _allows(rules.trigger, addressed):
            return Unbound(f"{kind} trigger rule {rules.trigger!r}" + ("" if rules.trigger == NEVER else ": not addressed"))
        generation = self.generation(agent, ref) + 1
        name = fork_name(spec.fork_prefix, ref, generation)
        while taken.get(name, self._homes.get(name, (agent, ref))) != (agent, ref):
            # Spelled alike by another home or agent: the next generation, until the name is free.
            generation += 1
            name = fork_name(spec.fork_prefix, ref, generation)
        return Spawn(name, ref, generation)

    # -- changing ------------------------------------------------------------------------------

    def reserve(self, agent: str, spawn: Spawn, now: float) -> Binding:
        """Take a :class:`Spawn`: its generation is used (the counter moves up to it) and the
        channel is bound, pending the host's answer, so the next message joins it."""
        key = (agent, spawn.home)
        self._generations[key] = max(self._generations.get(key, 0), spawn.generation)
        binding = Binding(agent, spawn.home, spawn.fork, spawn.generation, PENDING, now)
        self._bindings[key] = binding
        self._forks[spawn.fork] = binding
        self.remember(agent, spawn.fork, spawn.home)
        return binding

    def bind(self, agent: str, home: ChannelRef, fork: str, generation: int) -> Binding | None:
        """The host made ``fork``: its binding is bound, if it is still the channel's.

        The counter never goes down: a late answer for an older generation raises it to at most
        what it already was. A stale answer (the binding was released, or a newer spawn took
        the channel) binds nothing and returns None."""
        key = (agent, home)
        self._generations[key] = max(self._generations.get(key, 0), generation)
        binding = self._bindings.get(key)
        if binding is None or binding.fork != fork:
            return None
        binding.state = BOUND
        return binding

    def touched(self, fork: str, now: float) -> None:
        """A message went to ``fork``: its idle clock starts again."""
        binding = self._forks.get(fork)
        if binding is not None:
            binding.last_message = max(binding.last_message, now)

    def release(self, fork: str, reason: str) -> Release | None:
        """Let ``fork`` go: its channel is unbound (the counter stays, so the next is newer)."""
        binding = self._forks.pop(fork, None)
        if binding is None:
            return None
        key = (binding.agent, binding.home)
        if self._bindings.get(key) is binding:
            del self._bindings[key]
        return Release(binding, reason)

    def idle(self, ttl_of: Mapping[str, float], now: float) -> list[Binding]:
        """Bound forks whose last message is older than their agent's TTL (``ttl_of[agent]``)."""
        return [b for b in self._bindings.values() if b.state == BOUND and b.agent in ttl_of and now - b.last_message >= ttl_of[b.agent]]

    def next_idle_deadline(self, ttl_of: Mapping[str, float]) -> float | None:
        deadlines = [b.last_message + ttl_of[b.agent] for b in self._bindings.values() if b.state == BOUND and b.agent in ttl_of]
        return min(deadlines, default=None)


def counters_of(rows: Iterable[tuple[str, str, str, int]]) -> dict[tuple[str, ChannelRef], int]:
    """The journal's ``(agent, server, channel, generation)`` rows as the book's counters."""
    return {(agent, ChannelRef(server, channel)): generation for agent, server, channel, generation in rows}
