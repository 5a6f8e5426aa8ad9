"""Conversation forks: the config's shape and messages, the pure decision and its counters
(routing/forks.py), and the journal's counters (store/schema.py)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpl_router.host_notices import HostNotice, wire_of
from mcpl_router.config import ConfigError, parse_config
from mcpl_router.routing.agents import AgentSpec
from mcpl_router.hosts.agents import AgentSpecParams, spec_from_params
from mcpl_router.routing.forks import (
    WakeRoute,
    route_wakes,
    CHANNEL,
    DM,
    GROUP_DM,
    ConversationsSpec,
    Existing,
    ForkBook,
    KindRules,
    Spawn,
    Unbound,
    counters_of,
    fork_name,
    kind_of,
)
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.store.journal import Journal
from mcpl_router.store.schema import SCHEMA_VERSION
from mcpl_router.testing.journal import open_journal

A_DM = ChannelRef("a", "dm-1")
B_DM = ChannelRef("b", "dm-1")
SPEC = ConversationsSpec(template="kai", fork_prefix="kai-")


def parse(agent: dict[str, Any]) -> Any:
    return parse_config({"mcplServers": {"a": {"url": "ws://127.0.0.1:1/"}}, "agents": {"kai": agent}},
                        source="conf.toml", base_dir=Path("/etc"), environ={})


# -- config ------------------------------------------------------------------------------------


def test_the_config_reads_conversations_with_defaults_per_kind() -> None:
    config = parse({"conversations": {"forkPrefix": "k-", "idleTtl": 60, "closurePrompt": "bye",
                                      "groupDm": {"trigger": "always"}, "channel": {"trigger": "mention", "bind": "mention"}}})
    spec = config.agents["kai"].conversations
    assert spec is not None
    assert spec.template == "kai" and spec.fork_prefix == "k-" and spec.idle_ttl == 60 and spec.closure_prompt == "bye"
    assert spec.rules_for(DM) == KindRules("always", "always")
    assert spec.rules_for(GROUP_DM) == KindRules("always", "always")
    assert spec.rules_for(CHANNEL) == KindRules("mention", "mention")
    assert parse({}).agents["kai"].conversations is None


def test_the_config_refuses_a_bad_rule_with_its_key_and_fix() -> None:
    with pytest.raises(ConfigError) as caught:
        parse({"conversations": {"dm": {"trigger": "mentoin"}, "idleTtl": 0, "forkPrefix": "a b", "tmeplate": "x"}})
    text = "\n".join(str(error) for error in caught.value.errors)
    assert "agents.kai.conversations.dm.trigger" in text and 'Did you mean "mention"' in text
    assert "agents.kai.conversations.idleTtl" in text
    assert "agents.kai.conversations.forkPrefix" in text and "whitespace" in text
    assert "agents.kai.conversations.tmeplate" in text and 'Did you mean "template"' in text


def test_a_hello_spec_reads_conversations_as_the_config_does() -> None:
    spec = spec_from_params(msgspec.convert({"name": "kai", "conversations": {"template": "kai-t"}}, AgentSpecParams))
    assert spec.conversations is not None and spec.conversations.template == "kai-t"
    assert spec.to_wire()["conversations"]["dm"] == {"trigger": "always", "bind": "always"}
    with pytest.raises(msgspec.ValidationError, match="conversations.channel.bind"):
        msgspec.convert({"name": "kai", "conversations": {"channel": {"bind": "sometimes"}}}, AgentSpecParams)


# -- the decision ------------------------------------------------------------------------------


def test_two_servers_dms_on_one_id_each_spawn_their_own_fork_named_by_server() -> None:
    book = ForkBook()
    first = book.decide("kai", SPEC, A_DM, DM, addressed=True)
    assert first == Spawn("kai-a-dm-1-1", A_DM, 1)
    book.reserve("kai", first, 0.0)
    second = book.decide("kai", SPEC, B_DM, DM, addressed=True)
    assert second == Spawn("kai-b-dm-1-1", B_DM, 1)
    book.reserve("kai", second, 0.0)
    # Each server's next message joins its own fork (pending or bound).
    assert book.decide("kai", SPEC, A_DM, DM, addressed=False) == Existing("kai-a-dm-1-1", A_DM)
    assert book.decide("kai", SPEC, B_DM, DM, addressed=False) == Existing("kai-b-dm-1-1", B_DM)
    assert book.fork("kai-b-dm-1-1") is not None and book.fork("kai-b-dm-1-1").home == B_DM


def test_two_homes_or_agents_that_spell_one_fork_name_never_share_it() -> None:
    """Server ``a-b``'s channel ``c`` and server ``a``'s channel ``b-c`` spell one name, and so
    do two agents with one prefix forking one home: the second is given the next generation,
    so each fork name means one (agent, home)."""
    book = ForkBook()
    first, second = ChannelRef("a-b", "c"), ChannelRef("a", "b-c")
    one = book.decide("kai", SPEC, first, DM, addressed=True)
    book.reserve("kai", one, 0.0)
    other = book.decide("kai", SPEC, second, DM, addressed=True)
    assert other.fork != one.fork and other.generation == 2
    book.reserve("kai", other, 0.0)
    assert book.home_of(one.fork) == first and book.home_of(other.fork) == second
    theirs = book.decide("ann", SPEC, first, DM, addressed=True)
    assert theirs.fork not in (one.fork, other.fork)
    book.reserve("ann", theirs, 0.0)
    assert book.decide("kai", SPEC, first, DM, addressed=False) == Existing(one.fork, first)
    assert book.decide("ann", SPEC, first, DM, addressed=False) == Existing(theirs.fork, first)


def test_the_kind_rules_decide_spawn_bind_and_trunk() -> None:
    book = ForkBook()
    general = ChannelRef("a", "general")
    assert isinstance(book.decide("kai", SPEC, general, CHANNEL, addressed=True), Unbound)  # channel: never
    group = ChannelRef("a", "g")
    assert isinstance(book.decide("kai", SPEC, group, GROUP_DM, addressed=False), Unbound)  # mention
    spawn = book.decide("kai", SPEC, group, GROUP_DM, addressed=True)
    assert isinstance(spawn, Spawn)
    book.reserve("kai", spawn, 0.0)
    mention_bind = ConversationsSpec(template="kai", rules={GROUP_DM: KindRules("mention", "mention")})
    assert isinstance(book.decide("kai", mention_bind, group, GROUP_DM, addressed=False), Unbound)
    assert isinstance(book.decide("kai", mention_bind, group, GROUP_DM, addressed=True), Existing)


def test_kinds_by_descriptor() -> None:
    assert kind_of("dm", True) == DM
    assert kind_of("group_dm", False) == GROUP_DM
    assert kind_of("text", False) == CHANNEL
    assert fork_name("f-", ChannelRef("a b", "c"), 3) == "f-a_b-c-3"


def test_a_late_spawns_bind_never_lowers_the_counter_nor_takes_the_channel() -> None:
    book = ForkBook()
    old = book.decide("kai", SPEC, B_DM, DM, addressed=True)
    book.reserve("kai", old, 0.0)
    book.release(old.fork, "spawn failed")
    new = book.decide("kai", SPEC, B_DM, DM, addressed=True)
    assert isinstance(new, Spawn) and new.generation == 2
    book.reserve("kai", new, 1.0)
    assert book.bind("kai", B_DM, new.fork, new.generation) is not None
    # The first spawn's answer comes late: it binds nothing and the counter stays at 2.
    assert book.bind("kai", B_DM, old.fork, old.generation) is None
    assert book.generation("kai", B_DM) == 2
    assert book.binding("kai", B_DM).fork == "kai-b-dm-1-2"
    # Released, the next is newer still.
    book.release(new.fork, "idle")
    assert book.decide("kai", SPEC, B_DM, DM, addressed=True) == Spawn("kai-b-dm-1-3", B_DM, 3)


def test_idle_forks_by_their_agents_ttl() -> None:
    book = ForkBook()
    spawn = book.decide("kai", SPEC, A_DM, DM, addressed=True)
    book.reserve("kai", spawn, 0.0)
    assert book.idle({"kai": 10.0}, 100.0) == []  # pending: not idle
    book.bind("kai", A_DM, spawn.fork, spawn.generation)
    book.touched(spawn.fork, 5.0)
    assert book.next_idle_deadline({"kai": 10.0}) == 15.0
    assert book.idle({"kai": 10.0}, 14.0) == []
    assert [b.fork for b in book.idle({"kai": 10.0}, 15.0)] == [spawn.fork]


refs = st.builds(ChannelRef, st.sampled_from(["a", "b", "c"]), st.sampled_from(["general", "dm-1", "x"]))
steps = st.lists(st.tuples(st.sampled_from(["spawn", "bind", "late", "release"]), refs), max_size=40)


@settings(max_examples=200, deadline=None)
@given(steps)
def test_no_fork_name_is_proposed_twice_and_no_counter_goes_down(plan: list[tuple[str, ChannelRef]]) -> None:
    book = ForkBook()
    proposed: set[str] = set()
    reserved: dict[ChannelRef, list[Spawn]] = {}
    for step, ref in plan:
        before = book.generation("kai", ref)
        if step == "spawn" and book.binding("kai", ref) is None:
            decision = book.decide("kai", SPEC, ref, DM, addressed=True)
            assert isinstance(decision, Spawn)
            assert decision.fork not in proposed
            assert ref.server_id in decision.fork
            proposed.add(decision.fork)
            book.reserve("kai", decision, 0.0)
            reserved.setdefault(ref, []).append(decision)
        elif step == "bind" and book.binding("kai", ref) is not None:
            binding = book.binding("kai", ref)
            book.bind("kai", ref, binding.fork, binding.generation)
        elif step == "late" and reserved.get(ref):
            oldest = reserved[ref][0]
            book.bind("kai", ref, oldest.fork, oldest.generation)
        elif step == "release" and book.binding("kai", ref) is not None:
            book.release(book.binding("kai", ref).fork, "test")
        assert book.generation("kai", ref) >= before
        # Bindings are per ref: no two refs share one fork.
        forks = [b.fork for b in book.bindings()]
        assert len(forks) == len(set(forks))


# -- the journal's counters ----------------------------------------------------------------------


async def test_counters_survive_a_restart_and_are_never_lowered(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    async with open_journal(path) as journal:
        journal.raise_fork_generation("kai", "b", "dm-1", 2)
        journal.raise_fork_generation("kai", "b", "dm-1", 1)  # a late spawn's
        journal.raise_fork_generation("kai", "a", "dm-1", 1)
        await journal.flush()
    again = Journal(path)
    try:
        assert counters_of(again.fork_generations()) == {("kai", B_DM): 2, ("kai", A_DM): 1}
    finally:
        again.close()


def test_a_version_1_journal_gains_the_fork_counters(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    Journal(path).close()
    db = sqlite3.connect(str(path))
    # Version 1 had neither table of versions 2 (fork counters) and 3 (tune-outs).
    db.execute("DROP TABLE fork_generations")
    db.execute("DROP TABLE tune_outs")
    db.execute("PRAGMA user_version = 1")
    db.close()
    journal = Journal(path)
    try:
        assert journal.fork_generations() == []
        db = sqlite3.connect(str(path))
        version = db.execute("PRAGMA user_version").fetchone()[0]
        assert version == SCHEMA_VERSION == 4  # through 2 and 3, to 4 at once
        assert db.execute("SELECT COUNT(*) FROM tune_outs").fetchone()[0] == 0
        db.close()
    finally:
        journal.close()


# -- the fence ---------------------------------------------------------------------------------

from mcpl_router.routing.fork_fence import (  # noqa: E402
    REASON_FORK_HOME_GONE,
    REASON_FORK_NAME_ALONE,
    REASON_FORK_NO_OPEN,
    REASON_FORK_NOT_HOME,
    FenceRefusal,
    fenced,
)

HOME = ChannelRef("b", "general")


def fence(verb: str, name: str | None, server_id: str | None, registered: set[ChannelRef] | None = None) -> Any:
    known = {HOME, ChannelRef("a", "general")} if registered is None else registered
    return fenced(verb, HOME, name, server_id, is_registered=known.__contains__, home_names=frozenset({"b:general"}),
                  home_shown="b:general", not_done="Nothing was sent.")


@pytest.mark.parametrize("verb", ["publish", "close", "decline"])
def test_a_name_its_home_answers_to_means_its_home(verb: str) -> None:
    for name, server_id in (("general", None), ("b:general", None), ("general", "b"), (None, "b"), ("", ""), (None, None)):
        assert fence(verb, name, server_id) == HOME, (name, server_id)


@pytest.mark.parametrize("verb", ["publish", "close", "decline"])
def test_another_servers_channel_with_the_homes_id_is_refused_however_named(verb: str) -> None:
    for name, server_id in (("a:general", None), ("general", "a"), (None, "a"), ("other", None), ("b:general", "a")):
        refused = fence(verb, name, server_id)
        assert isinstance(refused, FenceRefusal) and refused.reason == REASON_FORK_NOT_HOME, (name, server_id)
        assert "b:general" in refused.text


def test_the_homes_qualified_name_with_its_server_works_alone_unless_that_pair_is_a_channel() -> None:
    refused = fence("publish", "b:general", "b")
    assert refused.reason == REASON_FORK_NAME_ALONE and "alone" in refused.text
    odd = ChannelRef("b", "b:general")
    refused = fence("publish", "b:general", "b", {HOME, odd})
    assert refused.reason == REASON_FORK_NOT_HOME


def test_a_gone_home_is_refused_as_gone_and_a_fork_opens_nothing() -> None:
    gone = fence("close", "general", None, registered={ChannelRef("a", "general")})
    assert gone.reason == REASON_FORK_HOME_GONE
    assert "Nothing was closed" in gone.text and "until its server registers it again" in gone.text
    assert fence("open", "general", None).reason == REASON_FORK_NO_OPEN


def test_a_released_fork_stays_fenced_and_a_restart_remembers_each_homes_newest_fork() -> None:
    """An older generation was released before the newer was reserved: after a restart the
    newest name per home is fenced (the one a host may still hold), not every name ever used."""
    from mcpl_router.hosts.forks import Forks

    book = ForkBook()
    spawn = book.decide("kai", SPEC, B_DM, DM, addressed=True)
    book.reserve("kai", spawn, 0.0)
    book.release(spawn.fork, "idle")
    assert book.fork(spawn.fork) is None and book.home_of(spawn.fork) == B_DM

    class Counters:
        def fork_generations(self) -> list[tuple[str, str, str, int]]:
            return [("kai", "b", "dm-1", 2)]

        def raise_fork_generation(self, agent: str, server_id: str, channel_id: str, generation: int) -> None:
            raise AssertionError("not asked")

    spec = AgentSpec(name="kai", conversations=SPEC)
    forks = Forks(registry=None, journal=Counters(), policy_deliveries=lambda event: [],  # type: ignore[arg-type]
                  agent_of={"kai": spec}.get, owner_of=lambda name: None, notify_agent=lambda *a: None)
    assert forks.home_of("kai-b-dm-1-2") == B_DM and forks.home_of("kai-b-dm-1-1") is None
    assert forks.home_of("kai-b-dm-1-3") is None and forks.home_of("kai") is None
    assert forks.book.generation("kai", B_DM) == 2


def test_the_book_keeps_one_fenced_name_per_home_however_many_generations() -> None:
    """Forks spawned and released again and again: the names fenced grow with the homes, not
    with the spawns; the newest stays fenced to its home after its release."""
    book = ForkBook()
    home = ChannelRef("a", "dm-1")
    names = []
    for _ in range(50):
        spawn = book.decide("kai", SPEC, home, DM, addressed=True)
        assert isinstance(spawn, Spawn)
        book.reserve("kai", spawn, 0.0)
        names.append(spawn.fork)
        assert book.release(spawn.fork, "idle") is not None
    assert len(set(names)) == 50 and book.generation("kai", home) == 50
    assert len(book._homes) == 1 and book.home_of(names[-1]) == home


async def test_a_trunk_that_no_longer_forks_lets_its_bound_forks_go_at_once(autojump_clock: Any) -> None:
    """A reload drops kai's ``conversations``: its bound fork is released (``no-longer-forks``)
    and told so, without waiting out the idle TTL of a rule that is gone."""
    import trio

    from mcpl_router.hosts.forks import Forks

    class Counters:
        def fork_generations(self) -> list[tuple[str, str, str, int]]:
            return []

        def raise_fork_generation(self, agent: str, server_id: str, channel_id: str, generation: int) -> None:
            pass

    specs = {"kai": AgentSpec(name="kai", conversations=ConversationsSpec(template="kai", fork_prefix="kai-", idle_ttl=3600))}
    told: list[tuple[str, str, Any]] = []

    async def notify(agent: str, notice: HostNotice) -> bool:
        method, params = wire_of(notice)
        told.append((agent, method, params))
        return True

    forks = Forks(registry=None, journal=Counters(), policy_deliveries=lambda event: [],  # type: ignore[arg-type]
                  agent_of=specs.get, owner_of=lambda name: None, notify_agent=notify)
    spawn = forks.book.decide("kai", SPEC, A_DM, DM, addressed=True)
    assert isinstance(spawn, Spawn)
    forks.book.reserve("kai", spawn, 0.0)
    assert forks.book.bind("kai", A_DM, spawn.fork, spawn.generation) is not None
    async with trio.open_nursery() as nursery:
        await nursery.start(forks.run)
        await trio.sleep(60)
        assert forks.book.fork(spawn.fork) is not None  # an hour's TTL: still bound
        specs["kai"] = AgentSpec(name="kai")
        forks.agents_changed()
        await trio.sleep(1)
        assert forks.book.fork(spawn.fork) is None and forks.home_of(spawn.fork) == A_DM  # released, still fenced
        nursery.cancel_scope.cancel()
    [(agent, method, params)] = told
    assert (agent, method, params["reason"], params["channel"]) == (spawn.fork, "wake", "fork/close", {"serverId": "a", "channelId": "dm-1"})


# -- who is woken, decided at once (issue 27 item 3) ---------------------------------------------


def _snapshot(book: ForkBook) -> tuple[object, ...]:
    return (book.bindings(), {agent_ref: book.generation(*agent_ref) for agent_ref in [("kai", A_DM), ("mo", A_DM)]},
            [book.home_of(name) for name in ("kai-a-dm-1-1", "kai-a-dm-1-2")])


def test_who_is_woken_is_decided_without_touching_the_book_and_two_spawns_in_one_message_get_names_apart() -> None:
    book = ForkBook()
    shared_prefix = ConversationsSpec(template="t", fork_prefix="kai-")
    before = _snapshot(book)
    routes = route_wakes([("kai", True), ("mo", True), ("plain", False)], ref=A_DM, kind=DM, book=book,
                         conversations_of={"kai": shared_prefix, "mo": shared_prefix}.get)
    assert _snapshot(book) == before  # read only: the shell reserves, journals and asks
    kai, mo, plain = routes
    assert kai.spawn is not None and mo.spawn is not None
    assert kai.recipient == "kai-a-dm-1-1" and mo.recipient == "kai-a-dm-1-2"  # one prefix, one home: names apart
    assert plain == WakeRoute("plain", "plain")
    # Carried out in order, they are what the shell's loop reserves.
    book.reserve("kai", kai.spawn, 0.0)
    book.reserve("mo", mo.spawn, 0.0)
    [again_kai, fork_self] = route_wakes([("kai", True), ("kai-a-dm-1-1", True)], ref=A_DM, kind=DM, book=book,
                                         conversations_of={"kai": shared_prefix}.get)
    assert again_kai == WakeRoute("kai", "kai-a-dm-1-1", touched="kai-a-dm-1-1")
    assert fork_self == WakeRoute("kai-a-dm-1-1", None)  # a fork hears its home by the decision alone
    # A push (no channel) goes to the agent itself.
    assert route_wakes([("kai", True)], ref=None, kind="", book=book, conversations_of={"kai": shared_prefix}.get) == (
        WakeRoute("kai", "kai"),)
