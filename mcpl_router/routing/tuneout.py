"""Tune-outs: which agents have which channels tuned out, and what each holds. Pure (no trio).

A tuned-out channel stays open, but the wakes its traffic would give the agent are *held*
(newest ``backlog_cap`` kept, older ones counted as dropped) and handed over as one summary
wake every ``cadence`` seconds while anything is held. A tune-out ends after ``duration``
seconds or ``max_wakes`` summary wakes (whichever comes first; neither given: only when
cancelled). Held wakes stay durable in the journal as the agent's unacked deliveries; a
summary names their seqs.

A tune-out can be resumed (:meth:`TuneOutTable.resume`: the daemon saves each one in its journal
and reloads it at start-up). ``handed_through`` is what makes that exact: the newest seq the
tune-out no longer holds, so the agent's unacked wakes from the channel after it are the ones it
held.

Keyed by ``(agent, ChannelRef)``: two servers' ``general`` are two tune-outs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Final

import attrs

from mcpl_router.routing.refs import ChannelRef

__all__ = [
    "DEFAULT_BACKLOG_CAP",
    "DEFAULT_CADENCE",
    "Summary",
    "TuneOut",
    "TuneOutSettings",
    "TuneOutTable",
]

#: Seconds between summary wakes when ``cadence`` isn't given.
DEFAULT_CADENCE: Final = 300.0
#: Held wakes kept per tune-out when ``backlogCap`` isn't given.
DEFAULT_BACKLOG_CAP: Final = 50
#: The least cadence (a tune-out that wakes every few ms would be no tune-out).
MIN_CADENCE: Final = 0.05


@attrs.frozen
class TuneOutSettings:
    """How a tune-out runs: ``cadence`` and ``duration`` in seconds."""

    cadence: float = DEFAULT_CADENCE
    backlog_cap: int = DEFAULT_BACKLOG_CAP
    max_wakes: int | None = None
    duration: float | None = None

    @classmethod
    def from_arguments(cls, arguments: Mapping[str, object]) -> TuneOutSettings | tuple[str, str]:
        """Settings from tool arguments, or ``(field, problem)`` for the first bad one."""

        def number(field: str, *, integer: bool, least: float) -> float | int | None | tuple[str, str]:
            value = arguments.get(field)
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not isinstance(value, int)):
                kind = "a whole number" if integer else "a number of seconds"
                return field, f"must be {kind}"
            if value < least:
                return field, f"must be at least {least:g}"
            return value

        cadence = number("cadence", integer=False, least=MIN_CADENCE)
        backlog = number("backlogCap", integer=True, least=1)
        max_wakes = number("maxWakes", integer=True, least=1)
        duration = number("duration", integer=False, least=MIN_CADENCE)
        for checked in (cadence, backlog, max_wakes, duration):
            if isinstance(checked, tuple):
                return checked
        return cls(
            cadence=float(cadence) if cadence is not None else DEFAULT_CADENCE,  # type: ignore[arg-type]
            backlog_cap=int(backlog) if backlog is not None else DEFAULT_BACKLOG_CAP,  # type: ignore[arg-type]
            max_wakes=int(max_wakes) if max_wakes is not None else None,  # type: ignore[arg-type]
            duration=float(duration) if duration is not None else None,  # type: ignore[arg-type]
        )


@attrs.frozen
class Summary:
    """What one summary wake hands over: the held seqs (oldest first) and how many were dropped."""

    agent: str
    ref: ChannelRef
    held: tuple[int, ...]
    dropped: int
    summary: str | None
    final: bool


@attrs.define
class TuneOut:
    """One agent's tune-out of one channel."""

    agent: str
    ref: ChannelRef
    settings: TuneOutSettings
    started: float
    next_summary: float
    held: list[int] = attrs.field(factory=list)
    dropped: int = 0
    wakes: int = 0
    summary: str | None = None
    #: The newest seq this tune-out no longer holds: the journal's last seq when it began, then
    #: the newest each summary handed over.
    handed_through: int = 0

    @property
    def ends_at(self) -> float | None:
        """When the duration runs out, if it has one."""
        return None if self.settings.duration is None else self.started + self.settings.duration

    def hold(self, seq: int) -> None:
        """Hold one wake; past the cap the oldest is dropped (counted)."""
        self.held.append(seq)
        while len(self.held) > self.settings.backlog_cap:
            self.held.pop(0)
            self.dropped += 1

    def take(self, *, final: bool) -> Summary:
        """Hand over what is held (and a delivered summary); the tune-out starts holding anew."""
        summary = Summary(self.agent, self.ref, tuple(self.held), self.dropped, self.summary, final)
        if self.held:
            # Held seqs only grow (wakes are diverted in seq order), so the last is the newest.
            self.handed_through = max(self.handed_through, self.held[-1])
        self.held, self.dropped, self.summary = [], 0, None
        return summary


@attrs.define
class TuneOutTable:
    """Every tune-out, by agent and channel."""

    _tune_outs: dict[tuple[str, ChannelRef], TuneOut] = attrs.field(factory=dict, init=False)

    def enter(self, agent: str, ref: ChannelRef, settings: TuneOutSettings, now: float, *, handed_through: int = 0) -> TuneOut:
        """Tune ``ref`` out for ``agent``; entering again restarts it with the new settings, keeping what's held.

        ``handed_through``: the newest seq already sent when it begins (kept on entering again).
        """
        previous = self._tune_outs.get((agent, ref))
        tune_out = TuneOut(agent, ref, settings, started=now, next_summary=now + settings.cadence, handed_through=handed_through)
        if previous is not None:
            tune_out.held, tune_out.dropped, tune_out.summary = previous.held, previous.dropped, previous.summary
            tune_out.handed_through = previous.handed_through
        self._tune_outs[(agent, ref)] = tune_out
        return tune_out

    def resume(
        self,
        agent: str,
        ref: ChannelRef,
        settings: TuneOutSettings,
        *,
        started: float,
        now: float,
        wakes: int,
        handed_through: int,
        summary: str | None,
        held: Iterable[int],
    ) -> TuneOut:
        """Take back a saved tune-out (``started`` on this table's clock, maybe before ``now``).

        Its summaries keep their rhythm: the next falls at the first ``started + k × cadence``
        after ``now``, so a restart neither hurries nor postpones one by more than a cadence.
        ``held`` (oldest first) is held again under the cap, as if diverted one by one.
        """
        steps = max(1, math.floor((now - started) / settings.cadence) + 1)
        tune_out = TuneOut(agent, ref, settings, started=started, next_summary=started + steps * settings.cadence,
                           wakes=wakes, summary=summary, handed_through=handed_through)
        for seq in held:
            tune_out.hold(seq)
        self._tune_outs[(agent, ref)] = tune_out
        return tune_out

    def get(self, agent: str, ref: ChannelRef) -> TuneOut | None:
        return self._tune_outs.get((agent, ref))

    def end(self, agent: str, ref: ChannelRef) -> Summary | None:
        """End a tune-out; what it still held, as a final summary (None if it wasn't tuned out)."""
        tune_out = self._tune_outs.pop((agent, ref), None)
        return None if tune_out is None else tune_out.take(final=True)

    def tuned_out(self, agent: str) -> frozenset[ChannelRef]:
        """The channels ``agent`` has tuned out."""
        return frozenset(ref for (owner, ref) in self._tune_outs if owner == agent)

    def all(self) -> list[TuneOut]:
        return list(self._tune_outs.values())

    def divert(self, agent: str, ref: ChannelRef | None, seq: int) -> bool:
        """Whether a wake of ``agent`` from ``ref`` is held (its channel is tuned out)."""
        if ref is None:
            return False
        tune_out = self._tune_outs.get((agent, ref))
        if tune_out is None:
            return False
        tune_out.hold(seq)
        return True

    def holds(self, agent: str, ref: ChannelRef | None, seq: int) -> bool:
        """Whether the wake ``seq`` of ``agent`` from ``ref`` is held now (nothing changes)."""
        tune_out = None if ref is None else self._tune_outs.get((agent, ref))
        return tune_out is not None and seq in tune_out.held

    def due(self, now: float) -> list[Summary]:
        """Summaries due at ``now``, ending the tune-outs whose duration or wake count ran out.

        A tune-out holding nothing at its cadence gives no wake (and doesn't count one).
        """
        out: list[Summary] = []
        for key, tune_out in list(self._tune_outs.items()):
            ends_at = tune_out.ends_at
            if ends_at is not None and now >= ends_at:
                del self._tune_outs[key]
                out.append(tune_out.take(final=True))
                continue
            if now < tune_out.next_summary:
                continue
            tune_out.next_summary = now + tune_out.settings.cadence
            if not tune_out.held and tune_out.summary is None:
                continue
            tune_out.wakes += 1
            last = tune_out.settings.max_wakes is not None and tune_out.wakes >= tune_out.settings.max_wakes
            if last:
                del self._tune_outs[key]
            out.append(tune_out.take(final=last))
        return out

    def next_deadline(self) -> float | None:
        """The soonest moment :meth:`due` may have something to do."""
        moments = [t.next_summary for t in self._tune_outs.values()]
        moments += [e for e in (t.ends_at for t in self._tune_outs.values()) if e is not None]
        return min(moments) if moments else None
