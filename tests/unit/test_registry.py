"""The channel registry: per-server registration, admission, withdrawal and pushes.

Cases that involve two servers run in both registration orders (the ``order`` fixture), so
"whichever server registered first" can never pass for the right answer.
"""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import (
    CHANNEL_NOT_PERMITTED,
    UNKNOWN_CHANNEL,
    ChannelDescriptor,
    ChannelRegistry,
    RegistrationPolicy,
)

FULL = RegistrationPolicy.permissive()


def register_in_order(
    registry: ChannelRegistry, pairs: list[tuple[str, dict]], reverse: bool
) -> None:
    """Register each (server, wire descriptor), in the order given or reversed."""
    for server_id, wire in reversed(pairs) if reverse else pairs:
        results = registry.register(server_id, [wire], FULL)
        assert results[0].accepted, results


@pytest.fixture(params=[False, True], ids=["a-first", "b-first"])
def reverse(request: pytest.FixtureRequest) -> bool:
    return request.param


# ---------------------------------------------------------------------- descriptors


def test_descriptor_from_wire_reads_every_field() -> None:
    descriptor = ChannelDescriptor.from_wire(
        {
            "id": "discord:1:2",
            "type": "text",
            "label": "general",
            "direction": "inbound",
            "address": {"guildId": "1", "channelId": 2},
            "metadata": {"topic": "hi", "tags": ["x"]},
            "initiallyOpen": True,
            "capabilities": {"ignored": True},
        }
    )
    assert descriptor.id == "discord:1:2"
    assert descriptor.type == "text"
    assert descriptor.label == "general"
    assert descriptor.direction == "inbound"
    assert descriptor.address == (("guildId", "1"), ("channelId", "2"))
    assert descriptor.initially_open is True
    assert descriptor.metadata["tags"] == ("x",)
    with pytest.raises(TypeError):
        descriptor.metadata["topic"] = "changed"  # frozen: a caller can't change what we hold
    hash(descriptor)  # hashable although metadata is a mapping
    assert descriptor.to_wire()["metadata"] == {"topic": "hi", "tags": ["x"]}


def test_descriptor_defaults() -> None:
    descriptor = ChannelDescriptor.from_wire({"id": "general"})
    assert descriptor.label == "general"
    assert descriptor.direction == "bidirectional"
    assert descriptor.address == ()
    assert descriptor.initially_open is False


@pytest.mark.parametrize(
    ("wire", "fragment"),
    [
        ({"label": "x"}, "no id"),
        ({"id": ""}, "empty"),
        ({"id": 7}, "must be a string"),
        ({"id": "x", "direction": "sideways"}, "direction"),
        ({"id": "x", "address": "123"}, "address"),
        ({"id": "x", "initiallyOpen": "yes"}, "initiallyOpen"),
        (["x"], "must be an object"),
    ],
)
def test_descriptor_from_wire_refuses_malformed(wire: object, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        ChannelDescriptor.from_wire(wire)


# ---------------------------------------------------------------------- registration


def test_register_keeps_two_servers_channels_with_one_id(reverse: bool) -> None:
    registry = ChannelRegistry()
    register_in_order(registry, [("a", {"id": "general"}), ("b", {"id": "general"})], reverse)
    a, b = ChannelRef("a", "general"), ChannelRef("b", "general")
    assert registry.is_registered(a) and registry.is_registered(b)
    assert registry.get(a) != registry.get(b)
    assert set(registry.refs_with_id("general")) == {a, b}
    assert [e.ref for e in registry.channels_for("a")] == [a]
    assert [e.ref for e in registry.channels_for("b")] == [b]


def test_colon_key_collision_keeps_both_channels(reverse: bool) -> None:
    """Server a's ``b:room`` and server a:b's ``room`` share the string ``a:b:room``, not a key."""
    registry = ChannelRegistry()
    register_in_order(
        registry,
        [("a", {"id": "b:room", "label": "A"}), ("a:b", {"id": "room", "label": "AB"})],
        reverse,
    )
    first, second = ChannelRef("a", "b:room"), ChannelRef("a:b", "room")
    assert first.qualified_name == second.qualified_name == "a:b:room"
    assert registry.get(first).descriptor.label == "A"
    assert registry.get(second).descriptor.label == "AB"
    assert set(registry.refs_with_qualified_name("a:b:room")) == {first, second}
    assert len(registry) == 2


def test_register_refuses_ids_outside_patterns() -> None:
    registry = ChannelRegistry()
    policy = RegistrationPolicy(may_register=True, may_receive=True, id_patterns=("discord:acme:*",))
    results = registry.register(
        "d", [{"id": "discord:acme:1"}, {"id": "discord:other:1"}, {"id": "discord:acme:x:y"}], policy
    )
    assert [(r.id, r.accepted) for r in results] == [
        ("discord:acme:1", True),
        ("discord:other:1", False),
        # fnmatch's * spans colons: documented
        ("discord:acme:x:y", True),
    ]
    assert "outside" in results[1].reason
    assert not registry.is_registered(ChannelRef("d", "discord:other:1"))


def test_register_refuses_everything_without_the_grant() -> None:
    registry = ChannelRegistry()
    results = registry.register("a", [{"id": "general"}], RegistrationPolicy(may_receive=True))
    assert not results[0].accepted
    assert "channels.register" in results[0].reason
    assert len(registry) == 0


def test_each_descriptor_is_authorized_independently() -> None:
    registry = ChannelRegistry()
    policy = RegistrationPolicy(may_register=True, id_patterns=("ok:*",))
    results = registry.register("a", [{"id": "ok:1"}, {"id": ""}, {"id": "no:1"}, {"id": "ok:2"}], policy)
    assert [r.accepted for r in results] == [True, False, False, True]
    assert "malformed" in results[1].reason
    assert [e.ref.channel_id for e in registry.channels_for("a")] == ["ok:1", "ok:2"]


def test_duplicate_id_in_one_call_is_refused_each_time() -> None:
    registry = ChannelRegistry()
    results = registry.register("a", [{"id": "x", "label": "one"}, {"id": "x", "label": "two"}, {"id": "y"}], FULL)
    assert [r.accepted for r in results] == [False, False, True]
    assert not registry.is_registered(ChannelRef("a", "x"))


def test_re_register_replaces_descriptor_and_keeps_place_and_open_state() -> None:
    registry = ChannelRegistry()
    registry.register("a", [{"id": "x", "label": "Old", "type": "dm"}, {"id": "y"}], FULL)
    ref = ChannelRef("a", "x")
    assert registry.set_open(ref, True)
    order = registry.get(ref).order
    results = registry.register("a", [{"id": "x", "label": "New", "type": "text"}], FULL)
    assert results[0].accepted
    entry = registry.get(ref)
    assert entry.descriptor.label == "New"
    assert entry.order == order
    assert entry.open is True
    assert [e.ref.channel_id for e in registry.channels_for("a")] == ["x", "y"]
    # The label indexes follow the new descriptor.
    assert list(registry.refs_with_label("new")) == [ref]
    assert not registry.refs_with_label("old")
    assert not registry.dm_refs_with_label("old")


def test_refused_descriptor_in_a_notification_is_logged() -> None:
    registry = ChannelRegistry()
    policy = RegistrationPolicy(may_register=True, id_patterns=("slack:*",))
    with capture_logs() as logs:
        results = registry.register(
            "tg", [{"id": "slack:C1"}, {"id": "telegram:1:user:2"}], policy, form="notification"
        )
    assert [r.accepted for r in results] == [True, False]
    refused = [e for e in logs if e["event"] == "channels.register.refused"]
    assert len(refused) == 1
    assert refused[0]["log_level"] == "warning"
    assert refused[0]["server"] == "tg"
    assert refused[0]["channel"] == "telegram:1:user:2"
    assert refused[0]["form"] == "notification"
    assert "outside" in refused[0]["reason"]


def test_refusals_in_channels_changed_are_logged_too() -> None:
    registry = ChannelRegistry()
    with capture_logs() as logs:
        registry.change("a", added=[{"id": 3}], removed=[], updated=[{"id": "nope"}], policy=FULL)
    events = [(e["event"], e["method"], e["form"]) for e in logs]
    assert events == [("channels.register.refused", "channels/changed", "notification")] * 2


def test_channels_order_is_registration_order_across_servers() -> None:
    registry = ChannelRegistry()
    registry.register("b", [{"id": "x"}], FULL)
    registry.register("a", [{"id": "y"}, {"id": "z"}], FULL)
    registry.register("b", [{"id": "w"}], FULL)
    entries = registry.all_entries()
    assert [(e.ref.server_id, e.ref.channel_id) for e in entries] == [
        ("b", "x"), ("a", "y"), ("a", "z"), ("b", "w"),
    ]
    assert [e.order for e in entries] == sorted(e.order for e in entries)
    assert [e.ref.channel_id for e in registry.channels_for("b")] == ["x", "w"]
    assert registry.servers() == ["b", "a"]


# ---------------------------------------------------------------------- change / withdraw


def test_withdraw_returns_exactly_the_withdrawn_refs(reverse: bool) -> None:
    registry = ChannelRegistry()
    register_in_order(
        registry,
        [("a", {"id": "general"}), ("b", {"id": "general"}), ("b", {"id": "random"})],
        reverse,
    )
    withdrawn = registry.withdraw("b", ["general", "never-registered", "general"])
    assert withdrawn == [ChannelRef("b", "general")]
    assert registry.is_registered(ChannelRef("a", "general"))
    assert list(registry.refs_with_id("general")) == [ChannelRef("a", "general")]
    assert list(registry.refs_with_qualified_name("b:general")) == []


def test_change_removes_first_then_adds_then_updates() -> None:
    registry = ChannelRegistry()
    registry.register("a", [{"id": "x"}, {"id": "y", "label": "Y"}], FULL)
    result = registry.change(
        "a",
        added=[{"id": "z"}],
        removed=["x", "other"],
        updated=[{"id": "y", "label": "Y2"}, {"id": "x"}],
        policy=FULL,
    )
    assert result.withdrawn == (ChannelRef("a", "x"),)
    assert [(r.id, r.accepted) for r in result.added] == [("z", True)]
    assert [(r.id, r.accepted) for r in result.updated] == [("y", True), ("x", False)]
    assert [r.to_wire()["id"] for r in result.results] == ["z", "y", "x"]
    assert registry.get(ChannelRef("a", "y")).descriptor.label == "Y2"


def test_remove_server_withdraws_only_its_channels(reverse: bool) -> None:
    registry = ChannelRegistry()
    register_in_order(
        registry,
        [("a", {"id": "general", "address": {"channelId": "1"}}), ("b", {"id": "general"}),
         ("a", {"id": "dm", "type": "dm", "label": "Ada"})],
        reverse,
    )
    removed = registry.remove_server("a")
    assert set(removed) == {ChannelRef("a", "general"), ChannelRef("a", "dm")}
    assert registry.servers() == ["b"]
    assert list(registry.refs_with_id("general")) == [ChannelRef("b", "general")]
    assert not registry.dm_refs_with_label("ada")
    assert not registry.refs_with_native_id("a", "1")
    assert registry.remove_server("a") == []


# ---------------------------------------------------------------------- admission


def test_a_server_cannot_have_a_message_admitted_into_another_servers_channel(reverse: bool) -> None:
    registry = ChannelRegistry()
    register_in_order(registry, [("a", {"id": "general"}), ("c", {"id": "random"})], reverse)
    admission = registry.admit_incoming("b", "general", FULL)
    assert not admission.accepted
    assert admission.code == UNKNOWN_CHANNEL
    assert admission.ref is None
    assert "not registered by this server" in admission.reason
    # a's own message is admitted into a's channel.
    own = registry.admit_incoming("a", "general", FULL)
    assert own.accepted and own.ref == ChannelRef("a", "general")


def test_admission_with_both_servers_registering_goes_to_the_senders(reverse: bool) -> None:
    registry = ChannelRegistry()
    register_in_order(registry, [("a", {"id": "general"}), ("b", {"id": "general"})], reverse)
    assert registry.admit_incoming("b", "general", FULL).ref == ChannelRef("b", "general")
    assert registry.admit_incoming("a", "general", FULL).ref == ChannelRef("a", "general")


def test_admission_needs_the_incoming_grant() -> None:
    registry = ChannelRegistry()
    registry.register("a", [{"id": "general"}], FULL)
    admission = registry.admit_incoming("a", "general", RegistrationPolicy(may_register=True))
    assert (admission.accepted, admission.code) == (False, CHANNEL_NOT_PERMITTED)
    assert "channels.incoming" in admission.reason


def test_admission_follows_the_patterns_current_at_receipt() -> None:
    registry = ChannelRegistry()
    registry.register("d", [{"id": "discord:acme:1"}, {"id": "discord:old:1"}], FULL)
    narrowed = RegistrationPolicy(may_register=True, may_receive=True, id_patterns=("discord:acme:*",))
    assert registry.admit_incoming("d", "discord:acme:1", narrowed).accepted
    refused = registry.admit_incoming("d", "discord:old:1", narrowed)
    assert (refused.accepted, refused.code) == (False, CHANNEL_NOT_PERMITTED)
    assert refused.ref == ChannelRef("d", "discord:old:1")


def test_admission_refuses_an_outbound_only_channel() -> None:
    registry = ChannelRegistry()
    registry.register("a", [{"id": "announce", "direction": "outbound"}], FULL)
    with capture_logs() as logs:
        admission = registry.admit_incoming("a", "announce", FULL, form="notification")
    assert (admission.accepted, admission.code) == (False, CHANNEL_NOT_PERMITTED)
    assert "outbound" in admission.reason
    assert logs[0]["event"] == "channels.incoming.refused"
    assert logs[0]["code"] == CHANNEL_NOT_PERMITTED


def test_a_channels_admission_is_decided_once_while_the_registry_and_policy_stand(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every message of a busy channel gets the same answer: decided once (its id checked
    against the patterns once), and anew after any change to the registry or under another policy."""
    import mcpl_router.routing.registry as registry_module

    matched: list[str] = []
    real = registry_module.fnmatch.fnmatchcase

    def counted(name: str, pattern: str) -> bool:
        matched.append(name)
        return real(name, pattern)

    monkeypatch.setattr(registry_module.fnmatch, "fnmatchcase", counted)
    registry = ChannelRegistry()
    registry.register("d", [{"id": "discord:acme:1"}], FULL)
    matched.clear()
    acme = RegistrationPolicy(may_register=True, may_receive=True, id_patterns=("discord:acme:*",))
    for _ in range(50):
        admission = registry.admit_incoming("d", "discord:acme:1", acme)
        assert admission.accepted and admission.ref == ChannelRef("d", "discord:acme:1")
    assert matched == ["discord:acme:1"]  # once, not 50 times
    # Another policy (a narrowed grant at receipt) is decided for itself, at once.
    other = RegistrationPolicy(may_register=True, may_receive=True, id_patterns=("discord:other:*",))
    assert not registry.admit_incoming("d", "discord:acme:1", other).accepted
    assert not registry.admit_incoming("d", "discord:acme:1", RegistrationPolicy(may_register=True)).accepted
    assert registry.admit_incoming("d", "discord:acme:1", acme).accepted  # the kept one still stands
    # Re-registered outbound-only: refused from the next message on.
    registry.register("d", [{"id": "discord:acme:1", "direction": "outbound"}], FULL)
    assert registry.admit_incoming("d", "discord:acme:1", acme).code == CHANNEL_NOT_PERMITTED
    # Registered again both ways, then withdrawn: admitted, then unknown.
    registry.register("d", [{"id": "discord:acme:1"}], FULL)
    assert registry.admit_incoming("d", "discord:acme:1", acme).accepted
    assert registry.withdraw("d", ["discord:acme:1"]) == [ChannelRef("d", "discord:acme:1")]
    assert registry.admit_incoming("d", "discord:acme:1", acme).code == UNKNOWN_CHANNEL
    # Another server's channel with the same id never takes a kept admission.
    registry.register("d", [{"id": "general"}], FULL)
    assert registry.admit_incoming("d", "general", FULL).accepted
    assert registry.admit_incoming("e", "general", FULL).code == UNKNOWN_CHANNEL


def test_every_refused_message_is_logged_not_only_the_first() -> None:
    registry = ChannelRegistry()
    registry.register("a", [{"id": "announce", "direction": "outbound"}], FULL)
    with capture_logs() as logs:
        for _ in range(3):
            assert not registry.admit_incoming("a", "announce", FULL).accepted
    assert [entry["event"] for entry in logs] == ["channels.incoming.refused"] * 3


# ---------------------------------------------------------------------- pushes


def test_push_naming_another_servers_channel_registers_it_lazily_for_the_pusher(reverse: bool) -> None:
    registry = ChannelRegistry()
    register_in_order(registry, [("a", {"id": "general", "label": "A's"}), ("c", {"id": "x"})], reverse)
    a_ref = ChannelRef("a", "general")
    before = registry.get(a_ref)
    pushed = registry.push_channel("b", FULL, mcpl_channel_id="general", label="B's")
    assert pushed.ref == ChannelRef("b", "general")
    assert pushed.registered_lazily
    entry = registry.get(pushed.ref)
    assert entry.lazy and entry.descriptor.label == "B's"
    assert registry.get(a_ref) is before  # a's entry exactly as it was
    assert set(registry.refs_with_id("general")) == {a_ref, ChannelRef("b", "general")}
    # A second push finds the lazy channel and registers nothing.
    again = registry.push_channel("b", FULL, mcpl_channel_id="general")
    assert again.ref == pushed.ref and not again.registered_lazily


def test_push_naming_its_own_channel_registers_nothing(reverse: bool) -> None:
    registry = ChannelRegistry()
    register_in_order(registry, [("a", {"id": "general"}), ("b", {"id": "general"})], reverse)
    pushed = registry.push_channel("b", FULL, mcpl_channel_id="general")
    assert pushed.ref == ChannelRef("b", "general")
    assert not pushed.registered_lazily
    assert not registry.get(pushed.ref).lazy


def test_push_by_native_id_resolves_through_the_pushing_servers_address_only(reverse: bool) -> None:
    registry = ChannelRegistry()
    register_in_order(
        registry,
        [
            ("a", {"id": "discord:1:123", "address": {"guildId": "1", "channelId": "123"}}),
            ("b", {"id": "discord:9:456", "address": {"guildId": "9", "channelId": "456"}}),
        ],
        reverse,
    )
    assert registry.push_channel("a", FULL, native_channel_id="123").ref == ChannelRef("a", "discord:1:123")
    # b never described native 123: a's channel is not b's, and nothing is registered.
    missing = registry.push_channel("b", FULL, native_channel_id="123")
    assert missing.ref is None and not missing.registered_lazily
    assert "native id" in missing.reason
    # A guildId is not a channel id.
    assert registry.push_channel("a", FULL, native_channel_id="1").ref is None
    assert len(registry) == 2


def test_lazy_register_stays_within_the_grant() -> None:
    registry = ChannelRegistry()
    registry.register("a", [{"id": "general"}], FULL)
    no_grant = registry.push_channel("b", RegistrationPolicy(may_receive=True), mcpl_channel_id="general")
    assert no_grant.ref is None and "channels.register" in no_grant.reason
    narrowed = RegistrationPolicy(may_register=True, id_patterns=("slack:*",))
    outside = registry.push_channel("b", narrowed, mcpl_channel_id="general")
    assert outside.ref is None and "outside" in outside.reason
    assert list(registry.refs_with_id("general")) == [ChannelRef("a", "general")]


def test_lazy_channel_takes_its_descriptor_when_registered_properly() -> None:
    registry = ChannelRegistry()
    pushed = registry.push_channel("b", FULL, mcpl_channel_id="general", native_channel_id="77")
    assert registry.refs_with_native_id("b", "77")
    registry.register("b", [{"id": "general", "label": "General", "initiallyOpen": True}], FULL)
    entry = registry.get(pushed.ref)
    assert not entry.lazy
    assert entry.open is True
    assert entry.descriptor.label == "General"
    assert not registry.refs_with_native_id("b", "77")  # the new descriptor has no address


def test_indexes_hold_refs_never_bare_or_joined_strings() -> None:
    registry = ChannelRegistry()
    registry.register("a", [{"id": "b:room"}], FULL)
    registry.register("a:b", [{"id": "room"}], FULL)
    for name in ("b:room", "room"):
        assert all(isinstance(ref, ChannelRef) for ref in registry.refs_with_id(name))
    assert all(isinstance(ref, ChannelRef) for ref in registry.refs_with_qualified_name("a:b:room"))
    assert all(isinstance(entry.ref, ChannelRef) for entry in registry.all_entries())


def test_descriptor_built_in_code_is_validated_too() -> None:
    with pytest.raises(ValueError):
        ChannelDescriptor(id="")
    with pytest.raises(ValueError):
        ChannelDescriptor(id="x", direction="sideways")  # type: ignore[arg-type]
    assert ChannelDescriptor(id="x").label == "x"
