"""What a prose mode decides about a round beyond its segments: the invitation an agent reads
for a closed channel, and whether mid-turn arrivals hold an inferred route.

Pure, like :mod:`mcpl_router.routing.prose` (the grammar) and :mod:`mcpl_router.routing.modes`
(the modes that read it): this module sits above both, asking the agent's mode its questions
with the grammar's answers, so neither of them needs the other's faces.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
import attrs

from mcpl_router.routing import texts
from mcpl_router.routing.modes import ProseMode
from mcpl_router.routing.names import ChannelNames
from mcpl_router.routing.prose import ProseState, Resolve, Segment, target_token
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.turns import TurnRouting

__all__ = ["Arrival", "RoundFacts", "RoundPlan", "after_failed_pinned_delivery", "hold_for_arrivals", "invitation_text",
           "plan_round", "round_end_notices"]


def invitation_text(
    mode: ProseMode,
    names: ChannelNames,
    ref: ChannelRef,
    author: str | None,
    *,
    may_publish: bool,
) -> str:
    """The closed-channel invitation for an agent in ``mode`` addressed in ``ref``.

    The first option reaches that channel alone in the agent's mode
    (:meth:`ProseMode.invitation_reply <mcpl_router.routing.modes.ProseMode.invitation_reply>`):
    a ``>>``/``>>>`` line with :func:`target_token`'s token, the turn's plain text, a
    ``channel_publish`` call with the name that picks it alone (a ``channelId`` is no target
    line, so ``skip_reply`` or a name with a space is fine there), or a note that no name does
    (then: a server's send tool).
    """
    reply = mode.invitation_reply(names.pick_name(ref), token=target_token(names, ref), may_publish=may_publish)
    return texts.invitation(author, names.name_shown(ref), reply, channel_id=ref.channel_id, server_id=ref.server_id)


@attrs.frozen
class Arrival:
    """A message that arrived for the agent while its turn was open."""

    ref: ChannelRef | None
    thread_id: str | None
    addressed: bool
    conversational: bool = True


def hold_for_arrivals(
    mode: ProseMode, routing: TurnRouting, state: ProseState, arrivals: Sequence[Arrival], *, deliberate: bool
) -> tuple[ChannelRef, ...]:
    """Whether mid-turn arrivals hold an inferred route (PROSE: mid-turn hold).

    A message from a *different* conversation that addresses the agent, or continues one the
    agent sent into this turn, holds an inferred locus for the rest of the turn. Deliberate
    routes (a ``channel_open``, a ``>>>`` pin) and same-conversation arrivals change nothing.

    Returns:
        The competing channels (the old locus first) when the route becomes held, else ``()``.
    """
    locus = routing.locus
    if not mode.infers_locus or locus is None or deliberate or state.pin is not None:
        return ()
    others = [
        arrival.ref
        for arrival in arrivals
        if arrival.ref is not None
        and arrival.conversational
        and arrival.ref != locus
        and (arrival.addressed or arrival.ref in routing.engaged)
    ]
    if not others:
        return ()
    return tuple(dict.fromkeys([locus, *others]))


# ---------------------------------------------------------------------- a round's plan


@attrs.frozen
class RoundFacts:
    """What a round's routing is decided from: its words and the turn's routing as it was when
    they were written (``*_then``) and is now.

    ``targets_*`` count the ``channel_open`` calls that set a speech target: a count, not a
    moved locus, since a continuation or an arrival moves an inferred locus too.
    """

    text: str
    prose: ProseState
    locus: ChannelRef | None
    pin_then: ChannelRef | None
    pin_now: ChannelRef | None
    targets_then: int
    targets_now: int
    targets_seen: int
    silenced: bool = False


@attrs.frozen
class RoundPlan:
    """Where a round's words go and what the turn's prose state becomes, decided at once.

    ``started`` is the prose state the words were read in (after a speech target set since
    lifted quiet and hold); ``prose`` the state after reading them; ``sticky_target`` the
    turn's new sticky target when ``sets_sticky``; ``notices`` what the agent is told before
    the words are carried out (where its speech now lands).
    """

    segments: tuple[Segment, ...]
    started: ProseState
    prose: ProseState
    targets_seen: int
    sets_sticky: bool = False
    sticky_target: ChannelRef | None = None
    notices: tuple[str, ...] = ()


def plan_round(mode: ProseMode, facts: RoundFacts, *, resolve: Resolve, shown: Callable[[ChannelRef], str]) -> RoundPlan:
    """Decide a round: its segments, pins, quiet and hold, and what the agent is told. Pure:
    ``facts.prose`` is read, never edited (the shell installs ``plan.prose``)."""
    # The words go along the pin in force when they were written.
    state = facts.prose.with_pin(facts.pin_then if mode.keeps_pins else None)
    targets_seen = facts.targets_seen
    if facts.targets_then != facts.targets_seen:
        # A channel_open that set the speech target before these words were written
        # supersedes a >>>skip_reply or a failed >>>.
        state.quiet = state.hold = False
        targets_seen = facts.targets_then
    started = state.with_pin(state.pin)
    segments = mode.segments(facts.text, state, locus=facts.locus, resolve=resolve, silenced=facts.silenced)
    sets_sticky, sticky = False, None
    notices: list[str] = []
    if mode.keeps_pins:
        # A channel_open that landed after these words were written wins for later words, and
        # so does a pin withdrawn meanwhile.
        moved = facts.targets_now != facts.targets_then or facts.pin_now != facts.pin_then
        if not moved:
            if mode.tells_pin_changes and state.pin != facts.pin_then and state.pin is not None:
                notices.append(texts.speech_lands_in(shown(state.pin)))
            sets_sticky, sticky = True, state.pin
    return RoundPlan(tuple(segments), started, state, targets_seen, sets_sticky, sticky, tuple(notices))


def round_end_notices(mode: ProseMode, started: ProseState, ended: ProseState) -> tuple[str, ...]:
    """What the agent is told once a round's words are carried out: its later words are now
    private, or held, until it names a target (modes that tell pin changes)."""
    if not mode.tells_pin_changes:
        return ()
    notices = []
    if ended.quiet and not started.quiet:
        notices.append(texts.SPEECH_PRIVATE_UNTIL_TARGET)
    if ended.hold and not started.hold:
        notices.append(texts.SPEECH_HELD_UNTIL_TARGET)
    return tuple(notices)


def after_failed_pinned_delivery(state: ProseState) -> ProseState:
    """A failed delivery along a ``>>>`` pin clears the pin and holds later words."""
    return attrs.evolve(state, pin=None, hold=True)
