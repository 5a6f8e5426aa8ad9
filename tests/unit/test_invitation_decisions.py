"""A message wake's closed-channel invitation is decided once per (agent, channel) and kept until
something it reads changes (issue 30): the channel lifecycle's ``has_open`` keeps its answer
while the registry's generation, the agents' decisions and the agent's fork home stand, and
:meth:`Invitations.for_agent` keeps the rest (registered, the spec's mode and publish right, the
text per author) while the registry's generation and the agent's spec stand. Wired as the
daemon wires them (``SessionManager.wake_params`` over ``Invitations(router,
lifecycle.has_open)``); a real registry and journal, no sockets.

What is kept must never outlive what it was decided from: each test changes one input (the
agent's own decision, another agent's, a fork home, the registry, the spec) and checks the next
wake is decided anew, with what a fresh, keep-nothing decision says.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mcpl_router.events import EventBus
from mcpl_router.hosts.sessions import SessionManager
from mcpl_router.metrics import DaemonMetrics
from mcpl_router.routing.agents import AgentSpec
from mcpl_router.routing.desired import CLOSED, OPEN, DesiredChannels
from mcpl_router.routing.modes import mode_named
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import ChannelEntry, RegistrationPolicy
from mcpl_router.routing.router import Router
from mcpl_router.routing.wakes import REASON_MESSAGE, Wake
from mcpl_router.store.journal import Journal
from mcpl_router.tools.channel_lifecycle import HAS_OPEN_KEPT, ChannelLifecycle
from mcpl_router.turns.invitations import AUTHORS_KEPT, INVITATION_CACHE, Invitations

FULL = RegistrationPolicy.permissive()
GENERAL = ChannelRef("a", "general")
LOUNGE = ChannelRef("a", "lounge")  # registered open (initiallyOpen)
#: The rule itself, not counted by the ``asked`` fixture.
RULE = DesiredChannels.has_open


class World:
    """A registry, a lifecycle, invitations and sessions as the daemon wires them; fork homes
    in a dict the lifecycle reads (the daemon gives ``Forks.home_of``)."""

    def __init__(self, journal: Journal) -> None:
        self.router = Router()
        registered = self.router.registry.register("a", [{"id": "general"}, {"id": "lounge", "initiallyOpen": True}], FULL)
        assert all(result.accepted for result in registered)
        self.homes: dict[str, ChannelRef] = {}
        self.lifecycle = ChannelLifecycle(self.router, {}, journal, fork_home=self.homes.get, events=EventBus())
        self.invitations = Invitations(self.router, self.lifecycle.has_open)
        self.sessions = SessionManager(agents={}, journal=journal, router=self.router, metrics=DaemonMetrics([]),
                                       invitations=self.invitations, servers_list=list)
        for name in ("kai", "mo"):
            self.sessions.directory.specs[name] = AgentSpec(name=name)
        self.seq = 0

    def invitation(self, agent: str, ref: ChannelRef, author: str = "Dee") -> object:
        """What the next message's wake for ``agent`` in ``ref`` carries as its invitation."""
        self.seq += 1
        wake = Wake(self.seq, agent, REASON_MESSAGE, ref, {"author": {"name": author}, "text": "hi"}, ("chat:mention",), True, "a")
        return self.sessions.wake_params(wake).get("invitation")

    def fresh(self, agent: str, ref: ChannelRef, author: str = "Dee") -> str | None:
        """What a decision keeping nothing says now (the rule itself, asked anew)."""
        spec = self.sessions.directory.specs[agent]
        wake = Wake(0, agent, REASON_MESSAGE, ref, {"author": {"name": author}}, (), True, "a")
        desired = self.lifecycle.desired
        plain = Invitations(self.router, lambda who, where: RULE(desired, who, where, self.router.registry.get(where),
                                                                  home=self.homes.get(who)))
        return plain.invitation_for(wake, spec.mode, may_publish=spec.allowed_tools is None)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    opened = Journal(tmp_path / "journal.sqlite3")
    yield opened
    opened.close()


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ChannelRef]]:
    """Each time the decisions' rule is asked whether an agent has a channel open (the work
    the kept answer saves)."""
    calls: list[tuple[str, ChannelRef]] = []
    real = DesiredChannels.has_open

    def counted(self: DesiredChannels, agent: str, ref: ChannelRef, entry: ChannelEntry | None, *,
                home: ChannelRef | None = None) -> bool:
        calls.append((agent, ref))
        return real(self, agent, ref, entry, home=home)

    monkeypatch.setattr(DesiredChannels, "has_open", counted)
    return calls


def test_a_channels_wakes_ask_once_whether_the_agent_has_it_open(journal: Journal, asked: list[tuple[str, ChannelRef]]) -> None:
    world = World(journal)
    first = world.invitation("kai", GENERAL)
    assert isinstance(first, str) and first.startswith("[channels] Dee addressed you in general")
    for _ in range(49):
        assert world.invitation("kai", GENERAL) == first
    assert asked == [("kai", GENERAL)]  # once for 50 wakes, not 50 times
    assert world.invitation("mo", GENERAL) == first  # another agent: its own answer
    assert world.invitation("kai", LOUNGE) is None  # another channel (open as registered): its own
    assert asked == [("kai", GENERAL), ("mo", GENERAL), ("kai", LOUNGE)]
    # Another author: another text, and the same kept answer.
    assert world.invitation("kai", GENERAL, author="Eve") == world.fresh("kai", GENERAL, author="Eve") != first
    assert len(asked) == 3


def test_the_agents_own_decision_is_heard_at_its_next_wake(journal: Journal, asked: list[tuple[str, ChannelRef]]) -> None:
    world = World(journal)
    assert world.invitation("mo", LOUNGE) is None  # open as registered: every undecided agent's
    generation = world.router.registry.generation
    world.lifecycle.decide("mo", LOUNGE, CLOSED)  # no registry change: the decisions' alone
    assert world.router.registry.generation == generation
    assert world.invitation("mo", LOUNGE) == world.fresh("mo", LOUNGE) is not None
    world.lifecycle.decide("mo", LOUNGE, OPEN)
    assert world.invitation("mo", LOUNGE) is None
    assert len(asked) == 3  # decided anew after each decision


def test_another_agents_decision_is_heard_too(journal: Journal) -> None:
    """kai opening general puts kai there, not mo; kai closing it again (the transport stays
    open) makes it everyone's again: mo's answer reads kai's decision."""
    world = World(journal)
    world.router.registry.set_open(GENERAL, True)
    world.lifecycle.decide("kai", GENERAL, OPEN)
    assert world.invitation("kai", GENERAL) is None
    invited = world.invitation("mo", GENERAL)
    assert invited is not None and invited == world.fresh("mo", GENERAL)
    world.lifecycle.decide("kai", GENERAL, CLOSED)  # the transport stays open: no registry change
    assert world.invitation("mo", GENERAL) is None and world.fresh("mo", GENERAL) is None
    assert world.invitation("kai", GENERAL) == world.fresh("kai", GENERAL) is not None


def test_a_fork_home_is_heard_at_the_forks_next_wake(journal: Journal) -> None:
    world = World(journal)
    world.sessions.directory.specs["kai-a-general-1"] = AgentSpec(name="kai-a-general-1")
    assert world.invitation("kai-a-general-1", GENERAL) is not None  # no fork yet: invited
    world.homes["kai-a-general-1"] = GENERAL  # spawned, homed on general: in it
    assert world.invitation("kai-a-general-1", GENERAL) is None
    world.homes["kai-a-general-1"] = LOUNGE  # (a name means one home; moved here only to see it read)
    assert world.invitation("kai-a-general-1", GENERAL) == world.fresh("kai-a-general-1", GENERAL) is not None
    del world.homes["kai-a-general-1"]
    assert world.invitation("kai-a-general-1", GENERAL) is not None


def test_the_registry_and_the_spec_are_heard(journal: Journal) -> None:
    world = World(journal)
    named = world.invitation("kai", GENERAL)
    assert named is not None
    # Another server's general: the shown name is qualified from now on, in the kept text too.
    assert world.router.registry.register("b", [{"id": "general"}], FULL)[0].accepted
    qualified = world.invitation("kai", GENERAL)
    assert qualified == world.fresh("kai", GENERAL) != named
    # Withdrawn: no invitation (not registered); registered again: invited again.
    world.router.registry.withdraw("a", ["general"])
    assert world.invitation("kai", GENERAL) is None
    assert world.router.registry.register("a", [{"id": "general"}], FULL)[0].accepted
    assert world.invitation("kai", GENERAL) == qualified
    # Opened by a tune-out or a send (the registry's open state): every undecided agent's.
    world.router.registry.set_open(GENERAL, True)
    assert world.invitation("kai", GENERAL) is None
    world.router.registry.set_open(GENERAL, False)
    # A new spec (a reload, a hello): its mode and publish right, at once.
    texts = {qualified}
    for spec in (AgentSpec(name="kai", prose_routing="named"), AgentSpec(name="kai", prose_routing="named", allowed_tools=("channel_list",))):
        world.sessions.directory.specs["kai"] = spec
        text = world.invitation("kai", GENERAL)
        assert isinstance(text, str) and text == world.fresh("kai", GENERAL) and text not in texts
        texts.add(text)
        assert text == world.invitations.invitation_for(
            Wake(0, "kai", REASON_MESSAGE, GENERAL, {"author": {"name": "Dee"}}, (), True, "a"), mode_named(spec.prose_routing),
            may_publish=spec.allowed_tools is None)


def test_what_is_kept_is_bounded_whatever_the_servers_send(journal: Journal) -> None:
    world = World(journal)
    for n in range(AUTHORS_KEPT * 3):
        assert world.invitation("kai", GENERAL, author=f"user-{n}") == world.fresh("kai", GENERAL, author=f"user-{n}")
    assert all(len(kept.texts) <= AUTHORS_KEPT for kept in world.invitations._kept.values())
    channels = [{"id": f"c{n}"} for n in range(max(INVITATION_CACHE, HAS_OPEN_KEPT // 2) + 10)]
    assert all(result.accepted for result in world.router.registry.register("a", channels, FULL))
    for n in range(len(channels)):
        for agent in ("kai", "mo"):
            assert world.invitation(agent, ChannelRef("a", f"c{n}")) is not None
    assert len(world.invitations._kept) <= INVITATION_CACHE
    assert len(world.lifecycle._kept) <= HAS_OPEN_KEPT
