"""Whether a committed wake is sent or held (routing/held.py): the order of the holds, the
replay's rules, and a property over any mix of tune-outs, gate rules and replays — all without a
process, a nursery or a clock (the time is a number passed in)."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from mcpl_router.routing.gate_batches import AgentGate
from mcpl_router.routing.gating import ALWAYS, DEBOUNCE, DEFER, Behaviour, Decision
from mcpl_router.routing.held import Fate, GateAsked, held, replayed
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.tuneout import TuneOutSettings, TuneOutTable
from mcpl_router.routing.wakes import REASON_MESSAGE, Wake

A_GENERAL = ChannelRef("a", "general")
B_GENERAL = ChannelRef("b", "general")  # the same id on another server: another channel
AGENT = "kai"


def wake(seq: int, channel: ChannelRef = A_GENERAL, agent: str = AGENT) -> Wake:
    return Wake(seq=seq, agent=agent, reason=REASON_MESSAGE, channel=channel, payload={"seq": seq}, tags=(), addressed=False)


def gate_deciding(behaviour: Behaviour, gate: AgentGate, asked: list[int]) -> Callable[[Wake], GateAsked | None]:
    def gate_for(wake: Wake) -> GateAsked:
        asked.append(wake.seq)
        return GateAsked(gate, Decision(behaviour, None))

    return gate_for


def ungated(wake: Wake) -> None:
    return None


def test_a_tuned_out_channel_holds_the_wake_and_the_gate_never_sees_it() -> None:
    tune_outs = TuneOutTable()
    tune_outs.enter(AGENT, A_GENERAL, TuneOutSettings(), now=0.0)
    asked: list[int] = []
    gate_for = gate_deciding(Behaviour(DEFER), AgentGate(AGENT, 10), asked)
    assert held(wake(1), tune_outs=tune_outs, gate_for=gate_for, now=1.0).fate is Fate.TUNED_OUT
    assert asked == []
    assert tune_outs.holds(AGENT, A_GENERAL, 1)
    # The same id on the other server is another channel: not tuned out, so the gate decides it.
    assert held(wake(2, B_GENERAL), tune_outs=tune_outs, gate_for=gate_for, now=1.0).fate is Fate.GATED
    assert asked == [2]


def test_an_ungated_agent_s_wake_is_sent_and_changes_nothing() -> None:
    tune_outs = TuneOutTable()
    fate = held(wake(1), tune_outs=tune_outs, gate_for=ungated, now=0.0)
    assert fate.fate is Fate.SENT and fate.batches == () and fate.decision is None


def test_a_wake_that_goes_out_takes_the_deferred_ones_along_as_a_batch() -> None:
    gate = AgentGate(AGENT, 10)
    tune_outs = TuneOutTable()
    assert held(wake(1), tune_outs=tune_outs, gate_for=gate_deciding(Behaviour(DEFER), gate, []), now=0.0).fate is Fate.GATED
    fate = held(wake(2), tune_outs=tune_outs, gate_for=gate_deciding(Behaviour(ALWAYS), gate, []), now=0.0)
    assert fate.fate is Fate.GATED  # not alone: it goes in the batch
    [batch] = fate.batches
    assert batch.seqs == (1, 2)


def test_a_replay_keeps_holds_and_does_not_decide_a_wake_sent_alone_twice() -> None:
    tune_outs = TuneOutTable()
    tune_outs.enter(AGENT, B_GENERAL, TuneOutSettings(), now=0.0)
    gate = AgentGate(AGENT, 10)
    asked: list[int] = []
    always = gate_deciding(Behaviour(ALWAYS), gate, asked)
    assert held(wake(1, B_GENERAL), tune_outs=tune_outs, gate_for=always, now=0.0).fate is Fate.TUNED_OUT
    assert held(wake(2), tune_outs=tune_outs, gate_for=gate_deciding(Behaviour(DEFER), gate, asked), now=0.0).fate is Fate.GATED
    assert held(wake(3), tune_outs=tune_outs, gate_for=always, now=0.0).fate is Fate.GATED  # takes 2 along
    assert held(wake(4), tune_outs=tune_outs, gate_for=always, now=0.0).fate is Fate.SENT
    asked.clear()

    def replay(seq: int, channel: ChannelRef = A_GENERAL) -> Fate:
        return replayed(wake(seq, channel), tune_outs=tune_outs, gate=gate, gate_for=always, now=5.0).fate

    assert replay(1, B_GENERAL) is Fate.TUNED_OUT
    assert replay(4) is Fate.SENT and asked == []  # decided before and sent alone: not asked again
    assert replay(5) is Fate.SENT and asked == [5]  # no hold has it: decided as new
    # A tune-out that handed its wake over in a summary doesn't take it back at a replay.
    tune_outs.due(now=10_000.0)
    assert replay(1, B_GENERAL) is Fate.SENT


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from([A_GENERAL, B_GENERAL]),
            st.sampled_from([ALWAYS, DEFER, DEBOUNCE]),
            st.integers(min_value=-1, max_value=40),  # >= 0: read back an earlier wake (a replay)
        ),
        min_size=1,
        max_size=30,
    ),
    tuned_out=st.sets(st.sampled_from([A_GENERAL, B_GENERAL])),
)
def test_every_wake_is_sent_once_or_held_by_one_hold_and_the_decision_is_deterministic(
    steps: list[tuple[ChannelRef, str, int]], tuned_out: set[ChannelRef]
) -> None:
    def run() -> list[tuple[Fate, tuple[tuple[int, ...], ...]]]:
        tune_outs = TuneOutTable()
        for ref in tuned_out:
            tune_outs.enter(AGENT, ref, TuneOutSettings(backlog_cap=1000), now=0.0)
        gate = AgentGate(AGENT, 1000)
        out: list[tuple[Fate, tuple[tuple[int, ...], ...]]] = []
        made: list[Wake] = []
        sent: set[int] = set()
        batched: set[int] = set()

        def held_by() -> dict[int, list[str]]:
            return {w.seq: [name for name, holds in (("tune-out", tune_outs.holds(AGENT, w.channel, w.seq)),
                                                     ("gate", gate.holds(w.seq)), ("sent", w.seq in sent),
                                                     ("batch", w.seq in batched)) if holds] for w in made}

        for now, (ref, kind, replay) in enumerate(steps):
            behaviour = Behaviour(kind, ms=500) if kind == DEBOUNCE else Behaviour(kind)
            asked: list[int] = []
            gate_for = gate_deciding(behaviour, gate, asked)
            old = made[replay % len(made)] if replay >= 0 and made else None
            if old is not None and old.seq not in batched:
                # Read back while a hold has it (or after it went alone): the same place again.
                place = held_by()[old.seq]
                fate = replayed(old, tune_outs=tune_outs, gate=gate, gate_for=gate_for, now=float(now))
                assert fate.fate is {"tune-out": Fate.TUNED_OUT, "gate": Fate.GATED, "sent": Fate.SENT}[place[0]]
                assert asked == [] and fate.batches == ()
            else:
                new = wake(len(made) + 1, ref)
                made.append(new)
                fate = held(new, tune_outs=tune_outs, gate_for=gate_for, now=float(now))
                # A tuned-out channel's wake is held by its tune-out and never reaches the gate.
                assert (fate.fate is Fate.TUNED_OUT) == (ref in tuned_out)
                assert (asked == []) == (ref in tuned_out)
                if fate.fate is Fate.SENT:
                    sent.add(new.seq)
            for batch in fate.batches:
                assert not batched & set(batch.seqs), "a held wake went out in two batches"
                assert all(w.channel not in tuned_out for w in batch.wakes)
                batched.update(batch.seqs)
            out.append((fate.fate, tuple(batch.seqs for batch in fate.batches)))
        # Nothing is lost: every wake is sent alone, went in a batch, or is held by one hold.
        for seq, places in held_by().items():
            assert len(places) == 1, (seq, places)
        return out

    # The same facts, the same fates: nothing reads a clock or a global.
    assert run() == run()
