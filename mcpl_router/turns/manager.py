"""TurnManager: opening, leases and closing of turns; the host's turn methods land here.

The decisions are :mod:`mcpl_router.routing.turns`' and the agent's mode's (pure); the parts
this wires carry them out over the server links:

- :mod:`~mcpl_router.turns.speech`: each round's text routed and published, drafted or bounced;
- :mod:`~mcpl_router.turns.typing`: the turn's typing on its channel's own server, and hosts' leases;
- :mod:`~mcpl_router.turns.drafts`: drafts (journaled) and the receipt at close;
- :mod:`~mcpl_router.turns.lifecycle`: ``inference/lifecycle`` ``started`` once and exactly one
  terminal per ``started`` on every exit path (close, supersede, lease expiry, host gone, drain).

Each turn's timers run in a *keeper* task in the manager's nursery: it refreshes typing and
aborts a turn the host says nothing about for ``lease`` seconds, or whose connection is gone,
so a crashed host can never leave a channel typing. Every exception in a keeper is caught
and logged, and ends its turn.
"""

from __future__ import annotations

import collections
import functools
import itertools
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

import trio

from mcpl_router.events import ChannelsChanged, EventBus, HostClosed
from mcpl_router.jsonrpc import INVALID_PARAMS, RpcError
from mcpl_router.logs import get_logger
from mcpl_router.mcpl.context import HookFacts, before_inference
from mcpl_router.routing import prose, texts
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.agents import agent_may_call
from mcpl_router.routing.turns import OUTCOMES, MalformedChannel, Turn, TurnRouting, TurnTable, requested_channel, trigger_of
from mcpl_router.turns.drafts import receipt_of
from mcpl_router.turns.keeper import TurnKeepers
from mcpl_router.turns.lifecycle import REFUSAL_REACTION
from mcpl_router.turns.parts import TurnParts
from mcpl_router.turns.ports import ContextMetrics, Owners, ToolListing
from mcpl_router.turns.run import DAEMON_DRAINING, FINISH_GRACE, TURN_NOT_OPEN, HostLink, Timing, TurnRun
from mcpl_router.turns.wakes import NO_FENCE, RouteFence, fenced, wake_facts

if TYPE_CHECKING:
    from mcpl_router.mcpl.session import ServerSession
    from mcpl_router.routing.agents import AgentSpec
    from mcpl_router.routing.router import Router
    from mcpl_router.store.journal import Journal

__all__ = ["TurnManager"]

#: Ended turns whose tool calls are still taken (newest kept): a script a turn started may run on.
ENDED_TURNS_KEPT: Final = 1024


def _not_open(turn_id: str) -> RpcError:
    return RpcError(
        TURN_NOT_OPEN,
        f"Turn {texts.quoted(turn_id)} is not open here (never opened on this daemon, as one opened"
        " on another node of a cluster before a takeover; closed; superseded; or its lease expired)."
        " Open a new turn with turn/open.",
        {"turnId": turn_id},
    )


class TurnManager:
    """Every open turn and the tasks that keep them.

    Args:
        router: the registry and the one resolver.
        servers: the servers' sessions by server id (a live view of the daemon's links: reloads change it).
        journal: wakes read mid-turn, drafts kept.
        sessions: who owns which agent, the wakes, and the agents' specs.
        tools: the one name table of the tools offered and called.
        metrics: ``beforeInference`` latencies.
        is_draining: True once shutdown started: no new turns.
    """

    typing_interval: Timing[float] = Timing()
    lease: Timing[float] = Timing()
    context_timeout: Timing[float] = Timing()
    publish_timeout: Timing[float | None] = Timing()
    connection_poll: Timing[float] = Timing()
    host_typing_lease: Timing[float] = Timing()

    def __init__(
        self,
        *,
        router: Router,
        servers: Mapping[str, ServerSession],
        journal: Journal,
        sessions: Owners,
        tools: ToolListing,
        parts: TurnParts | None = None,
        metrics: ContextMetrics | None = None,
        is_draining: Callable[[], bool] = lambda: False,
        notices_for: Callable[[str], list[str]] = lambda agent: [],
        route_fence: RouteFence = NO_FENCE,
        events: EventBus | None = None,
    ) -> None:
        self._router = router
        self._servers = servers
        self._journal = journal
        self._sessions = sessions
        self._metrics = metrics
        self._is_draining = is_draining
        # What an agent was not told outside a turn (a channel its open couldn't be restored
        # in): given at its next turn/open, once.
        self._notices_for = notices_for
        if parts is None:
            parts = TurnParts.build(router=router, servers=servers, journal=journal, notify_agent=sessions.notify_agent)
        self.parts = parts
        self.timings = parts.timings
        self.table = TurnTable()
        self._runs = parts.runs
        #: Recently ended turns, newest last (a script left running may still call tools in one).
        self._ended: collections.OrderedDict[str, TurnRun] = collections.OrderedDict()
        self._ids = itertools.count(1)
        self._id_salt = secrets.token_hex(4)  # ids unique across restarts; not a getrandom a turn
        self._log = get_logger()
        self._nursery: trio.Nursery | None = None
        #: The reaction a provider-refused turn's latest inbound message gets (not for named).
        self.refusal_reaction: str = REFUSAL_REACTION
        #: The one name table, as a turn lists an agent's tools and tells a send (the table
        #: itself, and dispatching a call, are ``tools/``'s).
        self.tools = tools
        #: Which channels an agent's turn may take (the forks').
        self.route_fence = route_fence
        self.typing = parts.typing
        self.drafts = parts.drafts
        self.speech = parts.speech
        self.lifecycle = parts.lifecycle
        self.keepers = TurnKeepers(self)
        if events is not None:
            events.subscribe(ChannelsChanged, self._channels_changed)
            events.subscribe(HostClosed, self._host_closed)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the turns' keeper tasks (and the hosts' typing leases) until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                await nursery.start(self.typing.run)
                await nursery.start(self.keepers.run)
                task_status.started()
                await trio.sleep_forever()
            finally:
                self._nursery = None

    # ------------------------------------------------------------------ plumbing

    def _shown(self, ref: ChannelRef) -> str:
        return self._router.names.name_shown(ref)

    def _ref_wire(self, ref: ChannelRef | None) -> dict[str, str] | None:
        return None if ref is None else {**ref.to_wire(), "shown": self._shown(ref)}

    def run_for(self, connection: HostLink, turn_id: str) -> TurnRun:
        """The open turn ``turn_id``, which ``connection``'s host must own; renews its lease."""
        run = self._runs.get(turn_id)
        if run is None or run.finished:
            raise _not_open(turn_id)
        self._sessions.require_owner(connection, run.turn.agent)
        # Anything the host says about a turn renews its lease.
        run.lease_deadline = trio.current_time() + self.timings.lease
        return run

    def _new_ids(self) -> tuple[str, str]:
        return f"t-{(n := next(self._ids))}-{self._id_salt}", f"inf-{n}-{self._id_salt}"

    def open_turns(self) -> list[Turn]:
        """Every open turn (for status and tests)."""
        return self.table.all()

    def run_of(self, turn_id: str) -> TurnRun | None:
        """The shell state of an open turn (for tests)."""
        return self._runs.get(turn_id)

    def runs(self) -> list[TurnRun]:
        """Every open turn's shell state."""
        return list(self._runs.values())

    # ------------------------------------------------------------------ turn/open

    async def open(
        self,
        connection: HostLink,
        agent: str,
        *,
        wakes: Sequence[int] = (),
        channel: str | Mapping[str, object] | None = None,
        subagent: bool = False,
    ) -> dict[str, object]:
        """Open a turn for ``agent`` (owned by ``connection``): fix its trigger, start typing.

        The channel comes from one request: the newest addressed wake's ref among ``wakes``,
        or else ``channel`` as the host named it. A name that means none or several channels
        gives the turn no channel, and nothing falls back to another.

        The locus (where plain speech goes) is the one conversation the wakes hold (addressed
        ones first); several → held. ``system`` holds the lines the host puts at the system
        position of every request of the turn (named mode's line); ``subagent`` picks the
        subagent wording.
        """
        if self._is_draining():
            # Shutdown ends open turns and then stops the links: a turn opened now would start
            # typing and get no terminal.
            raise RpcError(
                DAEMON_DRAINING,
                "The daemon is shutting down (daemon/shutdown was sent): no new turns. Open the"
                " turn again once it is back.",
                {"agent": agent},
            )
        sessions = self._sessions
        spec = sessions.require_owner(connection, agent)
        facts = fenced(await wake_facts(sessions.wake, agent, wakes, nothing_done="No turn was opened."), self.route_fence, agent)
        trigger: ChannelRef | None = None
        message_id = thread_id = None
        chosen = trigger_of(facts)
        if chosen is not None:
            trigger, message_id, thread_id = chosen.channel, chosen.message_id, chosen.thread_id
        elif channel is not None:
            try:
                trigger = requested_channel(self._router.names, channel)
            except MalformedChannel as exc:
                raise RpcError(INVALID_PARAMS, str(exc), {"field": "channel"}) from None
        if trigger is not None and not self.route_fence.may_take_route(agent, trigger):
            trigger = message_id = thread_id = None  # a fork's conversation, or not this fork's home
        # A fork's home always wins: its turn is there even when opened on no wake (fork/close).
        trigger = trigger or self.route_fence.home_of(agent)
        turn_id, inference_id = self._new_ids()
        turn = Turn(
            turn_id=turn_id,
            inference_id=inference_id,
            agent=agent,
            routing=TurnRouting.starting_at(trigger),
            wakes=tuple(fact.seq for fact in facts),
            conversation_id=agent,
            turn_index=self.table.next_index(agent),
            trigger_message_id=message_id,
            trigger_thread_id=thread_id,
        )
        mode = spec.mode
        state = prose.ProseState()
        competing = self.speech.place_at_open(mode, turn.routing, state, facts)
        run = TurnRun(
            turn=turn,
            connection=connection,
            mode=mode,
            lease_deadline=trio.current_time() + self.timings.lease,
            prose=state,
            subagent=bool(subagent),
            seen_seq=max([self._journal.last_seq(), *(fact.seq for fact in facts)]),
        )
        superseded = self.table.add(turn)
        self._runs[turn_id] = run
        self._log.info(
            "turn.opened",
            agent=agent,
            turn=turn_id,
            server=trigger.server_id if trigger else None,
            channel=trigger.channel_id if trigger else None,
            wakes=list(turn.wakes),
        )
        if superseded is not None:
            old = self._runs.get(superseded.turn_id)
            if old is not None:
                self._log.info("turn.superseded", agent=agent, turn=turn_id, superseded=superseded.turn_id)
                await self.finish(old, "aborted", why="superseded")
        self.keepers.opened(run)
        locus = turn.routing.locus
        routing_line = mode.routing_line(
            self._shown(locus) if locus else None, competing, held_ambiguous=state.held_reason == prose.REASON_AMBIGUOUS
        )
        untold = self.drafts.tell_untold(agent)
        return {
            "turnId": turn_id,
            "inferenceId": inference_id,
            "channel": self._ref_wire(trigger),
            "tools": self.tools_for(spec, run),
            "system": mode.system_lines(may_publish=agent_may_call(spec, "channel_publish"), subagent=run.subagent),
            "notices": ([texts.untold_drafts([draft.draft_id for draft in untold])] if untold else []) + self._notices_for(agent),
            "proseRouting": mode.name,
            "shown": {
                "channel": self._shown(trigger) if trigger else None,
                "locus": self._shown(locus) if locus else None,
                "routing": routing_line,
            },
        }

    # ------------------------------------------------------------------ turn/continue

    async def continue_(self, connection: HostLink, turn_id: str, *, wakes: Sequence[int] = ()) -> dict[str, object]:
        """Another start of an open turn: a continuation on new wakes, or a budget restart.

        The turn keeps its id, drafts, pins, engagement and lifecycle (it is not superseded).
        A start whose wakes name a channel re-pins the turn there, on that wake's own server
        (:meth:`Speech.place_at_start`); the turn answers those wakes too, so they no longer
        count as mid-turn arrivals that hold its route. Typing moves at once where it moved.
        """
        run = self.run_for(connection, turn_id)
        turn = run.turn
        facts = fenced(await wake_facts(self._sessions.wake, turn.agent, wakes, nothing_done="The turn was not continued."),
                       self.route_fence, turn.agent)
        async with run.lock:
            if run.finished:
                raise _not_open(turn_id)  # ended while its wakes were read
            turn.wakes = tuple(dict.fromkeys((*turn.wakes, *(fact.seq for fact in facts))))
            run.starts += 1
            notice = self.speech.place_at_start(run, facts)
            if notice is not None:
                run.notices.append(notice)
            if run.typing_sent is not None and run.typing_sent[0] != turn.routing.typing_channel:
                await self.typing.refresh(run)
                run.next_typing = trio.current_time() + self.typing_interval
        trigger, locus = turn.routing.trigger, turn.routing.locus
        self._log.info(
            "turn.continued", agent=turn.agent, turn=turn_id, start=run.starts, wakes=list(wakes),
            server=trigger.server_id if trigger else None, channel=trigger.channel_id if trigger else None,
        )
        return {
            "turnId": turn_id,
            "start": run.starts,
            "channel": self._ref_wire(trigger),
            "wasIn": [self._ref_wire(ref) for ref in turn.routing.was_in],
            "notices": [notice] if notice is not None else [],
            "shown": {"channel": self._shown(trigger) if trigger else None, "locus": self._shown(locus) if locus else None},
        }

    # ------------------------------------------------------------------ turn/context

    async def context(
        self, connection: HostLink, turn_id: str, *, user_message: object = None, model: str | None = None
    ) -> dict[str, object]:
        """Fan ``context/beforeInference`` out; the injections grouped by position."""
        run = self.run_for(connection, turn_id)
        turn = run.turn
        await self.lifecycle.start(run)
        facts = HookFacts(
            inference_id=turn.inference_id,
            conversation_id=turn.conversation_id,
            turn_index=turn.turn_index,
            model=model,
            user_message=user_message,
            incoming=turn.routing.trigger,
            incoming_message_id=turn.trigger_message_id,
            incoming_thread_id=turn.trigger_thread_id,
            default_outgoing=turn.routing.locus,
            fork_home=self.route_fence.home_of(turn.agent),
        )
        result = await before_inference(
            list(self._servers.values()),
            facts,
            self._router.registry,
            timeout=self.timings.context_timeout,
            log_fields={"agent": turn.agent, "turn": turn.turn_id},
        )
        if self._metrics is not None:
            self._metrics.context_answered(result.servers, result.elapsed)
        return result.to_wire()

    # ------------------------------------------------------------------ turn/text, turn/round

    def text(self, connection: HostLink, turn_id: str, round_: int, delta: str) -> None:
        """Buffer a round's text delta (``turn/text`` is a notification: nothing answers).

        The route in force when a round's first words arrive is the one they travel along: a
        ``channel_open`` landing later in the round changes only later rounds' words.
        """
        run = self.run_for(connection, turn_id)
        if not run.turn.add_text(round_, delta):
            self._log.warning("turn.text.late", agent=run.turn.agent, turn=turn_id, round=round_)
            return
        routing = run.turn.routing
        run.round_routes.setdefault(round_, (routing.locus, routing.sticky_target, routing.speech_targets_set))

    async def round(
        self, connection: HostLink, turn_id: str, round_: int, tool_calls: Sequence[Mapping[str, object]] = ()
    ) -> dict[str, object]:
        """A round ended: route its text now; its deliveries and the notices it raised.

        ``tool_calls`` are the calls the model made in this round, which the host runs after
        this: a send among them holds the round's plain text (send-silencing), since the agent
        is already saying what it means to say.
        """
        run = self.run_for(connection, turn_id)
        if self.round_sends(tool_calls):
            run.explicit_send_rounds.add(round_)
        await self.lifecycle.start(run)
        async with run.lock:
            seen = len(run.notices)
            deliveries = await self.speech.route_round(run, round_)
        return {"deliveries": [d.to_wire() for d in deliveries], "notices": run.notices[seen:]}

    # ------------------------------------------------------------------ tools

    def tools_for(self, agent: AgentSpec, run: TurnRun) -> list[dict[str, object]]:
        """Every provider's tools this agent may call, in provider order (read from the name table)."""
        return self.tools.offered(agent, run)

    def round_sends(self, tool_calls: Sequence[Mapping[str, object]]) -> bool:
        """Whether any of a round's tool calls (not yet run) is a send tool."""
        for tool_call in tool_calls:
            name = tool_call.get("name")
            arguments = tool_call.get("arguments")
            arguments = arguments if isinstance(arguments, Mapping) else {}
            if isinstance(name, str) and self.tools.is_send(name, arguments):
                return True
        return False

    def run_for_call(self, connection: HostLink, turn_id: str) -> TurnRun:
        """The turn a ``turn/tool`` call names: the open one (its lease renewed), or one that
        has ended lately (a script it started may still call tools; the call then reads no
        turn's channels, ``routing.turns.call_scope``)."""
        ended = self._ended.get(turn_id)
        return self.run_for(connection, turn_id) if ended is None else ended

    # ------------------------------------------------------------------ turn/close

    async def close(self, connection: HostLink, turn_id: str, outcome: str, usage: object = None) -> dict[str, object]:
        """End a turn: route what's left, stop typing, send the lifecycle terminal; the receipt.

        ``refused`` (the model provider refused) ends the turn as ``failed`` for servers and
        marks the turn's latest inbound message with :attr:`refusal_reaction` through
        ``channels/acknowledge`` on that message's own server, where the agent's mode reacts.
        """
        if outcome not in OUTCOMES:
            raise RpcError(INVALID_PARAMS, f"outcome must be one of completed, aborted, failed, refused; got {texts.quoted(str(outcome))}")
        run = self.run_for(connection, turn_id)
        turn = run.turn
        async with run.lock:
            seen = len(run.notices)
            if outcome == "completed":
                for round_ in turn.unrouted_rounds():
                    await self.speech.route_round(run, round_)
            else:
                # An aborted, failed or refused turn's unfinished words are not posted.
                self.speech.hold_unfinished(run, outcome)
        await self.finish(run, "failed" if outcome == "refused" else outcome, why="closed", usage=usage)
        if outcome == "refused":
            # After the turn has ended (typing stopped, terminal sent), and in the background:
            # a server slow to answer the reaction must not hold the host's close.
            if self._nursery is not None:
                self._nursery.start_soon(self.lifecycle.react_to_refusal, run, self.refusal_reaction)
            else:
                await self.lifecycle.react_to_refusal(run, self.refusal_reaction)
        deliveries = turn.routing.deliveries
        receipt = {
            "text": receipt_of(run, self._router.names),
            "delivered": [d.to_wire() for d in deliveries if d.outcome == "delivered"],
            "held": len(run.drafts),
            "private": run.private,
            "suppressed": run.suppressed,
            "kept": run.kept,
        }
        drafts = [d.to_wire(time.time()) for d in self.drafts.made_in(run)]
        return {
            "receipt": receipt,
            "deliveries": [d.to_wire() for d in deliveries],
            "drafts": drafts,
            "notices": run.notices[seen:],
            "again": run.again and outcome == "completed",
        }

    # ------------------------------------------------------------------ ending a turn

    async def finish(self, run: TurnRun, outcome: str, *, why: str, usage: object = None) -> None:
        """End a turn once, whichever way: stop its typing and send its lifecycle terminal.

        Exclusive with round routing: ``finished`` is set first (a round being routed re-checks
        it before each publish and chunk, so it stops after the publish in flight), then the
        end waits for the turn's lock, so the streams complete after the round's last chunk.
        The wait is bounded by one publish, and shielded. The sends are queued at once where
        they fit (:meth:`_end_queued`); what must wait for room waits shielded, within
        ``FINISH_GRACE``.
        """
        if run.finished:
            return
        run.finished = True
        turn = run.turn
        turn.outcome = outcome
        self.table.remove(turn)
        self._runs.pop(turn.turn_id, None)
        self._ended[turn.turn_id] = run
        while len(self._ended) > ENDED_TURNS_KEPT:
            self._ended.popitem(last=False)
        self.keepers.ended(run)
        acquired = not run.lock.locked()
        if acquired:
            run.lock.acquire_nowait()  # the common case: no round is being routed
        else:
            with trio.CancelScope(shield=True, deadline=trio.current_time() + self.speech.longest_publish() + FINISH_GRACE):
                await run.lock.acquire()
                acquired = True
        if not acquired:
            self._log.warning("turn.finish.lock_timeout", agent=turn.agent, turn=turn.turn_id, why=why)
        try:
            if not (acquired and self._end_queued(run, outcome, usage)):
                # Shielded: the stop and the terminal must go out even when the caller is being
                # cancelled (a lease expiry inside the keeper, a host gone mid-call), within a bound.
                with trio.CancelScope(shield=True, deadline=trio.current_time() + FINISH_GRACE):
                    # Concurrently where two servers hear the end: one's stuck typing stop must not cost another its terminal.
                    if run.ends_on_one_server():
                        await self.typing.stop(run)
                        await self.lifecycle.end(run, outcome, usage)
                    else:
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(self.typing.stop, run)
                            nursery.start_soon(self.lifecycle.end, run, outcome, usage)
        finally:
            if acquired:
                run.lock.release()
        self._log.info("turn.ended", agent=turn.agent, turn=turn.turn_id, outcome=outcome, why=why)

    def _end_queued(self, run: TurnRun, outcome: str, usage: object) -> bool:
        """The common end: one server hears it and its outbox has room, so the typing stop, the
        streams' completes and the terminal are queued now, in that order, with no scope or
        wait. False at the first that doesn't fit: what was queued is off the turn, and
        :meth:`finish` sends the rest (in order, shielded, within its bound)."""
        return run.ends_on_one_server() and self.typing.stop_nowait(run) and self.lifecycle.end_nowait(run, outcome, usage)

    async def drain(self) -> None:
        """Abort every open turn (daemon shutdown): typing stopped, lifecycle terminals sent.

        All at once, so the whole drain takes one turn's bound, not one per turn.
        """
        async with trio.open_nursery() as nursery:
            for turn in self.table.all():
                run = self._runs.get(turn.turn_id)
                if run is not None:
                    nursery.start_soon(functools.partial(self.finish, run, "aborted", why="shutdown"))

    def _channels_changed(self, event: ChannelsChanged) -> None:
        if event.removed:
            # Only these refs' typing stops: another server's channel with the id keeps its own.
            self.channels_removed(event.removed)

    def _host_closed(self, event: HostClosed) -> None:
        # The host is gone: its turns end now (typing stopped, lifecycle terminal sent), not
        # at their lease. Compared by identity: the event's connection is a HostLink.
        self.connection_closed(event.connection)

    def connection_closed(self, connection: object) -> None:
        """A host connection is gone: its turns end at their keeper's next check (soon), and
        the typing it started by itself is stopped now."""
        self.typing.host_gone(connection)
        for run in list(self._runs.values()):
            if run.connection is connection:
                run.lease_deadline = min(run.lease_deadline, trio.current_time())

    async def stop_typing_in(self, ref: ChannelRef) -> None:
        """``channel_close`` of ``ref``: stop the typing of the turns typing in exactly that channel."""
        await self.parts.stop_typing_in(ref)

    def typing_statistics(self) -> dict[str, int]:
        """Typing indicators the daemon holds now: for turns, and started by hosts."""
        return self.typing.statistics(self._runs.values())

    def channels_removed(self, refs: Sequence[ChannelRef]) -> None:
        """Channels withdrawn (or their server gone): only those channels' typing is forgotten."""
        self.typing.withdrawn(refs, self._runs.values())
