"""Conversation forks, run: the decision's shell (routing/forks.py decides; docs/forks.md).

- **Where a message goes.** The inbound handler asks :meth:`Forks.deliveries_for` (which asks
  the sessions' wake policy first) whom an event wakes, before its commit. A delivery of a
  forking agent's message becomes its fork's (an existing fork, or one it spawns), so the wake
  is journaled under the fork's name in the event's own transaction: durable before the server
  hears ``accepted``, and replayed to the fork agent when its host claims it. A fork agent hears
  nothing by its own wake policy: only its home's messages, by the decision.
- **Spawn.** After the commit (:meth:`Forks.accepted`) a spawn asks the connection owning the
  trunk agent, with the daemon→host request ``fork/spawn {agent, fork, home, template,
  generation}``. The host answers once its fork agent exists (declared in ``session/hello``
  like any agent, so owned by that connection); the binding is bound on that answer. A refused,
  failed or timed-out spawn releases the binding (``fork.spawn.failed``) and hands the wakes
  journaled for the fork back to the trunk agent (they go to its host, in seq order); the next
  message spawns a newer generation. Each generation is journaled before the host is asked.
- **Idle.** A bound fork with no message for its agent's ``idleTtl`` is sent its closure prompt
  as a ``wake`` (``reason: "fork/close"``) and released (``fork.released``).

Every trace (``fork.spawning``, ``fork.bound``, ``fork.spawn.failed``, ``fork.released``) names
the fork's server and channel. State is changed only in trio tasks; the spawns waiting for
their task are bounded by the inbound batches that made them (one per new binding).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Final, Protocol

import trio

from mcpl_router.host_notices import HostNotice, WakeNotice
from mcpl_router.jsonrpc import PeerClosed, RequestTimeout, RpcError
from mcpl_router.events import EventBus, InboundAccepted
from mcpl_router.logs import get_logger
from mcpl_router.routing.forks import Binding, ConversationsSpec, ForkBook, counters_of, fork_name, kind_of, route_wakes
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.store.journal import Delivery, EventKind, InboundEvent

if TYPE_CHECKING:
    from mcpl_router.routing.agents import AgentSpec
    from mcpl_router.hosts.connection import HostConnection
    from mcpl_router.routing.registry import ChannelRegistry

FORK_SPAWN: Final = "fork/spawn"
REASON_FORK_CLOSE: Final = "fork/close"
#: How long a host has to make a fork agent and answer ``fork/spawn``.
SPAWN_TIMEOUT: Final = 30.0
#: Decisions remembered as naming no forking agent (one per channel and tags: cleared when full).
PLAIN_DECISIONS_KEPT: Final = 4096


class ForkJournal(Protocol):
    """What the forks keep durable: the generation counters."""

    def fork_generations(self) -> list[tuple[str, str, str, int]]: ...

    def raise_fork_generation(self, agent: str, server_id: str, channel_id: str, generation: int) -> None: ...


class Forks:
    """Every forking agent's conversation forks. Run :meth:`run` in the daemon's nursery.

    Args:
        registry: a channel's descriptor (its kind: DM, group DM, channel).
        journal: the generation counters.
        policy_deliveries: whom an event wakes by the wake policy (:meth:`AgentDirectory.deliveries_for`).
        agent_of: an agent's spec (its ``conversations``), or None.
        owner_of: the connection owning an agent now, or None.
        notify_agent: a notification to an agent's owner (the closure prompt).
        hand_over: the wakes owed to a fork whose spawn failed, given to its trunk
            (:meth:`AgentDirectory.hand_over_wakes`); how many.
        events: where it hears each committed event (:class:`InboundAccepted`).
    """

    spawn_timeout: float = SPAWN_TIMEOUT

    def __init__(
        self,
        *,
        registry: ChannelRegistry,
        journal: ForkJournal,
        policy_deliveries: Callable[[InboundEvent], Sequence[Delivery]],
        agent_of: Callable[[str], AgentSpec | None],
        owner_of: Callable[[str], HostConnection | None],
        notify_agent: Callable[[str, HostNotice], Awaitable[bool]],
        hand_over: Callable[[str, str], Awaitable[int]] | None = None,
        events: EventBus | None = None,
    ) -> None:
        self._registry = registry
        self._journal = journal
        self._policy = policy_deliveries
        self._agent_of = agent_of
        self._owner_of = owner_of
        self._notify_agent = notify_agent
        self._hand_over = hand_over
        counters = counters_of(journal.fork_generations())
        self.book = ForkBook(counters)
        # The policy's decisions (its kept tuples, by identity) found to name no forking agent:
        # while no fork has a home, such a decision is every event's routing as it stands. The
        # tuple is held, so its id can't name another; a changed spec makes the policy decide
        # anew, in new tuples.
        self._plain: dict[int, Sequence[Delivery]] = {}
        for (agent, home), generation in counters.items():
            conversations = self._conversations_of(agent)
            if conversations is not None:
                # The newest generation only: any older one was released before it was taken.
                self.book.remember(agent, fork_name(conversations.fork_prefix, home, generation), home)
        self._to_ask: list[Binding] = []
        self._changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._log = get_logger()
        if events is not None:
            events.subscribe(InboundAccepted, self._inbound_accepted)

    # -- what the channel tools and gates ask ----------------------------------------------------

    def home_of(self, agent: str) -> ChannelRef | None:
        """The home of fork ``agent`` (a ref; released forks too), or None for no fork."""
        return self.book.home_of(agent)

    def may_take_route(self, agent: str, ref: ChannelRef) -> bool:
        """Whether ``agent``'s turn, batch or default may take ``ref`` (seed 000's
        ``mayTakeGateRoute``, by ref): a fork only its home, never another server's channel with
        its home's id; a trunk no channel one of its forks holds (pending or bound)."""
        if not self.book.any_forks():
            return True  # no fork has a home, so none holds a channel (a binding has a home)
        home = self.book.home_of(agent)
        if home is not None:
            return ref == home
        return self.book.binding(agent, ref) is None

    # -- before the commit -----------------------------------------------------------------------

    def deliveries_for(self, event: InboundEvent) -> Sequence[Delivery]:
        """Whom an event wakes: the policy's agents, each forking agent's message given to its
        fork (decided by ``route_wakes``; the reservations, counters and clock are this shell's)."""
        decided = self._policy(event)
        if self._plain.get(id(decided)) is decided and not self.book.any_forks():
            return decided  # as it was found the last time (below), and still no fork anywhere
        if not any(self.book.home_of(d.agent) is not None or self._conversations_of(d.agent) is not None for d in decided):
            # No fork and no forking agent among them (most messages): each is woken as itself,
            # as route_wakes would say, without building its routes or reading the clock.
            if type(decided) is tuple:
                if len(self._plain) >= PLAIN_DECISIONS_KEPT:
                    self._plain.clear()
                self._plain[id(decided)] = decided
            return decided
        ref = None if event.channel_id is None or event.kind != EventKind.MESSAGE else ChannelRef(event.server_id, event.channel_id)
        kind = ""
        if ref is not None and any(self._conversations_of(d.agent) is not None for d in decided):
            entry = self._registry.get(ref)
            kind = kind_of(None if entry is None else entry.descriptor.type, entry is not None and entry.descriptor.is_dm)
        routes = route_wakes(((d.agent, d.addressed) for d in decided), ref=ref, kind=kind, book=self.book,
                             conversations_of=self._conversations_of)
        out: list[Delivery] = []
        now = trio.current_time()
        for delivery, route in zip(decided, routes, strict=True):
            if route.recipient is None:
                continue  # a fork (released ones too) hears its home alone, by the decision
            if route.spawn is not None:
                assert ref is not None
                binding = self.book.reserve(delivery.agent, route.spawn, now)
                self._journal.raise_fork_generation(delivery.agent, ref.server_id, ref.channel_id, route.spawn.generation)
                self._to_ask.append(binding)
                conversations = self._conversations_of(delivery.agent)
                self._trace("fork.spawning", binding, template=conversations.template if conversations else None, kind=kind)
            elif route.touched is not None:
                self.book.touched(route.touched, now)
            if route.recipient == delivery.agent:
                out.append(delivery)
            else:
                out.append(Delivery(route.recipient, delivery.reason, delivery.tags, delivery.addressed))
        return out

    def _conversations_of(self, agent: str) -> ConversationsSpec | None:
        spec = self._agent_of(agent)
        return None if spec is None else spec.conversations

    # -- after the commit --------------------------------------------------------------------------

    def _inbound_accepted(self, accepted: InboundAccepted) -> None:
        """An event committed: the spawns it decided ask their hosts now."""
        if self._to_ask:
            self._changed.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Ask hosts to spawn, and release idle forks, until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                deadline = self.book.next_idle_deadline(self._ttls())
                with trio.move_on_at(math.inf if deadline is None else deadline):
                    await self._changed.wait()
                self._changed = trio.Event()
                asking, self._to_ask = self._to_ask, []
                for binding in asking:
                    nursery.start_soon(self._spawn, binding)
                for binding in self.book.idle(self._ttls(), trio.current_time()):
                    await self._close_idle(binding)

    def agents_changed(self) -> None:
        """Agents' specs changed (a reload): a trunk that no longer forks lets its forks go now."""
        self._changed.set()

    def _ttls(self) -> dict[str, float]:
        ttls = {}
        for binding in self.book.bindings():
            conversations = self._conversations_of(binding.agent)
            # A trunk that no longer forks (its conversations dropped by a reload): its forks
            # count as idle at once, rather than staying bound to a rule that is gone.
            ttls[binding.agent] = 0.0 if conversations is None else conversations.idle_ttl
        return ttls

    async def _spawn(self, binding: Binding) -> None:
        conversations = self._conversations_of(binding.agent)
        owner = self._owner_of(binding.agent)
        if conversations is None or owner is None or owner.peer is None:
            await self._failed(binding, "no connection owns the agent" if conversations is not None else "the agent no longer forks")
            return
        params = {
            "agent": binding.agent,
            "fork": binding.fork,
            "home": binding.home.to_wire(),
            "template": conversations.template,
            "generation": binding.generation,
        }
        try:
            await owner.peer.request(FORK_SPAWN, params, timeout=self.spawn_timeout)
        except RpcError as exc:
            await self._failed(binding, f"the host refused: {exc}")
            return
        except (PeerClosed, RequestTimeout) as exc:
            await self._failed(binding, f"the host did not answer: {type(exc).__name__}")
            return
        if self._owner_of(binding.fork) is not owner:
            await self._failed(binding, "the host answered, but its connection does not own the fork agent")
            return
        bound = self.book.bind(binding.agent, binding.home, binding.fork, binding.generation)
        if bound is None:
            self._trace("fork.bind.stale", binding)
            return
        bound.last_message = max(bound.last_message, trio.current_time())
        self._trace("fork.bound", binding, connection=owner.id)
        self._changed.set()

    async def _failed(self, binding: Binding, reason: str) -> None:
        # Released first: no later message is given to this name, so what it is owed is final.
        self.book.release(binding.fork, reason)
        # The messages journaled for the fork while it was being spawned would be owed to an
        # agent that never came: they are the trunk's again, and go to its host now.
        handed = 0 if self._hand_over is None else await self._hand_over(binding.fork, binding.agent)
        self._trace("fork.spawn.failed", binding, reason=reason, level="warning", handed_to_trunk=handed)

    async def _close_idle(self, binding: Binding) -> None:
        conversations = self._conversations_of(binding.agent)
        prompt = "" if conversations is None else conversations.closure_prompt
        reason = "idle" if conversations is not None else "no-longer-forks"
        released = self.book.release(binding.fork, reason)
        if released is None:
            return
        params = {
            "seq": 0,  # nothing to ack: the closure prompt is no journaled event
            "agent": binding.fork,
            "reason": REASON_FORK_CLOSE,
            "channel": binding.home.to_wire(),
            "fork": {"agent": binding.agent, "home": binding.home.to_wire(), "generation": binding.generation},
            "prompt": prompt,
            "tags": [],
            "addressed": False,
        }
        told = await self._notify_agent(binding.fork, WakeNotice(params))
        self._trace("fork.released", binding, reason=reason, told=bool(told))

    def _trace(self, event: str, binding: Binding, *, level: str = "info", **fields: object) -> None:
        log = self._log.warning if level == "warning" else self._log.info
        log(event, agent=binding.agent, fork=binding.fork, server=binding.home.server_id, channel=binding.home.channel_id,
            generation=binding.generation, **fields)
