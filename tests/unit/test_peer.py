"""The JSON-RPC peer over trio memory streams: correlation, errors answered, never silence."""

from __future__ import annotations

import contextlib
import json

from typing import Any

import msgspec
import pytest
import structlog
import trio
import trio.testing
from trio.testing import wait_all_tasks_blocked

from mcpl_router.jsonrpc import (
    INVALID_PARAMS,
    Deferred,
    PeerLimits,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    Inbound,
    MethodTable,
    NdjsonStream,
    Peer,
    PeerClosed,
    RequestTimeout,
    RpcError,
)
from mcpl_router.jsonrpc.envelope import NotificationOut, encode


class Remote:
    """The other side, speaking raw ndjson so tests control every byte."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.framed = NdjsonStream(stream, stream)

    async def send(self, obj: object) -> None:
        await self.stream.send_all(json.dumps(obj).encode() + b"\n")

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive(self) -> dict:
        return json.loads(await self.framed.receive_message())


class EchoParams(msgspec.Struct):
    text: str
    times: int = 1


def make_table(peer_box: list[Peer] | None = None) -> MethodTable:
    table = MethodTable()

    async def echo(params: EchoParams, _inbound: Inbound) -> str:
        return params.text * params.times

    async def ask_back(_params: object, _inbound: Inbound) -> object:
        # A handler awaiting the other side: must not deadlock the read loop.
        assert peer_box is not None
        return await peer_box[0].request("ping")

    async def fail(_params: object, _inbound: Inbound) -> None:
        raise RpcError(-32017, "not permitted", {"capability": "channels.publish"})

    async def crash(_params: object, _inbound: Inbound) -> None:
        raise ValueError("boom")

    table.add("echo", echo, EchoParams)
    table.add("askBack", ask_back)
    table.add("fail", fail)
    table.add("crash", crash)
    return table


@pytest.fixture
async def wired(nursery: trio.Nursery):
    left, right = trio.testing.memory_stream_pair()
    box: list[Peer] = []
    peer = Peer(NdjsonStream(left, left), make_table(box), request_timeout=5)
    box.append(peer)
    await nursery.start(peer.run)
    return peer, Remote(right)


async def _wired_to(nursery: trio.Nursery, handler: Any, **peer_options: Any) -> tuple[Peer, Remote]:
    """A running peer serving ``handler`` over a memory stream, and the raw other side."""
    left, right = trio.testing.memory_stream_pair()
    peer = Peer(NdjsonStream(left, left), handler, **peer_options)
    await nursery.start(peer.run)
    return peer, Remote(right)


@pytest.fixture
async def wired_host(nursery: trio.Nursery):
    """A host-style connection: every line must be JSON-RPC (no log lines to skip)."""
    left, right = trio.testing.memory_stream_pair()
    peer = Peer(NdjsonStream(left, left, skip_log_lines=False), make_table(), request_timeout=5)
    await nursery.start(peer.run)
    return peer, Remote(right)


async def test_their_request_is_answered_with_their_id_even_zero_and_strings(wired) -> None:
    _peer, remote = wired
    with trio.fail_after(5):
        for their_id in (0, "abc", 17):
            await remote.send({"jsonrpc": "2.0", "id": their_id, "method": "echo", "params": {"text": "x", "times": 2}})
            answer = await remote.receive()
            assert answer == {"jsonrpc": "2.0", "id": their_id, "result": "xx"}


async def test_colliding_ids_are_kept_apart(wired, nursery: trio.Nursery) -> None:
    peer, remote = wired
    results: list[object] = []

    async def ours() -> None:
        results.append(await peer.request("theirMethod", {"q": 1}))

    with trio.fail_after(5):
        nursery.start_soon(ours)
        our_request = await remote.receive()
        assert our_request["id"] == 1 and our_request["method"] == "theirMethod"
        # They send a request with the same id 1 before answering ours.
        await remote.send({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"text": "hi"}})
        assert await remote.receive() == {"jsonrpc": "2.0", "id": 1, "result": "hi"}
        await remote.send({"jsonrpc": "2.0", "id": 1, "result": {"ok": True}})
        while not results:
            await trio.sleep(0.001)
    assert results == [{"ok": True}]


async def test_malformed_json_gets_parse_error_and_link_stays_up(wired_host) -> None:
    _peer, remote = wired_host
    with trio.fail_after(5):
        await remote.send_raw(b'{"jsonrpc": "2.0", "id": 3, "method": \n')
        answer = await remote.receive()
        assert answer["error"]["code"] == PARSE_ERROR and answer["id"] is None
        await remote.send({"jsonrpc": "2.0", "id": 4, "method": "echo", "params": {"text": "still"}})
        assert (await remote.receive())["result"] == "still"


@pytest.mark.parametrize(
    ("message", "expected_id"),
    [
        ({"jsonrpc": "2.0", "id": 5}, 5),
        ({"jsonrpc": "1.0", "id": 6, "method": "echo"}, 6),
        ({"jsonrpc": "2.0", "id": 7, "method": 12}, 7),
        ({"jsonrpc": "2.0", "id": 8, "method": "echo", "result": 1}, 8),
        ([{"jsonrpc": "2.0", "id": 9, "method": "echo"}], None),
    ],
    ids=["no-method", "wrong-version", "method-not-string", "method-and-result", "batch"],
)
async def test_invalid_requests_get_invalid_request(wired_host, message: object, expected_id: object) -> None:
    _peer, remote = wired_host
    with trio.fail_after(5):
        await remote.send(message)
        answer = await remote.receive()
        assert answer["error"]["code"] == INVALID_REQUEST
        assert answer["id"] == expected_id


async def test_unknown_method_and_bad_params(wired) -> None:
    _peer, remote = wired
    with trio.fail_after(5):
        await remote.send({"jsonrpc": "2.0", "id": 1, "method": "nope"})
        assert (await remote.receive())["error"]["code"] == METHOD_NOT_FOUND
        await remote.send({"jsonrpc": "2.0", "id": 2, "method": "echo", "params": {"text": 3}})
        answer = await remote.receive()
        assert answer["error"]["code"] == INVALID_PARAMS
        assert "$.text" in answer["error"]["message"]


async def test_handler_errors_become_answers(wired) -> None:
    _peer, remote = wired
    with trio.fail_after(5):
        await remote.send({"jsonrpc": "2.0", "id": 1, "method": "fail"})
        answer = await remote.receive()
        assert answer["error"] == {"code": -32017, "message": "not permitted", "data": {"capability": "channels.publish"}}
        await remote.send({"jsonrpc": "2.0", "id": 2, "method": "crash"})
        answer = await remote.receive()
        assert answer["error"]["code"] == -32603
        assert "boom" not in answer["error"]["message"]  # internals stay in our logs


async def test_non_json_line_is_skipped_and_logged(wired) -> None:
    _peer, remote = wired
    with structlog.testing.capture_logs() as logs, trio.fail_after(5):
        await remote.send_raw(b"Logged in as demo-bot#1234\n\n")
        await remote.send({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"text": "ok"}})
        assert (await remote.receive())["result"] == "ok"
    skipped = [entry for entry in logs if entry["event"] == "jsonrpc.line.skipped"]
    assert skipped and "Logged in as" in skipped[0]["line"]


async def test_a_line_that_is_not_json_rpc_is_never_answered_on_a_line_oriented_stream(wired) -> None:
    """``[server] started`` looks like a batch and truncated JSON like a message: both are log
    lines on a server's stdout, skipped and logged; the server is never written an answer."""
    peer, remote = wired
    with structlog.testing.capture_logs() as logs, trio.fail_after(5):
        await remote.send_raw(b"[discord-mcpl] Client initialized (MCPL mode)\n")
        await remote.send_raw(b'{"half a line\n')
        await remote.send({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"text": "ok"}})
        # The first thing written back is the answer to id 1: nothing answered the log lines.
        assert await remote.receive() == {"jsonrpc": "2.0", "id": 1, "result": "ok"}
    assert peer.statistics().skipped_lines == 2
    assert not [entry for entry in logs if entry["event"] == "jsonrpc.message.malformed"]


async def test_oversized_message_is_refused_and_link_stays_up(nursery: trio.Nursery) -> None:
    left, right = trio.testing.memory_stream_pair()
    peer = Peer(NdjsonStream(left, left, max_message_bytes=1000), make_table())
    await nursery.start(peer.run)
    remote = Remote(right)
    with trio.fail_after(5):
        big = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "echo", "params": {"text": "y" * 5000}})
        for start in range(0, len(big), 700):  # arrives in pieces, as over a pipe
            await remote.send_raw(big[start : start + 700].encode())
        await remote.send_raw(b"\n")
        answer = await remote.receive()
        assert answer["error"]["code"] == INVALID_REQUEST and "exceeds" in answer["error"]["message"]
        await remote.send({"jsonrpc": "2.0", "id": 2, "method": "echo", "params": {"text": "small"}})
        assert (await remote.receive()) == {"jsonrpc": "2.0", "id": 2, "result": "small"}
    assert peer.statistics().oversized_messages == 1


async def test_request_deadline(nursery: trio.Nursery, autojump_clock: trio.abc.Clock) -> None:
    left, right = trio.testing.memory_stream_pair()
    peer = Peer(NdjsonStream(left, left), make_table(), request_timeout=2)
    await nursery.start(peer.run)
    remote = Remote(right)
    nursery.start_soon(remote.receive)  # the request is read but never answered
    with pytest.raises(RequestTimeout) as caught:
        await peer.request("silence")
    assert caught.value.sent is True
    assert peer.statistics().pending_requests == 0


async def test_handler_awaiting_our_request_does_not_deadlock(wired) -> None:
    _peer, remote = wired
    with trio.fail_after(5):
        await remote.send({"jsonrpc": "2.0", "id": "q", "method": "askBack"})
        ping = await remote.receive()
        assert ping["method"] == "ping"
        await remote.send({"jsonrpc": "2.0", "id": ping["id"], "result": "pong"})
        assert await remote.receive() == {"jsonrpc": "2.0", "id": "q", "result": "pong"}


async def test_close_fails_pending_requests(nursery: trio.Nursery) -> None:
    left, right = trio.testing.memory_stream_pair()
    peer = Peer(NdjsonStream(left, left), make_table())
    await nursery.start(peer.run)
    remote = Remote(right)
    with trio.fail_after(5):

        async def close_after_request() -> None:
            await remote.receive()
            await right.aclose()

        nursery.start_soon(close_after_request)
        with pytest.raises(PeerClosed):
            await peer.request("anything")
    with pytest.raises(PeerClosed):
        await peer.request("after-close")


async def test_inbound_order_is_preserved(nursery: trio.Nursery) -> None:
    seen: list[str] = []

    async def handler(inbound: Inbound) -> None:
        # Yield a few times: tasks would interleave here if dispatch weren't ordered.
        for _ in range(3):
            await trio.sleep(0)
        seen.append(inbound.method)

    peer, remote = await _wired_to(nursery, handler)
    methods = [f"m{i}" for i in range(50)]
    with trio.fail_after(5):
        for method in methods:
            await remote.send({"jsonrpc": "2.0", "method": method})
        while len(seen) < len(methods):
            await trio.sleep(0.001)
    assert seen == methods


async def test_a_full_lane_is_backpressure_and_nothing_is_dropped(nursery: trio.Nursery) -> None:
    """Issue 9: past a full queue the read loop waits; requests and notifications all arrive."""
    release = trio.Event()
    seen: list[str] = []

    async def handler(inbound: Inbound) -> str:
        await release.wait()
        seen.append(inbound.method)
        return inbound.method

    left, right = trio.testing.memory_stream_pair()
    peer = Peer(NdjsonStream(left, left), handler, limits=PeerLimits(inbound_messages=1))
    await nursery.start(peer.run)
    remote = Remote(right)
    with trio.fail_after(5):
        for i in range(20):
            await remote.send({"jsonrpc": "2.0", "method": f"n{i}"})
        await remote.send({"jsonrpc": "2.0", "id": 99, "method": "last"})
        await wait_all_tasks_blocked()
        assert peer.statistics().backpressure_waits >= 1
        release.set()
        answer = await remote.receive()
    assert answer == {"jsonrpc": "2.0", "id": 99, "result": "last"}
    assert seen == [f"n{i}" for i in range(20)] + ["last"]


async def test_one_slow_lane_does_not_hold_another(nursery: trio.Nursery) -> None:
    release = trio.Event()

    async def handler(inbound: Inbound) -> str:
        if inbound.method == "slow":
            await release.wait()
        return inbound.method

    def lane_of(inbound: Inbound) -> object:
        return msgspec.json.decode(inbound.params)["lane"]

    left, right = trio.testing.memory_stream_pair()
    peer = Peer(NdjsonStream(left, left), handler, lane_of=lane_of, limits=PeerLimits(inbound_messages=8))
    await nursery.start(peer.run)
    remote = Remote(right)
    with trio.fail_after(5):
        await remote.send({"jsonrpc": "2.0", "id": 1, "method": "slow", "params": {"lane": "ann"}})
        # ann's lane fills up behind her slow call: still within the connection's bound, so
        # bob's messages go on being read and answered.
        for i in range(3):
            await remote.send({"jsonrpc": "2.0", "method": "delta", "params": {"lane": "ann"}})
        for i in range(50):  # far more than the bound: bob's lane drains as fast as it fills
            await remote.send({"jsonrpc": "2.0", "id": 100 + i, "method": "fast", "params": {"lane": "bob"}})
        answers = [await remote.receive() for _ in range(50)]
        assert [a["id"] for a in answers] == [100 + i for i in range(50)]
        assert peer.statistics().inbound_queued == 3  # ann's deltas, waiting in her lane
        release.set()
        assert (await remote.receive())["id"] == 1
    await wait_all_tasks_blocked()
    assert peer.statistics().lanes == 0  # idle lanes end


async def test_a_slow_reader_that_keeps_reading_is_never_taken_for_a_stalled_one(nursery: trio.Nursery) -> None:
    """The stall timeout measures progress: a big message to a slow but steady reader goes out."""
    left, right = trio.testing.lockstep_stream_pair()
    # Each 64 KiB piece takes ~0.16 s at this reader's pace, the whole message ~1.5 s: a stall
    # deadline on the whole write (the old behaviour) trips, one on progress never does.
    peer = Peer(NdjsonStream(left, left), make_table(), limits=PeerLimits(stall_timeout=1.0))
    await nursery.start(peer.run)
    received = bytearray()

    async def slow_reader() -> None:
        while b"\n" not in received:
            received.extend(await right.receive_some(8192))
            await trio.sleep(0.02)  # ~400 KiB/s

    with trio.fail_after(10):
        nursery.start_soon(slow_reader)
        await peer.notify("big", {"blob": "x" * 600_000})
        while b"\n" not in received:
            await trio.sleep(0.05)
    assert not peer.closed and peer.statistics().stalled == 0
    assert len(received) > 600_000


async def test_what_was_queued_goes_out_before_a_graceful_close(nursery: trio.Nursery) -> None:
    left, right = trio.testing.memory_stream_pair()
    peer = Peer(NdjsonStream(left, left), make_table())
    await nursery.start(peer.run)
    remote = Remote(right)
    with trio.fail_after(5):
        await peer.notify("last", {"words": "goodbye"})
        await peer.aclose("done")
        assert (await remote.receive())["method"] == "last"


async def test_a_deferred_answer_lets_the_lane_move_on(nursery: trio.Nursery) -> None:
    release = trio.Event()

    async def handler(inbound: Inbound) -> object:
        if inbound.method == "later":
            async def wait() -> str:
                await release.wait()
                return "done"

            return Deferred(wait)
        return inbound.method

    peer, remote = await _wired_to(nursery, handler)
    with trio.fail_after(5):
        await remote.send({"jsonrpc": "2.0", "id": 1, "method": "later"})
        await remote.send({"jsonrpc": "2.0", "id": 2, "method": "now"})
        assert (await remote.receive())["id"] == 2
        release.set()
        assert await remote.receive() == {"jsonrpc": "2.0", "id": 1, "result": "done"}


async def test_a_pushed_answer_goes_out_when_settled_with_no_task_waiting(nursery: trio.Nursery) -> None:
    from mcpl_router.jsonrpc.handlers import Later

    pending: dict[str, Later] = {}

    async def handler(inbound: Inbound) -> object:
        later = pending[inbound.method] = Later()
        if inbound.method == "early":
            later.settle("already")  # settled before the peer subscribed: kept, then delivered
        return Deferred.pushed(later)

    peer, remote = await _wired_to(nursery, handler)
    with trio.fail_after(5):
        await remote.send({"jsonrpc": "2.0", "id": 1, "method": "ok"})
        await remote.send({"jsonrpc": "2.0", "id": 2, "method": "refused"})
        await remote.send({"jsonrpc": "2.0", "id": 3, "method": "early"})
        assert await remote.receive() == {"jsonrpc": "2.0", "id": 3, "result": "already"}
        await wait_all_tasks_blocked()
        pending["refused"].settle(None, RpcError(-32000, "no"))
        pending["ok"].settle("done")
        assert (await remote.receive())["error"]["code"] == -32000
        assert await remote.receive() == {"jsonrpc": "2.0", "id": 1, "result": "done"}
        assert peer.statistics().handler_failures == 0


async def test_nesting_too_deep_is_refused_and_the_connection_stays_up(wired_host) -> None:
    _peer, remote = wired_host
    with trio.fail_after(5):
        deep = b'{"jsonrpc":"2.0","id":1,"method":"echo","params":' + b"[" * 5000 + b"]" * 5000 + b"}\n"
        await remote.send_raw(deep)
        answer = await remote.receive()
        assert answer["error"]["code"] == INVALID_REQUEST and "nested too deeply" in answer["error"]["message"]
        await remote.send({"jsonrpc": "2.0", "id": 2, "method": "echo", "params": {"text": "alive"}})
        assert (await remote.receive())["result"] == "alive"


async def test_invalid_utf8_in_params_names_the_field(wired_host) -> None:
    _peer, remote = wired_host
    with trio.fail_after(5):
        await remote.send_raw(b'{"jsonrpc":"2.0","id":1,"method":"echo","params":{"text":"a\xed\xb3\xbf"}}\n')
        answer = await remote.receive()
        assert answer["id"] == 1 and answer["error"]["code"] == INVALID_PARAMS
        assert "invalid UTF-8 at text" in answer["error"]["message"]


async def test_a_peer_that_never_reads_is_bounded_then_disconnected(nursery: trio.Nursery) -> None:
    """Issue 9: junk from a client that never reads costs a bounded outbox, then a logged close."""
    # Lockstep: a write blocks until the other side reads, as a full socket buffer does.
    left, right = trio.testing.lockstep_stream_pair()
    limits = PeerLimits(outbox_messages=16, outbox_bytes=4096, stall_timeout=0.5)
    peer = Peer(NdjsonStream(left, left, skip_log_lines=False), make_table(), limits=limits)
    done = trio.Event()

    async def serve() -> None:
        await peer.run()
        done.set()

    nursery.start_soon(serve)
    sent = 0
    with structlog.testing.capture_logs() as logs, trio.fail_after(10):
        async with trio.open_nursery() as flood:

            async def junk() -> None:
                nonlocal sent
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    while not done.is_set():
                        await right.send_all(b"junk!\n" * 50)
                        sent += 50

            flood.start_soon(junk)
            await done.wait()
            flood.cancel_scope.cancel()
    stats = peer.statistics()
    assert stats.stalled == 1 and sent > limits.outbox_messages
    # Bounded: the queue's bytes plus one write batch, whatever was sent.
    assert stats.outbox_high_water_bytes <= limits.outbox_bytes + 256 * 1024
    assert [entry for entry in logs if entry["event"] == "jsonrpc.peer.stalled"]


async def test_two_peers_talk_and_every_message_says_jsonrpc_2_0(nursery: trio.Nursery) -> None:
    """Peer to peer, both directions; and the bytes on the wire carry ``"jsonrpc": "2.0"``."""
    left, right = trio.testing.memory_stream_pair()
    wire: list[bytes] = []

    class Tapped(NdjsonStream):
        async def send_message(self, data: bytes) -> None:
            wire.append(data)
            await super().send_message(data)

        async def send_messages(self, messages: list[bytes], **options: Any) -> None:
            wire.extend(messages)
            await super().send_messages(messages, **options)

    box: list[Peer] = []
    a = Peer(Tapped(left, left), make_table(box))
    b = Peer(Tapped(right, right), make_table())
    box.append(a)
    await nursery.start(a.run)
    await nursery.start(b.run)
    with trio.fail_after(5):
        assert await b.request("echo", {"text": "ab", "times": 2}) == "abab"
        assert await a.request("echo", {"text": "ba"}) == "ba"
        await b.notify("echo", {"text": "n"})
        with pytest.raises(RpcError) as refused:
            await b.request("fail")
        assert refused.value.code == -32017
    assert wire and all(json.loads(data)["jsonrpc"] == "2.0" for data in wire)
    assert not any(b'"params"' in data for data in wire if b'"method":"ping"' in data)


class _Note(msgspec.Struct):
    n: int


async def _noting_peer(nursery: trio.Nursery, *, concurrent: bool = False) -> tuple[Peer, Remote, list[int]]:
    """A peer whose ``note`` notifications record their ``n`` (in a lane, or each in a task)."""
    seen: list[int] = []
    table = MethodTable()

    async def note(params: _Note, _inbound: Inbound) -> None:
        seen.append(params.n)

    table.add("note", note, _Note, concurrent=concurrent)
    peer, remote = await _wired_to(nursery, table, request_timeout=5, concurrent_methods=table.concurrent_methods)
    return peer, remote, seen


async def _send_lines(remote: Remote, lines: list[dict[str, Any]]) -> None:
    # One write: the lines arrive in one read, buffered together.
    await remote.send_raw(b"".join(json.dumps(line).encode() + b"\n" for line in lines))


@pytest.mark.parametrize("concurrent", [False, True], ids=["in-a-lane", "in-its-own-task"])
async def test_an_answer_never_overtakes_the_notifications_sent_before_it(nursery: trio.Nursery, concurrent: bool) -> None:
    """Buffered messages are read without a yield each: the tasks handed the notifications that
    came first must still have started before whoever awaits the answer runs."""
    peer, remote, seen = await _noting_peer(nursery, concurrent=concurrent)

    async def answer_after_notes() -> None:
        request = await remote.receive()
        notes = [{"jsonrpc": "2.0", "method": "note", "params": {"n": n}} for n in range(5)]
        await _send_lines(remote, [*notes, {"jsonrpc": "2.0", "id": request["id"], "result": "done"}])

    nursery.start_soon(answer_after_notes)
    assert await peer.request("go") == "done"
    assert sorted(seen) == [0, 1, 2, 3, 4]


async def test_what_came_after_an_answer_is_handled_after_its_requester_resumed(nursery: trio.Nursery) -> None:
    """An answer and a notification in one read: whoever awaited the answer acts on it before
    the notification's handler runs (trio's scheduler may run a pass in either order, so many
    rounds)."""
    peer, remote, seen = await _noting_peer(nursery)
    for n in range(100):

        async def answer_then_note(n: int = n) -> None:
            request = await remote.receive()
            await _send_lines(remote, [{"jsonrpc": "2.0", "id": request["id"], "result": "done"}, {"jsonrpc": "2.0", "method": "note", "params": {"n": n}}])

        nursery.start_soon(answer_then_note)
        assert await peer.request("go") == "done"
        assert n not in seen, f"round {n}: the note was handled before the requester resumed"
        await wait_all_tasks_blocked()
        assert seen[-1] == n


async def test_the_outbox_high_water_is_its_peak_while_a_write_was_under_way(nursery: trio.Nursery) -> None:
    """The high water is read where the outbox's total falls (a write ends) and when asked, not
    at each message queued: it is still the peak, the write under way counted with the queue."""
    left, right = trio.testing.lockstep_stream_pair()  # a write blocks until the other side reads
    peer = Peer(NdjsonStream(left, left, skip_log_lines=False), make_table(), limits=PeerLimits(stall_timeout=30))
    nursery.start_soon(peer.run)
    message = encode(NotificationOut(method="n", params={"pad": "x" * 100}))
    with trio.fail_after(10):
        for _ in range(5):
            assert peer._enqueue_nowait(message)
        await wait_all_tasks_blocked()  # the writer took them all into one write, blocked on it
        queued_and_writing = 5 * len(message)
        assert peer.statistics().outbox_high_water_bytes == queued_and_writing  # asked mid-write
        for _ in range(3):
            assert peer._enqueue_nowait(message)  # queued behind the write under way
        read = b""
        while read.count(b"\n") < 8:
            read += await right.receive_some(65536)
        await wait_all_tasks_blocked()
    peak = 8 * len(message)
    assert peer.statistics().outbox_high_water_bytes == peak
    assert peer._outbox_bytes == 0 and peer._writing_bytes == 0  # all written: the peak stays
