"""Wake gates, run: each agent's held wakes, their timers, and the batched wakes they become.

The rules and decisions are pure (:mod:`mcpl_router.routing.gating`, what matches;
:mod:`mcpl_router.routing.gate_batches`, what is held and when it goes). This module runs them:

- **Where.** The sessions ask their diversion of every wake (``hosts/diversion.py``
  :class:`~mcpl_router.hosts.diversion.WakeHolds`; the order, a tune-out first and then the
  gate, is the core's: :mod:`mcpl_router.routing.held`). This module gives the agent's gate
  and its rules' decision (:meth:`WakeGates.ask`) and carries out what the gate decided. A wake the gate holds is not sent; one it lets through goes out as
  before. The wake policy admitted the wake before the gate saw it: a gate never wakes anyone.
- **Batches.** Held wakes go out as one ``wake`` with ``reason: "batch"`` through the owner's
  outbox (paced by acks like any wake): see :func:`batch_params` and docs/host-api.md.
- **Admission at delivery.** A held wake goes into its batch only while its server is still
  configured, still grants what it came by (``channels.incoming``, ``pushEvents``), still
  registers its channel (a message's, or the one a push names) and, for a push naming no
  channel, is still connected. One that fails is dropped from the batch: it wakes no
  one (and so sets no turn's channel or default), is logged (``gate.held.dropped``), counted,
  and acked in the journal so it never comes back.
- **Durable or bounded.** Every held wake is an unacked delivery in the journal; only the timers
  and batches are in memory, at most ``maxHeld`` per agent (the wake that reaches it flushes its
  bucket at once, cause ``full``). A batch whose agent has no owner when it falls due is
  forgotten here; its wakes stay unacked. A replay (``session/hello``, a restart) reads unacked
  wakes back in seq order and asks the diversion of each (``routing.held.replayed``): held ones stay held, the
  rest are gated again as if they had just arrived (timers start at the replay).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Final, TypedDict

import attrs
import trio

from mcpl_router.events import EventBus, WakeDelivered
from mcpl_router.logs import get_logger
from mcpl_router.routing.gate_batches import AgentGate, Batch
from mcpl_router.routing.held import GateAsked, Held
from mcpl_router.routing.gating import Decision, GateFacts, ResolvedRule, WakeGateSpec, decide, resolve_rules
from mcpl_router.routing.names import Resolved
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.wakes import REASON_MESSAGE, Wake

from mcpl_router.store.journal import JournalFailure
from mcpl_router.turns.wakes import NO_FENCE

if TYPE_CHECKING:
    from mcpl_router.routing.agents import AgentSpec
    from mcpl_router.turns.wakes import RouteFence
    from mcpl_router.mcpl.session import ServerSession
    from mcpl_router.routing.registry import ChannelRegistry
    from mcpl_router.routing.router import Router
    from mcpl_router.store.journal import Journal

REASON_BATCH: Final = "batch"
#: What each wake kind came by (the grant's feature), checked again at delivery.
_FEATURE: Final = {REASON_MESSAGE: "channels.incoming"}
_PUSH_FEATURE: Final = "pushEvents"


class StillAdmitted:
    """Whether a held wake may still be delivered: None if so, else why not."""

    def __init__(self, registry: ChannelRegistry, servers: Mapping[str, ServerSession]) -> None:
        self._registry = registry
        self._servers = servers  # a live view of the daemon's links: a reload changes it

    def __call__(self, wake: Wake, server_id: str) -> str | None:
        session = self._servers.get(server_id)
        if session is None:
            return "server gone"
        if not session.allows(_FEATURE.get(wake.reason, _PUSH_FEATURE)):
            return "grant withdrawn"
        if wake.channel is not None:
            # A message's or a push's channel: its own server must still register it.
            return None if self._registry.is_registered(wake.channel) else "channel withdrawn"
        if wake.reason == REASON_MESSAGE:
            return "channel withdrawn"
        # A push naming no channel: its server must still be connected (nothing else vouches).
        return None if session.ready else "server disconnected"


class JournalSettle:
    """Acks held wakes dropped at delivery, so they never come back (``settle``)."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    async def __call__(self, agent: str, seqs: list[int]) -> None:
        try:
            await self._journal.submit_ack([agent], seqs)
        except JournalFailure as exc:
            # Not acked: they stay owed, and a replay gates them again (and drops them again).
            get_logger(agent=agent).warning("gate.settle.failed", seqs=len(seqs), error=str(exc))


@attrs.define
class _Resolved:
    generation: int
    spec: WakeGateSpec
    rules: tuple[ResolvedRule, ...]


class WakeGates:
    """Every agent's wake gate. Run :meth:`run` in the daemon's nursery.

    Args:
        router: the registry's generation and the one resolver (rules' qualified names), and
            the names batched wakes show.
        agent_of: an agent's spec (its ``wake_gate``), or None for an unknown agent.
        admitted: whether a held wake may still be delivered (:class:`StillAdmitted`).
        deliver: hand a batched wake ``(agent, seqs, params)`` to its owner's outbox; False when
            no connection owns the agent (``SessionManager.offer_batch``).
        settle: ack ``(agent, seqs)`` in the journal (held wakes dropped at delivery).
        count: a counter ``(agent, outcome)`` for ``/metrics``.
        route_fence: which channels a batch's route may be for its agent (the forks').
        events: where a sent batch's route is told as delivered (:class:`WakeDelivered`).
    """

    def __init__(
        self,
        *,
        router: Router,
        agent_of: Callable[[str], AgentSpec | None],
        admitted: Callable[[Wake, str], str | None],
        deliver: Callable[[str, tuple[int, ...], dict[str, object]], bool],
        settle: Callable[[str, list[int]], Awaitable[None]],
        count: Callable[[str, str], None],
        route_fence: RouteFence = NO_FENCE,
        events: EventBus | None = None,
    ) -> None:
        self._router = router
        self._agent_of = agent_of
        self._admitted = admitted
        self._deliver = deliver
        self._settle = settle
        self._count = count
        self._gates: dict[str, AgentGate] = {}
        self._resolved: dict[str, _Resolved] = {}
        self._to_settle: list[tuple[str, list[int]]] = []
        #: Which channels a batch's route may be for its agent (the forks').
        self.route_fence = route_fence
        # A batch went out: its route's wake is told as delivered (it sets the agent's default channel).
        self._events = events
        self._changed = trio.Event()
        self.counters: dict[str, int] = {}
        self._log = get_logger()

    # -- the gate's part of the diversion (hosts/diversion.py asks, routing/held.py decides) ------

    def gate_of(self, agent: str) -> AgentGate | None:
        """The agent's gate as it stands (None until a wake of it met an active gate)."""
        return self._gates.get(agent)

    def ungated(self, agent: str) -> bool:
        """Whether ``agent``'s wakes go out as they come (:meth:`ask` would answer None).
        Asked of every wake, so it reads the spec and the gate itself; ``_gating`` asks it."""
        spec = self._agent_of(agent)
        if spec is None:
            return True
        if spec.wake_gate.active:
            return False
        gate = self._gates.get(agent)
        return gate is None or not gate.held_count

    def _gating(self, agent: str) -> AgentSpec | None:
        """The agent's spec while its gate may hold a wake. None when its wakes go out as they
        come: an unknown agent, or one whose rules hold nothing and whose gate holds nothing (a
        gate turned off by a reload still lets what it holds go through its buckets)."""
        return None if self.ungated(agent) else self._agent_of(agent)

    def ask(self, wake: Wake) -> GateAsked | None:
        """The agent's gate and the decision of its rules for ``wake``; None when ungated."""
        spec = self._gating(wake.agent)
        if spec is None:
            return None
        gate = self._gates.get(wake.agent)
        if gate is None:
            gate = self._gates[wake.agent] = AgentGate(wake.agent, spec.wake_gate.max_held)
        gate.max_held = max(1, spec.wake_gate.max_held)
        return GateAsked(gate, self._decide(wake, spec.wake_gate, _server_of(wake)))

    def carry_out(self, wake: Wake, fate: Held) -> None:
        """What the gate decided for ``wake``: count a hold, send the batches it made due."""
        if not fate.sent:
            behaviour = None if fate.decision is None else fate.decision.behaviour.kind
            rule = None if fate.decision is None else fate.decision.rule
            self._bump(wake.agent, "held")
            self._log.debug("gate.held", agent=wake.agent, seq=wake.seq, behaviour=behaviour, rule=rule)
        gate = self._gates[wake.agent]
        for batch in fate.batches:
            self._send(batch, gate)
        self._changed.set()

    def statistics(self) -> dict[str, object]:
        """What each agent's gate holds now, and the counters (held, batches, dropped, unowned)."""
        return {"held": {agent: gate.held_count for agent, gate in self._gates.items() if gate.held_count}, "counters": dict(self.counters)}

    # -- the timers ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send batches as they fall due, and ack dropped wakes, until cancelled."""
        task_status.started()
        while True:
            deadlines = [d for gate in self._gates.values() if (d := gate.next_deadline()) is not None]
            with trio.move_on_at(min(deadlines, default=math.inf)):
                await self._changed.wait()
            self._changed = trio.Event()
            now = trio.current_time()
            for gate in list(self._gates.values()):
                for batch in gate.due(now):
                    self._send(batch, gate)
            settle, self._to_settle = self._to_settle, []
            for agent, seqs in settle:
                await self._settle(agent, seqs)

    # -- helpers -------------------------------------------------------------------------------

    def _decide(self, wake: Wake, spec: WakeGateSpec, server_id: str) -> Decision:
        generation = self._router.registry.generation
        cached = self._resolved.get(wake.agent)
        if cached is None or cached.generation != generation or cached.spec is not spec:
            cached = _Resolved(generation, spec, resolve_rules(spec, self._pair_named))
            self._resolved[wake.agent] = cached
        facts = GateFacts(wake.reason, server_id, wake.channel, wake.tags)
        return decide(cached.rules, spec.default, facts)

    def _pair_named(self, name: str) -> ChannelRef | None:
        # The qualified reading alone: a gate entry must say its server, so a bare id (a
        # discord id holds colons too) never matches whichever server registers it.
        names = self._router.names
        resolved = names.channel_qualified(name, not_done="The gate rule's entry matches nothing.")
        if isinstance(resolved, Resolved):
            return resolved.ref
        registry = names.registry
        id_on = [ref.server_id for ref in sorted(registry.refs_with_id(name), key=registry.order_of)]
        self._log.info("gate.channel.unresolved", name=name, kind=resolved.kind,
                       candidates=[ref.qualified_name for ref in resolved.candidates], idOn=id_on)
        return None

    def _send(self, batch: Batch, gate: AgentGate) -> None:
        kept: list[Wake] = []
        dropped: list[int] = []
        for wake in batch.wakes:
            server_id = _server_of(wake)
            why = self._admitted(wake, server_id)
            if why is None:
                kept.append(wake)
                continue
            dropped.append(wake.seq)
            self._bump(wake.agent, "dropped")
            channel = None if wake.channel is None else wake.channel.channel_id
            self._log.warning("gate.held.dropped", agent=wake.agent, seq=wake.seq, server=server_id, channel=channel, reason=why)
        if dropped:
            self._to_settle.append((batch.agent, dropped))
            self._changed.set()
        if not kept:
            self._log.info("gate.batch.empty", agent=batch.agent, cause=batch.cause, dropped=len(dropped))
            return
        params, route = batch_params(batch, kept, self._router.names.name_shown,
                                     lambda ref: self.route_fence.may_take_route(batch.agent, ref))
        seqs = tuple(wake.seq for wake in kept)
        if self._deliver(self._target_of(batch, kept), seqs, params):
            if route is not None and self._events is not None:
                self._events.publish(WakeDelivered(route))
            self._bump(batch.agent, "batches")
            self._log.info("gate.batch.sent", agent=batch.agent, cause=batch.cause, seqs=len(seqs), route_seq=params["seq"],
                           route_server=params["routeServerId"], dropped=len(dropped))
        else:
            # Nobody owns the agent: the wakes stay unacked and come back through the gate at its claim.
            gate.forget(seqs)
            self._bump(batch.agent, "unowned")
            self._log.info("gate.batch.unowned", agent=batch.agent, seqs=len(seqs))

    def _target_of(self, batch: Batch, kept: list[Wake]) -> str:
        """Who a batch wakes: its agent. A conversation fork's messages are the fork's own
        deliveries from the start (hosts/forks.py decides before the commit), so a fork's batch
        holds only its home's wakes. A trunk's batch may still hold a channel's messages from
        before a fork took it: its route never is such a channel (:attr:`route_fence`)."""
        return batch.agent

    def _bump(self, agent: str, outcome: str) -> None:
        self.counters[outcome] = self.counters.get(outcome, 0) + 1
        self._count(agent, outcome)


def _server_of(wake: Wake) -> str:
    return wake.source_server


class _Conversation(TypedDict):
    """One conversation of a batched wake: its channel and the seqs it holds."""

    serverId: str  # noqa: N815 - the wire's names
    channelId: str | None  # noqa: N815
    shown: str | None
    seqs: list[int]


def batch_params(
    batch: Batch, kept: list[Wake], shown: Callable[[ChannelRef], str], may_take: Callable[[ChannelRef], bool] = lambda _ref: True
) -> tuple[dict[str, object], Wake | None]:
    """A batched wake's params (docs/host-api.md), and the wake it routes by (None: no route).

    The route is the newest addressed (else newest) kept wake whose channel the agent may take
    (``may_take``: a trunk never a channel its fork holds); where none may be taken the batch
    has no route channel.
    """
    takeable = [wake for wake in kept if wake.channel is None or may_take(wake.channel)]
    route = batch.route(takeable or kept)
    routed = route if takeable else None
    conversations: dict[tuple[str, str | None], _Conversation] = {}
    for wake in kept:
        server_id = _server_of(wake)
        channel_id = None if wake.channel is None else wake.channel.channel_id
        row = conversations.get((server_id, channel_id))
        if row is None:
            row = conversations[(server_id, channel_id)] = {
                "serverId": server_id,
                "channelId": channel_id,
                "shown": None if wake.channel is None else shown(wake.channel),
                "seqs": [],
            }
        row["seqs"].append(wake.seq)
    route_channel = None if routed is None or route.channel is None else {**route.channel.to_wire(), "shown": shown(route.channel)}
    tags = list(dict.fromkeys(tag for wake in kept for tag in wake.tags))
    return {
        "seq": route.seq,
        "agent": batch.agent,
        "reason": REASON_BATCH,
        "channel": route_channel,
        "routeServerId": None if routed is None else _server_of(route),
        "routeChannel": route_channel,
        "routeReason": route.reason,
        "seqs": [wake.seq for wake in kept],
        "conversations": list(conversations.values()),
        "messages": [wake.payload for wake in kept if wake.reason == REASON_MESSAGE],
        "events": [wake.payload for wake in kept if wake.reason != REASON_MESSAGE],
        "tags": tags,
        "addressed": any(wake.addressed for wake in kept),
        "gate": {"cause": batch.cause, "behaviour": batch.behaviour.to_wire()},
    }, routed
