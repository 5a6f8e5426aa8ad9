"""Whom an event wakes is decided once per (kind, server, channel, tags) and reused until the
registry or an agent changes (hosts/directory.py), and a message that involves no fork is not
routed through the fork book (hosts/forks.py). A real registry and journal; no sockets.

What is kept must never outlive what it was decided from: each test below changes one input
(a channel registered that a policy names, a descriptor becoming a DM, an agent declared or
reconfigured, the tags) and checks the next message is decided anew.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import mcpl_router.hosts.directory as directory_module
from mcpl_router.store.records import EventKind
from mcpl_router.config import AgentConfig
from mcpl_router.hosts.agents import spec_from_config
from mcpl_router.hosts.directory import DECISION_CACHE, AgentDirectory
from mcpl_router.hosts.forks import Forks
from mcpl_router.routing.agents import AgentSpec
from mcpl_router.routing.forks import ConversationsSpec
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import RegistrationPolicy
from mcpl_router.routing.router import Router
from mcpl_router.routing.wakes import InboundFacts, WakePolicy
from mcpl_router.store.journal import Delivery, InboundEvent, Journal

FULL = RegistrationPolicy.permissive()


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    opened = Journal(tmp_path / "journal.sqlite3")
    yield opened
    opened.close()


def _directory(journal: Journal, **agents: AgentConfig) -> tuple[AgentDirectory, Router]:
    router = Router()
    assert router.registry.register("a", [{"id": "general"}, {"id": "random"}], FULL)[0].accepted
    return AgentDirectory(agents=agents, journal=journal, router=router), router


def _message(channel: str, *tags: str, server: str = "a", n: int = 0) -> InboundEvent:
    payload: dict[str, object] = {"channelId": channel, "messageId": f"m-{n}", "text": "hi", "tags": list(tags)}
    return InboundEvent(server, channel, EventKind.MESSAGE, f"m-{n}", payload)


def _woken(directory: AgentDirectory, event: InboundEvent) -> list[str]:
    return [delivery.agent for delivery in directory.deliveries_for(event)]


@pytest.fixture
def decisions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each agent's policy asked of an event (the work the kept decision saves)."""
    asked: list[str] = []
    real = directory_module.wakes

    def counted(policy: WakePolicy, facts: InboundFacts) -> bool:
        asked.append(facts.channel.channel_id if facts.channel is not None else "")
        return real(policy, facts)

    monkeypatch.setattr(directory_module, "wakes", counted)
    return asked


def test_a_channels_messages_are_decided_once_while_nothing_changes(journal: Journal, decisions: list[str]) -> None:
    directory, _ = _directory(journal, ann=AgentConfig("ann", wake_channels=("general",)), bo=AgentConfig("bo"))
    for n in range(50):
        assert _woken(directory, _message("general", n=n)) == ["ann"]
    assert len(decisions) == 2  # each agent's policy once, not 50 times
    assert _woken(directory, _message("general", "chat:mention", n=51)) == ["ann", "bo"]  # other tags: decided anew
    assert _woken(directory, _message("random", n=52)) == []  # another channel: decided anew
    assert len(decisions) == 6


def test_the_deliveries_are_the_ones_decided_and_no_caller_can_change_them(journal: Journal) -> None:
    directory, _ = _directory(journal, ann=AgentConfig("ann", wake_channels=("general",)))
    first = directory.deliveries_for(_message("general", "chat:reply", n=1))
    assert first == (Delivery("ann", "message", ("chat:reply", "chat:addressed"), True),)
    # The kept decision itself is handed out: a tuple, so no caller can change what the next
    # message of the channel is told.
    assert isinstance(first, tuple)
    assert directory.deliveries_for(_message("general", "chat:reply", n=2)) is first


def test_a_channel_registered_later_that_a_policy_names_is_heard_from_then_on(journal: Journal) -> None:
    directory, router = _directory(journal, ann=AgentConfig("ann", wake_channels=("news",)))
    assert _woken(directory, _message("news", n=1)) == []  # not registered yet: the name resolves to nothing
    assert router.registry.register("a", [{"id": "news"}], FULL)[0].accepted
    assert _woken(directory, _message("news", n=2)) == ["ann"]


def test_a_channel_that_becomes_a_dm_wakes_the_default_agent(journal: Journal) -> None:
    directory, router = _directory(journal, bo=AgentConfig("bo"))
    assert _woken(directory, _message("general", n=1)) == []
    assert router.registry.register("a", [{"id": "general", "type": "dm"}], FULL)[0].accepted  # re-registered as a DM
    assert router.registry.get(ChannelRef("a", "general")) is not None
    assert router.registry.get(ChannelRef("a", "general")).descriptor.is_dm  # type: ignore[union-attr]
    assert _woken(directory, _message("general", n=2)) == ["bo"]


def test_an_agent_declared_or_reconfigured_later_is_decided_for_at_once(journal: Journal) -> None:
    directory, _ = _directory(journal, ann=AgentConfig("ann"))
    assert _woken(directory, _message("general", n=1)) == []
    # A hello's spec goes straight into the specs (hosts/sessions.py): no call tells the directory.
    directory.specs["cy"] = AgentSpec(name="cy", wake_servers=("a",))
    assert _woken(directory, _message("general", n=2)) == ["cy"]
    added, changed = directory.configure_agents({"ann": AgentConfig("ann", wake_channels=("general",))})  # a reload
    assert (added, changed) == ([], ["ann"])
    assert _woken(directory, _message("general", n=3)) == ["ann", "cy"]
    directory.specs["cy"] = AgentSpec(name="cy")  # re-declared narrower, same name
    assert _woken(directory, _message("general", n=4)) == ["ann"]


def test_pushes_are_kept_apart_from_messages_of_the_same_channel(journal: Journal) -> None:
    directory, _ = _directory(journal, bo=AgentConfig("bo"))
    assert _woken(directory, _message("general", n=1)) == []
    push = InboundEvent("a", "general", EventKind.PUSH, "e-1", {"eventId": "e-1"})
    assert _woken(directory, push) == ["bo"]  # a push wakes an unscoped agent; a plain message doesn't
    assert _woken(directory, InboundEvent("a", None, EventKind.PUSH, "e-2", None)) == ["bo"]


def test_the_kept_decisions_are_bounded_whatever_tags_the_servers_send(journal: Journal) -> None:
    directory, _ = _directory(journal, bo=AgentConfig("bo", wake_tags=("x:*",)))
    for n in range(DECISION_CACHE + 10):
        assert _woken(directory, _message("general", f"x:{n}", n=n)) == ["bo"]
    assert len(directory._decisions) <= DECISION_CACHE


async def test_a_message_involving_no_fork_keeps_the_policys_deliveries_and_a_forking_agent_still_forks(journal: Journal) -> None:
    directory, router = _directory(journal, ann=AgentConfig("ann"),
                                   kai=AgentConfig("kai", conversations=ConversationsSpec(template="t")))
    assert router.registry.register("a", [{"id": "dm-1", "type": "dm"}], FULL)[0].accepted

    async def notify(agent: str, notice: object) -> bool:
        return True

    forks = Forks(registry=router.registry, journal=journal, policy_deliveries=directory.deliveries_for,
                  agent_of=directory.agent, owner_of=lambda name: None, notify_agent=notify)
    plain = forks.deliveries_for(_message("general", "chat:mention", n=1))
    assert [d.agent for d in plain] == ["ann", "kai"]  # kai forks DMs only: a channel's message stays its own
    assert forks.book.bindings() == []
    dm = forks.deliveries_for(_message("dm-1", n=2))
    assert [d.agent for d in dm] == ["ann", "fork-a-dm-1-1"]  # kai's DM message goes to a new fork
    # Once the fork exists, kai's DM messages go to it, and the fork is never woken by the policy itself.
    directory.specs["fork-a-dm-1-1"] = spec_from_config(AgentConfig("fork-a-dm-1-1"))
    again = forks.deliveries_for(_message("dm-1", n=3))
    assert [d.agent for d in again] == ["ann", "fork-a-dm-1-1"]


async def test_a_decision_remembered_as_naming_no_fork_is_routed_again_once_its_agent_forks(journal: Journal) -> None:
    """The forks remember a kept decision that names no forking agent and hand it back as it is;
    an agent reconfigured to fork makes the policy decide anew (new tuples), and its next DM
    message goes to a fork, not to it."""
    directory, router = _directory(journal, kai=AgentConfig("kai"))
    assert router.registry.register("a", [{"id": "dm-1", "type": "dm"}], FULL)[0].accepted

    async def notify(agent: str, notice: object) -> bool:
        return True

    forks = Forks(registry=router.registry, journal=journal, policy_deliveries=directory.deliveries_for,
                  agent_of=directory.specs.get, owner_of=lambda name: None, notify_agent=notify)
    first = forks.deliveries_for(_message("dm-1", n=1))
    assert [d.agent for d in first] == ["kai"]
    assert forks.deliveries_for(_message("dm-1", n=2)) is first  # remembered: handed back as it is
    directory.specs["kai"] = spec_from_config(AgentConfig("kai", conversations=ConversationsSpec(template="t")))
    forked = forks.deliveries_for(_message("dm-1", n=3))
    assert [d.agent for d in forked] == ["fork-a-dm-1-1"]
    assert forks.book.any_forks()
