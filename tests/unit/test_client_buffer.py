"""The client's notification buffer: bounded per kind, wakes never dropped, drops counted."""

from __future__ import annotations

import pytest
import trio

from mcpl_router.client import Notification, NotificationBuffer


def note(method: str, n: int) -> Notification:
    return Notification(method, {"n": n})


async def test_a_host_that_reads_only_wakes_keeps_bounded_memory_and_the_drops_are_counted() -> None:
    buffer = NotificationBuffer(max_wakes=8, max_notifications=3)
    for n in range(10):
        await buffer.put(note("server/state", n))
        await buffer.put(note("wake", n))
        assert (await buffer.receive("wake")).params == {"n": n}
    stats = buffer.statistics()
    assert stats.notifications_buffered == 3 and stats.current_buffer_used == 3
    assert stats.dropped == 7 and stats.dropped_by_method == {"server/state": 7}
    assert stats.wakes_received == 10 and stats.notifications_received == 10
    # The newest three are the ones kept, oldest first.
    assert [(await buffer.receive()).params["n"] for _ in range(3)] == [7, 8, 9]


async def test_wakes_are_never_dropped_the_put_waits_for_room() -> None:
    buffer = NotificationBuffer(max_wakes=2, max_notifications=2)
    await buffer.put(note("wake", 0))
    await buffer.put(note("wake", 1))
    put_done = trio.Event()

    async def put_third() -> None:
        await buffer.put(note("wake", 2))
        put_done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(put_third)
        await trio.sleep(0.02)
        assert not put_done.is_set() and buffer.statistics().wake_waits >= 1
        # Other notifications still go in meanwhile (they are never held up by wakes).
        await buffer.put(note("server/state", 0))
        assert (await buffer.receive("wake")).params == {"n": 0}
        with trio.fail_after(1):
            await put_done.wait()
    assert [(await buffer.receive("wake")).params["n"] for _ in range(2)] == [1, 2]
    assert buffer.statistics().dropped == 0


async def test_receive_by_method_keeps_the_rest_in_arrival_order() -> None:
    buffer = NotificationBuffer()
    for item in (note("a", 0), note("wake", 1), note("b", 2), note("a", 3), note("wake", 4)):
        await buffer.put(item)
    assert (await buffer.receive("b")).params == {"n": 2}
    assert [(await buffer.receive()).params["n"] for _ in range(4)] == [0, 1, 3, 4]
    assert buffer.receive_nowait() is None


async def test_closing_lets_the_held_be_read_then_ends() -> None:
    buffer = NotificationBuffer()
    await buffer.put(note("wake", 0))
    buffer.close()
    assert [item.params["n"] async for item in buffer] == [0]
    with pytest.raises(trio.EndOfChannel):
        await buffer.receive("wake")


async def test_a_reader_waiting_for_one_method_is_woken_by_it_alone() -> None:
    buffer = NotificationBuffer()
    got: list[Notification] = []

    async def wait_for_state() -> None:
        got.append(await buffer.receive("server/state"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_state)
        await trio.sleep(0.01)
        await buffer.put(note("channels/changed", 0))
        await trio.sleep(0.01)
        assert not got
        await buffer.put(note("server/state", 1))
    assert got == [note("server/state", 1)]
    assert buffer.statistics().notifications_buffered == 1


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        NotificationBuffer(max_wakes=0)
