"""What holds some wakes back instead of sending them: the tune-outs and the wake gates.

The sessions ask one :class:`WakeDiversion` (given to ``SessionManager`` at construction) for every
new wake and every wake read back from the journal. :class:`WakeHolds` is the daemon's: the
core decides each wake's fate (:mod:`mcpl_router.routing.held`: a tune-out first, then the
gate) with the clock passed in, and this carries it out (logs, counters, the batches it made due).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Protocol

import trio

from mcpl_router.logs import get_logger
from mcpl_router.routing.held import Fate, Held, held, replayed
from mcpl_router.routing.wakes import Wake

if TYPE_CHECKING:
    from mcpl_router.hosts.gate import WakeGates
    from mcpl_router.routing.tuneout import TuneOutTable

__all__ = ["NO_DIVERSION", "WakeDiversion", "WakeHolds"]


class WakeDiversion(Protocol):
    """What holds some wakes back instead of sending them."""

    def divert(self, wake: Wake) -> bool:
        """Whether a new wake is held (then it is not sent)."""
        ...

    def holds(self, wake: Wake) -> bool:
        """Whether a wake read back from the journal is held (not to be sent)."""
        ...


class WakeHolds:
    """The tune-outs' and the wake gates' holds, asked in the core's order (routing/held.py).

    Args:
        tune_outs: every agent's tune-outs (``TuneOuts.table``).
        gates: every agent's wake gate; it sends the batches a wake makes due.
    """

    def __init__(self, tune_outs: TuneOutTable, gates: WakeGates) -> None:
        self._tune_outs = tune_outs
        self._gates = gates
        self._log = get_logger()

    def divert(self, wake: Wake) -> bool:
        if self._gates.ungated(wake.agent) and (wake.channel is None or self._tune_outs.get(wake.agent, wake.channel) is None):
            # Nothing can hold it (no tune-out of its channel, no gate): sent, with nothing to
            # decide, log or carry out, and no clock read. Most wakes, once per wake.
            return False
        fate = held(wake, tune_outs=self._tune_outs, gate_for=self._gates.ask, now=trio.current_time())
        if fate.fate is Fate.TUNED_OUT and wake.channel is not None:
            self._log.info("tuneout.held", agent=wake.agent, server=wake.channel.server_id, channel=wake.channel.channel_id, seq=wake.seq)
        return self._carry_out(wake, fate)

    def holds(self, wake: Wake) -> bool:
        fate = replayed(wake, tune_outs=self._tune_outs, gate=self._gates.gate_of(wake.agent), gate_for=self._gates.ask,
                        now=trio.current_time())
        return self._carry_out(wake, fate)

    def _carry_out(self, wake: Wake, fate: Held) -> bool:
        if fate.decision is not None:
            self._gates.carry_out(wake, fate)  # the gate decided it now: its log, counters and batches
        return not fate.sent


class _NoDiversion:
    def divert(self, wake: Wake) -> bool:
        return False

    def holds(self, wake: Wake) -> bool:
        return False


NO_DIVERSION: Final = _NoDiversion()
