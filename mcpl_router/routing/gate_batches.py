"""What one agent's wake gate holds, and when it lets it go (pure; the time is passed in).

:class:`AgentGate` is told each admitted wake with its :class:`~mcpl_router.routing.gating.Decision`
and answers with an :class:`Offer`: send the wake alone (as an ungated wake), or hold it, plus any
:class:`Batch` due now. :meth:`AgentGate.due` gives the batches whose time came.

- ``always``: the wake goes out now. If the agent has deferred wakes, they go with it, as one
  batch routed to this wake.
- ``defer``: held; delivered with the agent's next wake or batch that goes out, whatever its rule.
- ``debounce {ms}``: held in the bucket of its rule and source (its channel, or its server for a
  push naming none); the bucket goes out as one batch once no wake joined it for ``ms``.
- ``rate_limit {per, seconds}``: at most ``per`` wakes (a batch counts one) go out per rule in
  any ``seconds``; past that the wake is held in the rule's bucket, which goes out as one batch
  when the window allows the next wake.

**Bounded.** An agent's gate holds at most ``max_held`` wakes. The wake that reaches the bound
flushes early: its bucket (or, for ``defer``, the deferred wakes) goes out at once as a batch
with cause ``full``. Every batch takes the deferred wakes along.

Everything held is still an unacked delivery in the journal: this state is only when to send.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Final

import attrs

from mcpl_router.routing.gating import ALWAYS, DEBOUNCE, DEFER, RATE_LIMIT, Behaviour, Decision
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.wakes import Wake

#: Why a batch went out.
CAUSE_WAKE: Final = "wake"  # a wake that goes out took the deferred ones along
CAUSE_QUIET: Final = "debounce"
CAUSE_RATE: Final = "rate_limit"
CAUSE_FULL: Final = "full"
#: Seqs remembered as sent alone, so a replay of the same wake isn't decided (counted) twice.
PASSED_MEMORY: Final = 4096


@attrs.frozen
class Batch:
    """Held wakes going out as one wake: ``wakes`` in seq order (at least one)."""

    agent: str
    wakes: tuple[Wake, ...]
    cause: str
    behaviour: Behaviour

    @property
    def seqs(self) -> tuple[int, ...]:
        return tuple(wake.seq for wake in self.wakes)

    def route(self, wakes: Iterable[Wake] | None = None) -> Wake:
        """The wake the batch wakes for: the newest addressed one, else the newest (as turn/open)."""
        candidates = list(self.wakes if wakes is None else wakes)
        addressed = [wake for wake in candidates if wake.addressed]
        return (addressed or candidates)[-1]


@attrs.frozen
class Offer:
    """What to do with one wake: send it ``alone``, or not (held); and ``batches`` to send now."""

    alone: bool
    batches: tuple[Batch, ...] = ()


#: A bucket's key: (rule index or None for the default, behaviour kind, source).
BucketKey = tuple[int | None, str, ChannelRef | str | None]


@attrs.define
class _Bucket:
    behaviour: Behaviour
    due: float
    wakes: list[Wake] = attrs.field(factory=list)


class AgentGate:
    """One agent's held wakes, buckets and rate windows."""

    def __init__(self, agent: str, max_held: int) -> None:
        self.agent = agent
        self.max_held = max(1, max_held)
        self._deferred: list[Wake] = []
        self._buckets: dict[BucketKey, _Bucket] = {}
        # Per rate-limited rule: when its recent wakes went out (oldest first).
        self._sent: dict[int | None, deque[float]] = {}
        self._held: set[int] = set()
        # An OrderedDict: dropping a plain dict's oldest key scans the holes earlier drops left.
        self._passed: OrderedDict[int, None] = OrderedDict()

    # -- queries -------------------------------------------------------------------------------

    def holds(self, seq: int) -> bool:
        return seq in self._held

    def passed(self, seq: int) -> bool:
        """Whether ``seq`` was decided already and sent alone."""
        return seq in self._passed

    @property
    def held_count(self) -> int:
        return len(self._held)

    def next_deadline(self) -> float | None:
        return min((bucket.due for bucket in self._buckets.values()), default=None)

    # -- decisions -----------------------------------------------------------------------------

    def offer(self, wake: Wake, decision: Decision, now: float, *, server_id: str) -> Offer:
        """Decide one wake (from ``server_id``) under ``decision`` at ``now``."""
        behaviour = decision.behaviour
        if behaviour.kind == RATE_LIMIT and (decision.rule, RATE_LIMIT, None) not in self._buckets:
            if self._room(decision.rule, behaviour, now):
                self._sent.setdefault(decision.rule, deque()).append(now)
                return self._goes_out(wake, behaviour)
        if behaviour.kind not in (DEFER, DEBOUNCE, RATE_LIMIT):
            return self._goes_out(wake, behaviour)
        self._held.add(wake.seq)
        if behaviour.kind == DEFER:
            self._deferred.append(wake)
            if self.held_count >= self.max_held:
                return Offer(False, (self._batch(None, CAUSE_FULL, behaviour),))
            return Offer(False)
        key = self._key(wake, decision, server_id)
        bucket = self._buckets.get(key)
        if behaviour.kind == DEBOUNCE:
            due = now + behaviour.ms / 1000
            if bucket is None:
                bucket = self._buckets[key] = _Bucket(behaviour, due)
            bucket.due = due  # quiet is counted from the newest wake
        elif bucket is None:
            window = self._sent.setdefault(decision.rule, deque())
            bucket = self._buckets[key] = _Bucket(behaviour, window[0] + behaviour.seconds if window else now)
        bucket.wakes.append(wake)
        if self.held_count >= self.max_held:
            del self._buckets[key]
            if behaviour.kind == RATE_LIMIT:
                self._sent.setdefault(decision.rule, deque()).append(now)
            return Offer(False, (self._batch(bucket, CAUSE_FULL, behaviour),))
        return Offer(False)

    def due(self, now: float) -> list[Batch]:
        """The batches whose time came at ``now``, oldest due first."""
        out = []
        for key, bucket in sorted(self._buckets.items(), key=lambda item: item[1].due):
            if bucket.due > now:
                continue
            if bucket.behaviour.kind == RATE_LIMIT:
                rule = key[0]
                if not self._room(rule, bucket.behaviour, now):
                    window = self._sent[rule]
                    bucket.due = window[0] + bucket.behaviour.seconds
                    continue
                self._sent.setdefault(rule, deque()).append(now)
            del self._buckets[key]
            out.append(self._batch(bucket, CAUSE_RATE if bucket.behaviour.kind == RATE_LIMIT else CAUSE_QUIET, bucket.behaviour))
        return out

    def forget(self, seqs: Iterable[int]) -> None:
        """Drop ``seqs`` from what is held (a batch that could not be handed to a host: its wakes
        stay unacked in the journal and come back, through the gate, with the next replay)."""
        for seq in seqs:
            self._held.discard(seq)
            self._passed.pop(seq, None)

    # -- helpers -------------------------------------------------------------------------------

    def _room(self, rule: int | None, behaviour: Behaviour, now: float) -> bool:
        window = self._sent.setdefault(rule, deque())
        while window and window[0] <= now - behaviour.seconds:
            window.popleft()
        return len(window) < behaviour.per

    def _key(self, wake: Wake, decision: Decision, server_id: str) -> BucketKey:
        if decision.behaviour.kind == RATE_LIMIT:
            return (decision.rule, RATE_LIMIT, None)
        # The source: the wake's channel, or its server for a push naming none.
        return (decision.rule, DEBOUNCE, wake.channel if wake.channel is not None else server_id)

    def _goes_out(self, wake: Wake, behaviour: Behaviour) -> Offer:
        if not self._deferred:
            self._passed[wake.seq] = None
            if len(self._passed) > PASSED_MEMORY:
                self._passed.popitem(last=False)
            return Offer(True)
        self._held.add(wake.seq)
        bucket = _Bucket(behaviour, 0.0, [wake])
        return Offer(False, (self._batch(bucket, CAUSE_WAKE, Behaviour(ALWAYS) if behaviour.kind != RATE_LIMIT else behaviour),))

    def _batch(self, bucket: _Bucket | None, cause: str, behaviour: Behaviour) -> Batch:
        wakes = [*self._deferred, *(bucket.wakes if bucket is not None else ())]
        self._deferred = []
        wakes.sort(key=lambda wake: wake.seq)
        for wake in wakes:
            self._held.discard(wake.seq)
        return Batch(self.agent, tuple(wakes), cause, behaviour)
