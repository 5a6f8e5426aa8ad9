"""Each agent's decision per channel (open, closed, declined), kept in the journal, and the
servers held to it.

MCPL lets a server keep no subscriptions of its own: discord-mcpl's "desired state is
host-owned; channels/open and channels/close reconcile this set". After it restarts, or after
the daemon does, it registers again, closed, a channel an agent had opened, and nothing said
there reaches the agent until something opens it again. So the decisions are journaled
(``channel_open``, ``channel_close``, ``channel_decline``, and a connector send that opened a
channel), and every time a server registers channels, and every time its link becomes ready
(each epoch, after either side restarts: a server may register before its handshake ends, as
discord-mcpl does when the policy is slow), those the server's state differs on are
reconciled, on that server alone:

- some agent decided it open and the server registered it closed: ``channels/open``, with no
  history (the agent had the history it asked for at its own open: asked at most once);
- an agent closed it, none decided it open, and the server registered it open: ``channels/close``.

A tuned-out channel counts as decided open while the tune-out lasts: a tune-out keeps its
channel open (its traffic is what it holds and summarizes), so a server that registers it
closed again, after either side restarts or a cluster's takeover, is asked to open it, or the
tune-out, resumed from the journal, would hold nothing more and no agent would hear it.

A server that refuses: logged, counted, and each agent that wanted the channel open is told once
(a notice at its next turn), not at every registration. It is not asked again on that link
epoch (a server re-registering in a loop gets one ``channels/open``, not one per
registration); its next epoch (a restart, a reconnect), or the agent deciding again, tries
again.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Final

import trio

from mcpl_router.events import ChannelsChanged, EventBus, ServerRegranted, ServerStateChanged
from mcpl_router.logs import get_logger
from mcpl_router.mcpl.link import LinkState
from mcpl_router.routing import texts
from mcpl_router.routing.desired import CLOSED, DECLINED, OPEN, DesiredChannels
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.store.records import JournalFailure
from mcpl_router.mcpl.session import LIFECYCLE, CloseParams, HistoryParams, OpenParams, ServerSession
from mcpl_router.turns.sends import LIFECYCLE_TIMEOUT

if TYPE_CHECKING:
    from mcpl_router.routing.router import Router
    from mcpl_router.store.journal import Journal

__all__ = ["ChannelLifecycle", "RECONCILE_OPEN", "RECONCILE_CLOSE"]

#: (agent, channel) answers :meth:`ChannelLifecycle.has_open` keeps (all let go when full).
HAS_OPEN_KEPT: Final = 4096

RECONCILE_OPEN: Final = "open"
RECONCILE_CLOSE: Final = "close"
#: What a reconcile's outcome is counted as (``mcpl_router_channel_reconciles_total``).
DONE: Final = "done"
FAILED: Final = "failed"


class ChannelLifecycle:
    """The agents' channel decisions (journaled) and the ``channels/open``/``close`` that keep
    each server to them. One per daemon; the channel tools and the connector tools decide
    through it, the daemon tells it what each server registered."""

    timeout: float = LIFECYCLE_TIMEOUT

    def __init__(self, router: Router, servers: Mapping[str, ServerSession], journal: Journal, *,
                 fork_home: Callable[[str], ChannelRef | None] = lambda agent: None,
                 kept_open: Callable[[], Collection[ChannelRef]] = frozenset, events: EventBus | None = None) -> None:
        self._router = router
        #: The channels the tune-outs keep open now (the tune-outs' own, wired by the daemon).
        self._kept_open = kept_open
        self._servers = servers
        self._journal = journal
        self._fork_home = fork_home
        self._log = get_logger()
        #: What each agent last decided for each channel.
        self.desired = DesiredChannels()
        for agent, server_id, channel_id in journal.declines():
            self.desired.decide(agent, ChannelRef(server_id, channel_id), DECLINED)
        for agent, server_id, channel_id, state in journal.channel_decisions():
            self.desired.decide(agent, ChannelRef(server_id, channel_id), state)
        # Registered channels to check, in arrival order (a set: a registration storm of one
        # channel is one check). Bounded by the channels agents decided for.
        self._pending: dict[ChannelRef, None] = {}
        self._arrived = trio.Event()
        #: Reconciles by (server, action, outcome), since start.
        self.counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        #: The last reconcile's outcome per channel (for ``status``).
        self._last: dict[ChannelRef, dict[str, object]] = {}
        # (agent, channel) told that its open could not be restored: told once, until the
        # agent decides again or a reconcile succeeds.
        self._told: set[tuple[str, ChannelRef]] = set()
        self._notices: dict[str, dict[ChannelRef, str]] = {}
        # The link epoch each channel's server refused its reconcile on: not asked again on it.
        # Bounded by the channels agents decided for.
        self._refused_on: dict[ChannelRef, int] = {}
        # has_open's answers by (agent, channel), each with the fork home it was decided with,
        # while the registry's generation and the decisions' version they were decided at
        # stand (_kept_at): asked of every message wake, it changes far more rarely.
        self._kept: dict[tuple[str, ChannelRef], tuple[ChannelRef | None, bool]] = {}
        self._kept_at = (-1, -1)
        if events is not None:
            events.subscribe(ChannelsChanged, self._channels_changed)
            events.subscribe(ServerStateChanged, self._state_changed)
            # A reload that grants channels.lifecycle: the decisions skipped for want of it are
            # held now, not only at the server's next connection.
            events.subscribe(ServerRegranted, lambda regranted: self.link_ready(regranted.server_id))

    def _channels_changed(self, event: ChannelsChanged) -> None:
        if event.added:
            self.registered(event.added)

    def _state_changed(self, event: ServerStateChanged) -> None:
        # Every epoch (a reconnect too) holds the server to the agents' channel decisions,
        # those it registered before it was ready too.
        if event.new == LinkState.READY.value:
            self.link_ready(event.server_id)

    def has_open(self, agent: str, ref: ChannelRef) -> bool:
        """Whether ``agent`` is in channel ``ref`` by its own decisions, not merely because the
        channel's transport is open (:meth:`DesiredChannels.has_open
        <mcpl_router.routing.desired.DesiredChannels.has_open>` has the rule); a fork is in its home.

        Decided once per (agent, channel) and kept until something it reads changes: the
        registry (registered, open, its descriptor: the generation), any agent's decision (the
        rule reads the others' too: the decisions' version), or the agent's fork home. The
        homes are the forks' (the lifecycle is given only their reader), so each answer keeps
        the home it was decided with and holds while the agent's home is still that one."""
        registry = self._router.registry
        home = self._fork_home(agent)
        if registry.generation != self._kept_at[0] or self.desired.version != self._kept_at[1]:
            self._kept.clear()
            self._kept_at = (registry.generation, self.desired.version)
        key = (agent, ref)
        kept = self._kept.get(key)
        if kept is not None and (kept[0] is home or kept[0] == home):
            return kept[1]
        answer = self.desired.has_open(agent, ref, registry.get(ref), home=home)
        if len(self._kept) >= HAS_OPEN_KEPT:
            self._kept.clear()
        self._kept[key] = (home, answer)
        return answer

    # ------------------------------------------------------------------ decisions

    def decide(self, agent: str, ref: ChannelRef, state: str) -> None:
        """``agent`` decided ``state`` for ``ref``: kept, and journaled (written behind)."""
        self.desired.decide(agent, ref, state)
        self._told.discard((agent, ref))
        self._refused_on.pop(ref, None)
        self._notices.get(agent, {}).pop(ref, None)
        if state == DECLINED:
            self._journal.record_decline(agent, ref.server_id, ref.channel_id)
        else:
            self._journal.record_channel_decision(agent, ref.server_id, ref.channel_id, state)

    async def recorded(self) -> None:
        """Until every decision made so far is in the journal: a tool answers the agent only
        then, so what an agent was told survives a crash or a takeover. A journal that can't
        commit now keeps the writes queued (retried): said, and the decision stands in memory."""
        try:
            await self._journal.flush()
        except JournalFailure as exc:
            self._log.warning("channel.decision.not_yet_recorded", error=str(exc), effect="in force; written when the journal recovers")

    async def send_open(self, session: ServerSession, ref: ChannelRef, *, history: HistoryParams | None = None,
                        thread_id: str | None = None) -> texts.Reason | None:
        """``channels/open`` on ``ref``'s own server; None when answered (the channel is then
        open here too), else a stable reason."""
        params = OpenParams(channel_id=ref.channel_id, history=history, thread_id=thread_id)
        reason = await session.open_channel(params, timeout=self.timeout)
        if reason is None:
            self._router.registry.set_open(ref, True)
        return reason

    async def send_close(self, session: ServerSession, ref: ChannelRef) -> texts.Reason | None:
        """``channels/close`` on ``ref``'s own server; None when answered (then closed here too)."""
        reason = await session.close_channel(CloseParams(channel_id=ref.channel_id), timeout=self.timeout)
        if reason is None:
            self._router.registry.set_open(ref, False)
        return reason

    def notices_for(self, agent: str) -> list[str]:
        """What ``agent`` has not been told yet (a channel its open could not be restored in):
        given once, at its next turn."""
        pending = self._notices.pop(agent, {})
        return list(pending.values())

    # ------------------------------------------------------------------ reconciling

    def wanted(self, ref: ChannelRef, kept_open: Collection[ChannelRef] | None = None) -> bool | None:
        """What ``ref``'s transport should be: open while a tune-out keeps it (``kept_open``,
        read now when not given), else what the agents' decisions want
        (:meth:`DesiredChannels.wanted <mcpl_router.routing.desired.DesiredChannels.wanted>`)."""
        if ref in (self._kept_open() if kept_open is None else kept_open):
            return True
        return self.desired.wanted(ref)

    def registered(self, refs: Iterable[ChannelRef]) -> None:
        """A server registered ``refs`` (a new epoch, a restart of either side): check those an
        agent decided something for, or a tune-out keeps open, against what they want."""
        kept_open = self._kept_open()
        for ref in refs:
            if self.wanted(ref, kept_open) is not None:
                self._pending[ref] = None
        if self._pending:
            self._arrived.set()

    def link_ready(self, server_id: str) -> None:
        """``server_id``'s link became ready (each epoch): check its registered channels an
        agent decided something for. Those it registered while the link was still shaking
        hands were skipped then (nothing can be asked of it before its grant is settled)."""
        registry = self._router.registry
        refs = dict.fromkeys([*self.desired.refs(), *self._kept_open()])
        self.registered(ref for ref in refs if ref.server_id == server_id and registry.is_registered(ref))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Reconcile registered channels as they arrive, one at a time, until cancelled."""
        task_status.started()
        while True:
            if not self._pending:
                self._arrived = trio.Event()
                await self._arrived.wait()
                continue
            ref = next(iter(self._pending))
            del self._pending[ref]
            try:
                await self._reconcile(ref)
            except Exception:
                # One channel's failure must not stop the others being kept.
                self._log.exception("channel.reconcile.crashed", server=ref.server_id, channel=ref.channel_id)

    async def _reconcile(self, ref: ChannelRef) -> None:
        entry = self._router.registry.get(ref)
        kept_open = self._kept_open()
        wanted = self.wanted(ref, kept_open)
        if entry is None or wanted is None or entry.open == wanted:
            return
        session = self._servers.get(ref.server_id)
        if session is None or session.unusable(LIFECYCLE) is not None:
            # Without the lifecycle grant the server decides alone; a link not ready is checked
            # again when it is (link_ready).
            self._log.info("channel.reconcile.skipped", server=ref.server_id, channel=ref.channel_id,
                           why="link-not-ready" if session is None or not session.ready else "not-granted")
            return
        epoch = session.epoch
        if self._refused_on.get(ref) == epoch:
            self._log.info("channel.reconcile.skipped", server=ref.server_id, channel=ref.channel_id,
                           why="refused-this-epoch", epoch=epoch)
            return
        action = RECONCILE_OPEN if wanted else RECONCILE_CLOSE
        reason = await (self.send_open(session, ref) if wanted else self.send_close(session, ref))
        outcome = DONE if reason is None else FAILED
        self.counts[(ref.server_id, action, outcome)] += 1
        self._last[ref] = {"action": action, "outcome": outcome, "reason": reason, "at": trio.current_time()}
        agents = sorted(agent for agent, state in self.desired.deciders(ref).items() if state == (OPEN if wanted else CLOSED))
        if reason is None:
            self._refused_on.pop(ref, None)
            self._log.info("channel.reconciled", server=ref.server_id, channel=ref.channel_id, action=action, agents=agents,
                           tuned_out=ref in kept_open)
            for agent in agents:
                self._told.discard((agent, ref))
            return
        self._refused_on[ref] = epoch
        self._log.warning("channel.reconcile.failed", server=ref.server_id, channel=ref.channel_id, action=action,
                          reason=reason, agents=agents, tuned_out=ref in kept_open, epoch=epoch)
        if not wanted:
            return
        shown = self._router.names.name_shown(ref)
        for agent in agents:
            if (agent, ref) not in self._told:
                self._told.add((agent, ref))
                self._notices.setdefault(agent, {})[ref] = texts.reopen_failed(shown, ref.server_id, reason)

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, object]:
        """``status``'s ``channelDecisions``: the reconciles so far, and each channel whose
        server state differs from what its agents decided (a reconcile pending or refused)."""
        registry = self._router.registry
        diverging = []
        kept_open = self._kept_open()
        for ref in dict.fromkeys([*self.desired.refs(), *kept_open]):
            wanted = self.wanted(ref, kept_open)
            entry = registry.get(ref)
            if wanted is None or entry is None or entry.open == wanted:
                continue
            diverging.append({
                **ref.to_wire(),
                "desired": OPEN if wanted else CLOSED,
                "registered": "open" if entry.open else "closed",
                "last": self._last.get(ref),
            })
        totals: collections.Counter[str] = collections.Counter()
        for (_, action, outcome), count in self.counts.items():
            totals[f"{action}-{outcome}"] += count
        return {"reconciled": dict(totals), "pending": len(self._pending), "diverging": diverging}
