"""What the daemon owes one host connection: its notifications in order, and its wakes paced.

Wakes are **flow-controlled**: at most ``window`` wakes are outstanding (sent and not acked)
per connection. A fresh wake goes straight out while the connection keeps up; past the window
it waits in memory, up to ``fresh_limit`` wakes, and past that it stays where it already is,
durable in the journal, and the outbox reads it back in seq order, a page at a time, as acks
make room. A backlog of any size (the 20,000 unacked wakes
of a host that was away) is replayed the same way after ``session/hello``, so a host that reads
and acks gets every wake, once, in order, and is never disconnected for the size of its backlog.
A page is read while wakes are still being committed, acked and offered, so what the page lists
is checked against what the outbox knows went out since: the wakes in flight, the acks whose
commit the page may predate, a rewind under way, and a wake's offer that comes after its page.

Other notifications (notices, traces, ``server/state``, ``channels/changed``, summary wakes)
queue in order, up to :data:`NOTICE_LIMIT`. Sending waits on the connection's own bounded
outbox (:class:`~mcpl_router.jsonrpc.Peer`): a host that stops reading for the peer's stall
timeout is disconnected there. A host that lets :data:`NOTICE_LIMIT` notifications pile up
is disconnected too (``host.outbox.full``); everything it was owed that matters is in the
journal.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

import attrs
import trio

from mcpl_router.host_notices import HostNotice, wire_of
from mcpl_router.logs import get_logger
from mcpl_router.routing.wakes import Wake

if TYPE_CHECKING:
    from mcpl_router.hosts.connection import HostConnection
    from mcpl_router.store.journal import Journal, StoredDelivery

#: Wakes outstanding (sent, not acked) per connection; the rest wait.
WAKE_WINDOW: Final = 1024
#: Fresh wakes that wait in memory for room in the window, per connection; past this they wait
#: in the journal and are read back (a host that falls this far behind costs a read per page,
#: not memory). Without it a host a little behind kept every wake on the journal-read path.
FRESH_LIMIT: Final = 4096
#: Wakes read back from the journal per query.
REPLAY_PAGE: Final = 256
#: Notifications queued without yielding before the sender lets the other tasks run.
BURST: Final = 64
#: Other notifications waiting for one connection before it counts as not reading.
NOTICE_LIMIT: Final = 4096


@attrs.define
class _Cursor:
    """One agent's place in its wakes on this connection."""

    #: The highest seq sent (or the resume point): the journal is read after it.
    sent_through: int
    #: True while the journal may hold wakes past ``sent_through`` that were not sent.
    replaying: bool = True
    #: Counts wakes offered while replaying, so a page read meanwhile can't miss one.
    offers: int = 0
    #: The wakes offered since the replay's current page read began, in seq order (at most
    #: :data:`FRESH_LIMIT`; None once more came, until the next read): when that page shows the
    #: journal exhausted, these are what it may not have held, so the replay ends on them
    #: instead of reading again while traffic keeps coming.
    offered: deque[Wake] | None = attrs.field(factory=deque)
    sent: int = 0
    #: Seqs a gate's batched wake carries (hosts/gate.py): the replay skips them.
    batched: set[int] = attrs.field(factory=set)
    #: Counts rewinds: a page read or sent across one is from before it (see ``_send_pass``).
    rewinds: int = 0
    #: Acks of each seq on their way (their commit not settled yet): a page read meanwhile can
    #: still list the wake, which must not go out again (see :meth:`HostOutbox.acked`).
    acking: dict[int, int] = attrs.field(factory=dict)
    #: Seqs whose ack settled while the page under way was read or sent (it may predate the
    #: ack); forgotten when that page is done.
    settled_in_page: set[int] = attrs.field(factory=set)
    #: True from a page read's start until that page has been sent.
    paging: bool = False


@attrs.frozen
class OutboxStatistics:
    agents: int
    in_flight: int
    fresh_queued: int
    notices_queued: int
    replaying: int
    wakes_sent: int
    wakes_replayed: int
    #: Wakes kept in memory while their agent's replay reads (the offered shortcut).
    offered_queued: int = 0
    #: Times a wake went to the journal because the memory behind the window was full, and
    #: times a replay's offered memory overflowed (its replay then reads the journal to its end).
    fresh_spills: int = 0
    offered_spills: int = 0
    #: Acked seqs remembered until their ack's commit settles (bounded by the acks the journal's
    #: write queue holds).
    acks_pending: int = 0

    def to_wire(self) -> dict[str, int]:
        """As ``status`` shows it: each field in camelCase (``inFlight``, ``freshSpills``…)."""
        return {_camel(name): value for name, value in attrs.asdict(self).items()}


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


class HostOutbox:
    """The wakes and notifications owed to one connection, sent by :meth:`run` in its own task.

    Args:
        connection: the host connection (``notify`` returns False once it is gone).
        journal: where unsent wakes are read back from.
        render: a wake's notification params (shown names and invitations as of sending).
        on_sent: told of each wake's agent once the wake is queued on the connection (for ``/metrics``).
        wake_of: a stored delivery as a wake.
        held: whether a wake read back from the journal is held back (a tuned-out channel's, or
            one a wake gate holds or batches; it stays unacked).
    """

    def __init__(
        self,
        connection: HostConnection,
        journal: Journal,
        *,
        render: Callable[[Wake], dict[str, object]],
        wake_of: Callable[[StoredDelivery], Wake],
        held: Callable[[Wake], bool],
        on_sent: Callable[[str], None] | None = None,
        window: int = WAKE_WINDOW,
        fresh_limit: int = FRESH_LIMIT,
    ) -> None:
        self.connection = connection
        self._journal = journal
        self._render = render
        self._on_sent = on_sent or (lambda agent: None)
        self._wake_of = wake_of
        self._held = held
        self.window = window
        self.fresh_limit = fresh_limit
        self._cursors: dict[str, _Cursor] = {}
        self._in_flight: set[tuple[int, str]] = set()
        self._fresh: deque[Wake] = deque()
        self._notices: deque[HostNotice] = deque()
        # A gate's batched wakes: (agent, seqs, params), sent in order as the window allows.
        self._batches: deque[tuple[str, tuple[int, ...], dict[str, object]]] = deque()
        self._changed = trio.Event()
        self.closed = False
        self._disconnect: str | None = None
        # The sender's loop: a disconnect cancels a send blocked on a host that doesn't read.
        self._sending_scope = trio.CancelScope()
        self._counts = {"wakes_sent": 0, "wakes_replayed": 0, "fresh_spills": 0, "offered_spills": 0}
        self._burst = 0
        self._sending = False
        self._log = get_logger(connection=connection.id)

    # -- what the sessions tell it -------------------------------------------------------------

    def add_agent(self, agent: str, *, after_seq: int = 0) -> None:
        """This connection now owns ``agent``: replay its unacked wakes after ``after_seq``.

        A wake at or below ``after_seq`` counts as the host's, so it must not be past the
        journal's last seq (the sessions clamp a host's ``resumeFrom`` to it)."""
        self._cursors[agent] = _Cursor(sent_through=after_seq)
        self._poke()

    def rewind(self, agent: str, after_seq: int) -> None:
        """Wakes of ``agent`` after ``after_seq`` were owed to another agent until now (a fork
        whose spawn failed): read them back from the journal, in order (those in flight and
        the ones a gate's batch carries are not sent again)."""
        cursor = self._cursors.get(agent)
        if cursor is None:
            return
        cursor.sent_through = min(cursor.sent_through, after_seq)
        cursor.replaying = True
        cursor.offers += 1
        cursor.rewinds += 1
        # What was offered meanwhile is not all there is now: the replay reads the journal to
        # its end rather than ending on the offered wakes.
        cursor.offered = None
        self._poke()

    def remove_agent(self, agent: str) -> None:
        """Another connection took ``agent``: nothing more of it goes out here."""
        self._cursors.pop(agent, None)
        self._in_flight = {key for key in self._in_flight if key[1] != agent}
        self._fresh = deque(wake for wake in self._fresh if wake.agent != agent)
        self._batches = deque(batch for batch in self._batches if batch[0] != agent)

    def offer_batch(self, agent: str, seqs: tuple[int, ...], params: dict[str, object]) -> bool:
        """A gate's batched wake of ``agent`` carrying ``seqs`` (one ``wake`` notification, each
        seq outstanding until acked); False if this connection doesn't own the agent."""
        cursor = self._cursors.get(agent)
        if cursor is None or self.closed:
            return False
        cursor.batched.update(seqs)  # the replay must not send them again one by one
        self._batches.append((agent, seqs, params))
        self._poke()
        return True

    def offer(self, wake: Wake) -> bool:
        """A wake just committed for one of our agents; False if this connection doesn't own it."""
        cursor = self._cursors.get(wake.agent)
        if cursor is None or self.closed:
            return False
        if wake.seq <= cursor.sent_through or (wake.seq, wake.agent) in self._in_flight or wake.seq in cursor.acking:
            # Sent already (a replay's page read, taken just after this wake's commit, had it
            # before the commit's callback offered it), or the host has it: its resume point
            # (never past the journal's last seq at hello, so no later wake is below it), or
            # an ack before it went out.
            return True
        if cursor.replaying:
            cursor.offers += 1  # the replay reads it from the journal, in order
            self._keep_offered(cursor, wake)
        elif not self._fresh and not self._sending and not self._notices and not self._batches and len(self._in_flight) < self.window:
            # Nothing ahead of it and no pass under way: queued on the connection now, from
            # the commit's callback, rather than one scheduler hop later by the sender task.
            try:
                sent = self._send_now(wake, cursor)
            except Exception:
                # On the commit's callback: a wake that fails to render must not cost the rest of
                # the commit their offers. The sender task tries it again, in its own task.
                self._log.exception("wake.send_now.failed", agent=wake.agent, seq=wake.seq)
                sent = None
            if sent is None:
                self._fresh.append(wake)  # the connection's outbox is full: the sender waits
            elif not sent:
                self.closed = True
            else:
                return True
        elif len(self._fresh) < self.fresh_limit:
            self._fresh.append(wake)
        else:
            # The window is full and so is the memory behind it: from here this agent's wakes
            # come from the journal, in order.
            cursor.replaying = True
            cursor.offers += 1
            cursor.offered = deque()
            self._keep_offered(cursor, wake)
            self._counts["fresh_spills"] += 1
            self._fresh = deque(w for w in self._fresh if w.agent != wake.agent)
            self._log.info("wake.window.full", agent=wake.agent, window=self.window, seq=wake.seq)
        self._poke()
        return True

    def _keep_offered(self, cursor: _Cursor, wake: Wake) -> None:
        # Bounded: past it the replay reads them all back from the journal.
        if cursor.offered is not None:
            if len(cursor.offered) < self.fresh_limit:
                cursor.offered.append(wake)
            else:
                cursor.offered = None
                self._counts["offered_spills"] += 1

    def notify(self, notice: HostNotice) -> bool:
        """Queue a notification; False when the queue is full (the caller disconnects)."""
        if self.closed:
            return False
        if len(self._notices) >= NOTICE_LIMIT:
            return False
        self._notices.append(notice)
        self._poke()
        return True

    def acked(self, agent: str, seqs: list[int]) -> None:
        """The host acked ``seqs`` of ``agent``: the window opens now, before the ack is durable.

        Until the ack's commit settles (see :meth:`host_acked`), a page read from the journal can
        still list those wakes as unacked, so the cursor remembers them and the replay never
        sends them again.
        """
        cursor = self._cursors.get(agent)
        in_flight = self._in_flight
        # Acked before it was sent (a host acking what it has from elsewhere): such a wake may
        # wait in memory (fresh, or offered during a replay) and must never go out after its
        # ack was answered. Rare, so only then are the queues filtered.
        early: set[int] = set()
        for seq in seqs:
            sent = (seq, agent)
            if sent in in_flight:
                in_flight.remove(sent)
            else:
                early.add(seq)
            if cursor is not None:
                cursor.batched.discard(seq)
                cursor.acking[seq] = cursor.acking.get(seq, 0) + 1
        if early:
            self._fresh = deque(wake for wake in self._fresh if wake.agent != agent or wake.seq not in early)
            if cursor is not None and cursor.offered:
                cursor.offered = deque(wake for wake in cursor.offered if wake.seq not in early)
        self._poke()

    def host_acked(self, agents: Sequence[str], seqs: list[int]) -> Callable[[object], None]:
        """``wake/ack`` of ``seqs`` for ``agents``: :meth:`acked` for each. Returns what to call
        once the ack's commit has settled (durable; or failed, and then they stay owed and a
        later replay may send them again): from then a page read shows it, so the cursors the
        ack was counted on (not a later owner's) forget it: at once, or, while a page that may
        predate it is being read or sent, when that page is done."""
        for agent in agents:
            self.acked(agent, seqs)
        cursors = [cursor for cursor in map(self._cursors.get, agents) if cursor is not None]
        return lambda _failure: self._acks_settled(cursors, seqs)

    @staticmethod
    def _acks_settled(cursors: list[_Cursor], seqs: Sequence[int]) -> None:
        for cursor in cursors:
            for seq in seqs:
                pending = cursor.acking.get(seq)
                if pending is None:
                    continue
                if pending > 1:
                    cursor.acking[seq] = pending - 1  # another ack of it is still on its way
                else:
                    del cursor.acking[seq]
                if cursor.paging:
                    cursor.settled_in_page.add(seq)

    def close(self, *, disconnect: str | None = None) -> None:
        """Stop sending; with ``disconnect``, the sender task also closes the connection with
        that reason (a host too slow to read its notices: its send, blocked on that host, is
        cancelled first; what it was sending is journaled or was a notice to that host)."""
        self.closed = True
        self._disconnect = disconnect
        if disconnect is not None:
            self._sending_scope.cancel()
        self._poke()

    def statistics(self) -> OutboxStatistics:
        return OutboxStatistics(
            agents=len(self._cursors),
            in_flight=len(self._in_flight),
            fresh_queued=len(self._fresh),
            notices_queued=len(self._notices),
            replaying=sum(1 for cursor in self._cursors.values() if cursor.replaying),
            offered_queued=sum(len(cursor.offered or ()) for cursor in self._cursors.values()),
            acks_pending=sum(len(cursor.acking) for cursor in self._cursors.values()),
            **self._counts,
        )

    def _poke(self) -> None:
        self._changed.set()

    # -- the sender ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Send until the connection closes."""
        with self._sending_scope:
            while not self.closed:
                await self._changed.wait()
                self._changed = trio.Event()
                while not self.closed and await self._send_some():
                    # What a pass queued without waiting: the others run before the next one.
                    await trio.lowlevel.checkpoint()
        if self._disconnect is not None and self.connection.peer is not None:
            await self.connection.peer.aclose(self._disconnect)

    async def _send_some(self) -> bool:
        """Send what is owed and fits; True if anything went out (there may be more)."""
        # While a pass is under way (it may wait with a wake taken out of the queues), a new
        # wake queues behind it: order is the pass's to keep.
        self._sending = True
        try:
            return await self._send_pass()
        finally:
            self._sending = False

    async def _send_pass(self) -> bool:
        progressed = False
        while self._notices:
            method, params = wire_of(self._notices.popleft())
            if not await self._send(method, params):
                return False
            progressed = True
        while self._batches and len(self._in_flight) < self.window:
            agent, seqs, params = self._batches.popleft()
            if self._cursors.get(agent) is None:
                continue
            self._in_flight.update((seq, agent) for seq in seqs)
            self._counts["wakes_sent"] += 1
            if not await self._send("wake", params):
                return False
            progressed = True
        while self._fresh and len(self._in_flight) < self.window:
            wake = self._fresh.popleft()
            cursor = self._cursors.get(wake.agent)
            if cursor is None or cursor.replaying or wake.seq <= cursor.sent_through or (wake.seq, wake.agent) in self._in_flight:
                continue
            if not await self._send_wake(wake, cursor):
                return False
            progressed = True
        for agent, cursor in list(self._cursors.items()):
            room = self.window - len(self._in_flight)
            if room <= 0:
                break
            if not cursor.replaying:
                continue
            cursor.paging = True
            try:
                sent = await self._send_page(agent, cursor, min(room, REPLAY_PAGE))
            finally:
                cursor.paging = False
                cursor.settled_in_page.clear()  # the next read's snapshot shows those acks
            if sent is None:
                return False
            progressed = progressed or sent
        return progressed

    async def _send_page(self, agent: str, cursor: _Cursor, limit: int) -> bool | None:
        """Read one page of a replaying agent's wakes after ``sent_through`` and send what is
        owed; True if anything moved (there may be more), None if the connection is gone."""
        offers, rewinds = cursor.offers, cursor.rewinds
        # What the end needs is what is offered from here on: anything committed before the
        # read's snapshot is in a page that comes back short. Started afresh at each read, so
        # a memory that overflowed once (a host far behind under a long flood) doesn't keep
        # the agent on the journal's path until traffic pauses.
        cursor.offered = deque()
        page = await self._journal.unacked_deliveries(agent, after_seq=cursor.sent_through, limit=limit)
        progressed = False
        for stored in page:
            if self._cursors.get(agent) is not cursor:
                return progressed  # taken by another connection meanwhile: its new one replays it
            if cursor.rewinds != rewinds:
                # Rewound during the read or a send: the older wakes handed over come first,
                # and sending this page on would move sent_through past them.
                return True
            wake = self._wake_of(stored)
            if wake.seq <= cursor.sent_through:
                continue
            if (wake.seq, agent) in self._in_flight or wake.seq in cursor.acking or wake.seq in cursor.settled_in_page:
                # Out already (in flight), or acked after the read's snapshot: nothing to send,
                # and the next read starts after it (a page of only these is not read again
                # and again while the host holds them).
                cursor.sent_through = wake.seq
                continue
            if wake.seq in cursor.batched:
                cursor.sent_through = wake.seq  # it went out (or will) in a gate's batch
                continue
            if self._held(wake):
                cursor.sent_through = wake.seq  # held for a tune-out's summary; stays unacked
                continue
            if not await self._send_wake(wake, cursor):
                return None
            self._counts["wakes_replayed"] += 1
            progressed = True
        if self._cursors.get(agent) is not cursor:
            return progressed  # taken meanwhile: its new connection replays it
        if len(page) < limit and (cursor.offers == offers or self._end_on_offered(cursor)):
            cursor.replaying = False
            cursor.offered = deque()
            self._log.info("wake.replay.caught_up", agent=agent, sent=cursor.sent, through=cursor.sent_through)
            return True
        return progressed or bool(page)

    def _end_on_offered(self, cursor: _Cursor) -> bool:
        """The page just read found the journal exhausted, but wakes were offered meanwhile:
        end the replay on the offered ones if every one is known and they fit in memory.

        Each offered wake was committed before it was offered, so any committed before the
        read's snapshot is in the page or already sent (its seq at most ``sent_through``); the
        rest committed after it, with higher seqs, and are in ``offered`` in seq order. Any
        wake committed later is offered after this, fresh, behind them.
        """
        offered = cursor.offered
        if offered is None:
            return False
        unsent = [wake for wake in offered if wake.seq > cursor.sent_through]
        if len(self._fresh) + len(unsent) > self.fresh_limit:
            return False
        self._fresh.extend(unsent)
        return True

    async def _send_wake(self, wake: Wake, cursor: _Cursor) -> bool:
        self._mark_sent(wake, cursor)
        if not await self._send("wake", self._render(wake)):
            return False
        self._on_sent(wake.agent)
        return True

    def _send_now(self, wake: Wake, cursor: _Cursor) -> bool | None:
        """Queue one wake without waiting: True queued, False the connection is gone, None no
        room (nothing changed: the wake is the sender's to send)."""
        sent = self.connection.notify_nowait("wake", self._render(wake))
        if sent:
            self._mark_sent(wake, cursor)
            self._on_sent(wake.agent)
        return sent

    def _mark_sent(self, wake: Wake, cursor: _Cursor) -> None:
        if wake.seq > cursor.sent_through:
            cursor.sent_through = wake.seq
        self._in_flight.add((wake.seq, wake.agent))
        cursor.sent += 1
        self._counts["wakes_sent"] += 1

    async def _send(self, method: str, params: object) -> bool:
        # Queued straight into the connection's outbox while it has room: a commit's worth of
        # wakes goes out in one burst (and one write), not one scheduler round trip each. A
        # checkpoint every BURST keeps a long burst from holding the other tasks up.
        sent = self.connection.notify_nowait(method, params)
        if sent is None:
            sent = await self.connection.notify(method, params)
            self._burst = 0
        else:
            self._burst += 1
            if self._burst >= BURST:
                self._burst = 0
                await trio.lowlevel.checkpoint()
        if sent:
            return True
        # Gone: what it was owed that matters (its wakes) stays unacked in the journal.
        self.closed = True
        return False
