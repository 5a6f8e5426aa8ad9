"""Whether a committed wake goes to its agent now, or is held (no I/O; the clock is passed in).

Which agents an event wakes is decided before its commit (:mod:`~mcpl_router.routing.wakes`
and, for conversation forks, :mod:`~mcpl_router.routing.forks`) and journaled with it. Once it
is committed, each wake meets the agent's holds in one order, decided here:

1. **A tune-out** of the wake's channel holds it for the channel's summary
   (:class:`~mcpl_router.routing.tuneout.TuneOutTable`); the gate never sees it.
2. **The wake gate** decides it under the agent's rules
   (:class:`~mcpl_router.routing.gate_batches.AgentGate`): sent alone, or held — and a wake may
   make held ones due, which go now as batches.
3. Otherwise it is **sent** alone.

A wake read back from the journal (a replay, a claim) goes through :func:`replayed`: a hold that
still has it keeps it, a gate that sent it alone before doesn't decide it again, and a wake no
hold has yet is decided as if new.

The tables are the core's own state: this module changes them (a tune-out holds a seq, a gate
fills a bucket) and returns what the shell carries out — the batches to send, what to log and
count. It never sends, logs or reads the clock.
"""

from __future__ import annotations

import enum
from collections.abc import Callable

import attrs

from mcpl_router.routing.gate_batches import AgentGate, Batch
from mcpl_router.routing.gating import Decision
from mcpl_router.routing.tuneout import TuneOutTable
from mcpl_router.routing.wakes import Wake

__all__ = ["Fate", "GateAsked", "Held", "held", "replayed"]


class Fate(enum.Enum):
    """What became of one wake (not a reason: nothing is told it, so not a string enum)."""

    #: Sent to its agent now, alone.
    SENT = "sent"
    #: Held by the tune-out of its channel, for the channel's summary.
    TUNED_OUT = "tuned-out"
    #: Held by the agent's wake gate (it goes in a batch later, or in one of :attr:`Held.batches`).
    GATED = "gated"


@attrs.frozen
class GateAsked:
    """The agent's gate and the rule's decision for this wake (asked only when needed)."""

    gate: AgentGate
    decision: Decision


@attrs.frozen
class Held:
    """One wake's fate, and the batches its arrival made due (to send now, in order)."""

    fate: Fate
    batches: tuple[Batch, ...] = ()
    #: The gate's decision, when the gate decided this wake now (the shell logs its rule).
    decision: Decision | None = None

    @property
    def sent(self) -> bool:
        return self.fate is Fate.SENT


_SENT = Held(Fate.SENT)
_TUNED_OUT = Held(Fate.TUNED_OUT)
_GATED = Held(Fate.GATED)


def held(wake: Wake, *, tune_outs: TuneOutTable, gate_for: Callable[[Wake], GateAsked | None], now: float) -> Held:
    """A new wake's fate at ``now``.

    ``gate_for(wake)`` is the agent's gate and its decision, or None for an ungated agent; it is
    asked only once no tune-out holds the wake (a rule is not resolved for a wake it won't see).
    """
    if tune_outs.divert(wake.agent, wake.channel, wake.seq):
        return _TUNED_OUT
    return _gated(wake, gate_for, now)


def replayed(
    wake: Wake,
    *,
    tune_outs: TuneOutTable,
    gate: AgentGate | None,
    gate_for: Callable[[Wake], GateAsked | None],
    now: float,
) -> Held:
    """A wake read back from the journal: held where a hold still has it, else decided as new.

    ``gate`` is the agent's gate as it stands (None if it has none yet). A tune-out does not
    take a replayed wake it no longer holds (it handed it over in a summary, or dropped it past
    its cap): that wake is the agent's backlog now.
    """
    if tune_outs.holds(wake.agent, wake.channel, wake.seq):
        return _TUNED_OUT
    if gate is not None and gate.holds(wake.seq):
        return _GATED
    if gate is not None and gate.passed(wake.seq):
        return _SENT  # decided before and sent alone: not decided (counted) twice
    return _gated(wake, gate_for, now)


def _gated(wake: Wake, gate_for: Callable[[Wake], GateAsked | None], now: float) -> Held:
    asked = gate_for(wake)
    if asked is None:
        return _SENT
    offer = asked.gate.offer(wake, asked.decision, now, server_id=wake.source_server)
    return Held(Fate.SENT if offer.alone else Fate.GATED, offer.batches, asked.decision)
