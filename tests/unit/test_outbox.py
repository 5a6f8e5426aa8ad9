"""The host outbox's replay: it ends even while new wakes keep arriving during each page read,
and no interleaving across its reads and sends sends a wake twice, after its ack, or never."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from mcpl_router.host_notices import ServerStateNotice
from mcpl_router.hosts.outbox import HostOutbox
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.wakes import Wake
from mcpl_router.store.journal import JournalFailure
from mcpl_router.store.records import Delivery, StoredDelivery, StoredEvent


class _Journal:
    """Committed, unacked deliveries; a read takes its snapshot, then yields (as a thread would)."""

    def __init__(self) -> None:
        self.rows: list[StoredDelivery] = []
        self.reads = 0
        self.during_read: Any = None

    def commit(self, seq: int) -> StoredDelivery:
        row = StoredDelivery(Delivery("kai", "message", (), False), StoredEvent(seq, "s", "general", "message", {"n": seq}, 0.0))
        self.rows.append(row)
        return row

    def ack_committed(self, *seqs: int) -> None:
        self.rows = [row for row in self.rows if row.event.seq not in seqs]

    async def unacked_deliveries(self, agent: str, *, after_seq: int = 0, limit: int = 1000) -> list[StoredDelivery]:
        self.reads += 1
        page = [row for row in self.rows if row.event.seq > after_seq][:limit]
        if self.during_read is not None:
            self.during_read()  # committed after the snapshot: not in this page
        await trio.lowlevel.checkpoint()
        return page


class _Connection:
    id = 1

    def __init__(self) -> None:
        self.sent: list[int] = []

    async def notify(self, method: str, params: Any) -> bool:
        await trio.lowlevel.checkpoint()
        self.sent.append(params["seq"])
        return True

    def notify_nowait(self, method: str, params: Any) -> bool | None:
        # Room for one in two: both ways of sending are taken.
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls % 2:
            return None
        self.sent.append(params["seq"])
        return True


def _wake(seq: int) -> Wake:
    return Wake(seq=seq, agent="kai", reason="message", channel=ChannelRef("s", "general"), payload={"n": seq}, tags=(), addressed=False)


def _outbox(journal: _Journal, connection: _Connection, **options: Any) -> HostOutbox:
    return HostOutbox(
        connection,  # type: ignore[arg-type]
        journal,  # type: ignore[arg-type]
        render=lambda wake: {"seq": wake.seq},
        wake_of=lambda stored: _wake(stored.event.seq),
        held=lambda wake: False,
        **options,
    )


@asynccontextmanager
async def _running_after_hello(journal: _Journal, outbox: HostOutbox, *backlog: int) -> AsyncIterator[None]:
    """kai claimed with ``backlog`` in the journal; the outbox runs for the block, which starts
    once the hello's replay has sent what it could."""
    for seq in backlog:
        journal.commit(seq)
    outbox.add_agent("kai")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        await trio.testing.wait_all_tasks_blocked()
        yield
        nursery.cancel_scope.cancel()


async def test_replay_ends_while_wakes_keep_coming() -> None:
    journal = _Journal()
    connection = _Connection()
    outbox = _outbox(journal, connection)
    for seq in range(1, 6):
        journal.commit(seq)  # a backlog from before the hello
    next_seq = iter(range(6, 100))

    def arrive() -> None:
        # A wake committed (and offered) during every read, as under steady traffic.
        seq = next(next_seq)
        journal.commit(seq)
        outbox.offer(_wake(seq))

    journal.during_read = arrive
    outbox.add_agent("kai")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        await trio.testing.wait_all_tasks_blocked()
        assert outbox.statistics().replaying == 0
        journal.during_read = None
        reads = journal.reads
        for _ in range(20):
            arrive()  # fresh now: straight out, no read of the journal
            await trio.testing.wait_all_tasks_blocked()
        assert journal.reads == reads
        nursery.cancel_scope.cancel()
    assert connection.sent == sorted(set(connection.sent))  # each once, in seq order
    assert connection.sent == list(range(1, connection.sent[-1] + 1))


async def test_replay_ends_under_steady_traffic_after_its_memory_overflowed_once() -> None:
    """A burst during one page read overflows the offered memory (a host far behind); traffic
    then goes on, a wake during every read. The next short page still ends the replay: what
    was offered before a read began is in that read's page, so the memory starts afresh."""
    journal = _Journal()
    connection = _Connection()
    outbox = _outbox(journal, connection, fresh_limit=3)
    for seq in range(1, 6):
        journal.commit(seq)
    next_seq = iter(range(6, 1000))

    def arrive(count: int) -> None:
        for _ in range(count):
            seq = next(next_seq)
            journal.commit(seq)
            outbox.offer(_wake(seq))

    # The first read: more than the memory holds; then one a read, for fifty reads (the code
    # before this fix read the journal until the traffic stopped).
    bursts = iter([5, *[1] * 50])
    journal.during_read = lambda: arrive(next(bursts, 0))
    outbox.add_agent("kai")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        await trio.testing.wait_all_tasks_blocked()
        assert outbox.statistics().offered_spills == 1
        assert outbox.statistics().replaying == 0  # ended while a wake came during every read
        assert journal.reads == 2  # the burst's read, then one short page that ended it
        journal.during_read = None
        arrive(3)  # fresh now: straight out
        await trio.testing.wait_all_tasks_blocked()
        assert journal.reads == 2
        nursery.cancel_scope.cancel()
    assert connection.sent == list(range(1, connection.sent[-1] + 1))  # each once, in seq order
    assert connection.sent[-1] == 5 + 5 + 1 + 3


async def test_a_wake_acked_while_replaying_is_not_sent_from_memory() -> None:
    journal = _Journal()
    connection = _Connection()
    outbox = _outbox(journal, connection)
    journal.commit(1)

    def arrive() -> None:
        journal.commit(2)
        outbox.offer(_wake(2))
        outbox.acked("kai", [2])  # the host acks it before it was sent (it had it from elsewhere)
        journal.rows = [row for row in journal.rows if row.event.seq != 2]
        journal.during_read = None

    journal.during_read = arrive
    outbox.add_agent("kai")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert connection.sent == [1]
    assert outbox.statistics().replaying == 0


class _Recording(_Connection):
    """Records notices and wakes in the order they were queued."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[str] = []

    async def notify(self, method: str, params: Any) -> bool:
        await trio.lowlevel.checkpoint()
        self.order.append(method)
        return True

    def notify_nowait(self, method: str, params: Any) -> bool | None:
        self.order.append(method)
        return True


async def test_a_wake_with_nothing_ahead_is_queued_at_once_and_one_behind_a_notice_waits_its_turn() -> None:
    journal = _Journal()
    connection = _Recording()
    sent: list[str] = []  # each wake's agent, as /metrics is told of it
    outbox = _outbox(journal, connection, on_sent=sent.append)
    outbox.add_agent("kai")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        await trio.testing.wait_all_tasks_blocked()  # the replay found nothing: caught up
        journal.commit(1)
        outbox.offer(_wake(1))
        assert connection.order == ["wake"] and sent == ["kai"]  # from the offer itself
        outbox.notify(ServerStateNotice("a", "connecting", "ready"))
        journal.commit(2)
        outbox.offer(_wake(2))
        assert connection.order == ["wake"]  # behind the notice, for the sender task
        await trio.testing.wait_all_tasks_blocked()
        assert connection.order == ["wake", "server/state", "wake"] and sent == ["kai", "kai"]
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("during_the_read", ["nothing", "a second rewind", "an ack of 4"])
async def test_a_rewind_sends_the_older_wakes_handed_over_and_nothing_twice(during_the_read: str) -> None:
    """A fork's spawn failed: wakes 2 and 3 were its, now they are kai's (older than what kai
    was sent). The rewind reads them back; 1 and 4, sent already, do not go again.

    Also when another rewind comes while kai's replay reads a page (of 5): that page is not sent
    on, since it would move kai past the wakes handed over; the next read sends 2, 3 and 5. And
    when the host acks 4 during the read and the ack commits: the page, read before, still lists
    4, which must not go out again.
    """
    journal = _Journal()
    connection = _Connection()
    outbox = _outbox(journal, connection)
    async with _running_after_hello(journal, outbox, 1, 4):
        assert sorted(connection.sent) == [1, 4]
        journal.commit(2)
        journal.commit(3)
        if during_the_read == "a second rewind":
            journal.commit(5)

        def meanwhile() -> None:
            journal.during_read = None
            if during_the_read == "a second rewind":
                outbox.rewind("kai", 1)
            else:
                settle = outbox.host_acked(["kai"], [4])
                journal.ack_committed(4)
                settle(None)  # durable, so answered

        journal.during_read = None if during_the_read == "nothing" else meanwhile
        journal.rows.sort(key=lambda row: row.event.seq)
        outbox.rewind("kai", 4 if during_the_read == "a second rewind" else 1)
        await trio.testing.wait_all_tasks_blocked()
    expected = [1, 2, 3, 4, 5] if during_the_read == "a second rewind" else [1, 2, 3, 4]
    assert sorted(connection.sent) == expected and len(connection.sent) == len(expected)
    assert outbox.statistics().replaying == 0



class _Roomy(_Connection):
    """Room for every wake at once; a gate's batches recorded apart."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[int, ...]] = []

    def notify_nowait(self, method: str, params: Any) -> bool | None:
        if "seqs" in params:
            self.batches.append(tuple(params["seqs"]))
        else:
            self.sent.append(params["seq"])
        return True


async def _replay_with(journal: _Journal, outbox: HostOutbox, during_read: Any) -> None:
    journal.during_read = during_read
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()


async def test_a_gate_batch_acked_during_a_page_read_is_not_sent_again_one_by_one() -> None:
    journal = _Journal()
    connection = _Roomy()
    outbox = _outbox(journal, connection)
    for seq in (1, 2, 3):
        journal.commit(seq)
    outbox.add_agent("kai")
    assert outbox.offer_batch("kai", (2, 3), {"seq": 3, "seqs": [2, 3]})

    def host_acks_the_batch() -> None:
        journal.during_read = None
        outbox.acked("kai", [2, 3])
        journal.ack_committed(2, 3)

    await _replay_with(journal, outbox, host_acks_the_batch)
    assert connection.batches == [(2, 3)]
    assert connection.sent == [1]


async def test_a_wake_acked_early_while_its_page_is_read_is_never_sent() -> None:
    """As the test before, but the wake acked early is in the page being read, not in memory."""
    journal = _Journal()
    connection = _Roomy()
    outbox = _outbox(journal, connection)
    journal.commit(1)
    journal.commit(2)

    def host_acks_2_early() -> None:
        journal.during_read = None
        outbox.acked("kai", [2])  # it had 2 from elsewhere
        journal.ack_committed(2)

    outbox.add_agent("kai")
    await _replay_with(journal, outbox, host_acks_2_early)
    assert connection.sent == [1]


async def test_a_wakes_late_offer_after_a_replay_page_sent_it_sends_nothing() -> None:
    """Wake 2's commit lands just before a page read's snapshot, and its callback's offer runs
    after the page was sent and the replay ended: the offer finds it sent already."""
    journal = _Journal()
    connection = _Roomy()
    outbox = _outbox(journal, connection)
    journal.commit(1)
    journal.commit(2)  # committed; its offer is still to come
    outbox.add_agent("kai")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        await trio.testing.wait_all_tasks_blocked()
        assert connection.sent == [1, 2] and outbox.statistics().replaying == 0
        assert outbox.offer(_wake(2))  # the commit's callback, late: still ours, nothing sent
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert connection.sent == [1, 2]


async def test_a_rewound_replay_reads_past_its_wakes_in_flight_not_the_same_page_again() -> None:
    """Window 3: 3 and 4 in flight, 2 handed back and sent, then acked. With room for one, the
    page after 2 is [3], in flight: the next read starts after it, not at it again."""
    journal = _Journal()
    connection = _Roomy()
    outbox = _outbox(journal, connection, window=3)
    async with _running_after_hello(journal, outbox, 3, 4):
        assert connection.sent == [3, 4]
        journal.commit(2)
        journal.rows.sort(key=lambda row: row.event.seq)
        outbox.rewind("kai", 1)
        await trio.testing.wait_all_tasks_blocked()
        assert connection.sent == [3, 4, 2]
        reads = journal.reads
        settle = outbox.host_acked(["kai"], [2])
        journal.ack_committed(2)
        settle(None)
        with trio.move_on_after(1):
            await trio.testing.wait_all_tasks_blocked()  # never returned while it read in a loop
        assert journal.reads - reads <= 3  # [3], [4], then an empty page ends the replay
        assert outbox.statistics().replaying == 0
    assert connection.sent == [3, 4, 2]


async def test_an_ack_is_remembered_until_its_commit_settles_or_the_page_under_way_is_done() -> None:
    """Nothing is kept for good: an ack settled with no page under way is forgotten at once;
    one settled while a page is read, once that page is done (the next read's snapshot shows
    it), even when the replay ends on that page and no read comes again."""
    journal = _Journal()
    outbox = _outbox(journal, _Roomy())
    outbox.add_agent("kai")
    outbox.host_acked(["kai"], [1, 2])(None)  # no page under way: forgotten at once
    settle_7_to_9 = outbox.host_acked(["kai"], [7, 8, 9])  # e.g. wakes the host had from elsewhere
    cursor = outbox._cursors["kai"]
    assert cursor.acking == {7: 1, 8: 1, 9: 1}
    seen: list[set[int]] = []

    def settles_during_the_read() -> None:
        journal.during_read = None
        settle_7_to_9(None)  # the page being read may predate it: kept for that page
        seen.append(set(cursor.settled_in_page))

    await _replay_with(journal, outbox, settles_during_the_read)
    assert seen == [{7, 8, 9}] and outbox.statistics().replaying == 0
    assert cursor.acking == {} and cursor.settled_in_page == set()


async def test_an_ack_settling_after_its_agent_was_claimed_again_leaves_the_new_count_alone() -> None:
    """kai leaves this connection and comes back (a new cursor) while an old ack of 3 is on its
    way, and the host acks 3 again: the old ack's settling must not forget the new one's."""
    journal = _Journal()
    outbox = _outbox(journal, _Roomy())
    outbox.add_agent("kai")
    old_ack = outbox.host_acked(["kai"], [3])
    outbox.remove_agent("kai")
    outbox.add_agent("kai")
    new_ack = outbox.host_acked(["kai"], [3])
    old_ack(None)
    assert outbox._cursors["kai"].acking == {3: 1}
    new_ack(None)
    assert outbox._cursors["kai"].acking == {}


@pytest.mark.parametrize("sent_before", [False, True])
async def test_a_second_ack_of_a_wake_keeps_it_from_a_page_after_the_first_ack_failed(sent_before: bool) -> None:
    """The host acks a wake twice before the first commit settles, and that one fails (the wake
    stays owed). The second is still on its way when a page read predating it lists the wake;
    it commits and is answered during the read: the page must not send the wake. Both for an
    early ack (2, never sent) and for a wake sent, then handed around by a rewind (4)."""
    journal = _Journal()
    connection = _Roomy()
    outbox = _outbox(journal, connection)
    journal.commit(1)
    journal.commit(4 if sent_before else 2)
    outbox.add_agent("kai")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        if sent_before:
            await trio.testing.wait_all_tasks_blocked()
            assert connection.sent == [1, 4]
        seq = 4 if sent_before else 2
        first = outbox.host_acked(["kai"], [seq])
        second = outbox.host_acked(["kai"], [seq])
        first(JournalFailure("disk I/O error"))

        def second_ack_commits() -> None:
            journal.during_read = None
            journal.ack_committed(seq)
            second(None)  # durable, so answered: the wake must never go out after this

        journal.during_read = second_ack_commits
        if sent_before:
            journal.commit(2)
            journal.commit(3)
            journal.rows.sort(key=lambda row: row.event.seq)
            outbox.rewind("kai", 1)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert connection.sent == ([1, 4, 2, 3] if sent_before else [1])


class _Full(_Connection):
    """The connection's own outbox has no room now: every wake waits for the sender task."""

    def notify_nowait(self, method: str, params: Any) -> bool | None:
        return None


async def test_a_wake_acked_while_it_waits_in_memory_is_never_sent() -> None:
    journal = _Journal()
    connection = _Full()
    outbox = _outbox(journal, connection)
    outbox.add_agent("kai")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(outbox.run)
        await trio.testing.wait_all_tasks_blocked()  # caught up: nothing in the journal
        journal.commit(1)
        journal.commit(2)
        outbox.offer(_wake(1))
        outbox.offer(_wake(2))  # both wait in memory for the sender
        outbox.acked("kai", [1])  # acked before it went out (the host had it from elsewhere)
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    assert connection.sent == [2]
