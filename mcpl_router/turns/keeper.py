"""What keeps an open turn: its typing refreshed, its lease and its host's connection watched.

A turn's keeper task starts only once the turn has lived its *first look* (the shortest of the
connection poll, the typing interval and the lease): before then nothing a keeper watches can
fall due, and most turns of a busy daemon have ended by then, with no keeper's task, sleep or
cancellation spent on them. The typing start a turn opens with goes out at once, in a short task
of its own (never in the host's call: a server slow to read must not hold ``turn/open``).
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Protocol

import trio

from mcpl_router.logs import Logger, get_logger

if TYPE_CHECKING:
    from mcpl_router.turns.run import TurnRun, TurnTimings
    from mcpl_router.turns.typing import TypingIndicators

__all__ = ["KeptTurns", "TurnKeepers"]


class KeptTurns(Protocol):
    """What a keeper reads and calls of the turns it keeps (the :class:`TurnManager`): the
    timings as they are now (tests shorten them), the typing, and a turn's one way to end."""

    @property
    def timings(self) -> TurnTimings: ...

    @property
    def typing(self) -> TypingIndicators: ...

    async def finish(self, run: TurnRun, outcome: str, *, why: str, usage: object = None) -> None: ...


class TurnKeepers:
    """Starts each open turn's keeper when it is first due, and runs the keepers."""

    def __init__(self, manager: KeptTurns) -> None:
        self._manager = manager
        self._log = get_logger()
        self._nursery: trio.Nursery | None = None
        # Turns opened and not yet kept, in open order, each with when its keeper starts: at
        # most one entry per open turn (an ending turn leaves at once). An OrderedDict: most
        # leave early, and a plain dict's first key is found past their holes.
        self._waiting: collections.OrderedDict[str, tuple[TurnRun, float]] = collections.OrderedDict()
        self._arrived = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start keepers as they fall due, until cancelled (the keepers run in this nursery)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await self._start_when_due(nursery)
            finally:
                self._nursery = None

    async def _start_when_due(self, nursery: trio.Nursery) -> None:
        while True:
            if not self._waiting:
                self._arrived = trio.Event()
                await self._arrived.wait()
                continue
            # The oldest first: with the timings unchanged, first opened is first due.
            turn_id, (run, due) = next(iter(self._waiting.items()))
            if trio.current_time() < due:
                await trio.sleep_until(due)
                continue
            self._waiting.popitem(last=False)
            if not run.finished:
                nursery.start_soon(self.keep, run, name=f"turn-keeper:{turn_id}")

    def opened(self, run: TurnRun) -> None:
        """A turn opened: its typing starts now, its keeper once it is first due."""
        if run.finished:
            # Ended while it opened (superseded by the next open, or the drain, while the open
            # ended the turn before it): its stop has gone, so no start may follow.
            return
        manager = self._manager
        nursery = self._nursery
        if nursery is None:
            # No running keepers (a TurnManager driven directly by a unit test): keep it now.
            trio.lowlevel.spawn_system_task(self.keep, run, name=f"turn-keeper:{run.turn.turn_id}")
            return
        if run.host_gone:
            # Its host left while it opened: kept now, so it ends at once, with no typing sent.
            nursery.start_soon(self.keep, run, name=f"turn-keeper:{run.turn.turn_id}")
            return
        if run.turn.routing.typing_channel is not None and not self._first_typing_now(run):
            nursery.start_soon(self._first_typing, run, name=f"turn-typing:{run.turn.turn_id}")
        timings = manager.timings
        first_look = min(timings.connection_poll, timings.typing_interval, timings.lease)
        self._waiting[run.turn.turn_id] = (run, trio.current_time() + first_look)
        self._arrived.set()

    def ended(self, run: TurnRun) -> None:
        """A turn ended: a keeper not started yet never will be; a running one is cancelled."""
        self._waiting.pop(run.turn.turn_id, None)
        # A task started after this sees ``finished`` and ends before making its scope.
        if run.first_typing is not None:
            run.first_typing.cancel()
        if run.cancel is not None:
            run.cancel.cancel()

    def _first_typing_now(self, run: TurnRun) -> bool:
        """The first typing start queued in the opener's call while its server's outbox has
        room: no task a turn for a send that doesn't wait. False: the task sends it."""
        manager = self._manager
        try:
            sent = manager.typing.start_nowait(run)
        except Exception:
            # The task tries again, and a failure there ends the turn as a keeper's would.
            self._log.exception("turn.typing.start_failed", agent=run.turn.agent, turn=run.turn.turn_id)
            return False
        if sent:
            run.next_typing = trio.current_time() + manager.timings.typing_interval
        return sent

    async def _first_typing(self, run: TurnRun) -> None:
        manager = self._manager
        if run.finished:
            return
        # Set before the send, so a keeper starting meanwhile doesn't start it twice.
        run.next_typing = trio.current_time() + manager.timings.typing_interval
        run.first_typing = scope = trio.CancelScope()
        try:
            with scope:
                await manager.typing.refresh(run)
        except Exception:
            # As a keeper's crash would: logged, and the turn ends.
            self._log.exception("turn.keeper.crashed", agent=run.turn.agent, turn=run.turn.turn_id)
            await manager.finish(run, "failed", why="keeper-crashed")

    async def keep(self, run: TurnRun) -> None:
        """Refresh the turn's typing and watch its lease and connection until the turn ends."""
        manager = self._manager
        turn = run.turn
        log: Logger = self._log
        if run.finished:
            return
        run.cancel = scope = trio.CancelScope()
        try:
            with scope:
                while True:
                    now = trio.current_time()
                    if run.host_gone:
                        await manager.finish(run, "aborted", why="host-gone")
                        return
                    if now >= run.lease_deadline:
                        log.warning("turn.lease.expired", agent=turn.agent, turn=turn.turn_id, lease=manager.timings.lease)
                        await manager.finish(run, "aborted", why="lease-expired")
                        return
                    moved = run.typing_sent is not None and run.typing_sent[0] != turn.routing.typing_channel
                    if moved or (turn.routing.typing_channel is not None and now >= run.next_typing):
                        await manager.typing.refresh(run)
                        run.next_typing = trio.current_time() + manager.timings.typing_interval
                    wake_at = min(run.lease_deadline, now + manager.timings.connection_poll)
                    if turn.routing.typing_channel is not None:
                        wake_at = min(wake_at, run.next_typing)
                    await trio.sleep_until(wake_at)
        except Exception:
            # A keeper's exception must not end the keepers' nursery: log it, end the turn.
            log.exception("turn.keeper.crashed", agent=turn.agent, turn=turn.turn_id)
            await manager.finish(run, "failed", why="keeper-crashed")
