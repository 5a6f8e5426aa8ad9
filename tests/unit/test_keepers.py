"""A turn's keeper starts when it is first due: a short turn spends none; a long one is kept.

Stand-ins for the manager's timings, typing and finish, on trio's autojump clock (virtual time).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio

from mcpl_router.routing.modes import mode_named
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.turns import Turn, TurnRouting
from mcpl_router.turns import TurnRun
from mcpl_router.turns.keeper import TurnKeepers
from mcpl_router.turns.run import TurnTimings

GENERAL = ChannelRef("a", "general")


class _Typing:
    def __init__(self) -> None:
        self.starts: list[tuple[str, float]] = []
        #: Whether the server's outbox has room now (the opening start then needs no task).
        self.room = False
        #: Which way each start went: "queued" in the opener's call, "task" from a task.
        self.ways: list[str] = []

    def start_nowait(self, run: TurnRun) -> bool:
        if not self.room:
            return False
        self.starts.append((run.turn.turn_id, trio.current_time()))
        self.ways.append("queued")
        run.typing_sent = (GENERAL, 1)
        return True

    async def refresh(self, run: TurnRun) -> None:
        await trio.lowlevel.checkpoint()
        self.starts.append((run.turn.turn_id, trio.current_time()))
        self.ways.append("task")
        run.typing_sent = (GENERAL, 1)


class _Manager:
    def __init__(self) -> None:
        self.timings = TurnTimings(connection_poll=0.5, typing_interval=2.0, lease=60.0)
        self.typing = _Typing()
        self.ended: list[tuple[str, str]] = []
        self.keepers = _CountingKeepers(self)

    async def finish(self, run: TurnRun, outcome: str, *, why: str) -> None:
        run.finished = True
        self.ended.append((run.turn.turn_id, why))
        self.keepers.ended(run)


class _CountingKeepers(TurnKeepers):
    def __init__(self, manager: Any) -> None:
        super().__init__(manager)
        self.kept: list[str] = []

    async def keep(self, run: TurnRun) -> None:
        self.kept.append(run.turn.turn_id)
        await super().keep(run)


@asynccontextmanager
async def keepers_running(manager: _Manager) -> AsyncIterator[None]:
    """The manager's keepers running for the block (cancelled at its end)."""
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.keepers.run)
        yield
        nursery.cancel_scope.cancel()


def _run(turn_id: str) -> TurnRun:
    turn = Turn(turn_id=turn_id, inference_id=f"i-{turn_id}", agent="ada", routing=TurnRouting.starting_at(GENERAL))
    return TurnRun(turn=turn, connection=None, mode=mode_named("locus"), lease_deadline=trio.current_time() + 60)


async def test_a_turn_ended_before_its_first_look_costs_no_keeper_but_got_its_typing(autojump_clock: trio.abc.Clock) -> None:
    manager = _Manager()
    async with keepers_running(manager):
        run = _run("short")
        assert run.turn.routing.typing_channel == GENERAL
        manager.keepers.opened(run)
        await trio.sleep(0.1)
        await manager.finish(run, "completed", why="closed")
        await trio.sleep(10)
    assert manager.keepers.kept == []
    assert [turn for turn, _at in manager.typing.starts] == ["short"]  # the opening start, at once
    assert manager.typing.starts[0][1] < 0.1


async def test_a_turn_that_outlives_its_first_look_is_kept(autojump_clock: trio.abc.Clock) -> None:
    manager = _Manager()
    async with keepers_running(manager):
        run = _run("long")
        opened_at = trio.current_time()
        manager.keepers.opened(run)
        await trio.sleep(4.5)  # typing refreshed at 2 s and 4 s
        run.lease_deadline = trio.current_time()  # then its lease runs out
        await trio.sleep(1)
    assert manager.keepers.kept == ["long"]
    starts = [round(at - opened_at, 1) for _turn, at in manager.typing.starts]
    assert starts == [0.0, 2.0, 4.0]
    assert manager.ended == [("long", "lease-expired")]


async def test_a_turn_whose_host_left_while_it_opened_ends_at_once_with_no_typing(autojump_clock: trio.abc.Clock) -> None:
    manager = _Manager()
    async with keepers_running(manager):
        run = _run("orphan")
        run.connection = _GoneConnection()  # type: ignore[assignment]
        manager.keepers.opened(run)
        await trio.sleep(0.01)
    assert manager.ended == [("orphan", "host-gone")]
    assert manager.typing.starts == []


async def test_a_crash_in_the_opening_typing_start_ends_the_turn_as_a_keepers_would(autojump_clock: trio.abc.Clock) -> None:
    manager = _Manager()

    async def crash(_run: TurnRun) -> None:
        raise RuntimeError("boom")

    manager.typing.refresh = crash  # type: ignore[method-assign]
    async with keepers_running(manager):
        manager.keepers.opened(_run("crashing"))
        await trio.sleep(0.01)
    assert manager.ended == [("crashing", "keeper-crashed")]


async def test_with_room_the_opening_typing_start_is_queued_in_the_openers_call(autojump_clock: trio.abc.Clock) -> None:
    manager = _Manager()
    manager.typing.room = True
    async with keepers_running(manager):
        run = _run("roomy")
        manager.keepers.opened(run)
        # Before any scheduling point: sent from the opener's own call, no task for it.
        assert manager.typing.ways == ["queued"]
        assert run.next_typing == trio.current_time() + manager.timings.typing_interval
        await trio.sleep(2.5)  # the keeper's refresh at 2 s comes from the keeper's task
        await manager.finish(run, "completed", why="closed")
    assert manager.typing.ways == ["queued", "task"]
    assert manager.keepers.kept == ["roomy"]


async def test_without_room_the_opening_typing_start_waits_in_a_task_not_in_the_opener(autojump_clock: trio.abc.Clock) -> None:
    manager = _Manager()
    async with keepers_running(manager):
        run = _run("crowded")
        manager.keepers.opened(run)
        await trio.sleep(0.1)
    assert manager.typing.ways == ["task"]


async def test_a_turn_that_ended_while_it_opened_gets_no_typing_start(autojump_clock: trio.abc.Clock) -> None:
    """Superseded (or drained) while its open ended the turn before it: its stop has gone."""
    manager = _Manager()
    manager.typing.room = True
    async with keepers_running(manager):
        run = _run("ended-while-opening")
        await manager.finish(run, "aborted", why="superseded")
        manager.keepers.opened(run)
        await trio.sleep(10)
    assert manager.typing.starts == []
    assert manager.keepers.kept == []


async def test_a_typing_task_that_starts_after_its_turn_ended_sends_nothing(autojump_clock: trio.abc.Clock) -> None:
    manager = _Manager()
    async with keepers_running(manager):
        run = _run("gone-before-it-ran")
        manager.keepers.opened(run)  # no room: a task is started for the typing
        await manager.finish(run, "completed", why="closed")  # ...and the turn ends before it runs
        await trio.sleep(1)
    assert manager.typing.starts == []
    assert run.typing_sent is None


class _GonePeer:
    closed = True


class _GoneConnection:
    peer = _GonePeer()
