"""The sessions' sends that a turn makes on its way: cancellation points, never scheduling points.

A turn's host trace (``inference:started``) is queued between the server's lifecycle ``started``
and its ``context/beforeInference``; a yield there let the server's writer send the first alone.
A real journal in a temporary directory; no sockets.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

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
                assert await sessions.notify_agent("nobody", "inference:started", {}) is False  # no owner
            assert passes.count == before  # not a scheduling point: nothing else ran meanwhile
    finally:
        journal.close()


async def test_a_trace_is_still_a_cancellation_point(tmp_path: Path) -> None:
    sessions, journal = _sessions(tmp_path)
    try:
        with trio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(trio.Cancelled):
                await sessions.notify_agent("nobody", "inference:started", {})
    finally:
        journal.close()


async def test_a_wake_read_from_memory_lets_no_other_task_run_first(tmp_path: Path) -> None:
    """``turn/open`` reads its wakes: a recent one comes from memory without a scheduler pass."""
    sessions, journal = _sessions(tmp_path)
    event = InboundEvent("a", "general", "message", "m-1", {"channelId": "general", "messageId": "m-1"})
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
