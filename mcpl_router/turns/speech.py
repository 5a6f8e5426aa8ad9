"""The speech of a round: its text routed as the round ends, and the routing carried out.

The agent's mode decides (:mod:`mcpl_router.routing.modes`); this module carries out each
segment: publish on the destination's own server, draft (journaled), bounce with a notice,
or count. Each round's words travel along the route in force when its first words arrived;
messages that arrived since the turn last looked may hold an inferred locus (mid-turn hold).
``[routing]`` notices go back to the host with the round's answer.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from mcpl_router.logs import Logger, get_logger
from mcpl_router.routing import prose, rounds, texts
from mcpl_router.routing.drafts import Draft
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.modes import ProseMode
from mcpl_router.routing.turns import Delivery, TurnRouting, WakeFact, trigger_of
from mcpl_router.store.records import EventKind
from mcpl_router.turns.drafts import DraftBook
from mcpl_router.turns.run import PUBLISH_TIMEOUT, TurnRun, TurnTimings
from mcpl_router.turns.sends import publish_text
from mcpl_router.turns.streams import OutgoingStreams
from mcpl_router.turns.typing import TypingIndicators

if TYPE_CHECKING:
    from mcpl_router.mcpl.session import ServerSession
    from mcpl_router.routing.router import Router
    from mcpl_router.store.journal import Journal

__all__ = ["Speech"]

#: The most mid-turn arrivals one tool boundary reads.
ARRIVALS_READ = 10000


class Speech:
    """Routes each round's plain text and publishes, drafts or bounces what it decides."""

    def __init__(
        self,
        *,
        router: Router,
        servers: Mapping[str, ServerSession],
        journal: Journal,
        drafts: DraftBook,
        typing: TypingIndicators,
        streams: OutgoingStreams,
        timings: TurnTimings,
        tuned_out: Callable[[str], Collection[ChannelRef]] = lambda _agent: (),
    ) -> None:
        self._router = router
        self._servers = servers
        self._journal = journal
        self._drafts = drafts
        self._typing = typing
        self._streams = streams
        self._timings = timings
        self._log = get_logger()
        #: Bounces in a row per agent (a bounce wakes the agent again at most twice in a row).
        self._bounce_streak: dict[str, int] = {}
        # The channels each agent tuned out (the tune-outs'): their traffic is held for a
        # summary, so a mid-turn arrival there competes for nothing.
        self._tuned_out = tuned_out

    def _shown(self, ref: ChannelRef) -> str:
        return self._router.names.name_shown(ref)

    # -- targets ---------------------------------------------------------------------------

    def _takes_posts(self, ref: ChannelRef) -> bool:
        entry = self._router.registry.get(ref)
        return entry is None or entry.descriptor.direction != "inbound"

    def resolve_target(self, token: str, routing: TurnRouting | None, prefix: str = prose.EXPLICIT) -> prose.Target:
        """A target token as speech resolves it: the turn's own channels first, then the one
        resolver; a channel that takes no posts is refused."""
        return prose.resolve_target(token, self._router.names, routing, prefix=prefix, takes_posts=self._takes_posts)

    # -- a turn's opening ------------------------------------------------------------------

    def place_at_open(self, mode: ProseMode, routing: TurnRouting, state: prose.ProseState, facts: Sequence[WakeFact]) -> list[str]:
        """Where a new turn's plain speech lands and where its typing shows, per its mode;
        the competing channels' shown names when the wakes hold several conversations."""
        if not mode.speaks:
            # Nothing plain is ever posted, so there is no place to show typing.
            routing.locus = routing.typing_channel = None
            return []
        if not mode.infers_locus:
            # No locus: typing shows on the trigger, on its server.
            routing.locus = None
            return []
        if not facts:
            return []
        choice = prose.locus_of(facts)
        if choice.held:
            routing.locus = routing.typing_channel = None
            state.held_reason = prose.REASON_AMBIGUOUS
            return [self._shown(ref) for ref in choice.competing]
        if choice.ref is None:
            routing.locus = routing.typing_channel = None
        return []

    def place_at_start(self, run: TurnRun, facts: Sequence[WakeFact]) -> str | None:
        """A further start of an open turn (``turn/continue``) re-pins it on its wake's server.

        The start's trigger (:func:`~mcpl_router.routing.turns.trigger_of`, as at the open)
        becomes the turn's trigger and joins ``was_in``: within the turn its id now means that
        channel, on that server. An inferred locus moves to the start's one conversation (or is
        held among several); a deliberate one (a ``channel_open``, a ``>>>`` pin) stays. Hybrid's
        hold after a failed ``>>>`` and quiet after ``>>>skip_reply`` last until a new valid
        target, which a new message is not: they stay, and no notice says speech lands. Explicit
        mode's typing goes to the start's own wake, read once now. A start whose wakes name no
        channel (a budget restart) moves nothing. Returns the ``[routing]`` notice, if any.
        """
        chosen = trigger_of(facts)
        if chosen is None or chosen.channel is None:
            return None
        turn, routing, mode = run.turn, run.turn.routing, run.mode
        ref = chosen.channel
        deliberate = routing.deliberate_locus or routing.sticky_target is not None
        routing.trigger = ref
        turn.trigger_message_id, turn.trigger_thread_id = chosen.message_id, chosen.thread_id
        routing.moved_to(ref)
        # The agent was given a new message: a send earlier in the turn no longer silences it.
        run.explicit_send_rounds.clear()
        if not mode.speaks:
            return None
        if not mode.infers_locus:
            routing.typing_channel = ref  # explicit: typing on each start's own wake
            return None
        if deliberate:
            return None
        choice = prose.locus_of(facts)
        before = routing.locus
        routing.locus = routing.typing_channel = choice.ref
        if choice.held:
            run.prose.held_reason = prose.REASON_AMBIGUOUS
            return texts.speech_held([self._shown(other) for other in choice.competing])
        run.prose.held_reason = prose.REASON_NO_DESTINATION
        if choice.ref is not None and choice.ref != before and not (run.prose.hold or run.prose.quiet):
            return texts.speech_lands_in(self._shown(choice.ref))
        return None

    # -- a round ---------------------------------------------------------------------------

    async def route_round(self, run: TurnRun, round_: int) -> list[Delivery]:
        """Route one round's text (the caller holds the turn's lock); its deliveries."""
        turn = run.turn
        if run.finished and turn.outcome != "completed":
            # Ended (lease, host gone, superseded) while this call waited: post nothing more.
            return []
        text = turn.take_text(round_)
        routing = turn.routing
        locus_then, pin_then, targets_then = run.round_routes.pop(
            round_, (routing.locus, routing.sticky_target, routing.speech_targets_set)
        )
        log = self._log.bind(agent=turn.agent, turn=turn.turn_id, round=round_)
        mode = run.mode
        prefix = mode.target_prefix
        # Pins live in the routing (a channel_open with setSpeechTarget clears them); the words
        # go along the pin in force when they were written.
        pin_now = routing.sticky_target
        silenced = round_ in run.explicit_send_rounds
        # A tool boundary: messages that arrived meanwhile may hold later words.
        await self._arrivals(run, log)
        if not text.strip():
            return []
        # The core decides the round at once (routing/rounds.py); this only carries it out.
        plan = rounds.plan_round(
            mode,
            rounds.RoundFacts(text, run.prose, locus_then, pin_then, pin_now, targets_then, routing.speech_targets_set,
                              run.speech_targets_seen, silenced=silenced),
            resolve=lambda token: self.resolve_target(token, routing, prefix),
            shown=self._shown,
        )
        run.prose = plan.prose
        run.speech_targets_seen = plan.targets_seen
        run.notices.extend(plan.notices)
        if plan.sets_sticky:
            routing.sticky_target = plan.sticky_target
        deliveries: list[Delivery] = []
        for segment in plan.segments:
            delivery = await self._carry_out(run, round_, segment, prefix, log)
            if delivery is not None:
                deliveries.append(delivery)
        run.notices.extend(rounds.round_end_notices(mode, plan.started, run.prose))
        return deliveries

    def hold_unfinished(self, run: TurnRun, outcome: str) -> None:
        """An aborted, failed or refused turn's unrouted words: never posted; drafted where
        the mode would have posted them, else counted as the mode counts them."""
        turn = run.turn
        for round_ in turn.unrouted_rounds():
            text = turn.take_text(round_)
            if not text.strip():
                continue
            if run.mode.silent_action is not None:
                run.count_silent(run.mode.silent_action)
            else:
                self._drafts.new(run, text, prose.REASON_NO_DESTINATION, detail=f"turn-{outcome}")

    async def _arrivals(self, run: TurnRun, log: Logger) -> None:
        """Messages that arrived for the agent since the turn last looked (a tool boundary).

        A conversational message clears send-silencing for rounds not routed yet; one from
        another conversation that addresses the agent (or continues one it sent into) holds an
        inferred locus for the rest of the turn, with a notice, and its typing stops.
        """
        turn = run.turn
        if self._journal.last_seq() <= run.seen_seq:
            return  # nothing at all arrived since: no query (the usual case, per round)
        stored = await self._journal.unacked_deliveries(turn.agent, after_seq=run.seen_seq, limit=ARRIVALS_READ)
        if not stored:
            return
        run.seen_seq = max(item.event.seq for item in stored)
        tuned_out = self._tuned_out(turn.agent)
        taken = set(turn.wakes)
        arrivals = []
        for item in stored:
            event = item.event
            ref = ChannelRef(event.server_id, event.channel_id) if event.channel_id else None
            if ref is not None and ref in tuned_out:
                continue  # held for the tune-out's summary: not a conversation competing now
            if event.seq in taken:
                continue  # a start of this turn (turn/continue): the turn answers it
            payload = event.payload if isinstance(event.payload, Mapping) else {}
            thread = payload.get("threadId")
            arrivals.append(rounds.Arrival(ref, thread if isinstance(thread, str) else None, item.delivery.addressed,
                                          conversational=event.kind == EventKind.MESSAGE))
        if any(arrival.conversational for arrival in arrivals):
            run.explicit_send_rounds.clear()
        routing = turn.routing
        deliberate = routing.deliberate_locus
        competing = rounds.hold_for_arrivals(run.mode, routing, run.prose, arrivals, deliberate=deliberate)
        if not competing:
            return
        routing.locus = None
        run.prose.held_reason = prose.REASON_AMBIGUOUS
        # Later rounds' words are held; this round's were written before the arrival.
        for pending, (_locus, pin, targets) in list(run.round_routes.items()):
            run.round_routes[pending] = (None, pin, targets)
        if routing.typing_channel is not None:
            routing.typing_channel = None
            await self._typing.stop(run)
        run.notices.append(texts.speech_held([self._shown(ref) for ref in competing]))
        log.info("speech.held.mid_turn", competing=[ref.qualified_name for ref in competing])

    async def _carry_out(self, run: TurnRun, round_: int, segment: prose.Segment, prefix: str, log: Logger) -> Delivery | None:
        turn = run.turn
        action = segment.action
        if segment.again:
            run.again = True
        if action == "suppressed" or action == "kept":
            # A mode that never posts plain words: counted as it counts them.
            run.count_silent(action)
            log.info("speech.not_routed", why=run.mode.name, chars=len(segment.text))
            return None
        text = segment.text
        if run.finished and action == "deliver":
            # The turn ended (lease, host gone, superseded) while this round was being routed:
            # nothing more goes out; the words are kept as a draft (a {{unsent}} draft stays held).
            if not segment.unsent:
                draft = self._drafts.new(run, text, prose.REASON_NO_DESTINATION, target=segment.target, detail=f"turn-{turn.outcome}")
                log.info("speech.drafted", draft=draft.draft_id, reason=draft.reason, why="turn-ended", chars=len(text))
            return None
        unsent: Draft | None = None
        if segment.unsent:
            unsent = self._drafts.latest_bounced(turn.agent)
            if unsent is None or unsent.state != "held" or unsent.sending:
                run.notices.append(texts.unsent_unavailable(None if unsent is None else unsent.state))
                log.info("speech.unsent.refused", state=None if unsent is None else unsent.state)
                return None
            if action == "private":
                # ">>skip_reply {{unsent}}" sets the bounced draft aside.
                self._drafts.dismiss(unsent)
                run.private += 1
                return None
            text = prose.substitute_unsent(text, unsent.text)
        if action == "private":
            run.private += 1
            log.info("speech.private", chars=len(text))
            return None
        if action == "draft":
            draft = self._drafts.new(run, text, segment.reason or prose.REASON_NO_DESTINATION, target=segment.target)
            if unsent is not None:
                # The new draft holds the bounced draft's words: it replaces it (no duplicate).
                self._drafts.dismiss(unsent)
            log.info("speech.drafted", draft=draft.draft_id, reason=draft.reason, chars=len(text))
            return None
        if action == "bounce":
            self._bounce(run, text, segment.target, segment.why or texts.BOUNCE_NO_TARGET, segment.why_text,
                         segment.candidates, prefix, log, replaces=unsent)
            return None
        assert segment.ref is not None
        ref = segment.ref
        if unsent is not None:
            # Journaled before the publish, checked and set with no await between: a concurrent
            # resend of the same draft sees it being sent and is refused.
            fresh = self._drafts.draft(turn.agent, unsent.draft_id)
            if fresh is None or fresh.state != "held" or fresh.sending:
                run.notices.append(texts.unsent_unavailable(None if fresh is None else ("being sent" if fresh.sending else fresh.state)))
                log.info("speech.unsent.refused", state=None if fresh is None else fresh.state)
                return None
            unsent = fresh
            self._drafts.mark_sending(unsent, ref)
        if unsent is not None and not await self._drafts.recorded_before_sending(unsent, ref, round_):
            run.notices.append(texts.unsent_not_recorded())
            return None
        try:
            delivery = await self.publish(run, ref, text, round_)
        except BaseException:
            if unsent is not None:
                self._drafts.attempted(unsent, Delivery(ref, self._shown(ref), "unknown", round_, reason=texts.Reason.INTERRUPTED))
            raise
        turn.routing.record(delivery)
        if delivery.outcome != "failed" and not run.finished:
            # Decided words only: a chunk goes out once its delivery is known not to have
            # failed, so a stream (and its complete) carries only words that went out.
            await self._streams.chunk(run, ref, text)
        log.info(
            "speech.published",
            server=ref.server_id,
            channel=ref.channel_id,
            outcome=delivery.outcome,
            reason=delivery.reason,
            message_id=delivery.message_id,
        )
        if unsent is not None:
            self._drafts.attempted(unsent, delivery)
        if delivery.outcome == "delivered":
            self._bounce_streak[turn.agent] = 0
        elif delivery.outcome == "unknown":
            run.notices.append(texts.delivery_unknown(delivery.shown, ref.server_id, delivery.reason or texts.Reason.NO_RECEIPT))
        elif run.mode.bounces_failed_delivery or segment.pinned:
            # A failed >> or >>> delivery bounces; a failed >>> clears the pin and holds.
            if segment.pinned:
                run.prose = rounds.after_failed_pinned_delivery(run.prose)
                if turn.routing.sticky_target == ref:
                    turn.routing.sticky_target = None
            why = texts.bounce_why_not_delivered(delivery.shown, delivery.reason or texts.Reason.NOT_DELIVERED)
            if unsent is None:
                self._bounce(run, text, segment.target, texts.BOUNCE_NOT_DELIVERED, why, (), prefix, log)
            else:
                self._unsent_failed(run, delivery, unsent, prefix, log)
        elif unsent is not None:
            self._unsent_failed(run, delivery, unsent, prefix, log)
        else:
            run.notices.append(texts.delivery_failed(delivery.shown, ref.server_id, delivery.reason or texts.Reason.NOT_DELIVERED))
        return delivery

    def _unsent_failed(self, run: TurnRun, delivery: Delivery, draft: Draft, prefix: str, log: Logger) -> None:
        """A failed delivery of a bounced draft ({{unsent}}): say where and that it is still held."""
        turn = run.turn
        run.notices.append(texts.unsent_delivery_failed(
            delivery.shown, delivery.ref.server_id, delivery.reason or texts.Reason.NOT_DELIVERED, draft.draft_id, prefix))
        streak = self._bounce_streak.get(turn.agent, 0) + 1
        self._bounce_streak[turn.agent] = streak
        if streak <= prose.BOUNCE_WAKE_CAP:
            run.again = True
        log.info("speech.unsent.failed", draft=draft.draft_id, server=delivery.ref.server_id,
                 channel=delivery.ref.channel_id, reason=delivery.reason, streak=streak)

    # -- publishing --------------------------------------------------------------------------

    async def publish(self, run: TurnRun, ref: ChannelRef, text: str, round_: int | None = None) -> Delivery:
        """Publish ``text`` for ``run``'s turn to ``ref``, through ``ref``'s own server's session."""
        return await publish_text(
            self._servers,
            ref,
            self._shown(ref),
            text,
            conversation_id=run.turn.conversation_id,
            round_=run.turn.round if round_ is None else round_,
            decisions=self._router.names.decisions,
            via="speech",
            agent=run.turn.agent,
            registered=self._router.registry.is_registered(ref),
            timeout=self._timings.publish_timeout,
        )

    def longest_publish(self) -> float:
        """The longest a publish may take now (the bound on waiting for one at a turn's end)."""
        if self._timings.publish_timeout is not None:
            return self._timings.publish_timeout
        return max((session.request_timeout for session in self._servers.values()), default=PUBLISH_TIMEOUT)

    async def resend_draft(self, run: TurnRun, draft: Draft, ref: ChannelRef) -> Delivery:
        """Send ``draft`` to ``ref``: the attempt is journaled before the publish goes out.

        The caller checked ``draft`` (fresh from the journal) in the same task with no await
        since, so the check and the ``sending`` mark are one step. A send interrupted (the
        call cancelled) is recorded ``unknown``: the draft becomes unconfirmed, never stuck.
        """
        self._drafts.mark_sending(draft, ref)
        if not await self._drafts.recorded_before_sending(draft, ref, run.turn.round):
            return Delivery(ref, self._shown(ref), "failed", run.turn.round, reason=texts.Reason.NOT_RECORDED)
        try:
            delivery = await self.publish(run, ref, draft.text)
        except BaseException:
            self._drafts.attempted(draft, Delivery(ref, self._shown(ref), "unknown", run.turn.round, reason=texts.Reason.INTERRUPTED))
            raise
        # A failed attempt leaves the draft held (nothing arrived); see DraftBook.attempted.
        self._drafts.attempted(draft, delivery)
        return delivery

    def _bounce(
        self, run: TurnRun, text: str, target: str | None, why: str, why_text: str,
        candidates: Sequence[str], prefix: str, log: Logger, *, replaces: Draft | None = None,
    ) -> None:
        """Hold ``text`` as a bounced draft, with the notice. ``replaces``: the bounced draft
        ``{{unsent}}`` stood for; the new bounce takes its place instead of adding a copy (the
        same draft when the words are exactly its own, else a new one and the old dismissed)."""
        turn = run.turn
        if replaces is not None and replaces.text == text:
            draft = replaces
            draft.target, draft.detail = target, why
            self._drafts.save(draft)
            if draft.draft_id not in run.drafts:
                run.drafts.append(draft.draft_id)
        else:
            draft = self._drafts.new(run, text, prose.REASON_BOUNCED, target=target, detail=why)
            if replaces is not None:
                self._drafts.dismiss(replaces)
        example = prose.example_target(candidates, prefix, self._router.names, turn.routing.trigger)
        run.notices.append(texts.bounce(len(text), why_text, draft.draft_id, candidates, prefix=prefix, example_target=example))
        streak = self._bounce_streak.get(turn.agent, 0) + 1
        self._bounce_streak[turn.agent] = streak
        if streak <= prose.BOUNCE_WAKE_CAP:
            run.again = True
        log.info("speech.bounced", draft=draft.draft_id, why=why, chars=len(text), streak=streak)
        self._router.names.decisions.bounced(turn.agent, target, why, text)

