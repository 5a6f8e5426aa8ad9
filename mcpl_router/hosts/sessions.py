"""Host sessions and agents: ``session/hello``, agent ownership, durable wakes, ``wake/ack``.

An agent is owned by one host connection at a time; another host's claim is refused (-32010).
The same host (same ``host`` name) claiming it from a newer connection takes it over: that is a
host that reconnected before the daemon noticed its old connection drop. When the owning
connection drops, its agents stay held for the same host (same ``host`` name) for :attr:`SessionManager.grace` seconds, so a
host that reconnects picks them up again; after that any host may claim them. Wakes for an agent
nobody owns stay in the journal and are re-sent, in seq order, to the next session that claims it.

Every wake is written to the journal in the same transaction as its inbound event (the
inbound handler asks :meth:`SessionManager.deliveries_for` before the commit), so it is durable
before the server is answered ``accepted``; the notification goes out right after the commit.

Delivery is flow-controlled per connection (:mod:`mcpl_router.hosts.outbox`): at most a window
of wakes is outstanding until acked; the rest are read back from the journal in seq order as
acks make room. A host that stops reading is disconnected by its connection's stall timeout;
its wakes stay unacked in the journal and come back when it reconnects.
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Final, Protocol, TypedDict, TypeVarTuple, Unpack, cast

import attrs
import msgspec
import trio

from mcpl_router import __version__
from mcpl_router.host_notices import ChannelsChangedNotice, HostNotice, ServerStateNotice
from mcpl_router.config import AgentConfig
from mcpl_router.routing.agents import AgentSpec
from mcpl_router.hosts.agents import AckParams, AgentSpecParams, HelloParams, params_of, spec_from_params
from mcpl_router.hosts.connection import HostSession
from mcpl_router.hosts.diversion import NO_DIVERSION, WakeDiversion
from mcpl_router.hosts.directory import AgentDirectory
from mcpl_router.hosts.outbox import HostOutbox
from mcpl_router.events import ChannelsChanged, EventBus, HostClosed, HostOpened, InboundAccepted, ServerStateChanged, WakeDelivered
from mcpl_router.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, Deferred, RpcError
from mcpl_router.logs import get_logger
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.wakes import REASON_MESSAGE, Wake
from mcpl_router.store.journal import Delivery, InboundEvent, JournalFailure, StoredDelivery

if TYPE_CHECKING:
    from mcpl_router.hosts.connection import HostConnection
    from mcpl_router.routing.router import Router
    from mcpl_router.store.journal import Journal
    from mcpl_router.turns import Invitations

#: A task's arguments, as trio's ``start_soon`` takes them.
_Args = TypeVarTuple("_Args")


class AgentStatistics(TypedDict):
    """One known agent as ``status`` shows it: who owns it now, and its unacked wakes."""

    name: str
    proseRouting: str  # noqa: N815 - the wire's names
    host: str | None
    connection: int | None
    unackedWakes: int  # noqa: N815


class HostTotals(TypedDict):
    """Counters over every host connection that has closed (live ones are read when asked)."""

    connections: int
    stalledDisconnects: int  # noqa: N815 - the wire's names
    malformedMessages: int  # noqa: N815
    backpressureWaits: int  # noqa: N815
    outboxHighWaterBytes: int  # noqa: N815


class HostStatistics(TypedDict):
    """Host connections now and in total (``status``'s ``hosts``; ``/metrics`` reads it too)."""

    open: int
    connections: int
    stalledDisconnects: int  # noqa: N815 - the wire's names
    malformedMessages: int  # noqa: N815
    backpressureWaits: int  # noqa: N815
    outboxHighWaterBytes: int  # noqa: N815
    outboxFullDisconnects: int  # noqa: N815
    #: Each connection's wake window and queues (``connection`` and the outbox's counters).
    outboxes: list[dict[str, int]]

#: Recent wakes kept in memory for ``turn/open`` (older ones are read from the journal).
RECENT_WAKES: Final = 4096
#: Channels whose wake ``channel`` param is kept (all let go when full, or the registry moves).
CHANNEL_WIRE_KEPT: Final = 4096
#: How long a dropped connection's agents stay reserved for the same host.
GRACE_SECONDS: Final = 10.0

AGENT_OWNED: Final = -32010
UNKNOWN_AGENT: Final = -32011


class WakeCounts(Protocol):
    """Where the wakes sent and acked are counted (the daemon's metrics, above this floor)."""

    def wake_sent(self, agent: str) -> None: ...

    def wakes_acknowledged(self, agents: Sequence[str], count: int) -> None: ...


@attrs.define(eq=False)
class _Hold:
    """An agent reserved for the host whose connection dropped, until ``deadline``."""

    host: str
    deadline: float


# -- the manager ---------------------------------------------------------------------------------


class SessionManager:
    """Host connections, agent ownership and wake delivery for one daemon.

    Built by the daemon with what it uses; the daemon passes it each host connection's open
    and close. :meth:`run` must run in the daemon's nursery (it hosts each connection's sender
    task and the grace timers).
    """

    def __init__(
        self,
        *,
        journal: Journal,
        router: Router,
        metrics: WakeCounts,
        invitations: Invitations,
        servers_list: Callable[[], list[dict[str, object]]],
        directory: AgentDirectory | None = None,
        agents: Mapping[str, AgentConfig] | None = None,
        diversion: WakeDiversion = NO_DIVERSION,
        events: EventBus | None = None,
    ) -> None:
        self._journal = journal
        self._router = router
        self._metrics = metrics
        self._invitations = invitations
        self._servers_list = servers_list
        #: Who the agents are and who owns each (given by the daemon, which gives it to the
        #: parts built before the sessions too; or made here from ``agents``).
        self.directory = directory if directory is not None else AgentDirectory(agents=agents or {}, journal=journal, router=router)
        # The directory's state, changed here by hello, close and the grace timers.
        self._agents = self.directory.specs
        self._owners = self.directory.owners
        self._outboxes = self.directory.outboxes
        #: Tune-outs and wake gates hold some wakes back (hosts/diversion.py).
        self._diversion = diversion
        self.grace = GRACE_SECONDS
        self._holds: dict[str, _Hold] = {}
        # The newest wakes by (seq, agent), oldest first, at most RECENT_WAKES (turn/open reads).
        # An OrderedDict: dropping a plain dict's oldest key scans the holes earlier drops left.
        self._recent: collections.OrderedDict[tuple[int, str], Wake] = collections.OrderedDict()
        # Counters over every host connection that has closed (live ones are read when asked).
        self._closed_totals: HostTotals = {"connections": 0, "stalledDisconnects": 0,
                                           "malformedMessages": 0, "backpressureWaits": 0, "outboxHighWaterBytes": 0}
        self._nursery: trio.Nursery | None = None
        self._events = events
        self._log = get_logger()
        # A wake's ``channel`` param by ref, the same for every wake of the channel (its shown
        # name reads the registry) while the registry's generation stands (_wire_at).
        self._channel_wire: dict[ChannelRef, dict[str, object]] = {}
        self._wire_at = -1
        if events is not None:
            events.subscribe(ServerStateChanged, self._server_state_changed)
            events.subscribe(ChannelsChanged, self._channels_changed)
            events.subscribe(InboundAccepted, self._inbound_accepted)
            events.subscribe(HostOpened, self._host_opened)
            events.subscribe(HostClosed, self._host_closed)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the sender tasks and grace timers until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # -- what other code asks ------------------------------------------------------------------

    def agent(self, name: str) -> AgentSpec | None:
        """The agent called ``name``, or None if neither the config nor a host declared it."""
        return self.directory.agent(name)

    def agents(self) -> list[AgentSpec]:
        """Every known agent, configured ones first."""
        return self.directory.agents()

    def statistics(self) -> list[AgentStatistics]:
        """Every known agent, who owns it now (host name, connection) and its unacked wakes."""
        rows: list[AgentStatistics] = []
        for spec in self.agents():
            owner = self._owners.get(spec.name)
            session = owner.session if owner is not None else None
            rows.append(
                {
                    "name": spec.name,
                    "proseRouting": spec.prose_routing,
                    "host": session.host if session is not None else None,
                    "connection": owner.id if owner is not None else None,
                    "unackedWakes": self._journal.unacked_count(spec.name),
                }
            )
        return rows

    def configure_agents(self, agents: dict[str, AgentConfig]) -> tuple[list[str], list[str]]:
        """A reloaded config's agents (:meth:`AgentDirectory.configure_agents`)."""
        return self.directory.configure_agents(agents)

    def owner_of(self, name: str) -> HostConnection | None:
        """The connection owning agent ``name`` now, if any."""
        return self.directory.owner_of(name)

    def require_owner(self, connection: HostConnection, name: str) -> AgentSpec:
        """The agent's spec, if ``connection`` owns it.

        Raises:
            RpcError: -32011 for an unknown agent, -32010 when this connection doesn't own it.
        """
        spec = self._agents.get(name)
        if spec is None:
            raise RpcError(UNKNOWN_AGENT, f"Unknown agent {name!r}. Declare it in session/hello.", {"agent": name})
        if self._owners.get(name) is not connection:
            raise self._not_yours(name)
        return spec

    async def notify_agent(self, name: str, notice: HostNotice) -> bool:
        """Queue a notification to the connection owning ``name``; False when none does."""
        return await self.directory.notify_agent(name, notice)

    async def hand_over_wakes(self, from_agent: str, to_agent: str) -> int:
        """:meth:`AgentDirectory.hand_over_wakes`."""
        return await self.directory.hand_over_wakes(from_agent, to_agent)

    async def wake(self, seq: int, agent: str) -> Wake | None:
        """The wake of ``agent`` by the event ``seq`` (acked or not): a recent one from memory,
        an older one from the journal."""
        recent = self._recent.get((seq, agent))
        if recent is not None:
            # From memory: a cancellation point, no trip through the scheduler (turn/open asks).
            await trio.lowlevel.checkpoint_if_cancelled()
            return recent
        stored = await self._journal.delivery(seq, agent)
        return None if stored is None else _wake_of(stored)

    def outbox_statistics(self) -> list[dict[str, int]]:
        """Each connection's wake window and queues (for ``status``)."""
        return [{"connection": connection.id, **outbox.statistics().to_wire()} for connection, outbox in self._outboxes.items()]

    async def broadcast(self, notice: HostNotice) -> None:
        """Queue a notification to every connection that said hello."""
        await trio.lowlevel.checkpoint()
        self._broadcast_nowait(notice)

    # -- connection hooks (called by the listener) --------------------------------------------

    def opened(self, connection: HostConnection) -> None:
        outbox = HostOutbox(
            connection,
            self._journal,
            render=self.wake_params,
            wake_of=_wake_of,
            held=lambda wake: self._diversion.holds(wake),
            on_sent=self._metrics.wake_sent,
        )
        self._outboxes[connection] = outbox
        if not self._spawn(outbox.run):
            self._log.error("host.sessions.not_running", connection=connection.id)

    def offer_batch(self, agent: str, seqs: tuple[int, ...], params: dict[str, object]) -> bool:
        """A wake gate's batched wake (:meth:`AgentDirectory.offer_batch`)."""
        return self.directory.offer_batch(agent, seqs, params)

    def host_statistics(self) -> HostStatistics:
        """Host connections now and in total: what a slow or hostile host has cost (``status``)."""
        totals = self._closed_totals.copy()
        live = [connection.peer.statistics() for connection in self._outboxes if connection.peer is not None]
        for stats in live:
            totals["malformedMessages"] += stats.malformed_messages
            totals["backpressureWaits"] += stats.backpressure_waits
            totals["outboxHighWaterBytes"] = max(totals["outboxHighWaterBytes"], stats.outbox_high_water_bytes)
        return {
            "open": len(live),
            **totals,
            "outboxFullDisconnects": self.directory.outbox_full_disconnects,
            "outboxes": self.outbox_statistics(),
        }

    def closed(self, connection: HostConnection) -> None:
        if connection.peer is not None:
            stats = connection.peer.statistics()
            totals = self._closed_totals
            totals["connections"] += 1
            totals["stalledDisconnects"] += stats.stalled
            totals["malformedMessages"] += stats.malformed_messages
            totals["backpressureWaits"] += stats.backpressure_waits
            totals["outboxHighWaterBytes"] = max(totals["outboxHighWaterBytes"], stats.outbox_high_water_bytes)
            if stats.stalled:
                self._log.warning("host.disconnected", connection=connection.id, reason=connection.peer.close_reason)
        outbox = self._outboxes.pop(connection, None)
        if outbox is not None:
            outbox.close()
        session: HostSession | None = connection.session
        if session is None:
            return
        now = trio.current_time()
        for name in sorted(session.agents):
            if self._owners.get(name) is not connection:
                continue
            del self._owners[name]
            hold = _Hold(session.host, now + self.grace)
            self._holds[name] = hold
            self._log.info("agent.held", agent=name, host=session.host, connection=connection.id, grace=self.grace)
            self._spawn(self._release_after_grace, name, hold)

    def _spawn(self, fn: Callable[[Unpack[_Args]], Awaitable[object]], *args: Unpack[_Args]) -> bool:
        if self._nursery is None:
            return False
        try:
            self._nursery.start_soon(fn, *args)
        except RuntimeError:
            # Shutting down: the nursery takes no new tasks, and none are needed any more.
            return False
        return True

    async def _release_after_grace(self, name: str, hold: _Hold) -> None:
        await trio.sleep_until(hold.deadline)
        if self._holds.get(name) is hold:
            del self._holds[name]
            self._log.info("agent.released", agent=name, host=hold.host)

    def _enqueue(self, connection: HostConnection, notice: HostNotice) -> bool:
        return self.directory.enqueue(connection, notice)

    def _broadcast_nowait(self, notice: HostNotice) -> None:
        for connection in list(self._outboxes):
            if connection.session is not None:
                self._enqueue(connection, notice)

    # -- daemon events -------------------------------------------------------------------------

    def _host_opened(self, event: HostOpened) -> None:
        # The listener publishes its own HostConnection objects (hosts/listener.py).
        self.opened(cast("HostConnection", event.connection))

    def _host_closed(self, event: HostClosed) -> None:
        self.closed(cast("HostConnection", event.connection))

    def _server_state_changed(self, event: ServerStateChanged) -> None:
        self._broadcast_nowait(ServerStateNotice(event.server_id, event.old, event.new))

    def _channels_changed(self, event: ChannelsChanged) -> None:
        self._broadcast_nowait(ChannelsChangedNotice.of(event.server_id, event.added, event.removed))

    def _inbound_accepted(self, accepted: InboundAccepted) -> None:
        self.accepted(accepted.seq, accepted.event, accepted.deliveries)

    def deliveries_for(self, event: InboundEvent) -> Sequence[Delivery]:
        """Which agents an event wakes (decided before its commit and written with it)."""
        return self.directory.deliveries_for(event)

    def accepted(self, seq: int, event: InboundEvent, deliveries: Sequence[Delivery]) -> list[Wake]:
        """The event ``seq`` committed: hand its wakes to the agents' owners, each told as
        :class:`WakeDelivered` as it goes; returns the wakes that went (or wait for an owner),
        not those held back (a tune-out's, a gate's: those set no default until they go)."""
        channel = None if event.channel_id is None else ChannelRef(event.server_id, event.channel_id)
        woken: list[Wake] = []
        recent = self._recent
        for delivery in deliveries:
            agent = delivery.agent
            wake = Wake(seq, agent, delivery.reason, channel, event.payload, delivery.tags, delivery.addressed, event.server_id)
            # The wakes turn/open asks for are almost always the newest: a bounded few kept.
            recent[(seq, agent)] = wake
            if len(recent) > RECENT_WAKES:
                recent.popitem(last=False)
            if self._diversion.divert(wake):
                continue  # held: a tuned-out channel's (tools/tune_out.py) or a wake gate's (hosts/gate.py)
            woken.append(wake)
            owner = self._owners.get(agent)
            outbox = None if owner is None else self._outboxes.get(owner)
            if outbox is None or not outbox.offer(wake):
                # Once per wake on the hot path: no bound logger is built unless it is written.
                reason = "agent not owned" if owner is None else "owner's connection is closing"
                self._log.info("wake.pending", agent=agent, server=event.server_id, channel=event.channel_id, seq=seq, reason=reason)
            if self._events is not None:
                self._events.publish(WakeDelivered(wake))
        return woken

    def wake_params(self, wake: Wake) -> dict[str, object]:
        """The ``wake`` notification's params."""
        ref = wake.channel
        channel: dict[str, object] | None = None
        if ref is not None:
            if self._router.registry.generation != self._wire_at:
                self._channel_wire.clear()
                self._wire_at = self._router.registry.generation
            wire = self._channel_wire.get(ref)
            if wire is None:
                if len(self._channel_wire) >= CHANNEL_WIRE_KEPT:
                    self._channel_wire.clear()
                wire = self._channel_wire[ref] = {**ref.to_wire(), "shown": self._router.names.name_shown(ref)}
            channel = dict(wire)  # each wake's own: its params are the caller's to keep
        params: dict[str, object] = {
            "seq": wake.seq,
            "agent": wake.agent,
            "reason": wake.reason,
            "channel": channel,
            "tags": list(wake.tags),
            "addressed": wake.addressed,
        }
        if wake.reason == REASON_MESSAGE:
            params["messages"] = [wake.payload]
            # A message addressing the agent in a channel it hasn't joined: the options (prose routing).
            spec = self._agents.get(wake.agent)
            if spec is not None:
                invitation = self._invitations.for_agent(wake, spec)
                if invitation is not None:
                    params["invitation"] = invitation
        else:
            params["event"] = wake.payload
        return params

    # -- methods -------------------------------------------------------------------------------

    def hello(self, connection: HostConnection, params: HelloParams) -> dict[str, object]:
        """``session/hello``: claim the agents, then re-send their unacked wakes in seq order."""
        session: HostSession | None = connection.session
        if session is not None and session.host != params.host:
            raise RpcError(
                INVALID_PARAMS,
                f"This connection said hello as host {session.host!r}; it can't become {params.host!r}. "
                "Open another connection.",
            )
        specs = [self._spec_for(agent) for agent in params.agents]
        seen: set[str] = set()
        for spec in specs:
            if spec.name in seen:
                raise RpcError(INVALID_PARAMS, f"Agent {spec.name!r} is listed twice.", {"agent": spec.name})
            seen.add(spec.name)
            self._check_claimable(connection, params.host, spec.name)
        # Every agent is claimable: claim them all (all or nothing).
        if session is None:
            session = HostSession(params.host)
            connection.session = session
        log = get_logger(host=params.host, connection=connection.id)
        claimed: list[str] = []
        for spec in specs:
            self._agents[spec.name] = spec
            if not spec.configured:
                self._journal.save_agent(spec.name, msgspec.to_builtins(params_of(spec)))
            self._holds.pop(spec.name, None)
            previous = self._owners.get(spec.name)
            if previous is not connection:
                if previous is not None and previous.session is not None:
                    # The same host reconnected before we noticed its old connection drop: the
                    # newer connection is the host now.
                    previous.session.agents.discard(spec.name)
                    previous_outbox = self._outboxes.get(previous)
                    if previous_outbox is not None:
                        previous_outbox.remove_agent(spec.name)
                    log.info("agent.taken_over", agent=spec.name, previous=previous.id)
                self._owners[spec.name] = connection
                claimed.append(spec.name)
            session.agents.add(spec.name)
            log.info("agent.claimed", agent=spec.name)
        outbox = self._outboxes.get(connection)
        # Never past this journal's last seq (a host's point from another journal): no new wake is below it.
        resume_from = min(params.resume_from or 0, self._journal.last_seq())
        if outbox is not None:
            for name in claimed:  # each replayed from the journal in seq order, paced by acks (hosts/outbox.py)
                outbox.add_agent(name, after_seq=resume_from)
        pending = {name: self._journal.unacked_count(name) for name in claimed}
        log.info("session.hello", agents=sorted(session.agents), unacked_to_replay=sum(pending.values()), by_agent=pending)
        return {
            "daemonVersion": __version__,
            "servers": self._servers_list(),
            "agents": [self._agents[name].to_wire() for name in sorted(session.agents)],
            "wakeSeq": self._journal.last_seq(),
        }

    async def ack(self, connection: HostConnection, params: AckParams) -> Deferred:
        """``wake/ack``: the host has the wakes ``seqs`` (of its agents, or of ``agent``).

        Answered once the ack is durable; acks that arrive together share one commit, and the
        connection's other calls don't wait behind it (a :class:`Deferred` answer).
        """
        seqs = list(params.seqs or [])
        if params.seq is not None:
            seqs.append(params.seq)
        if params.agent is not None:
            agents = [self.require_owner(connection, params.agent).name]
        else:
            session: HostSession | None = connection.session
            agents = sorted(name for name in (session.agents if session else ()) if self._owners.get(name) is connection)
        outbox = self._outboxes.get(connection)
        # The window opens now; the journal's copy is marked below, and until that commit
        # settles the outbox remembers the ack (hosts/outbox.py).
        settled = None if outbox is None else outbox.host_acked(agents, seqs)
        try:
            wait = await self._journal.submit_ack(agents, seqs, on_done=settled)
        except JournalFailure as exc:
            raise _ack_not_recorded(exc) from exc

        async def answer() -> dict[str, object]:
            try:
                acked = await wait()
            except JournalFailure as exc:
                raise _ack_not_recorded(exc) from exc
            self._metrics.wakes_acknowledged(agents, acked)
            self._log.debug("wake.acked", connection=connection.id, seqs=len(seqs), agents=agents, acked=acked)
            return {"acked": acked}

        return Deferred(answer)

    def _spec_for(self, params: AgentSpecParams) -> AgentSpec:
        if not params.name or any(char.isspace() for char in params.name):
            raise RpcError(INVALID_PARAMS, f"{params.name!r} is not an agent name (non-empty, no whitespace).")
        configured = self._agents.get(params.name)
        if configured is not None and configured.configured:
            # The operator's config is the authority over a configured agent's tools and wakes.
            return configured
        return spec_from_params(params)

    def _check_claimable(self, connection: HostConnection, host: str, name: str) -> None:
        owner = self._owners.get(name)
        if owner is not None and owner is not connection and _host_of(owner) != host:
            raise self._not_yours(name)
        hold = self._holds.get(name)
        if owner is None and hold is not None and hold.host != host:
            left = max(0.0, hold.deadline - trio.current_time())
            raise RpcError(
                AGENT_OWNED,
                f"Agent {name!r} is held for host {hold.host!r}, whose connection dropped, for "
                f"{left:.1f} s more. Claim it after that, or from host {hold.host!r}.",
                {"agent": name, "owner": hold.host, "heldFor": left},
            )

    def _not_yours(self, name: str) -> RpcError:
        owner = self._owners.get(name)
        if owner is None:
            return RpcError(AGENT_OWNED, f"Agent {name!r} is not owned by this connection. Claim it with session/hello.", {"agent": name})
        host = owner.session.host if owner.session is not None else "?"
        return RpcError(
            AGENT_OWNED,
            f"Agent {name!r} is owned by host {host!r} (connection {owner.id}). One session owns an agent at a time.",
            {"agent": name, "owner": host, "connection": owner.id},
        )

def _ack_not_recorded(exc: JournalFailure) -> RpcError:
    return RpcError(
        INTERNAL_ERROR,
        f"Not recorded: the daemon could not commit the ack to its journal ({exc}). The wakes stay "
        "owed and may come again; ack them again later.",
        {"retry": True},
    )


def _host_of(connection: HostConnection) -> str | None:
    session: HostSession | None = connection.session
    return None if session is None else session.host


def _wake_of(stored: StoredDelivery) -> Wake:
    event = stored.event
    return Wake(
        seq=event.seq,
        agent=stored.delivery.agent,
        reason=stored.delivery.reason,
        channel=None if event.channel_id is None else ChannelRef(event.server_id, event.channel_id),
        payload=event.payload,
        tags=stored.delivery.tags,
        addressed=stored.delivery.addressed,
        server_id=event.server_id,
    )
