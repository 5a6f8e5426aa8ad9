"""Every ``started`` gets exactly one terminal, whatever is stuck and however a turn ends.

Stand-in links (no sockets) on trio's autojump clock: a stuck server is one whose send never
returns. Timing is virtual; nothing here measures wall-clock time.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import msgspec
import trio
import trio.testing

from mcpl_router.jsonrpc import PeerClosed
from mcpl_router.mcpl.context import queue_lifecycle, send_lifecycle
from mcpl_router.mcpl.link import LinkState
from mcpl_router.mcpl.session import LifecycleParams, ServerSession
from mcpl_router.routing.modes import mode_named
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import RegistrationPolicy
from mcpl_router.routing.router import Router
from mcpl_router.routing.turns import Turn, TurnRouting
from mcpl_router.testing.scheduling import scheduler_passes
from mcpl_router.turns import FINISH_GRACE, TurnManager, TurnRun


class _AllGranted:
    def allows(self, _capability: str) -> bool:
        return True


class StandInPort:
    """A server connection (the session's port) whose sends take ``send_delay``."""

    def __init__(self, server_id: str, *, send_delay: float = 0.0, gone: bool = False) -> None:
        self.server_id = server_id
        self.send_delay = send_delay
        self.gone = gone
        self.state = LinkState.READY
        self.grant = _AllGranted()
        self.epoch = 1
        self.phases: list[str] = []

    @property
    def request_timeout(self) -> float:
        return 30.0

    async def send_notification(self, method: str, params: dict[str, Any], capability: str | None = None) -> None:
        if self.gone:
            raise PeerClosed("connection closed")
        await trio.sleep(self.send_delay)
        self.phases.append(msgspec.to_builtins(params)["phase"])

    def send_notification_nowait(self, method: str, params: dict[str, Any], capability: str | None = None) -> bool:
        if self.gone:
            raise PeerClosed("connection closed")
        # A slow stand-in has no room now: the send waits, under its deadline.
        if self.send_delay:
            return False
        self.phases.append(msgspec.to_builtins(params)["phase"])
        return True


class _Sessions:
    async def notify_agent(self, *_: Any) -> bool:
        return True


class _NoTools:
    """A name table with nothing in it (these turns call no tool)."""

    def offered(self, agent: Any, run: Any) -> list[dict[str, Any]]:
        return []

    def is_send(self, name: str, arguments: Any) -> bool:
        return False


def _servers(*ports: StandInPort) -> list[ServerSession]:
    return [ServerSession(port) for port in ports]  # type: ignore[arg-type]


def _phase(phase: str) -> LifecycleParams:
    return LifecycleParams(inference_id="i1", conversation_id="ann", turn_index=0, phase=phase)


def _manager(ports: dict[str, StandInPort]) -> TurnManager:
    # Starting and ending inference reads only the servers' sessions and the sessions' trace notify.
    servers = {server_id: ServerSession(port) for server_id, port in ports.items()}  # type: ignore[arg-type]
    return TurnManager(router=Router(), servers=servers, journal=types.SimpleNamespace(), sessions=_Sessions(), tools=_NoTools())  # type: ignore[arg-type]


def _open_run(manager: TurnManager, index: int = 1) -> TurnRun:
    turn = Turn(turn_id=f"t{index}", inference_id=f"i{index}", agent=f"agent{index}", routing=TurnRouting.starting_at(None))
    manager.table.add(turn)
    run = TurnRun(turn=turn, connection=None, mode=mode_named("locus"), lease_deadline=1e9)
    manager._runs[turn.turn_id] = run
    return run


async def test_a_stuck_server_does_not_cost_another_its_terminal(autojump_clock: trio.abc.Clock) -> None:
    stuck, healthy = StandInPort("a", send_delay=60), StandInPort("b")
    with trio.CancelScope(shield=True, deadline=trio.current_time() + 5):
        await send_lifecycle(_servers(stuck, healthy), _phase("completed"), only={"a": 1, "b": 1})
    assert healthy.phases == ["completed"]


async def test_started_is_remembered_even_when_the_host_call_is_cancelled(autojump_clock: trio.abc.Clock) -> None:
    fast, slow = StandInPort("a"), StandInPort("b", send_delay=0.5)
    manager = _manager({"a": fast, "b": slow})
    run = _open_run(manager)
    with trio.move_on_after(0.1):  # the host drops while turn/context is still sending "started"
        await manager.lifecycle.start(run)
    await manager.finish(run, "aborted", why="host-gone")
    assert fast.phases == ["started", "aborted"]
    assert slow.phases == ["started", "aborted"]


async def test_shutdown_drain_takes_one_bound_not_one_per_turn(autojump_clock: trio.abc.Clock) -> None:
    stuck = StandInPort("a", send_delay=60)
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
    roomy, full = StandInPort("a"), StandInPort("b", send_delay=0.5)
    told: dict[str, int] = {}
    servers = _servers(roomy, full)
    waiting = queue_lifecycle(servers, _phase("started"), told=told)
    assert roomy.phases == ["started"] and full.phases == []
    assert waiting == [servers[1]]
    # Both recorded before their send: each may see "started", so each must get a terminal.
    assert told == {"a": 1, "b": 1}


def test_a_server_whose_connection_is_gone_is_not_counted_as_told() -> None:
    gone, healthy = StandInPort("a", gone=True), StandInPort("b")
    told: dict[str, int] = {}
    assert queue_lifecycle(_servers(gone, healthy), _phase("started"), told=told) == []
    assert told == {"b": 1}


async def test_a_turn_whose_servers_have_room_or_not_gets_started_and_one_terminal_on_each(autojump_clock: trio.abc.Clock) -> None:
    roomy, full = StandInPort("a"), StandInPort("b", send_delay=0.5)
    manager = _manager({"a": roomy, "b": full})
    run = _open_run(manager)
    await manager.lifecycle.start(run)  # a's queued at once, b's waited for
    await manager.finish(run, "completed", why="closed")
    assert roomy.phases == full.phases == ["started", "completed"]
    assert run.started == {"a": 1, "b": 1}


# -- the end queued at once, and what doesn't fit sent in order by the waiting path ----------


class RecordingPort(StandInPort):
    """Every notification in the order it reached the server; ``room`` is how many more its
    outbox takes now (None: always room). A send that must wait goes after a checkpoint."""

    def __init__(self, server_id: str, *, room: int | None = None) -> None:
        super().__init__(server_id)
        self.room = room
        self.heard: list[tuple[str, str]] = []
        self.waited: list[tuple[str, str]] = []

    @staticmethod
    def _what(method: str, params: Any) -> tuple[str, str]:
        params = msgspec.to_builtins(params)  # a session's typed params, as the wire has them
        return method, str(params.get("op") or params.get("phase") or params.get("content"))

    async def send_notification(self, method: str, params: dict[str, Any], capability: str | None = None) -> None:
        if self.gone:
            raise PeerClosed("connection closed")
        await trio.lowlevel.checkpoint()
        self.waited.append(self._what(method, params))
        self.heard.append(self._what(method, params))

    def send_notification_nowait(self, method: str, params: dict[str, Any], capability: str | None = None) -> bool:
        if self.gone:
            raise PeerClosed("connection closed")
        if self.room is not None:
            if self.room == 0:
                return False
            self.room -= 1
        self.heard.append(self._what(method, params))
        return True


GENERAL_A = ChannelRef("a", "general")
END_IN_ORDER = [
    ("channels/typing", "stop"),
    ("channels/outgoing/complete", "hello"),
    ("inference/lifecycle", "completed"),
]


def _ending_turn(room: int | None) -> tuple[TurnManager, TurnRun, RecordingPort]:
    """A turn typing in a:general, with a stream there and ``started`` told to a: all its end
    goes to one server, whose outbox takes ``room`` more messages."""
    link = RecordingPort("a")
    router = Router()
    router.registry.register("a", [{"id": "general"}], RegistrationPolicy.permissive())
    manager = TurnManager(router=router, servers={"a": ServerSession(link)}, journal=types.SimpleNamespace(), sessions=_Sessions(), tools=_NoTools())  # type: ignore[arg-type]
    run = _open_run(manager)
    run.typing_sent = (GENERAL_A, link.epoch)
    run.streams[GENERAL_A] = (link.epoch, ["hello"])
    run.started = {"a": link.epoch}
    run.started_done.set()
    link.room = room
    return manager, run, link


async def test_a_turn_ending_on_a_server_with_room_is_ended_in_the_call_with_no_scheduling_point() -> None:
    ends = [_ending_turn(room=None) for _ in range(3)]
    async with scheduler_passes() as passes:
        before = passes.count
        for manager, run, _link in ends:
            await manager.finish(run, "completed", why="closed")
        assert passes.count == before  # no task ran meanwhile: the queued path, not the waiting one
    for _manager_, run, link in ends:
        assert link.heard == END_IN_ORDER and link.waited == []
        assert run.typing_sent is None and run.streams == {} and run.started == {}


async def test_an_end_that_does_not_fit_goes_on_in_order_with_nothing_sent_twice() -> None:
    for room in range(3):  # the stop fits and nothing after it; the stop and the complete; none
        manager, run, link = _ending_turn(room=room)
        await manager.finish(run, "completed", why="closed")
        assert link.heard == END_IN_ORDER, room
        assert link.waited == END_IN_ORDER[room:], room  # what didn't fit went by the waiting path


async def test_an_end_whose_connection_is_gone_sends_nothing_raises_nothing_and_forgets_it_all() -> None:
    manager, run, link = _ending_turn(room=None)
    link.gone = True  # closed after the turn started: every send raises PeerClosed
    await manager.finish(run, "completed", why="closed")
    assert link.heard == [] and link.waited == []
    assert run.typing_sent is None and run.streams == {} and run.started == {}
    assert manager.run_of(run.turn.turn_id) is None  # ended all the same


async def test_an_end_while_started_is_still_going_out_sends_its_terminal_after_it_and_once() -> None:
    manager, run, link = _ending_turn(room=None)
    run.started_done = trio.Event()  # "started" is still being sent (to a slow server)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(manager.finish, run, "completed", why="closed"))
        await trio.testing.wait_all_tasks_blocked()
        assert ("inference/lifecycle", "completed") not in link.heard  # the terminal waits for the start
        run.started_done.set()
    # Each once, the terminal last; the stop and the complete by the waiting path (concurrently,
    # as for two servers), since the end could not be known to go to one server.
    assert sorted(link.heard) == sorted(END_IN_ORDER) and link.heard[-1] == END_IN_ORDER[-1]
    assert sorted(link.waited) == sorted(END_IN_ORDER[:2])
