"""Acks issued while a ``wake/ack`` is in flight go out together in the next one.

A host that acks each wake as its turn ends (from a task of its own, or several agents' tasks)
would send one ``wake/ack`` a wake; the daemon answers each once its journal commit is durable,
so while one is on its way the next ones queue up anyway. :class:`AckBatcher` keeps at most one
``wake/ack`` in flight per agent argument and gathers every ack issued meanwhile into the next
one: a round trip acks everything the host finished during the previous one (issue 30: the
bench's host acking everything pending in one ``wake/ack`` carried ×1.10–1.23 the messages).

What a caller is promised does not change: :meth:`AckBatcher.ack` returns once the request
carrying its seqs is answered, and that request's error reaches every caller whose seqs it
carried. An ack with nothing in flight goes out at once, alone. Acks for different ``agent``
arguments never share a request (the daemon checks the agent: one caller's wrong agent must not
fail another's ack), nor do seqs that are not all ints (their -32602 stays their own).

The first caller of a batch carries it (sends it from its own task, when the one before is
answered). A carrier cancelled with its batch on the wire leaves it to the next of its callers,
who sends it again (acking twice is harmless, docs/host-api.md). A batch whose callers have
all gone is forgotten: nobody is waiting for it.
"""

from __future__ import annotations

import collections
from collections.abc import Awaitable, Callable, Sequence

import trio

__all__ = ["AckBatcher", "AckStatistics"]

#: Sends one ``wake/ack`` (seqs, agent) and returns its ``acked`` count.
SendAck = Callable[[list[int], str | None], Awaitable[int]]


class _Batch:
    """The seqs of the acks that go out in one ``wake/ack``, and its outcome."""

    def __init__(self) -> None:
        # A dict keeps the callers' order and sends a seq two callers acked once.
        self.seqs: dict[int, None] = {}
        #: Its callers, in the order they joined: the first still waiting carries it.
        self.callers: list[object] = []
        self.on_wire = False
        self.done = False
        self.acked = 0
        self.error: Exception | None = None


class _Lane:
    """One agent argument's batches: the first is in flight (or next to go), the last joinable."""

    def __init__(self) -> None:
        self.batches: collections.deque[_Batch] = collections.deque()
        self.in_flight = False
        self.changed = trio.Event()

    def joinable(self) -> _Batch:
        if self.batches and not self.batches[-1].on_wire:
            return self.batches[-1]
        batch = _Batch()
        self.batches.append(batch)
        return batch

    def notify(self) -> None:
        """Wake every caller of this lane to look again (a batch ended, or the wire is free)."""
        self.changed.set()
        self.changed = trio.Event()


class AckStatistics:
    """What the batcher did: acks asked for, and the ``wake/ack`` requests that carried them."""

    def __init__(self) -> None:
        self.acks = 0
        self.requests = 0


class AckBatcher:
    """At most one ``wake/ack`` in flight per agent argument; acks issued meanwhile share the next.

    Args:
        send: sends one ``wake/ack`` and returns its ``acked`` count (raises its error).
    """

    def __init__(self, send: SendAck) -> None:
        self._send = send
        self._lanes: dict[str | None, _Lane] = {}
        self.statistics = AckStatistics()

    async def ack(self, seqs: Sequence[int], agent: str | None) -> int:
        """Ack ``seqs``; returns the ``acked`` count of the ``wake/ack`` that carried them.

        Raises:
            Exception: that request's error (``RpcError``, ``RequestTimeout``, ``PeerClosed``…).
        """
        self.statistics.acks += 1
        wanted = list(seqs)
        if not all(type(seq) is int for seq in wanted):
            # Not ours to judge: the daemon's answer to these seqs is this caller's alone.
            self.statistics.requests += 1
            return await self._send(wanted, agent)
        lane = self._lanes.get(agent)
        if lane is None:
            lane = self._lanes[agent] = _Lane()
        batch = lane.joinable()
        batch.seqs.update(dict.fromkeys(wanted))
        caller = object()
        batch.callers.append(caller)
        try:
            while not batch.done:
                if not lane.in_flight and lane.batches[0] is batch and batch.callers[0] is caller:
                    await self._carry(lane, batch, agent)
                else:
                    await lane.changed.wait()
        finally:
            batch.callers.remove(caller)
            if not batch.done and not batch.on_wire:
                if not batch.callers:
                    # Every caller of a batch not yet sent has gone: nobody waits for it.
                    lane.batches.remove(batch)
                lane.notify()  # the next caller may be the one to carry it now
            if not lane.batches and not lane.in_flight and self._lanes.get(agent) is lane:
                self._lanes.pop(agent)
        if batch.error is not None:
            raise batch.error
        return batch.acked

    async def _carry(self, lane: _Lane, batch: _Batch, agent: str | None) -> None:
        """Send ``batch`` from this caller's task; its outcome is every caller's."""
        lane.in_flight = True
        batch.on_wire = True
        self.statistics.requests += 1
        try:
            batch.acked = await self._send(list(batch.seqs), agent)
            batch.done = True
        except Exception as exc:
            batch.error = exc
            batch.done = True
        finally:
            lane.in_flight = False
            if batch.done:
                lane.batches.popleft()
            else:
                # This caller was cancelled with the batch on the wire: another of its callers
                # sends it again (a second ack of a seq is harmless); a later ack may join it.
                batch.on_wire = False
            lane.notify()
