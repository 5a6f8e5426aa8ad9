"""The one resolver, its refusals, the names an agent is shown, channel_list and explain.

Each seed-000 "Problem" this layer decides is a test here, run in both registration orders (the
``reverse`` fixture), so a lookup that takes "whichever registered first" fails in one of them.
"""

from __future__ import annotations

import json

import pytest

from mcpl_router.routing.names import ChannelNames, Refusal, Resolved
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import ChannelRegistry, RegistrationPolicy

FULL = RegistrationPolicy.permissive()
SENT = "Nothing was sent."


def names_for(pairs: list[tuple[str, dict]], reverse: bool) -> ChannelNames:
    """A resolver over a registry holding each (server, wire descriptor), in order or reversed."""
    registry = ChannelRegistry()
    for server_id, wire in reversed(pairs) if reverse else pairs:
        assert registry.register(server_id, [wire], FULL)[0].accepted
    return ChannelNames(registry)


@pytest.fixture(params=[False, True], ids=["given-order", "reversed"])
def reverse(request: pytest.FixtureRequest) -> bool:
    return request.param


def refused(result: Resolved | Refusal, kind: str) -> Refusal:
    assert isinstance(result, Refusal), result
    assert result.kind == kind, result
    return result


def candidate_lines(refusal: Refusal) -> list[str]:
    return [line[2:] for line in refusal.text.splitlines() if line.startswith("- ")]


A_GEN, B_GEN = ChannelRef("a", "general"), ChannelRef("b", "general")
TWO_GENERALS = [("a", {"id": "general"}), ("b", {"id": "general"})]


# ---------------------------------------------------------------------- shared id across servers


def test_shared_id_is_refused_as_ambiguous_never_taken_first(reverse: bool) -> None:
    names = names_for(TWO_GENERALS, reverse)
    refusal = refused(names.channel_named("general", not_done=SENT), "ambiguous")
    assert set(refusal.candidates) == {A_GEN, B_GEN}
    assert "is on more than one server" in refusal.text
    assert "not found" not in refusal.text.lower()
    assert SENT in refusal.text
    assert sorted(candidate_lines(refusal)) == ["a:general", "b:general"]
    assert set(names.channels_named("general")) == {A_GEN, B_GEN}


def test_qualified_name_picks_each_servers_channel(reverse: bool) -> None:
    names = names_for(TWO_GENERALS, reverse)
    assert names.channel_named("b:general") == Resolved(B_GEN, "one-match")
    assert names.channel_named("a:general") == Resolved(A_GEN, "one-match")
    assert names.channels_named("b:general") == [B_GEN]


def test_each_candidate_resolves_back_to_itself(reverse: bool) -> None:
    names = names_for(TWO_GENERALS + [("c", {"id": "c:general"})], reverse)
    refusal = refused(names.channel_named("general"), "ambiguous")
    for line in candidate_lines(refusal):
        assert len(names.channels_named(line)) == 1


def test_qualified_name_is_never_split_at_a_colon(reverse: bool) -> None:
    # Only the registered pair's own qualified name matches; no prefix or suffix of it does.
    names = names_for([("a:gen", {"id": "eral"}), ("a", {"id": "x"})], reverse)
    assert names.channels_named("a:gen:eral") == [ChannelRef("a:gen", "eral")]
    assert names.channels_named("a:gen") == []
    assert names.channels_named("gen:eral") == []


def test_shared_label_candidates_do_not_read_alike(reverse: bool) -> None:
    names = names_for(
        [("a", {"id": "general", "label": "general"}), ("b", {"id": "general", "label": "general"})],
        reverse,
    )
    labelled = names.channels_labelled("general")
    assert set(labelled) == {A_GEN, B_GEN}
    refusal = names.refuse_ambiguous("#general", labelled, not_done=SENT)
    assert "general, general" not in refusal.text
    lines = candidate_lines(refusal)
    assert sorted(lines) == ["a:general", "b:general"]
    assert len(set(lines)) == len(lines)


def test_shared_label_with_distinct_ids_names_each_by_its_id(reverse: bool) -> None:
    names = names_for(
        [("a", {"id": "discord:1:10", "label": "General"}), ("b", {"id": "slack:C1", "label": "general"})],
        reverse,
    )
    refusal = names.refuse_ambiguous("#general", names.channels_labelled("GENERAL"), not_done=SENT)
    assert sorted(candidate_lines(refusal)) == ["discord:1:10", "slack:C1"]


# ---------------------------------------------------------------------- DMs


def test_one_persons_dms_on_two_servers_answer_with_distinct_tokens(reverse: bool) -> None:
    dm = {"id": "dm:42", "type": "dm", "label": "Ada"}
    names = names_for([("a", dm), ("b", dm)], reverse)
    for name in ("dm:42", "Ada", "ada"):
        refusal = refused(names.channel_named(name, not_done=SENT), "ambiguous")
        assert set(refusal.candidates) == {ChannelRef("a", "dm:42"), ChannelRef("b", "dm:42")}
        assert sorted(candidate_lines(refusal)) == ["a:dm:42", "b:dm:42"]
        assert "not found" not in refusal.text.lower()
    assert names.channel_named("b:dm:42") == Resolved(ChannelRef("b", "dm:42"), "one-match")


def test_dm_labels_differing_only_in_case_are_told_apart_by_their_tokens(reverse: bool) -> None:
    names = names_for(
        [("a", {"id": "dm:1", "type": "dm", "label": "Ada"}), ("b", {"id": "dm:2", "type": "dm", "label": "ADA"})],
        reverse,
    )
    refusal = refused(names.channel_named("ada"), "ambiguous")
    assert sorted(candidate_lines(refusal)) == ["dm:1", "dm:2"]
    assert names.channel_named("dm:2") == Resolved(ChannelRef("b", "dm:2"), "one-match")


def test_a_dm_label_is_a_name_but_another_types_label_is_not(reverse: bool) -> None:
    names = names_for(
        [("a", {"id": "dm:1", "type": "dm", "label": "Ada"}), ("b", {"id": "c1", "label": "Bob"})],
        reverse,
    )
    assert names.channel_named("ADA") == Resolved(ChannelRef("a", "dm:1"), "one-match")
    assert names.channels_named("bob") == []
    assert names.channels_labelled("bob") == [ChannelRef("b", "c1")]


# ---------------------------------------------------------------------- colon collisions


def test_colon_key_collision_keeps_both_and_each_has_a_name(reverse: bool) -> None:
    names = names_for([("a", {"id": "b:room"}), ("a:b", {"id": "room"})], reverse)
    first, second = ChannelRef("a", "b:room"), ChannelRef("a:b", "room")
    assert names.registry.get(first) is not None and names.registry.get(second) is not None
    assert set(names.channels_named("a:b:room")) == {first, second}
    refusal = refused(names.channel_named("a:b:room", not_done=SENT), "ambiguous")
    assert "is on more than one server" in refusal.text
    assert sorted(candidate_lines(refusal)) == ["b:room", "room"]
    assert names.name_shown(first) == "b:room"
    assert names.name_shown(second) == "room"


def test_two_channels_of_one_server_answer_to_one_name(reverse: bool) -> None:
    names = names_for([("s", {"id": "s:room"}), ("s", {"id": "room"})], reverse)
    refusal = refused(names.channel_named("s:room", not_done=SENT), "ambiguous")
    assert 'could mean more than one channel on server "s"' in refusal.text
    assert "more than one server" not in refusal.text
    assert sorted(candidate_lines(refusal)) == ["room", "s:s:room"]
    assert names.name_shown(ChannelRef("s", "s:room")) == "s:s:room"


def test_a_channel_no_string_picks_alone_gets_a_route_line(reverse: bool) -> None:
    names = names_for(
        [("a", {"id": "b:room"}), ("c", {"id": "b:room"}), ("a:b", {"id": "room"})], reverse
    )
    lonely = ChannelRef("a", "b:room")
    refusal = refused(names.channel_named("b:room", not_done=SENT), "ambiguous")
    assert set(refusal.candidates) == {lonely, ChannelRef("c", "b:room")}
    lines = candidate_lines(refusal)
    assert "c:b:room" in lines
    (route,) = [line for line in lines if line != "c:b:room"]
    assert 'channelId "b:room" with serverId "a"' in route
    # What's shown for it is visibly not a name, and names nothing.
    shown = names.name_shown(lonely)
    assert shown == '"b:room" on server "a"'
    assert names.channels_named(shown) == []
    assert names.pick_name(lonely) is None
    # Its pair still reaches it.
    assert names.channel_named("b:room", server_id="a") == Resolved(lonely, "exact-pair")
    # A tool without serverId is told no channelId reaches it alone.
    no_server = refused(names.channel_named("b:room", server_id_accepted=False), "ambiguous")
    assert "no channelId reaches it alone" in no_server.text
    assert "serverId" not in no_server.text


# ---------------------------------------------------------------------- serverId beside a name


def test_server_id_names_the_exact_pair(reverse: bool) -> None:
    names = names_for(TWO_GENERALS, reverse)
    assert names.channel_named("general", server_id="b") == Resolved(B_GEN, "exact-pair")
    assert names.channel_named("general", server_id="a") == Resolved(A_GEN, "exact-pair")


def test_empty_server_id_means_not_given(reverse: bool) -> None:
    names = names_for(TWO_GENERALS, reverse)
    refused(names.channel_named("general", server_id=""), "ambiguous")
    assert names.channel_named("a:general", server_id="") == Resolved(A_GEN, "one-match")
    refused(names.channel_named("", server_id="a"), "no-name")


def test_server_id_the_id_is_not_on_is_told_which_servers_have_it(reverse: bool) -> None:
    names = names_for(TWO_GENERALS + [("c", {"id": "random"})], reverse)
    refusal = refused(names.channel_named("general", server_id="c", not_done=SENT), "not-on-server")
    assert set(refusal.candidates) == {A_GEN, B_GEN}
    assert 'Server "c" has no channel "general"' in refusal.text
    assert 'server "a" (name it a:general)' in refusal.text
    assert 'server "b" (name it b:general)' in refusal.text
    assert SENT in refusal.text


def test_a_server_id_the_schema_does_not_take_is_told_where_the_id_is_without_advice(reverse: bool) -> None:
    """channel_publish has no serverId: given one the channel isn't on, the refusal says where
    the id is, by the name channelId takes, and not to post there (another destination)."""
    names = names_for(TWO_GENERALS + [("c", {"id": "random"})], reverse)
    refusal = refused(names.channel_named("general", server_id="c", not_done=SENT, server_id_accepted=False), "not-on-server")
    assert 'server "a" (a:general)' in refusal.text and 'server "b" (b:general)' in refusal.text
    assert "name it" not in refusal.text


def test_server_id_with_an_id_one_server_has_offers_the_id_alone(reverse: bool) -> None:
    names = names_for([("a", {"id": "general"}), ("b", {"id": "random"})], reverse)
    refusal = refused(names.channel_named("general", server_id="b"), "not-on-server")
    assert 'server "a" (name it general)' in refusal.text


def test_server_id_with_an_id_no_server_has(reverse: bool) -> None:
    names = names_for(TWO_GENERALS, reverse)
    refusal = refused(names.channel_named("nowhere", server_id="a"), "not-on-server")
    assert "No server has a channel" in refusal.text
    assert refusal.candidates == ()


def test_server_id_with_a_qualified_name_is_told_the_name_works_alone(reverse: bool) -> None:
    names = names_for(TWO_GENERALS, reverse)
    refusal = refused(names.channel_named("a:general", server_id="a", not_done=SENT), "qualified-with-server")
    assert refusal.candidates == (A_GEN,)
    assert "without serverId" in refusal.text
    # With another server's id beside it, it is simply not on that server.
    other = refused(names.channel_named("a:general", server_id="b"), "not-on-server")
    assert "without serverId" not in other.text


def test_a_stored_ref_is_never_read_as_another_channels_qualified_name(reverse: bool) -> None:
    # A stored ref (a, general) whose channel a withdrew, while server x registers the id
    # "a:general": the pair must not be read as the string "a:general", which is x's channel.
    names = names_for([("a", {"id": "general"}), ("x", {"id": "a:general"})], reverse)
    names.registry.withdraw("a", ["general"])
    refusal = refused(names.channel_named("general", server_id="a"), "not-on-server")
    assert refusal.candidates == ()
    assert names.channels_named("a:general") == [ChannelRef("x", "a:general")]
    # And a server's own id that looks qualified is still its exact pair.
    assert names.channel_named("a:general", server_id="x") == Resolved(
        ChannelRef("x", "a:general"), "exact-pair"
    )


# ---------------------------------------------------------------------- unknown


def test_unknown_name_says_what_exists(reverse: bool) -> None:
    names = names_for(TWO_GENERALS + [("c", {"id": "random"})], reverse)
    refusal = refused(names.channel_named("gen", not_done=SENT), "unknown")
    assert "a:general" in refusal.text and "b:general" in refusal.text and "random" in refusal.text
    assert "more than one" not in refusal.text
    assert SENT in refusal.text


def test_unknown_listing_is_capped() -> None:
    names = names_for([("a", {"id": f"c{i}"}) for i in range(25)], False)
    refusal = refused(names.channel_named("nope"), "unknown")
    assert "c9" in refusal.text and "c10," not in refusal.text
    assert "and 15 more" in refusal.text


def test_unknown_with_nothing_registered() -> None:
    refusal = refused(ChannelNames(ChannelRegistry()).channel_named("general"), "unknown")
    assert "no server has registered a channel yet" in refusal.text


# ---------------------------------------------------------------------- shown names


def test_name_shown_is_the_id_where_it_picks_alone(reverse: bool) -> None:
    names = names_for([("a", {"id": "general"}), ("b", {"id": "random"})], reverse)
    assert names.name_shown(A_GEN) == "general"
    assert names.name_shown(ChannelRef("b", "random")) == "random"


def test_name_shown_is_the_qualified_name_where_the_id_is_shared(reverse: bool) -> None:
    names = names_for(TWO_GENERALS, reverse)
    assert names.name_shown(A_GEN) == "a:general"
    assert names.name_shown(B_GEN) == "b:general"


def test_a_shown_name_follows_each_registry_change_however_often_it_was_asked(reverse: bool) -> None:
    # name_shown remembers its answers for one registry generation: each change must show.
    names = names_for([("a", {"id": "general"})], reverse)
    registry = names.registry
    assert [names.name_shown(A_GEN) for _ in range(3)] == ["general"] * 3
    assert registry.register("b", [{"id": "general"}], FULL)[0].accepted
    assert names.name_shown(A_GEN) == "a:general"
    assert names.name_shown(B_GEN) == "b:general"
    registry.withdraw("b", ["general"])
    assert names.name_shown(A_GEN) == "general"
    assert names.name_shown(B_GEN) == "b:general"  # gone, and its id names a's channel
    registry.remove_server("a")
    assert names.name_shown(B_GEN) == "general"  # now nothing answers to it
    assert registry.register("b", [{"id": "a:general"}], FULL)[0].accepted
    assert names.name_shown(ChannelRef("b", "a:general")) == "a:general"
    assert registry.register("a", [{"id": "general"}], FULL)[0].accepted
    # "a:general" is now a's qualified name too: b's channel is shown by its own.
    assert names.name_shown(ChannelRef("b", "a:general")) == "b:a:general"
    assert names.name_shown(A_GEN) == "general"


def test_name_shown_for_a_channel_no_longer_registered(reverse: bool) -> None:
    names = names_for(TWO_GENERALS, reverse)
    names.registry.withdraw("b", ["general"])
    # Another server now has the id: shown by its qualified name, which names nothing now.
    assert names.name_shown(B_GEN) == "b:general"
    assert names.channels_named("b:general") == []
    # a's general is alone again, and shown by its id.
    assert names.name_shown(A_GEN) == "general"
    names.registry.withdraw("a", ["general"])
    assert names.name_shown(B_GEN) == "general"


def test_name_shown_for_a_gone_channel_never_names_another() -> None:
    names = names_for([("a", {"id": "general"}), ("x", {"id": "b:general"})], False)
    # b's general is gone (never registered); "general" is a's, and "b:general" is x's id.
    shown = names.name_shown(B_GEN)
    assert shown == '"general" on server "b"'
    assert names.channels_named(shown) == []


# ---------------------------------------------------------------------- channel_list


def test_channel_list_rows_name_shared_ids(reverse: bool) -> None:
    names = names_for(
        TWO_GENERALS + [("a", {"id": "random", "label": "Random", "direction": "outbound"})], reverse
    )
    rows = {row.ref: row for row in names.channel_list()}
    assert rows[A_GEN].name == "a:general" and rows[A_GEN].shown == "a:general"
    assert rows[B_GEN].name == "b:general"
    random = rows[ChannelRef("a", "random")]
    assert random.name is None and random.shown == "random"
    assert random.label == "Random" and random.direction == "outbound"
    assert "name" not in random.to_dict() and random.to_dict()["serverId"] == "a"
    assert [row.ref for row in names.channel_list()] == [e.ref for e in names.registry.all_entries()]


def test_channel_list_row_no_string_picks_has_no_name(reverse: bool) -> None:
    names = names_for(
        [("a", {"id": "b:room"}), ("c", {"id": "b:room"}), ("a:b", {"id": "room"})], reverse
    )
    rows = {row.ref: row for row in names.channel_list()}
    lonely = rows[ChannelRef("a", "b:room")]
    assert lonely.name is None
    assert lonely.shown == '"b:room" on server "a"'
    assert rows[ChannelRef("c", "b:room")].name == "c:b:room"
    assert rows[ChannelRef("a:b", "room")].name is None  # its id picks it alone
    assert rows[ChannelRef("a:b", "room")].shown == "room"


def test_channel_list_makes_no_lookup_per_row(monkeypatch: pytest.MonkeyPatch) -> None:
    names = names_for(TWO_GENERALS + [("a", {"id": "dm", "type": "dm", "label": "DM"})], False)

    def forbidden(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("channel_list looked a name up per row")

    for method in ("refs_with_id", "refs_with_qualified_name", "dm_refs_with_label"):
        # Slotted instances can't take attributes: patch the class for this test alone.
        monkeypatch.setattr(ChannelRegistry, method, forbidden)
    assert len(names.channel_list()) == 3


def test_channel_list_shown_matches_name_shown_with_dm_labels(reverse: bool) -> None:
    names = names_for(
        [
            ("a", {"id": "ada", "type": "dm", "label": "Ada"}),  # answers to "ada" twice: once
            ("b", {"id": "b:x", "type": "dm", "label": "a:ADA"}),  # label = a's qualified name
            ("b", {"id": "general"}),
            ("c", {"id": "dm:1", "type": "dm", "label": "general"}),
        ],
        reverse,
    )
    for row in names.channel_list():
        assert row.shown == names.name_shown(row.ref), row


# ---------------------------------------------------------------------- explain


def test_explain_shows_candidates_rule_and_refusal(reverse: bool) -> None:
    names = names_for([("s", {"id": "s:room"}), ("s", {"id": "room"})], reverse)
    explanation = names.explain("s:room")
    assert explanation.rule == "ambiguous"
    assert explanation.resolved is None
    assert explanation.refusal is not None and "could mean more than one channel" in explanation.refusal.text
    how = {c.ref: c.matched_by for c in explanation.candidates}
    assert how == {ChannelRef("s", "s:room"): ("id",), ChannelRef("s", "room"): ("qualified-name",)}
    shown = {c.ref: c.shown for c in explanation.candidates}
    assert shown == {ChannelRef("s", "s:room"): "s:s:room", ChannelRef("s", "room"): "room"}
    encoded = json.loads(json.dumps(explanation.to_dict()))
    assert encoded["rule"] == "ambiguous"
    assert {c["channelId"] for c in encoded["candidates"]} == {"s:room", "room"}


def test_explain_with_server_id_marks_the_exact_pair(reverse: bool) -> None:
    names = names_for(TWO_GENERALS, reverse)
    explanation = names.explain("general", server_id="b")
    assert explanation.rule == "exact-pair"
    assert explanation.resolved == B_GEN
    assert explanation.candidates[0].ref == B_GEN
    assert explanation.candidates[0].matched_by == ("server-and-id", "id")
    assert explanation.to_dict()["resolved"] == {"serverId": "b", "channelId": "general"}


def test_explain_of_a_dm_label(reverse: bool) -> None:
    names = names_for([("a", {"id": "dm:1", "type": "dm", "label": "Ada"}), ("b", {"id": "x"})], reverse)
    explanation = names.explain("ada")
    assert explanation.rule == "one-match"
    assert explanation.candidates[0].matched_by == ("dm-label",)
    assert explanation.candidates[0].shown == "dm:1"


# ---------------------------------------------------------------------- one server's channel (a server's own send)


def test_channel_on_server_reads_a_name_on_that_server_only(reverse: bool) -> None:
    names = names_for(
        [
            ("a", {"id": "general"}),
            ("b", {"id": "general"}),
            ("a", {"id": "b:room"}),
            ("a:b", {"id": "room"}),
            ("b", {"id": "dm-1", "type": "dm", "label": "Ada"}),
            ("b", {"id": "dm-2", "type": "dm", "label": "ADA"}),
            ("a", {"id": "dm-3", "type": "dm", "label": "Bob"}),
        ],
        reverse,
    )
    # The exact pair first: "general" on b is b's, though a has one too.
    assert names.channel_on_server("general", "b") == Resolved(B_GEN, "exact-pair")
    # The qualified form of its own channel; another server's qualified name is not its to pick.
    assert names.channel_on_server("b:general", "b") == Resolved(B_GEN, "one-match")
    assert names.channel_on_server("a:general", "b") is None
    # "a:b:room" answers to a's "b:room" and a:b's "room": each server picks its own.
    assert names.channel_on_server("a:b:room", "a") == Resolved(ChannelRef("a", "b:room"), "one-match")
    assert names.channel_on_server("a:b:room", "a:b") == Resolved(ChannelRef("a:b", "room"), "one-match")
    # A DM's label, on its server; elsewhere it names nothing there.
    assert names.channel_on_server("bob", "a") == Resolved(ChannelRef("a", "dm-3"), "one-match")
    assert names.channel_on_server("bob", "b") is None
    # Two of b's DMs answer to "ada": refused, each candidate named by its id.
    refusal = refused(names.channel_on_server("ada", "b", not_done=SENT), "ambiguous")
    assert set(refusal.candidates) == {ChannelRef("b", "dm-1"), ChannelRef("b", "dm-2")}
    assert sorted(candidate_lines(refusal)) == ["dm-1", "dm-2"]
    assert 'could mean more than one channel on server "b"' in refusal.text and SENT in refusal.text
    assert names.refusals["ambiguous"] == 1
    assert names.channel_on_server("", "b") is None


def test_explain_names_the_operators_command_where_an_agent_is_named_its_tool(reverse: bool) -> None:
    """`mcpl-router explain nosuch` is read by a person at a shell: it points at `mcpl-router
    channels`, not at channel_list, a tool only an agent has."""
    names = names_for(TWO_GENERALS, reverse)
    for explained in (names.explain("nosuch"), names.explain("nowhere", "a"), names.explain("")):
        assert explained.refusal is not None
        assert "`mcpl-router channels`" in explained.refusal.text and "channel_list" not in explained.refusal.text
    for result in (names.channel_named("nosuch"), names.channel_named("nowhere", server_id="a"), names.channel_named("")):
        assert isinstance(result, Refusal) and "channel_list" in result.text
