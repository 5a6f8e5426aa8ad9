"""Wake gating: the pure rules (routing/gating.py), the held state (routing/gate_batches.py) and
the shell (hosts/gate.py) over stand-ins on trio's virtual clock.

Servers ``a`` and ``b`` both register ``general``, in both orders: a rule naming ``b:general``
(or a ref to it) matches b's and never a's, and a batched wake routed to b's names ``b``.
"""

from __future__ import annotations

from typing import Any

import attrs
import pytest
import trio

from mcpl_router.hosts.diversion import WakeHolds
from mcpl_router.hosts.gate import WakeGates
from mcpl_router.routing.tuneout import TuneOutTable
from mcpl_router.routing.gate_batches import CAUSE_FULL, CAUSE_QUIET, CAUSE_RATE, CAUSE_WAKE, AgentGate
from mcpl_router.routing.gating import (
    DEBOUNCE,
    DEFER,
    RATE_LIMIT,
    Behaviour,
    ChannelMatch,
    Decision,
    GateFacts,
    GateRule,
    WakeGateSpec,
    decide,
    resolve_rules,
)
from mcpl_router.routing.names import Resolved
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import RegistrationPolicy
from mcpl_router.routing.router import Router
from mcpl_router.routing.wakes import REASON_MESSAGE, REASON_PUSH, Wake
from mcpl_router.testing.descriptors import channel_descriptor

A_GENERAL, B_GENERAL = ChannelRef("a", "general"), ChannelRef("b", "general")
AGENT = "kai"


def wake(seq: int, channel: ChannelRef | None = B_GENERAL, *, tags: tuple[str, ...] = (), reason: str = REASON_MESSAGE,
         addressed: bool = False, server_id: str = "") -> Wake:
    payload = {"messageId": f"m{seq}", "channelId": None if channel is None else channel.channel_id}
    return Wake(seq, AGENT, reason, channel, payload, tags, addressed, server_id or (channel.server_id if channel else ""))


def router_with(order: str) -> Router:
    router = Router()
    for server_id in order:
        assert router.registry.register(server_id, [channel_descriptor("general")], RegistrationPolicy.permissive())[0].accepted
    return router


@pytest.fixture(params=["ab", "ba"])
def order(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# -- rules (pure) ------------------------------------------------------------------------------


def test_rules_match_first_and_fall_back_to_the_default() -> None:
    spec = WakeGateSpec(
        rules=(
            GateRule(Behaviour(DEFER), tags_any=("chat:ambient",), tags_none=("chat:addressed",)),
            GateRule(Behaviour(RATE_LIMIT, per=1, seconds=5), kinds=(REASON_PUSH,)),
            GateRule(Behaviour(DEBOUNCE, ms=100), tags_all=("chat:a*", "x:*"), servers=("a",)),
        ),
        default=Behaviour(DEBOUNCE, ms=50),
    )
    rules = resolve_rules(spec, lambda name: None)

    def decided(facts: GateFacts) -> int | None:
        return decide(rules, spec.default, facts).rule

    assert decided(GateFacts(REASON_MESSAGE, "a", A_GENERAL, ("chat:ambient",))) == 0
    # tagsNone: an addressed message is not deferred by the first rule.
    assert decided(GateFacts(REASON_MESSAGE, "a", A_GENERAL, ("chat:ambient", "chat:addressed", "x:y"))) == 2
    assert decided(GateFacts(REASON_PUSH, "b", None, ("chat:ambient",))) == 0
    assert decided(GateFacts(REASON_PUSH, "b", None, ())) == 1
    assert decided(GateFacts(REASON_MESSAGE, "b", B_GENERAL, ("chat:addressed", "x:y"))) is None  # servers: a only
    assert decide(rules, spec.default, GateFacts(REASON_MESSAGE, "b", B_GENERAL, ())).behaviour == Behaviour(DEBOUNCE, ms=50)


def test_channel_entries_name_one_server_in_both_registration_orders(order: str) -> None:
    router = router_with(order)

    def channel_named(name: str) -> ChannelRef | None:
        resolved = router.names.channel_qualified(name, not_done="")
        return resolved.ref if isinstance(resolved, Resolved) else None

    for entry in (ChannelMatch(name="b:general"), ChannelMatch(ref=B_GENERAL), ChannelMatch(pattern="b:*")):
        spec = WakeGateSpec(rules=(GateRule(Behaviour(DEFER), channels=(entry,)),))
        rules = resolve_rules(spec, channel_named)
        assert decide(rules, spec.default, GateFacts(REASON_MESSAGE, "b", B_GENERAL, ())).rule == 0, entry
        assert decide(rules, spec.default, GateFacts(REASON_MESSAGE, "a", A_GENERAL, ())).rule is None, entry
    # A glob over qualified names may span servers on purpose.
    spec = WakeGateSpec(rules=(GateRule(Behaviour(DEFER), channels=(ChannelMatch(pattern="*:general"),)),))
    rules = resolve_rules(spec, channel_named)
    assert decide(rules, spec.default, GateFacts(REASON_MESSAGE, "a", A_GENERAL, ())).rule == 0
    # A name several channels answer to resolves to none: it matches nothing (never "the first").
    spec = WakeGateSpec(rules=(GateRule(Behaviour(DEFER), channels=(ChannelMatch(name="general"),)),))
    rules = resolve_rules(spec, channel_named)
    assert rules[0].refs == frozenset()


def _register(router: Router, server_id: str, *channel_ids: str) -> None:
    descriptors = [channel_descriptor(channel_id) for channel_id in channel_ids]
    assert all(result.accepted for result in router.registry.register(server_id, descriptors, RegistrationPolicy.permissive()))


def _pair_named(router: Router) -> Any:
    def pair_named(name: str) -> ChannelRef | None:
        resolved = router.names.channel_qualified(name, not_done="")
        return resolved.ref if isinstance(resolved, Resolved) else None

    return pair_named


@pytest.mark.parametrize("servers", [("a", "discord"), ("discord", "a")], ids=["a-first", "discord-first"])
def test_a_name_entry_is_only_ever_a_registered_pair_never_a_bare_id(servers: tuple[str, str]) -> None:
    """Issue 13: ``"discord:123:456"``, a discord-style bare id, was read as the id of whichever
    one server registered it. A name entry matches only the pair whose ``serverId:channelId``
    it is, in both registration orders."""
    router = Router()
    bare = ChannelRef("a", "discord:123:456")
    _register(router, "a", "discord:123:456")
    spec = WakeGateSpec(rules=(GateRule(Behaviour(DEFER), channels=(ChannelMatch(name="discord:123:456"),)),))
    # Only a registers the id: the entry is no pair's, and matches nothing.
    assert resolve_rules(spec, _pair_named(router))[0].refs == frozenset()
    assert isinstance(router.names.channel_named("discord:123:456"), Resolved)  # a tool's name reads it so
    # a's pair, written with its server, matches it.
    qualified = WakeGateSpec(rules=(GateRule(Behaviour(DEFER), channels=(ChannelMatch(name="a:discord:123:456"),)),))
    assert resolve_rules(qualified, _pair_named(router))[0].refs == frozenset({bare})
    # Server "discord" registering "123:456" makes the entry that pair, never a's id, in
    # either order: where channel_named would refuse the name as two channels'.
    router = Router()
    for server_id in servers:
        _register(router, server_id, "discord:123:456" if server_id == "a" else "123:456")
    pair = ChannelRef("discord", "123:456")
    rules = resolve_rules(spec, _pair_named(router))
    assert rules[0].refs == frozenset({pair})
    assert decide(rules, spec.default, GateFacts(REASON_MESSAGE, "discord", pair, ())).rule == 0
    assert decide(rules, spec.default, GateFacts(REASON_MESSAGE, "a", bare, ())).rule is None
    assert not isinstance(router.names.channel_named("discord:123:456"), Resolved)


@pytest.mark.parametrize("servers", [("a", "a:b"), ("a:b", "a")], ids=["a-first", "a:b-first"])
def test_a_qualified_name_two_pairs_share_matches_neither_and_a_ref_names_each(servers: tuple[str, str]) -> None:
    """a's ``b:room`` and a:b's ``room`` are both ``a:b:room``: never split at a colon, so the
    entry is two pairs' and matches neither; a ref names each."""
    router = Router()
    for server_id in servers:
        _register(router, server_id, "b:room" if server_id == "a" else "room")
    a_room, ab_room = ChannelRef("a", "b:room"), ChannelRef("a:b", "room")
    refusal = router.names.channel_qualified("a:b:room")
    assert not isinstance(refusal, Resolved) and set(refusal.candidates) == {a_room, ab_room}
    spec = WakeGateSpec(rules=(
        GateRule(Behaviour(DEFER), channels=(ChannelMatch(name="a:b:room"),)),
        GateRule(Behaviour(DEBOUNCE, ms=10), channels=(ChannelMatch(ref=ab_room),)),
    ))
    rules = resolve_rules(spec, _pair_named(router))
    assert rules[0].refs == frozenset()
    assert decide(rules, spec.default, GateFacts(REASON_MESSAGE, "a", a_room, ())).rule is None
    assert decide(rules, spec.default, GateFacts(REASON_MESSAGE, "a:b", ab_room, ())).rule == 1


async def test_the_shell_holds_by_the_pair_and_logs_a_bare_id_with_the_servers_that_have_it(
    autojump_clock: trio.abc.Clock, order: str
) -> None:
    from structlog.testing import capture_logs

    spec = WakeGateSpec(rules=(GateRule(Behaviour(DEFER), channels=(ChannelMatch(name="discord:1:2"), ChannelMatch(name="b:general"))),))
    parts = StandIns(spec, order)
    _register(parts.router, "a", "discord:1:2")
    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(parts.gates.run)
            assert not parts.holds.divert(wake(1, ChannelRef("a", "discord:1:2")))  # a bare id: not held
            assert not parts.holds.divert(wake(2, A_GENERAL))
            assert parts.holds.divert(wake(3, B_GENERAL))
            nursery.cancel_scope.cancel()
    [unresolved] = [log for log in logs if log["event"] == "gate.channel.unresolved"]
    assert unresolved["name"] == "discord:1:2" and unresolved["kind"] == "unknown" and unresolved["idOn"] == ["a"]
    assert router_text(parts.router, "discord:1:2").endswith('write it with its server, e.g. "a:discord:1:2".')


def router_text(router: Router, name: str) -> str:
    refusal = router.names.channel_qualified(name)
    assert not isinstance(refusal, Resolved)
    return refusal.text


# -- held state (pure, time passed in) ---------------------------------------------------------


def test_defer_holds_until_the_next_wake_that_goes_out() -> None:
    gate = AgentGate(AGENT, 10)
    deferred = Decision(Behaviour(DEFER), 0)
    assert not gate.offer(wake(1), deferred, 0.0, server_id="b").alone
    assert not gate.offer(wake(2), deferred, 1.0, server_id="b").alone
    offer = gate.offer(wake(3, A_GENERAL), Decision(Behaviour(), None), 2.0, server_id="a")
    assert not offer.alone
    (batch,) = offer.batches
    assert batch.seqs == (1, 2, 3) and batch.cause == CAUSE_WAKE and batch.route().seq == 3
    assert gate.held_count == 0
    assert gate.offer(wake(4), Decision(Behaviour(), None), 3.0, server_id="b").alone


def test_the_bound_flushes_early() -> None:
    gate = AgentGate(AGENT, 3)
    debounce = Decision(Behaviour(DEBOUNCE, ms=1000), None)
    gate.offer(wake(1), debounce, 0.0, server_id="b")
    gate.offer(wake(2), debounce, 0.1, server_id="b")
    offer = gate.offer(wake(3), debounce, 0.2, server_id="b")
    assert [batch.seqs for batch in offer.batches] == [(1, 2, 3)] and offer.batches[0].cause == CAUSE_FULL
    assert gate.next_deadline() is None


# -- the shell on the virtual clock --------------------------------------------------------------


class StandIns:
    def __init__(self, spec: WakeGateSpec, order: str = "ab") -> None:
        from mcpl_router.routing.agents import AgentSpec

        self.router = router_with(order)
        self.spec = AgentSpec(AGENT, wake_gate=spec)
        self.delivered: list[tuple[float, tuple[int, ...], dict[str, Any]]] = []
        self.settled: list[tuple[str, list[int]]] = []
        self.counts: list[tuple[str, str]] = []
        self.owned = True
        self.gates = WakeGates(
            router=self.router,
            agent_of=lambda name: self.spec if name == AGENT else None,
            admitted=self.admitted,
            deliver=self.deliver,
            settle=self.settle,
            count=lambda agent, outcome: self.counts.append((agent, outcome)),
        )
        #: What the sessions ask of each wake: no tune-outs here, so the gate's decision alone.
        self.holds = WakeHolds(TuneOutTable(), self.gates)

    def admitted(self, wake: Wake, server_id: str) -> str | None:
        if wake.reason == REASON_MESSAGE and (wake.channel is None or not self.router.registry.is_registered(wake.channel)):
            return "channel withdrawn"
        return None

    def deliver(self, agent: str, seqs: tuple[int, ...], params: dict[str, Any]) -> bool:
        if self.owned:
            self.delivered.append((trio.current_time(), seqs, params))
        return self.owned

    async def settle(self, agent: str, seqs: list[int]) -> None:
        await trio.lowlevel.checkpoint()
        self.settled.append((agent, seqs))


async def test_debounce_sends_one_batch_once_the_source_is_quiet(autojump_clock: trio.abc.Clock, order: str) -> None:
    parts = StandIns(WakeGateSpec(default=Behaviour(DEBOUNCE, ms=500)), order)
    async with trio.open_nursery() as nursery:
        await nursery.start(parts.gates.run)
        start = trio.current_time()
        for seq in (1, 2, 3):
            assert parts.holds.divert(wake(seq, B_GENERAL if seq != 2 else B_GENERAL, addressed=seq == 2))
            await trio.sleep(0.3)  # never quiet for 500 ms while they come
        assert parts.holds.divert(wake(4, A_GENERAL))  # another source: its own bucket
        await trio.sleep(0.1)
        assert parts.delivered == []
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    b_batch = next(d for d in parts.delivered if d[2]["routeServerId"] == "b")
    at, seqs, params = b_batch
    assert seqs == (1, 2, 3)
    assert at - start == pytest.approx(0.6 + 0.5)  # the last wake at 0.6 s, then 500 ms quiet
    # Routed to the newest addressed wake, on b's general, though a registers general too.
    assert params["seq"] == 2 and params["reason"] == "batch" and params["gate"]["cause"] == CAUSE_QUIET
    assert params["routeChannel"] == {"serverId": "b", "channelId": "general", "shown": "b:general"}
    assert params["conversations"] == [{"serverId": "b", "channelId": "general", "shown": "b:general", "seqs": [1, 2, 3]}]
    a_batch = next(d for d in parts.delivered if d[2]["routeServerId"] == "a")
    assert a_batch[1] == (4,)


async def test_rate_limit_holds_past_the_limit_and_batches_into_the_next_allowed_wake(autojump_clock: trio.abc.Clock) -> None:
    parts = StandIns(WakeGateSpec(default=Behaviour(RATE_LIMIT, per=2, seconds=10)))
    async with trio.open_nursery() as nursery:
        await nursery.start(parts.gates.run)
        start = trio.current_time()
        assert not parts.holds.divert(wake(1))  # under the limit: sent alone, as ungated
        await trio.sleep(1)
        assert not parts.holds.divert(wake(2))
        await trio.sleep(1)
        assert parts.holds.divert(wake(3))  # over: held
        assert parts.holds.divert(wake(4))
        await trio.sleep(7.5)
        assert parts.delivered == []
        await trio.sleep(1)  # at 10 s the first slot frees
        (at, seqs, params) = parts.delivered[0]
        assert seqs == (3, 4) and at - start == pytest.approx(10) and params["gate"]["cause"] == CAUSE_RATE
        # The batch counted one wake: the window (1 s and 10 s) is full again until 11 s.
        assert parts.holds.divert(wake(5))
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    assert [d[1] for d in parts.delivered] == [(3, 4), (5,)]
    assert parts.delivered[1][0] - start == pytest.approx(11)


async def test_defer_waits_for_a_later_wake_on_the_virtual_clock(autojump_clock: trio.abc.Clock) -> None:
    spec = WakeGateSpec(rules=(GateRule(Behaviour(DEFER), tags_any=("chat:ambient",)),))
    parts = StandIns(spec)
    async with trio.open_nursery() as nursery:
        await nursery.start(parts.gates.run)
        assert parts.holds.divert(wake(1, tags=("chat:ambient",)))
        assert parts.holds.divert(wake(2, A_GENERAL, tags=("chat:ambient",)))
        await trio.sleep(3600)
        assert parts.delivered == []  # no timer: deferred work waits for a wake
        assert parts.holds.divert(wake(3, tags=("chat:mention", "chat:addressed"), addressed=True))
        await trio.sleep(0)
        nursery.cancel_scope.cancel()
    (_, seqs, params) = parts.delivered[0]
    assert seqs == (1, 2, 3) and params["seq"] == 3 and params["routeServerId"] == "b"
    assert [row["serverId"] for row in params["conversations"]] == ["b", "a"]


async def test_a_gate_turned_off_while_it_holds_wakes_still_batches_them_then_lets_wakes_pass(autojump_clock: trio.abc.Clock) -> None:
    """An ungated agent's wakes skip the gate (no gate made, nothing counted); a reload that turns
    a gate off while it holds wakes leaves them to go through its buckets (the next wake takes
    them along as a batch), and once it holds nothing the agent's wakes pass as ungated."""
    parts = StandIns(WakeGateSpec())
    assert not parts.holds.divert(wake(1))
    assert parts.gates.gate_of(AGENT) is None and parts.counts == []
    parts.spec = attrs.evolve(parts.spec, wake_gate=WakeGateSpec(rules=(GateRule(Behaviour(DEFER), tags_any=("chat:ambient",)),)))
    async with trio.open_nursery() as nursery:
        await nursery.start(parts.gates.run)
        assert parts.holds.divert(wake(2, tags=("chat:ambient",)))
        parts.spec = attrs.evolve(parts.spec, wake_gate=WakeGateSpec())  # the reload: no rule holds now
        assert not parts.gates.ungated(AGENT)  # it still holds seq 2
        assert parts.holds.divert(wake(3))  # goes out as the batch that takes seq 2 along
        await trio.sleep(0)
        assert [d[1] for d in parts.delivered] == [(2, 3)]
        assert parts.gates.ungated(AGENT)
        assert not parts.holds.divert(wake(4))
        nursery.cancel_scope.cancel()
    assert [d[1] for d in parts.delivered] == [(2, 3)]


async def test_a_held_message_whose_channel_was_withdrawn_wakes_no_one_and_is_settled(autojump_clock: trio.abc.Clock, order: str) -> None:
    parts = StandIns(WakeGateSpec(default=Behaviour(DEBOUNCE, ms=200)), order)
    async with trio.open_nursery() as nursery:
        await nursery.start(parts.gates.run)
        assert parts.holds.divert(wake(1, B_GENERAL))
        assert parts.holds.divert(wake(2, B_GENERAL))
        parts.router.registry.withdraw("b", ["general"])  # a still registers general
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert parts.delivered == []
    assert parts.settled == [(AGENT, [1, 2])]
    assert parts.counts.count((AGENT, "dropped")) == 2


async def test_a_replay_keeps_held_wakes_held_and_gates_the_rest_again(autojump_clock: trio.abc.Clock) -> None:
    parts = StandIns(WakeGateSpec(default=Behaviour(DEFER)))
    diversions = parts.holds
    async with trio.open_nursery() as nursery:
        await nursery.start(parts.gates.run)
        assert diversions.divert(wake(1))
        assert diversions.holds(wake(1))  # read back while held: stays held, not sent twice
        parts.owned = False
        parts.spec = type(parts.spec)(AGENT, wake_gate=WakeGateSpec(rules=(GateRule(Behaviour(DEFER), tags_any=("x:y",)),)))
        assert diversions.divert(wake(2))  # goes out with 1 as a batch: nobody owns kai, forgotten
        assert parts.counts[-1] == (AGENT, "unowned")
        parts.owned = True
        # The claim's replay reads both back from the journal and gates them again: the rule
        # now defers only x:y, so each goes out alone.
        assert not diversions.holds(wake(1)) and not diversions.holds(wake(2))
        nursery.cancel_scope.cancel()


# -- the outbox: a batch is paced like wakes, and the replay doesn't send its seqs again --------


class _Connection:
    id = "c1"

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    async def notify(self, method: str, params: Any) -> bool:
        await trio.lowlevel.checkpoint()
        self.sent.append((method, params))
        return True

    def notify_nowait(self, method: str, params: Any) -> bool | None:
        self.sent.append((method, params))
        return True


class _Journal:
    """Unacked wakes 1..4 of kai (stand-ins: the outbox's wake_of is the identity here)."""

    def __init__(self) -> None:
        self.unacked = [wake(seq) for seq in (1, 2, 3, 4)]

    async def unacked_deliveries(self, agent: str, *, after_seq: int, limit: int) -> list[Wake]:
        await trio.lowlevel.checkpoint()
        return [w for w in self.unacked if w.seq > after_seq][:limit]


async def test_the_outbox_sends_a_batch_once_and_the_replay_skips_its_seqs(autojump_clock: trio.abc.Clock) -> None:
    from mcpl_router.hosts.outbox import HostOutbox

    connection, journal = _Connection(), _Journal()
    outbox = HostOutbox(connection, journal, render=lambda w: {"seq": w.seq}, wake_of=lambda w: w,  # type: ignore[arg-type]
                        held=lambda w: w.seq == 2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        outbox.add_agent(AGENT)
        assert outbox.offer_batch(AGENT, (2, 3), {"seq": 3, "reason": "batch", "seqs": [2, 3]})
        await trio.sleep(1)
        outbox.close()
    seqs = [params["seq"] for method, params in connection.sent if method == "wake"]
    assert sorted(seqs) == [1, 3, 4] and len(seqs) == 3  # 2 and 3 only inside the batch
    assert outbox.statistics().in_flight == 4


# -- the config and a hello's spec ---------------------------------------------------------------


def test_config_problems_name_the_file_key_problem_and_fix() -> None:
    from mcpl_router.config import ConfigError, parse_config

    data = {
        "mcplServers": {"a": {"url": "tcp://127.0.0.1:1"}, "b": {"url": "tcp://127.0.0.1:2"}},
        "agents": {"kai": {"wakeGate": {"rules": [
            {"channels": ["general"], "servers": ["bb"], "behaviour": "debouce"},
            {"kinds": ["mesage"], "behaviour": {"rate_limit": {"per": 0, "seconds": 5}}},
        ], "defualt": "defer"}}},
    }
    with pytest.raises(ConfigError) as raised:
        parse_config(data, source="router.toml", base_dir=".")
    lines = str(raised.value).splitlines()
    assert all(line.startswith("router.toml: agents.kai.wakeGate.") for line in lines)
    text = "\n".join(lines)
    assert 'rules[0].channels[0]: "general" names no server' in text and '"a:general"' in text
    assert 'rules[0].servers[0]: "bb" is not a server in mcplServers. Did you mean "b"?' in text
    assert 'rules[0].behaviour: "debouce" is not a wake gate behaviour. Did you mean "debounce"?' in text
    assert 'rules[1].kinds[0]: "mesage" is not an event kind. Did you mean "message"?' in text
    assert "rules[1].behaviour.rate_limit.per: 0 is out of range." in text
    assert 'wakeGate.defualt: "defualt" is not a wakeGate key. Did you mean "default"?' in text


@pytest.mark.parametrize("servers", [("a", "discord"), ("discord", "a")], ids=["a-first", "discord-first"])
def test_a_config_entry_no_configured_server_begins_is_refused(servers: tuple[str, str]) -> None:
    from mcpl_router.config import ConfigError, parse_config

    def parsed(entries: list[str], server_ids: tuple[str, ...]) -> Any:
        data = {
            "mcplServers": {server_id: {"url": f"tcp://127.0.0.1:{index + 1}"} for index, server_id in enumerate(server_ids)},
            "agents": {"kai": {"wakeGate": {"rules": [{"channels": entries, "behaviour": "defer"}]}}},
        }
        return parse_config(data, source="router.toml", base_dir=".")

    with pytest.raises(ConfigError) as raised:
        parsed(["discord:123:456"], ("a", "b"))
    text = str(raised.value)
    assert 'rules[0].channels[0]: "discord:123:456" is no configured server\'s qualified name' in text
    assert "never as a bare channel id" in text and '"a:discord:123:456"' in text and "Configured servers: a, b." in text
    # Server "discord" configured, in either order: the entry is its pair's name, accepted.
    config = parsed(["discord:123:456", "a:discord:123:456", "*:general"], servers)
    assert [match.name or match.pattern for match in config.agents["kai"].wake_gate.rules[0].channels] == [
        "discord:123:456", "a:discord:123:456", "*:general"]
    # A server id with a colon begins a name as any other does; one no server begins is refused.
    config = parsed(["a:b:room"], ("a:b",))
    assert config.agents["kai"].wake_gate.rules[0].channels == (ChannelMatch(name="a:b:room"),)
    with pytest.raises(ConfigError, match='"a:" names no server'):
        parsed(["a:"], ("a",))
    # A hello's spec doesn't know the servers: the entry is kept, and matches only a pair.
    import msgspec

    from mcpl_router.hosts.agents import AgentSpecParams, spec_from_params

    gate = {"rules": [{"channels": ["discord:123:456"], "behaviour": "defer"}]}
    spec = spec_from_params(msgspec.convert({"name": AGENT, "wakeGate": gate}, AgentSpecParams))
    assert spec.wake_gate.rules[0].channels == (ChannelMatch(name="discord:123:456"),)


def test_a_hello_spec_reads_the_gate_as_the_config_does() -> None:
    import msgspec

    from mcpl_router.hosts.agents import AgentSpecParams, params_of, spec_from_params

    gate = {"rules": [{"channels": [{"serverId": "b", "channelId": "general"}, "a:*"], "tagsAny": ["chat:ambient"],
                       "behaviour": {"debounce": {"ms": 250}}}], "default": "defer", "maxHeld": 8}
    spec = spec_from_params(msgspec.convert({"name": AGENT, "wakeGate": gate}, AgentSpecParams))
    assert spec.wake_gate.max_held == 8 and spec.wake_gate.default == Behaviour(DEFER)
    assert spec.wake_gate.rules[0].channels == (ChannelMatch(ref=B_GENERAL), ChannelMatch(pattern="a:*"))
    # Journaled as hello would declare it, and read back the same.
    again = spec_from_params(msgspec.convert(msgspec.to_builtins(params_of(spec)), AgentSpecParams))
    assert again == spec
    with pytest.raises(msgspec.ValidationError, match=r'agents\.kai\.wakeGate\.rules\[0\]\.behaviour: "defr" .* Did you mean "defer"'):
        msgspec.convert({"name": AGENT, "wakeGate": {"rules": [{"behaviour": "defr"}]}}, AgentSpecParams)
