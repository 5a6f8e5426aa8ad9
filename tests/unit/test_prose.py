"""Prose routing's pure core: the envelope grammar, targets, the locus, per-mode decisions.

Servers ``a`` and ``b`` both register ``general`` (in both registration orders): a decision
never takes "the first registered".
"""

from __future__ import annotations

import random

import attrs
import pytest

from mcpl_router.routing import prose, rounds, texts
from mcpl_router.routing.desired import DesiredChannels
from mcpl_router.routing.drafts import Draft, new_draft_id, page
from mcpl_router.routing.modes import mode_named
from mcpl_router.routing.names import ChannelNames
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import ChannelRegistry, RegistrationPolicy
from mcpl_router.routing.router import Router
from mcpl_router.routing.turns import TurnRouting, WakeFact
from mcpl_router.routing.wakes import Wake
from mcpl_router.testing.descriptors import channel_descriptor
from mcpl_router.testing.journal import open_journal
from mcpl_router.turns.invitations import Invitations

FULL = RegistrationPolicy.permissive()
A_GENERAL = ChannelRef("a", "general")
B_GENERAL = ChannelRef("b", "general")
B_RANDOM = ChannelRef("b", "random")


@pytest.fixture(params=[("a", "b"), ("b", "a")], ids=["a-first", "b-first"])
def names(request: pytest.FixtureRequest) -> ChannelNames:
    registry = ChannelRegistry()
    for server in request.param:
        ids = ["general", "random"] if server == "b" else ["general"]
        for channel_id in ids:
            assert registry.register(server, [channel_descriptor(channel_id)], FULL)[0].accepted
    return ChannelNames(registry)


# ---------------------------------------------------------------------- grammar


def test_explicit_envelopes_split_on_prefix_lines_and_keep_text_before_the_first() -> None:
    text = "preface\n>>general hello\nmore\n  >>b:general ! again\n>> not a prefix\n>>skip_reply"
    assert prose.split_envelopes(text, prose.EXPLICIT) == [
        prose.Envelope(None, "preface"),
        prose.Envelope("general", "hello\nmore"),
        prose.Envelope("b:general", "again\n>> not a prefix", again=True),
        prose.Envelope("skip_reply", ""),
    ]


def test_a_target_followed_by_bang_without_space_is_not_again() -> None:
    [envelope] = prose.split_envelopes(">>general !x", prose.EXPLICIT)
    assert envelope == prose.Envelope("general", "!x")


def test_hybrid_envelopes_allow_space_after_the_prefix_and_a_missing_target() -> None:
    assert prose.split_envelopes("hi\n>>> b:general there\n>>>\nlost", prose.PIN) == [
        prose.Envelope(None, "hi"),
        prose.Envelope("b:general", "there"),
        prose.Envelope("", "lost"),
    ]
    # ">>" lines are plain text in hybrid mode.
    assert prose.split_envelopes(">>general hi", prose.PIN) == [prose.Envelope(None, ">>general hi")]


def test_unsent_substitution() -> None:
    assert prose.substitute_unsent("say: {{unsent}}", "hello") == "say: hello"


# ---------------------------------------------------------------------- targets


def test_a_shared_id_is_ambiguous_with_one_token_per_candidate(names: ChannelNames) -> None:
    target = prose.resolve_target("general", names, None)
    assert target.why == texts.BOUNCE_AMBIGUOUS_TARGET
    assert sorted(target.candidates) == [">>a:general", ">>b:general"]
    assert prose.resolve_target("b:general", names, None).ref == B_GENERAL
    assert prose.resolve_target("random", names, None).ref == B_RANDOM
    assert prose.resolve_target("nowhere", names, None).why == texts.BOUNCE_UNKNOWN_TARGET
    assert prose.resolve_target("skip_reply", names, None).skip


def test_the_turns_own_channel_comes_first(names: ChannelNames) -> None:
    routing = TurnRouting.starting_at(B_GENERAL)
    assert prose.resolve_target("general", names, routing).ref == B_GENERAL
    routing = TurnRouting.starting_at(A_GENERAL)
    assert prose.resolve_target("general", names, routing).ref == A_GENERAL


def test_a_channel_that_takes_no_posts_is_refused(names: ChannelNames) -> None:
    target = prose.resolve_target("random", names, None, takes_posts=lambda ref: ref != B_RANDOM)
    assert target.ref is None and target.why == texts.BOUNCE_TAKES_NO_POSTS


# ---------------------------------------------------------------------- locus


def test_locus_prefers_addressed_and_holds_competing_conversations() -> None:
    assert prose.locus_of([]) == prose.LocusChoice(None)
    one = [WakeFact(1, A_GENERAL), WakeFact(2, B_GENERAL, addressed=True)]
    assert prose.locus_of(one) == prose.LocusChoice(B_GENERAL)
    two = [WakeFact(1, A_GENERAL, addressed=True), WakeFact(2, B_GENERAL, addressed=True)]
    choice = prose.locus_of(two)
    assert choice.ref is None and choice.held and set(choice.competing) == {A_GENERAL, B_GENERAL}
    assert prose.locus_of([WakeFact(1, None)]) == prose.LocusChoice(None)


# ---------------------------------------------------------------------- decisions


def decide(mode: str, text: str, state: prose.ProseState, names: ChannelNames, *, locus: ChannelRef | None = B_GENERAL,
           silenced: bool = False) -> list[prose.Segment]:
    routing = TurnRouting.starting_at(locus)
    return mode_named(mode).segments(text, state, locus=locus, silenced=silenced,
                        resolve=lambda token: prose.resolve_target(token, names, routing))


@pytest.mark.parametrize("mode, action", [("disabled", "suppressed"), ("named", "kept")])
def test_disabled_and_named_never_deliver_prefixes_included(mode: str, action: str, names: ChannelNames) -> None:
    for text in ("hello", ">>b:general hi", ">>> b:general hi"):
        [segment] = decide(mode, text, prose.ProseState(), names)
        assert segment.action == action and segment.ref is None


def test_locus_delivers_to_the_locus_drafts_without_one_and_when_silenced(names: ChannelNames) -> None:
    [seg] = decide("locus", "hi", prose.ProseState(), names)
    assert (seg.action, seg.ref) == ("deliver", B_GENERAL)
    [seg] = decide("locus", "hi", prose.ProseState(), names, locus=None)
    assert (seg.action, seg.reason) == ("draft", prose.REASON_NO_DESTINATION)
    [seg] = decide("locus", "hi", prose.ProseState(held_reason=prose.REASON_AMBIGUOUS), names, locus=None)
    assert seg.reason == prose.REASON_AMBIGUOUS
    [seg] = decide("locus", "hi", prose.ProseState(), names, silenced=True)
    assert (seg.action, seg.reason) == ("draft", prose.REASON_EXPLICIT_SEND)


def test_explicit_first_valid_target_sticks_and_untargeted_text_bounces(names: ChannelNames) -> None:
    state = prose.ProseState()
    [bounced] = decide("explicit", "no target", state, names, locus=None)
    assert bounced.action == "bounce" and bounced.why == texts.BOUNCE_NO_TARGET
    segments = decide("explicit", ">>a:general one\n>>random two\nstill two", state, names, locus=None)
    assert [(s.action, s.ref, s.text) for s in segments] == [("deliver", A_GENERAL, "one"), ("deliver", B_RANDOM, "two\nstill two")]
    assert state.pin == A_GENERAL
    [seg] = decide("explicit", "three", state, names, locus=None)
    assert (seg.action, seg.ref) == ("deliver", A_GENERAL)
    # Explicit mode ignores send-silencing.
    [seg] = decide("explicit", "four", state, names, locus=None, silenced=True)
    assert seg.action == "deliver"


def test_explicit_ambiguous_target_bounces_with_candidates_and_skip_reply_is_private(names: ChannelNames) -> None:
    segments = decide("explicit", ">>general hi\n>>skip_reply secret\n>>b:general ! {{unsent}}", prose.ProseState(), names, locus=None)
    assert [s.action for s in segments] == ["bounce", "private", "deliver"]
    assert sorted(segments[0].candidates) == [">>a:general", ">>b:general"]
    assert segments[2].unsent and segments[2].again


def test_hybrid_pin_beats_locus_skip_makes_private_and_failure_holds(names: ChannelNames) -> None:
    state = prose.ProseState()
    segments = decide("hybrid", "to locus\n>>> a:general pinned\nstill pinned envelope", state, names)
    assert [(s.action, s.ref) for s in segments] == [("deliver", B_GENERAL), ("deliver", A_GENERAL)]
    [seg] = decide("hybrid", "follows pin", state, names)
    assert (seg.action, seg.ref) == ("deliver", A_GENERAL)
    assert [s.action for s in decide("hybrid", ">>>skip_reply", state, names)] == [] and state.pin is None
    assert [s.action for s in decide("hybrid", "quiet", state, names)] == ["private"]
    assert [(s.action, s.reason) for s in decide("hybrid", ">>> nowhere lost", state, names)] == [("bounce", prose.REASON_BOUNCED)]
    assert [(s.action, s.reason) for s in decide("hybrid", "held", state, names)] == [("draft", prose.REASON_NO_DESTINATION)]
    assert [(s.action, s.ref) for s in decide("hybrid", ">>> random back", state, names)] == [("deliver", B_RANDOM)]
    assert [(s.action, s.ref) for s in decide("hybrid", "again", state, names)] == [("deliver", B_RANDOM)]


def test_hybrid_silenced_round_drafts_but_still_moves_the_pin(names: ChannelNames) -> None:
    state = prose.ProseState()
    [seg] = decide("hybrid", ">>> random words", state, names, silenced=True)
    assert (seg.action, seg.reason, seg.target) == ("draft", prose.REASON_EXPLICIT_SEND, "random")
    assert state.pin == B_RANDOM


def test_hybrid_unsent_stands_for_the_bounced_draft_and_the_advice_uses_the_hybrid_prefix(names: ChannelNames) -> None:
    state = prose.ProseState()
    [seg] = decide("hybrid", ">>> b:general {{unsent}}", state, names)
    assert (seg.action, seg.ref, seg.unsent) == ("deliver", B_GENERAL, True)
    [seg] = decide("hybrid", "after {{unsent}}", state, names)  # along the pin
    assert (seg.action, seg.unsent) == ("deliver", True)
    [seg] = decide("hybrid", ">>>skip_reply {{unsent}}", state, names)
    assert (seg.action, seg.unsent) == ("private", True)  # the shell dismisses the draft
    state = prose.ProseState()
    [seg] = decide("hybrid", ">>> nowhere {{unsent}}", state, names)
    assert (seg.action, seg.unsent) == ("bounce", True)
    # With no >>> in force, unprefixed text is read as in locus mode.
    [seg] = decide("hybrid", "{{unsent}}", state, names)
    assert (seg.action, seg.reason, seg.unsent) == ("draft", prose.REASON_NO_DESTINATION, False)
    [seg] = decide("hybrid", "{{unsent}}", prose.ProseState(), names)
    assert (seg.action, seg.ref, seg.unsent) == ("deliver", B_GENERAL, False)
    # Exactly {{unsent}} held again by a send is that draft, already held: nothing new.
    state = prose.ProseState()
    assert decide("hybrid", ">>> random {{unsent}}", state, names, silenced=True) == [] and state.pin == B_RANDOM
    assert decide("hybrid", "{{unsent}}", state, names, silenced=True) == []
    [seg] = decide("hybrid", "more {{unsent}}", state, names, silenced=True)
    assert (seg.action, seg.reason, seg.unsent) == ("draft", prose.REASON_EXPLICIT_SEND, True)
    advice = texts.bounce(5, "why.", "d-abcde", (), prefix=prose.PIN, example_target="b:general")
    assert ">>>b:general {{unsent}}" in advice and ">>>skip_reply {{unsent}}" in advice
    assert ">>skip_reply" not in advice.replace(">>>skip_reply", "")
    assert "To set them aside, write >>skip_reply {{unsent}}." in texts.bounce(5, "why.", "d-abcde", ())


def test_skip_reply_makes_everything_private(names: ChannelNames) -> None:
    state = prose.ProseState(all_private=True)
    for mode in ("locus", "hybrid", "explicit"):
        assert [s.action for s in decide(mode, ">>b:general hi", state, names)] == ["private"]


# ---------------------------------------------------------------------- drafts


def test_draft_ids_and_rows_round_trip() -> None:
    draft_id = new_draft_id(lambda candidate: False, random.Random(1))
    assert draft_id.startswith("d-") and len(draft_id) == 7
    draft = Draft(draft_id, "ann", "words " * 30, prose.REASON_BOUNCED, 10.0, target="general")
    assert Draft.from_row(draft.row()) == draft
    assert draft.preview().endswith("…") and len(draft.preview()) == 60
    drafts = [Draft(f"d-{i:05d}", "ann", "x", "bounced", float(i)) for i in range(12)]
    assert [d.draft_id for d in page(drafts, 2)] == ["d-00001", "d-00000"]


def test_receipt_wording() -> None:
    assert texts.prose_receipt(["b:general", "b:general", "a:general"], []) == "[delivered] plain speech → b:general · a:general"
    assert texts.prose_receipt([], [texts.note_named(2)]).startswith("[delivered] nothing — 2 plain-speech segment(s) kept in your context, sent to no one")


async def test_drafts_survive_reopening_the_journal(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "journal.sqlite3"
    draft = Draft("d-abcde", "ann", "kept", prose.REASON_NO_DESTINATION, 1.0)
    async with open_journal(path) as journal:
        journal.save_draft(draft.row())
    async with open_journal(path) as reopened:
        assert [Draft.from_row(row) for row in reopened.drafts_of("ann")] == [draft]


# ---------------------------------------------------------------------- invitation, mid-turn hold


def test_invitation_reply_reaches_that_channel_alone_per_mode(names: ChannelNames) -> None:
    text = rounds.invitation_text(mode_named("explicit"), names, B_GENERAL, "Dee", may_publish=True)
    assert "1. Reply without joining: begin a line with >>b:general" in text and text.startswith("[channels] Dee addressed you in b:general")
    assert "begin a line with >>> random" in rounds.invitation_text(mode_named("hybrid"), names, B_RANDOM, None, may_publish=True)
    assert 'channel_publish with channelId "b:general"' in rounds.invitation_text(mode_named("named"), names, B_GENERAL, None, may_publish=True)
    assert texts.INVITATION_REPLY_SEND_TOOL in rounds.invitation_text(mode_named("named"), names, B_GENERAL, None, may_publish=False)
    assert texts.INVITATION_REPLY_NONE in rounds.invitation_text(mode_named("disabled"), names, B_GENERAL, None, may_publish=False)


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")], ids=["a-first", "b-first"])
def test_the_invitation_asks_whether_the_agent_has_the_channel_open_not_the_transport(order: tuple[str, str]) -> None:
    """kai opened a:general (its transport is open for everyone): kai is not invited there, mo
    is, and kai is still invited to b:general, the other server's channel with that id."""
    router = Router()
    for server in order:
        assert router.registry.register(server, [channel_descriptor("general")], FULL)[0].accepted
    desired = DesiredChannels()
    invitations = Invitations(router, lambda agent, ref: desired.has_open(agent, ref, router.registry.get(ref)))
    locus = mode_named("locus")

    def invited(agent: str, ref: ChannelRef) -> str | None:
        wake = Wake(seq=1, agent=agent, reason="message", channel=ref, payload={"author": {"name": "Dee"}}, tags=(), addressed=True)
        return invitations.invitation_for(wake, locus, may_publish=True)

    assert invited("kai", A_GENERAL) is not None and invited("mo", A_GENERAL) is not None
    # kai's channel_open: the transport opens (for everyone) and kai decides "open".
    router.registry.set_open(A_GENERAL, True)
    desired.decide("kai", A_GENERAL, "open")
    assert invited("kai", A_GENERAL) is None
    text = invited("mo", A_GENERAL)
    assert text is not None and text.startswith("[channels] Dee addressed you in a:general")
    b_text = invited("kai", B_GENERAL)
    assert b_text is not None and 'channel_open with channelId "general" and serverId "b"' in b_text
    # Cached per registry change, yet decided per agent and per decision: kai closing it in his
    # own mind (a decline) invites him again at once, with no registry change between.
    desired.decide("kai", A_GENERAL, "declined")
    assert invited("kai", A_GENERAL) == text
    desired.decide("kai", A_GENERAL, "open")
    assert invited("kai", A_GENERAL) is None
    # Registered open by its server, a channel is every undecided agent's; one that decided
    # "closed" is still invited there.
    assert router.registry.register("a", [{**channel_descriptor("lounge"), "initiallyOpen": True}], FULL)[0].accepted
    lounge = ChannelRef("a", "lounge")
    assert invited("mo", lounge) is None
    desired.decide("mo", lounge, "closed")
    assert invited("mo", lounge) is not None
    # A conversation fork is in its home: never invited there.
    assert desired.has_open("kai-a-general-1", B_GENERAL, router.registry.get(B_GENERAL), home=B_GENERAL)
    assert not desired.has_open("kai-a-general-1", A_GENERAL, router.registry.get(A_GENERAL), home=B_GENERAL)


def test_mid_turn_hold_only_for_an_inferred_route_and_another_addressed_conversation() -> None:
    routing = TurnRouting.starting_at(B_GENERAL)
    state = prose.ProseState()
    elsewhere = rounds.Arrival(A_GENERAL, None, addressed=True)
    assert rounds.hold_for_arrivals(mode_named("locus"), routing, state, [rounds.Arrival(B_GENERAL, None, True)], deliberate=False) == ()
    assert rounds.hold_for_arrivals(mode_named("locus"), routing, state, [rounds.Arrival(A_GENERAL, None, False)], deliberate=False) == ()
    assert rounds.hold_for_arrivals(mode_named("locus"), routing, state, [elsewhere], deliberate=True) == ()
    assert rounds.hold_for_arrivals(mode_named("explicit"), routing, state, [elsewhere], deliberate=False) == ()
    assert rounds.hold_for_arrivals(mode_named("hybrid"), routing, prose.ProseState(pin=B_RANDOM), [elsewhere], deliberate=False) == ()
    assert rounds.hold_for_arrivals(mode_named("locus"), routing, state, [elsewhere], deliberate=False) == (B_GENERAL, A_GENERAL)
    routing.engage(A_GENERAL)
    ambient = rounds.Arrival(A_GENERAL, None, addressed=False)
    assert rounds.hold_for_arrivals(mode_named("locus"), routing, state, [ambient], deliberate=False) == (B_GENERAL, A_GENERAL)


@pytest.mark.parametrize("first", ["a", "b"])
def test_an_at_id_target_two_servers_dms_answer_to_is_refused_with_both(first: str) -> None:
    # Seed 000: "a <@id> mention that one person's DMs on both servers answer to is refused as
    # matching no DM". It is refused as ambiguous, naming each DM by a token that picks it.
    registry = ChannelRegistry()
    second = "b" if first == "a" else "a"
    for server_id in (first, second):
        registry.register(
            server_id,
            [{"id": f"dm:{server_id}-robin", "type": "dm", "label": "Robin", "address": {"userId": "123"}}],
            RegistrationPolicy.permissive(),
        )
    names = ChannelNames(registry)
    target = prose.resolve_target("<@123>", names, None)
    assert target.ref is None and target.why == texts.BOUNCE_AMBIGUOUS_TARGET
    assert sorted(target.candidates) == [">>dm:a-robin", ">>dm:b-robin"]
    registry.withdraw(first, [f"dm:{first}-robin"])
    assert prose.resolve_target("<@123>", names, None).ref == ChannelRef(second, f"dm:{second}-robin")
    assert prose.resolve_target("<@999>", names, None).why == texts.BOUNCE_UNKNOWN_TARGET


async def test_a_draft_left_sending_by_a_stopped_daemon_is_unconfirmed_at_the_next_open(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from mcpl_router.routing.drafts import Attempt

    path = tmp_path / "journal.sqlite3"
    cut_off = Draft("d-abcde", "ann", "cut off", prose.REASON_NO_DESTINATION, 1.0,
                    attempts=[Attempt("b", "general", "b:general", 2.0, "sending")])
    untouched = Draft("d-fghjk", "ann", "untouched", prose.REASON_NO_DESTINATION, 3.0)
    async with open_journal(path) as journal:
        journal.save_draft(cut_off.row())
        journal.save_draft(untouched.row())
    async with open_journal(path) as reopened:
        settled, kept = (Draft.from_row(row) for row in reopened.drafts_of("ann"))
    assert not settled.sending and settled.state == "unconfirmed"
    assert [(a.outcome, a.reason) for a in settled.attempts] == [("unknown", texts.Reason.INTERRUPTED)]
    assert kept == untouched


def _resend_target(names: ChannelNames, ref: ChannelRef, prefix: str = prose.EXPLICIT) -> str | None:
    """The target a bounce's resend example names, read back from its text as a line reads it."""
    example = prose.example_target((), prefix, names, ref)
    advice = texts.bounce(5, "why.", "d-abcde", (), prefix=prefix, example_target=example)
    [resend] = [line for line in advice.split("\n") if line.startswith("To send them")]
    line = resend.removeprefix("To send them, write a line ").split(" (the draft")[0]
    return prose.split_envelopes(line, prefix)[0].target


def test_a_bounce_example_is_one_target_token_that_is_not_skip_reply_and_falls_back_to_the_qualified_name() -> None:
    """A resend example must say "send it there": never ``skip_reply`` (which dismisses the
    draft), never a name with a space (which would parse as another target). A channel whose id
    is ``skip_reply`` is still reached alone by ``a:skip_reply``, so that is offered (seed 000:
    the qualified name is tried last, for a channel whose id isn't a target); a channel whose
    every name has a space gets the placeholder."""
    registry = ChannelRegistry()
    for channel_id in ("skip_reply", "my room", "lounge"):
        assert registry.register("a", [channel_descriptor(channel_id)], FULL)[0].accepted
    names = ChannelNames(registry)
    skip, room, lounge = ChannelRef("a", "skip_reply"), ChannelRef("a", "my room"), ChannelRef("a", "lounge")
    assert [prose.target_token(names, ref) for ref in (skip, room, lounge)] == ["a:skip_reply", None, "lounge"]
    assert prose.candidate_tokens(names, [skip, room, lounge], prose.EXPLICIT) == (">>a:skip_reply", ">>lounge")
    assert prose.candidate_tokens(names, [skip, room, lounge], prose.PIN) == (">>>a:skip_reply", ">>>lounge")
    assert prose.example_target((), prose.EXPLICIT, names, skip) == "a:skip_reply"
    assert prose.example_target((), prose.EXPLICIT, names, room) == "<channel>"
    assert prose.example_target((), prose.EXPLICIT, names, lounge) == "lounge"
    assert prose.example_target((), prose.EXPLICIT, names, None) == "<channel>"
    # The first candidate still wins over the trigger.
    assert prose.example_target((">>lounge",), prose.EXPLICIT, names, skip) == "lounge"
    # Read back from the bounce's text, the example's line is a target the resolver takes to
    # that channel, in both prefixes; the placeholder is no channel.
    for prefix in (prose.EXPLICIT, prose.PIN):
        assert _resend_target(names, skip, prefix) == "a:skip_reply"
        assert prose.resolve_target("a:skip_reply", names, None, prefix=prefix).ref == skip
        assert _resend_target(names, room, prefix) == "<channel>"
    assert prose.resolve_target("skip_reply", names, None).skip  # the id itself is private speech


def test_the_invitation_reply_reaches_a_skip_reply_channel_by_its_qualified_name() -> None:
    """On main's rule the explicit and hybrid invitations said no name reaches a channel whose
    id is ``skip_reply``, though ``>>a:skip_reply`` resolves to it."""
    registry = ChannelRegistry()
    for channel_id in ("skip_reply", "my room"):
        assert registry.register("a", [channel_descriptor(channel_id)], FULL)[0].accepted
    names = ChannelNames(registry)
    skip, room = ChannelRef("a", "skip_reply"), ChannelRef("a", "my room")

    def reply(mode: str, ref: ChannelRef, *, may_publish: bool = True) -> str:
        text = rounds.invitation_text(mode_named(mode), names, ref, "Dee", may_publish=may_publish)
        return next(line for line in text.split("\n") if line.startswith("1. "))

    assert reply("explicit", skip) == "1. Reply without joining: " + texts.invitation_reply_prefix(">>a:skip_reply")
    assert reply("hybrid", skip) == "1. Reply without joining: " + texts.invitation_reply_prefix(">>> a:skip_reply")
    # A channelId is no target line: there the id picks it alone, as before.
    assert reply("named", skip) == "1. Reply without joining: " + texts.invitation_reply_publish("skip_reply")
    assert reply("locus", skip) == "1. Reply without joining: " + texts.invitation_reply_locus()
    # An id with a space: its qualified name has the space too, so no line reaches it.
    for mode in ("explicit", "hybrid"):
        assert reply(mode, room) == "1. Reply without joining: " + texts.INVITATION_REPLY_NONE
    assert reply("named", room) == "1. Reply without joining: " + texts.invitation_reply_publish("my room")


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")], ids=["a-first", "b-first"])
def test_a_skip_reply_id_two_servers_share_is_offered_by_each_qualified_name(order: tuple[str, str]) -> None:
    registry = ChannelRegistry()
    for server_id in order:
        assert registry.register(server_id, [channel_descriptor("skip_reply"), channel_descriptor("general")], FULL)[0].accepted
    names = ChannelNames(registry)
    a_skip, b_skip = ChannelRef("a", "skip_reply"), ChannelRef("b", "skip_reply")
    assert prose.target_token(names, a_skip) == "a:skip_reply" and prose.target_token(names, b_skip) == "b:skip_reply"
    assert prose.target_token(names, A_GENERAL) == "a:general" and prose.target_token(names, B_GENERAL) == "b:general"
    # Candidates in the order given (the refusal's: registration order), each one token.
    refs = sorted([a_skip, b_skip], key=registry.order_of)
    assert prose.candidate_tokens(names, refs, prose.EXPLICIT) == tuple(f">>{ref.qualified_name}" for ref in refs)
    for ref in (a_skip, b_skip):
        assert prose.resolve_target(ref.qualified_name, names, None).ref == ref
        assert prose.example_target((), prose.PIN, names, ref) == ref.qualified_name
        text = rounds.invitation_text(mode_named("explicit"), names, ref, None, may_publish=True)
        assert texts.invitation_reply_prefix(f">>{ref.qualified_name}") in text
    # Trying tokens counts no refusal: /metrics counts names agents and hosts gave.
    assert names.refusals == {}


@pytest.mark.parametrize("order", [("a", "c", "a:b"), ("a:b", "c", "a")], ids=["a-first", "a:b-first"])
def test_a_channel_no_token_reaches_alone_is_offered_by_none(order: tuple[str, ...]) -> None:
    """a's ``b:room`` shares its id with c's and its qualified name ``a:b:room`` with a:b's
    ``room``: no token reaches it alone, so it is not offered, and the invitation says so."""
    registry = ChannelRegistry()
    for server_id in order:
        channel_id = "room" if server_id == "a:b" else "b:room"
        assert registry.register(server_id, [channel_descriptor(channel_id)], FULL)[0].accepted
    names = ChannelNames(registry)
    lonely = ChannelRef("a", "b:room")
    assert prose.target_token(names, lonely) is None
    assert prose.target_token(names, ChannelRef("c", "b:room")) == "c:b:room"
    assert prose.candidate_tokens(names, [lonely, ChannelRef("c", "b:room")], prose.EXPLICIT) == (">>c:b:room",)
    assert prose.example_target((), prose.EXPLICIT, names, lonely) == "<channel>"
    assert texts.INVITATION_REPLY_NONE in rounds.invitation_text(mode_named("explicit"), names, lonely, None, may_publish=True)


def test_a_token_the_line_reads_another_way_falls_back_to_the_qualified_name() -> None:
    """An id beginning ``#`` or ``@`` is read by the line as a label or a DM's label, not as
    itself; its qualified name is a plain name, which the line reads as that channel."""
    registry = ChannelRegistry()
    assert registry.register("a", [channel_descriptor("#lobby"), channel_descriptor("@robin")], FULL)[0].accepted
    assert registry.register("b", [{**channel_descriptor("c1"), "label": "lobby"}], FULL)[0].accepted
    names = ChannelNames(registry)
    lobby, robin = ChannelRef("a", "#lobby"), ChannelRef("a", "@robin")
    assert prose.resolve_target("#lobby", names, None).ref == ChannelRef("b", "c1")  # a label
    assert prose.target_token(names, lobby) == "a:#lobby"
    assert prose.resolve_target("a:#lobby", names, None).ref == lobby
    assert prose.resolve_target("@robin", names, None).ref is None  # "robin" names nothing
    assert prose.target_token(names, robin) == "a:@robin"
    assert prose.resolve_target("a:@robin", names, None).ref == robin


def test_a_prose_state_copied_with_a_pin_keeps_every_other_field() -> None:
    # with_pin stands in for attrs.evolve on every round: a field added to ProseState and not
    # copied by it would be lost between rounds. Each field is set apart from its default.
    state = prose.ProseState(ChannelRef("a", "one"), quiet=True, hold=True, all_private=True, held_reason="some-reason")
    defaults = prose.ProseState()
    assert all(getattr(state, field.name) != getattr(defaults, field.name) for field in attrs.fields(prose.ProseState))
    pin = ChannelRef("b", "two")
    assert state.with_pin(pin) == attrs.evolve(state, pin=pin)
    assert state.with_pin(None) == attrs.evolve(state, pin=None)
    assert state.with_pin(state.pin) is not state
