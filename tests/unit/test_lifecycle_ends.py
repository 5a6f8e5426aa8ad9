"""Every ``started`` gets exactly one terminal, whatever is stuck and however a turn ends.

Stand-in links (no sockets) on trio's autojump clock: a stuck server is one whose send never
returns. Timing is virtual; nothing here measures wall-clock time.
"""

from __future__ import annotations

import types
from typing import Any

import trio

from mcpl_router.config import ServerConfig
from mcpl_router.jsonrpc import PeerClosed
from mcpl_router.mcpl.context import queue_lifecycle, send_lifecycle
from mcpl_router.mcpl.link import LinkState
from mcpl_router.routing.modes import mode_named
from mcpl_router.routing.router import Router
from mcpl_router.routing.turns import Turn, TurnRouting
from mcpl_router.turns import FINISH_GRACE, TurnManager, TurnRun


class _AllGranted:
    def allows(self, _capability: str) -> bool:
        return True


class StandInLink:
    def __init__(self, server_id: str, *, send_delay: float = 0.0, gone: bool = False) -> None:
        self.server_id = server_id
        self.send_delay = send_delay
        self.gone = gone
        self.state = LinkState.READY
        self.grant = _AllGranted()
        self.epoch = 1
        self.phases: list[str] = []
        self.config = ServerConfig(id=server_id, transport="stdio", command="true")

    async def send_notification(self, method: str, params: dict[str, Any], capability: str | None = None) -> None:
        if self.gone:
            raise PeerClosed("connection closed")
        await trio.sleep(self.send_delay)
        self.phases.append(params["phase"])

    def send_notification_nowait(self, method: str, params: dict[str, Any], capability: str | None = None) -> bool:
        if self.gone:
            raise PeerClosed("connection closed")
        # A slow stand-in has no room now: the send waits, under its deadline.
        if self.send_delay:
            return False
        self.phases.append(params["phase"])
        return True


class _Sessions:
    async def notify_agent(self, *_: Any) -> bool:
        return True


def _manager(links: dict[str, StandInLink]) -> TurnManager:
    # Starting and ending inference reads only the links and the sessions' trace notify.
    return TurnManager(router=Router(), links=links, journal=types.SimpleNamespace(), sessions=_Sessions())  # type: ignore[arg-type]


def _open_run(manager: TurnManager, index: int = 1) -> TurnRun:
    turn = Turn(turn_id=f"t{index}", inference_id=f"i{index}", agent=f"agent{index}", routing=TurnRouting.starting_at(None))
    manager.table.add(turn)
    run = TurnRun(turn=turn, connection=None, mode=mode_named("locus"), lease_deadline=1e9)
    manager._runs[turn.turn_id] = run
    return run


async def test_a_stuck_server_does_not_cost_another_its_terminal(autojump_clock: trio.abc.Clock) -> None:
    stuck, healthy = StandInLink("a", send_delay=60), StandInLink("b")
    with trio.CancelScope(shield=True, deadline=trio.current_time() + 5):
        await send_lifecycle([stuck, healthy], {"phase": "completed"}, only={"a": 1, "b": 1})
    assert healthy.phases == ["completed"]


async def test_started_is_remembered_even_when_the_host_call_is_cancelled(autojump_clock: trio.abc.Clock) -> None:
    fast, slow = StandInLink("a"), StandInLink("b", send_delay=0.5)
    manager = _manager({"a": fast, "b": slow})
    run = _open_run(manager)
    with trio.move_on_after(0.1):  # the host drops while turn/context is still sending "started"
        await manager.lifecycle.start(run)
    await manager.finish(run, "aborted", why="host-gone")
    assert fast.phases == ["started", "aborted"]
    assert slow.phases == ["started", "aborted"]


async def test_shutdown_drain_takes_one_bound_not_one_per_turn(autojump_clock: trio.abc.Clock) -> None:
    stuck = StandInLink("a", send_delay=60)
    manager = _manager({"a": stuck})
    for index in range(4):
        run = _open_run(manager, index)
        run.started = {"a": 1}
        run.started_done.set()
    began = trio.current_time()
    await manager.drain()
    assert trio.current_time() - began < 2 * FINISH_GRACE  # one bound (virtual time), not four
    assert manager.table.all() == []


def test_a_server_with_room_is_told_at_once_and_one_without_is_left_to_wait_for() -> None:
    roomy, full = StandInLink("a"), StandInLink("b", send_delay=0.5)
    told: dict[str, int] = {}
    waiting = queue_lifecycle([roomy, full], {"phase": "started"}, told=told)
    assert roomy.phases == ["started"] and full.phases == []
    assert waiting == [full]
    # Both recorded before their send: each may see "started", so each must get a terminal.
    assert told == {"a": 1, "b": 1}


def test_a_server_whose_connection_is_gone_is_not_counted_as_told() -> None:
    gone, healthy = StandInLink("a", gone=True), StandInLink("b")
    told: dict[str, int] = {}
    assert queue_lifecycle([gone, healthy], {"phase": "started"}, told=told) == []
    assert told == {"b": 1}


async def test_a_turn_whose_servers_have_room_or_not_gets_started_and_one_terminal_on_each(autojump_clock: trio.abc.Clock) -> None:
    roomy, full = StandInLink("a"), StandInLink("b", send_delay=0.5)
    manager = _manager({"a": roomy, "b": full})
    run = _open_run(manager)
    await manager.lifecycle.start(run)  # a's queued at once, b's waited for
    await manager.finish(run, "completed", why="closed")
    assert roomy.phases == full.phases == ["started", "completed"]
    assert run.started == {"a": 1, "b": 1}
