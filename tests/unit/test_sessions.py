"""The sessions' sends that a turn makes on its way: cancellation points, never scheduling points.

A turn's host trace (``inference:started``) is queued between the server's lifecycle ``started``
and its ``context/beforeInference``; a yield there let the server's writer send the first alone.
A real journal in a temporary directory; no sockets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from mcpl_router.store.records import EventKind
from mcpl_router.host_notices import InferenceStartedNotice, ServerStateNotice
from mcpl_router.hosts.agents import AckParams, AgentSpecParams, HelloParams
from mcpl_router.hosts.connection import HostConnection
from mcpl_router.hosts.sessions import SessionManager
from mcpl_router.metrics import DaemonMetrics
from mcpl_router.routing.router import Router
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.store.journal import Delivery, InboundEvent, Journal
from mcpl_router.testing.scheduling import scheduler_passes
from mcpl_router.turns.invitations import Invitations


def _sessions(tmp_path: Path) -> tuple[SessionManager, Journal]:
    router = Router()
    journal = Journal(tmp_path / "journal.sqlite3")
    sessions = SessionManager(
        agents={}, journal=journal, router=router, metrics=DaemonMetrics([]), invitations=Invitations(router), servers_list=list
    )
    return sessions, journal


async def test_a_trace_to_an_agent_lets_no_other_task_run_first(tmp_path: Path) -> None:
    sessions, journal = _sessions(tmp_path)
    try:
        async with scheduler_passes() as passes:
            before = passes.count
            for _ in range(20):
                assert await sessions.notify_agent("nobody", InferenceStartedNotice("nobody", "t1", "i1", None, None)) is False  # no owner
            assert passes.count == before  # not a scheduling point: nothing else ran meanwhile
    finally:
        journal.close()


async def test_a_trace_is_still_a_cancellation_point(tmp_path: Path) -> None:
    sessions, journal = _sessions(tmp_path)
    try:
        with trio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(trio.Cancelled):
                await sessions.notify_agent("nobody", InferenceStartedNotice("nobody", "t1", "i1", None, None))
    finally:
        journal.close()


async def test_a_wake_read_from_memory_lets_no_other_task_run_first(tmp_path: Path) -> None:
    """``turn/open`` reads its wakes: a recent one comes from memory without a scheduler pass."""
    sessions, journal = _sessions(tmp_path)
    event = InboundEvent("a", "general", EventKind.MESSAGE, "m-1", {"channelId": "general", "messageId": "m-1"})
    sessions.accepted(7, event, [Delivery("ann", "message", (), True)])  # no owner: remembered, pending
    try:
        async with scheduler_passes() as passes:
            before = passes.count
            for _ in range(20):
                wake = await sessions.wake(7, "ann")
                assert wake is not None and wake.channel == ChannelRef("a", "general")
            assert passes.count == before
    finally:
        journal.close()


async def test_an_ack_the_outbox_remembers_is_forgotten_once_the_journal_settles_it(tmp_path: Path) -> None:
    """``wake/ack`` opens the window at once and the outbox remembers the seqs until the ack's
    commit settles (a page read meanwhile may still list them): settled, they are forgotten, so
    the memory holds only acks on their way. Also an ack of nothing, answered at once."""
    sessions, journal = _sessions(tmp_path)
    connection = HostConnection("unix")
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            await nursery.start(sessions.run)
            sessions.opened(connection)
            sessions.hello(connection, HelloParams(host="h", agents=[AgentSpecParams(name="kai")]))
            cursor = sessions._outboxes[connection]._cursors["kai"]
            answer = await sessions.ack(connection, AckParams(seqs=[5, 6]))
            assert cursor.acking == {5: 1, 6: 1}  # on its way: remembered
            assert sessions.outbox_statistics()[0]["acksPending"] == 2  # and shown in ``status``
            assert answer.wait is not None
            assert await answer.wait() == {"acked": 0}
            assert cursor.acking == {} and sessions.outbox_statistics()[0]["acksPending"] == 0
            answer = await sessions.ack(connection, AckParams(seqs=[]))
            assert answer.wait is not None and await answer.wait() == {"acked": 0}
            nursery.cancel_scope.cancel()
    finally:
        journal.close()


class _RecordingPeer:
    """What a host connection's peer is to the outbox: room for everything; the wakes it got."""

    closed = False

    def __init__(self) -> None:
        self.wakes: list[int] = []

    def notify_nowait(self, method: str, params: Any) -> bool:
        if method == "wake":
            self.wakes.append(params["seq"])
        return True

    async def notify(self, method: str, params: Any) -> None:
        await trio.lowlevel.checkpoint()
        self.notify_nowait(method, params)


@pytest.mark.parametrize("route", ["straight out", "behind a notice"])
async def test_a_resume_point_past_the_journals_last_seq_holds_back_no_later_wake(tmp_path: Path, route: str) -> None:
    """``resumeFrom`` from another journal (10, where this one's last seq is 0): the wakes that
    come after the hello are new, whether they go out from the commit's callback or wait
    behind a notice for the sender task."""
    sessions, journal = _sessions(tmp_path)
    peer = _RecordingPeer()
    connection = HostConnection("unix", peer=peer)  # type: ignore[arg-type]
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            await nursery.start(sessions.run)
            sessions.opened(connection)
            sessions.hello(connection, HelloParams(host="h", agents=[AgentSpecParams(name="kai")], resume_from=10))
            outbox = sessions._outboxes[connection]
            with trio.fail_after(10):
                while outbox.statistics().replaying:  # the hello's replay reads in a thread: nothing
                    await trio.sleep(0.01)
            if route == "behind a notice":
                assert outbox.notify(ServerStateNotice("a", "connecting", "ready"))
            event = InboundEvent("a", "general", EventKind.MESSAGE, "m-3", {"channelId": "general", "messageId": "m-3"})
            sessions.accepted(3, event, [Delivery("kai", "message", (), True)])
            with trio.fail_after(10):
                while not peer.wakes:
                    await trio.sleep(0.01)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    finally:
        journal.close()
    assert peer.wakes == [3]


class _StuckPeer:
    """A host that reads nothing: no room now, and a send that waits never returns."""

    closed = False

    def __init__(self) -> None:
        self.close_reason: str | None = None

    def notify_nowait(self, method: str, params: Any) -> bool:
        return False

    async def notify(self, method: str, params: Any) -> None:
        await trio.sleep_forever()

    async def aclose(self, reason: str = "closed by us", *, flush: bool = True) -> None:
        await trio.lowlevel.checkpoint()
        self.closed = True
        self.close_reason = reason


async def test_a_host_that_reads_no_notices_is_disconnected_even_while_a_send_to_it_waits(tmp_path: Path) -> None:
    from mcpl_router.hosts.outbox import NOTICE_LIMIT

    sessions, journal = _sessions(tmp_path)
    peer = _StuckPeer()
    connection = HostConnection("unix", peer=peer)  # type: ignore[arg-type]
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(sessions.run)
            sessions.opened(connection)
            sessions.hello(connection, HelloParams(host="h", agents=[AgentSpecParams(name="kai")]))
            notice = ServerStateNotice("a", "connecting", "ready")
            await sessions.broadcast(notice)
            await trio.testing.wait_all_tasks_blocked()  # the sender waits on the first, for ever
            for _ in range(NOTICE_LIMIT + 1):
                await sessions.broadcast(notice)
            assert sessions.directory.outbox_full_disconnects == 1
            with trio.fail_after(5):
                while not peer.closed:
                    await trio.sleep(0.01)
            assert peer.close_reason == "too slow: outbox full"
            nursery.cancel_scope.cancel()
    finally:
        journal.close()
