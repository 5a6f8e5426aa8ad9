"""The wake policy (pure): the default wakes on addressed messages, DMs and pushes; channels,
servers and tags widen and narrow it as ``routing/wakes.py`` documents."""

from __future__ import annotations

from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.tags import expand_tags
from mcpl_router.routing.wakes import InboundFacts, WakePolicy, agents_woken, resolve_policy, wakes

A_GENERAL = ChannelRef("a", "general")
B_GENERAL = ChannelRef("b", "general")


def message(ref: ChannelRef, *tags: str, is_dm: bool = False) -> InboundFacts:
    return InboundFacts("message", ref.server_id, ref, expand_tags(tags), is_dm=is_dm)


def push(server: str, ref: ChannelRef | None = None, *tags: str) -> InboundFacts:
    return InboundFacts("push", server, ref, expand_tags(tags))


DEFAULT = WakePolicy()


def test_default_wakes_on_addressed_messages_dms_and_pushes() -> None:
    assert not wakes(DEFAULT, message(A_GENERAL))
    assert not wakes(DEFAULT, message(A_GENERAL, "chat:ambient"))
    assert wakes(DEFAULT, message(A_GENERAL, "chat:mention"))
    assert wakes(DEFAULT, message(A_GENERAL, "chat:reply", "chat:ambient"))
    assert wakes(DEFAULT, message(A_GENERAL, "chat:dm"))
    assert wakes(DEFAULT, message(ChannelRef("a", "dm:1"), is_dm=True))
    assert wakes(DEFAULT, push("heartbeat"))
    assert wakes(DEFAULT, push("a", A_GENERAL))


def test_channels_widen_to_every_message_there_on_that_server_only() -> None:
    policy = WakePolicy(channels=frozenset({B_GENERAL}))
    assert wakes(policy, message(B_GENERAL))
    assert not wakes(policy, message(A_GENERAL))
    # Still woken when addressed elsewhere (default tags), but pushes only from its scope.
    assert wakes(policy, message(A_GENERAL, "chat:mention"))
    assert wakes(policy, push("b", B_GENERAL))
    assert not wakes(policy, push("a", A_GENERAL))
    assert not wakes(policy, push("heartbeat"))


def test_servers_widen_to_everything_from_them() -> None:
    policy = WakePolicy(servers=frozenset({"a"}))
    assert wakes(policy, message(A_GENERAL))
    assert wakes(policy, push("a"))
    assert not wakes(policy, message(B_GENERAL))
    assert not wakes(policy, push("b"))


def test_tags_replace_the_default() -> None:
    only_humans = WakePolicy(tags=("chat:from-human",))
    assert wakes(only_humans, message(A_GENERAL, "chat:from-human"))
    assert not wakes(only_humans, message(A_GENERAL, "chat:mention"))
    assert not wakes(only_humans, message(ChannelRef("a", "dm:1"), is_dm=True))
    wildcard = WakePolicy(tags=("chat:*",))
    assert wakes(wildcard, message(A_GENERAL, "chat:ambient"))
    deaf = WakePolicy(channels=frozenset({A_GENERAL}), tags=())
    assert not wakes(deaf, message(B_GENERAL, "chat:mention"))
    assert wakes(deaf, message(A_GENERAL))


def test_names_resolve_to_every_channel_they_name_at_decision_time() -> None:
    registered = {"general": [A_GENERAL, B_GENERAL], "b:general": [B_GENERAL]}
    both = resolve_policy(["general"], [], None, lambda name: registered.get(name, []))
    assert both.channels == {A_GENERAL, B_GENERAL}
    one = resolve_policy(["b:general"], [], None, lambda name: registered.get(name, []))
    assert one.channels == {B_GENERAL}
    assert resolve_policy(["nowhere"], [], [], lambda name: []).channels == frozenset()


def test_each_matching_agent_is_woken() -> None:
    policies = [("kai", DEFAULT), ("bo", WakePolicy(servers=frozenset({"b"}), tags=())), ("cy", WakePolicy(tags=()))]
    assert agents_woken(policies, message(B_GENERAL, "chat:mention")) == ["kai", "bo"]
    assert agents_woken(policies, message(A_GENERAL)) == []
    assert agents_woken(policies, push("x")) == ["kai", "cy"]
