"""Who the agents are, which host connection owns each, and the way to each owner's outbox.

The state the session protocol (hosts/sessions.py: hello, ack, a connection's open and close)
changes, and that the parts below it read or write through: the wake gates hand a batch to an
agent's owner, a tune-out's summary and a fork's closure prompt are sent to it, a fork whose spawn
failed hands its wakes back to its trunk, and the forks ask whom an event wakes. Kept apart from
the protocol so those parts are built before the sessions, each given this at construction (the
sessions in turn are given the tune-outs and gates they ask of every wake).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import msgspec
import trio

from mcpl_router.host_notices import HostNotice
from mcpl_router.config import AgentConfig
from mcpl_router.hosts.agents import AgentSpecParams, spec_from_config, spec_from_params
from mcpl_router.hosts.outbox import NOTICE_LIMIT, HostOutbox
from mcpl_router.logs import get_logger
from mcpl_router.routing.agents import AgentSpec
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.tags import expand_tags
from mcpl_router.routing.wakes import REASON_MESSAGE, REASON_PUSH, InboundFacts, WakePolicy, resolve_policy, wakes
from mcpl_router.store.journal import Delivery, EventKind, InboundEvent

if TYPE_CHECKING:
    from mcpl_router.hosts.connection import HostConnection
    from mcpl_router.routing.router import Router
    from mcpl_router.store.journal import Journal

#: Whom-an-event-wakes decisions kept (cleared whenever the registry or an agent changes, and
#: when full: the tags in a key come off the wire, so their combinations are the servers' to choose).
DECISION_CACHE: Final = 4096


class AgentSpecs(dict[str, AgentSpec]):
    """Every known agent's spec by name, with a version that moves at every change.

    What an event wakes is kept while the agents stand; the version says whether they do in
    one comparison, where reading every spec would cost each message a pass over the agents.
    """

    version: int = 0

    def __setitem__(self, name: str, spec: AgentSpec) -> None:
        super().__setitem__(name, spec)
        self.version += 1

    def __delitem__(self, name: str) -> None:
        super().__delitem__(name)
        self.version += 1

    def pop(self, *args: Any) -> Any:
        self.version += 1
        return super().pop(*args)

    def popitem(self) -> tuple[str, AgentSpec]:
        self.version += 1
        return super().popitem()

    def clear(self) -> None:
        self.version += 1
        super().clear()

    def update(self, *args: Any, **kwargs: AgentSpec) -> None:
        self.version += 1
        super().update(*args, **kwargs)

    def setdefault(self, name: str, spec: AgentSpec) -> AgentSpec:
        self.version += 1
        return super().setdefault(name, spec)


class AgentDirectory:
    """The agents' specs (configured, declared by hosts, saved in the journal), their owners,
    and each open connection's outbox. The sessions change owners and outboxes; the rest read.

    Args:
        agents: the configured agents.
        journal: the agents hosts declared earlier (read once), and the wakes a hand-over moves.
        router: the registry and the one resolver (each agent's wake policy names channels).
    """

    def __init__(self, *, agents: Mapping[str, AgentConfig], journal: Journal, router: Router) -> None:
        self._journal = journal
        self._router = router
        #: Every known agent by name (configured ones, those hosts declared).
        self.specs = AgentSpecs({name: spec_from_config(a) for name, a in agents.items()})
        for name, saved in journal.saved_agents().items():
            if name not in self.specs:
                try:
                    self.specs[name] = spec_from_params(msgspec.convert(saved, AgentSpecParams))
                except msgspec.ValidationError:
                    get_logger(agent=name).warning("agent.saved_spec.unreadable")
        #: The connection owning each owned agent.
        self.owners: dict[str, HostConnection] = {}
        #: Each open connection's outbox (wakes and notices, flow-controlled).
        self.outboxes: dict[HostConnection, HostOutbox] = {}
        #: Connections dropped because their outbox of notices was full.
        self.outbox_full_disconnects = 0
        # Each agent's resolved wake policy, with the registry generation it was resolved at.
        self._policies: dict[str, tuple[int, AgentSpec, WakePolicy]] = {}
        # Whom an event wakes, by (kind, server, channel, tags as given): the same answer for
        # every message of a channel with those tags while the registry (its generation) and
        # the agents (the specs' version) stand, so it is decided once, not per message.
        self._decisions: dict[tuple[EventKind, str, str | None, tuple[object, ...]], tuple[Delivery, ...]] = {}
        self._decided_at: tuple[int, int] = (-1, -1)
        self._log = get_logger()

    # -- who ---------------------------------------------------------------------------------

    def agent(self, name: str) -> AgentSpec | None:
        """The agent called ``name``, or None if neither the config nor a host declared it."""
        return self.specs.get(name)

    def agents(self) -> list[AgentSpec]:
        """Every known agent, configured ones first."""
        return sorted(self.specs.values(), key=lambda spec: (not spec.configured, spec.name))

    def configure_agents(self, agents: dict[str, AgentConfig]) -> tuple[list[str], list[str]]:
        """A reloaded config's agents: added ones declared, changed ones updated (new turns
        use the new spec). Returns (added, changed) names. Agents it no longer lists stay."""
        added: list[str] = []
        changed: list[str] = []
        for name, config in agents.items():
            spec = spec_from_config(config)
            previous = self.specs.get(name)
            if previous == spec:
                continue
            (added if previous is None else changed).append(name)
            self.specs[name] = spec
        return added, changed

    def owner_of(self, name: str) -> HostConnection | None:
        """The connection owning agent ``name`` now, if any."""
        return self.owners.get(name)

    # -- whom an event wakes -----------------------------------------------------------------

    def deliveries_for(self, event: InboundEvent) -> tuple[Delivery, ...]:
        """Which agents an event wakes by their policies (decided before its commit and written with it).

        A pure function of the event's kind, server, channel and tags, the registry and the
        agents' specs: kept per (kind, server, channel, tags as the message gave them) until the
        registry's generation or the specs' version moves (a hello, a reload or a saved agent).
        """
        stands = (self._router.registry.generation, self.specs.version)
        if stands != self._decided_at or len(self._decisions) >= DECISION_CACHE:
            self._decisions.clear()
            self._decided_at = stands
        payload = event.payload
        given = payload.get("tags") if type(payload) is dict else None
        try:
            # The tags as given are the key (expanding them is the decision's, on a miss): the
            # same tags a channel's messages carry decide once.
            key = (event.kind, event.server_id, event.channel_id, tuple(given) if given else ())
            decided = self._decisions.get(key)
        except TypeError:
            # Tags that can't be a key (a dict among them, a number): keyed by their closure,
            # which is only strings; the closure of a closure is itself, so the keys agree.
            tags = expand_tags(given)
            key = (event.kind, event.server_id, event.channel_id, tags)
            decided = self._decisions.get(key)
        if decided is None:
            decided = self._decisions[key] = self._decide(event, expand_tags(given))
        return decided

    def _decide(self, event: InboundEvent, tags: tuple[str, ...]) -> tuple[Delivery, ...]:
        facts = self._facts(event, tags)
        return tuple(
            Delivery(spec.name, facts.kind, facts.tags, facts.addressed) for spec in self.specs.values() if wakes(self._policy_of(spec), facts)
        )

    def _policy_of(self, spec: AgentSpec) -> WakePolicy:
        """``spec``'s wake policy with its channel names resolved, once per registry change
        (not once per message)."""
        generation = self._router.registry.generation
        cached = self._policies.get(spec.name)
        if cached is not None and cached[0] == generation and cached[1] is spec:
            return cached[2]
        policy = resolve_policy(spec.wake_channels, spec.wake_servers, spec.wake_tags, self._router.names.channels_named)
        self._policies[spec.name] = (generation, spec, policy)
        return policy

    def _facts(self, event: InboundEvent, tags: tuple[str, ...]) -> InboundFacts:
        channel = None if event.channel_id is None else ChannelRef(event.server_id, event.channel_id)
        entry = None if channel is None else self._router.registry.get(channel)
        return InboundFacts(
            kind=REASON_MESSAGE if event.kind == EventKind.MESSAGE else REASON_PUSH,
            server_id=event.server_id,
            channel=channel,
            tags=tags,
            is_dm=entry is not None and entry.descriptor.is_dm,
        )

    # -- to an agent's owner -----------------------------------------------------------------

    def outbox_of_agent(self, name: str) -> HostOutbox | None:
        owner = self.owners.get(name)
        return None if owner is None else self.outboxes.get(owner)

    async def notify_agent(self, name: str, notice: HostNotice) -> bool:
        """Queue a notification to the connection owning ``name``; False when none does.

        A cancellation point but no scheduling point: a turn's trace queued here must not let
        the server's writer send the lifecycle it queued just before alone, a write ahead of
        the ``context/beforeInference`` that follows (it queues without waiting, as sends do).
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        owner = self.owners.get(name)
        return owner is not None and self.enqueue(owner, notice)

    def offer_batch(self, agent: str, seqs: tuple[int, ...], params: dict[str, object]) -> bool:
        """A wake gate's batched wake (hosts/gate.py), paced by the owner's outbox; False if unowned."""
        outbox = self.outbox_of_agent(agent)
        return outbox is not None and outbox.offer_batch(agent, seqs, params)

    async def hand_over_wakes(self, from_agent: str, to_agent: str) -> int:
        """The wakes owed to ``from_agent`` (a fork whose spawn failed) become ``to_agent``'s,
        in the journal, and go to its owner now, in seq order; how many were handed over."""
        first, count = await self._journal.hand_over(from_agent, to_agent)
        outbox = self.outbox_of_agent(to_agent)
        if count and outbox is not None:
            outbox.rewind(to_agent, first - 1)
        return count

    def enqueue(self, connection: HostConnection, notice: HostNotice) -> bool:
        """Queue a notification to ``connection``; False if it has no outbox (any more)."""
        outbox = self.outboxes.get(connection)
        if outbox is None:
            return False
        if outbox.notify(notice):
            return True
        self._log.warning("host.outbox.full", connection=connection.id, method=notice.METHOD, size=NOTICE_LIMIT)
        self.outbox_full_disconnects += 1
        # Not reading: drop the connection rather than the messages. Its wakes are journaled
        # and come back on reconnect. The outbox's own task closes the connection.
        del self.outboxes[connection]
        outbox.close(disconnect="too slow: outbox full")
        return False
