"""A round's plan from the core (issue 27 item 3): segments, pins, quiet and hold, and what
the agent is told, decided at once by ``rounds.plan_round`` from the facts, without a process
and without editing the turn's state. Servers ``a`` and ``b`` both register ``general``."""

from __future__ import annotations

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpl_router.routing import prose, rounds, texts
from mcpl_router.routing.modes import MODE_NAMES, mode_named
from mcpl_router.routing.names import ChannelNames
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import ChannelRegistry, RegistrationPolicy
from mcpl_router.testing.descriptors import channel_descriptor

A_GENERAL = ChannelRef("a", "general")
B_GENERAL = ChannelRef("b", "general")
B_RANDOM = ChannelRef("b", "random")
CHANNELS = (A_GENERAL, B_GENERAL, B_RANDOM)


def names_of(order: tuple[str, str] = ("a", "b")) -> ChannelNames:
    registry = ChannelRegistry()
    for server in order:
        for channel_id in (["general", "random"] if server == "b" else ["general"]):
            assert registry.register(server, [channel_descriptor(channel_id)], RegistrationPolicy.permissive())[0].accepted
    return ChannelNames(registry)


def plan(mode: str, text: str, state: prose.ProseState, names: ChannelNames, *, locus: ChannelRef | None = B_GENERAL,
         pin_then: ChannelRef | None = None, pin_now: ChannelRef | None = None, targets: tuple[int, int, int] = (0, 0, 0),
         silenced: bool = False) -> rounds.RoundPlan:
    then, now, seen = targets
    facts = rounds.RoundFacts(text, state, locus, pin_then, pin_now, then, now, seen, silenced=silenced)
    return rounds.plan_round(mode_named(mode), facts, resolve=lambda token: prose.resolve_target(token, names, None),
                             shown=names.name_shown)


def test_a_hybrid_pin_moves_the_sticky_target_and_tells_the_agent() -> None:
    names = names_of()
    made = plan("hybrid", ">>> b:random hello", prose.ProseState(), names)
    assert [(s.action, s.ref) for s in made.segments] == [("deliver", B_RANDOM)]
    assert made.prose.pin == B_RANDOM and made.sets_sticky and made.sticky_target == B_RANDOM
    assert made.notices == (texts.speech_lands_in(names.name_shown(B_RANDOM)),)


def test_a_channel_open_after_the_words_were_written_keeps_the_sticky_target() -> None:
    made = plan("hybrid", ">>> b:random hello", prose.ProseState(), names_of(), targets=(0, 1, 0))
    assert not made.sets_sticky and made.notices == ()


def test_a_speech_target_set_since_lifts_quiet_and_hold_before_the_words_are_read() -> None:
    held = prose.ProseState(quiet=True, hold=True)
    made = plan("hybrid", "plain words", held, names_of(), targets=(1, 1, 0))
    assert (made.started.quiet, made.started.hold, made.targets_seen) == (False, False, 1)
    assert [(s.action, s.ref) for s in made.segments] == [("deliver", B_GENERAL)]
    assert rounds.round_end_notices(mode_named("hybrid"), made.started, made.prose) == ()


def test_skip_reply_in_hybrid_makes_later_words_private_and_says_so_at_the_round_end() -> None:
    made = plan("hybrid", ">>>skip_reply", prose.ProseState(), names_of())
    assert made.prose.quiet
    assert rounds.round_end_notices(mode_named("hybrid"), made.started, made.prose) == (texts.SPEECH_PRIVATE_UNTIL_TARGET,)


def test_a_failed_pinned_delivery_clears_the_pin_and_holds() -> None:
    after = rounds.after_failed_pinned_delivery(prose.ProseState(pin=B_RANDOM))
    assert (after.pin, after.hold) == (None, True)
    assert rounds.round_end_notices(mode_named("hybrid"), prose.ProseState(pin=B_RANDOM), after) == (texts.SPEECH_HELD_UNTIL_TARGET,)


# ---------------------------------------------------------------------- properties

TOKENS = st.sampled_from(["general", "a:general", "b:general", "b:random", "random", "nowhere", "skip_reply", ""])
LINES = st.one_of(
    st.sampled_from(["hello", "more words", "", "{{unsent}}"]),
    st.builds(lambda prefix, token, body: f"{prefix}{token} {body}", st.sampled_from([">>", ">>>"]), TOKENS,
              st.sampled_from(["hi", "there", ""])),
)
STATES = st.builds(prose.ProseState, pin=st.sampled_from([None, *CHANNELS]), quiet=st.booleans(), hold=st.booleans(),
                   all_private=st.booleans())
REFS = st.sampled_from([None, *CHANNELS])


@settings(max_examples=300, deadline=None)
@given(mode=st.sampled_from(MODE_NAMES), lines=st.lists(LINES, max_size=6), state=STATES, locus=REFS, pin_then=REFS,
       pin_now=REFS, targets=st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)), silenced=st.booleans(),
       order=st.sampled_from([("a", "b"), ("b", "a")]))
def test_a_round_plan_is_pure_and_every_delivery_is_to_a_registered_channel_it_names_alone(
    mode: str, lines: list[str], state: prose.ProseState, locus: ChannelRef | None, pin_then: ChannelRef | None,
    pin_now: ChannelRef | None, targets: tuple[int, int, int], silenced: bool, order: tuple[str, str],
) -> None:
    names = names_of(order)
    text = "\n".join(lines)
    before = attrs.evolve(state)
    first = plan(mode, text, state, names, locus=locus, pin_then=pin_then, pin_now=pin_now, targets=targets, silenced=silenced)
    # Pure: the turn's state is read, not edited; the same facts give the same plan.
    assert state == before
    again = plan(mode, text, state, names, locus=locus, pin_then=pin_then, pin_now=pin_now, targets=targets, silenced=silenced)
    assert again == first
    for segment in first.segments:
        if segment.action != "deliver":
            continue
        assert segment.ref is not None and names.registry.is_registered(segment.ref)
        # Delivered along a named target: that name picks this channel alone (a bare
        # "general", on two servers, never picks one).
        if segment.target:
            resolved = prose.resolve_target(segment.target, names, None)
            assert resolved.ref == segment.ref
        elif segment.pinned:
            assert segment.ref in (pin_then, first.prose.pin)
        else:
            # Untargeted words go to the locus, or along the pin they were written under.
            assert segment.ref in (locus, pin_then if mode_named(mode).keeps_pins else None)
    if first.sets_sticky:
        assert mode_named(mode).keeps_pins and first.sticky_target == first.prose.pin
    if not mode_named(mode).tells_pin_changes:
        assert first.notices == ()
