"""The typed client against a stand-in daemon (a local Peer over trio memory streams).

The stand-in answers each host API method with a canned result and records the params it was
sent, so these tests pin what the client writes (turn ids, round numbers, the close outcome on
each exit path) and what it reads (typed results), without a daemon.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from mcpl_router.client import (
    ContextResult,
    InferenceRequest,
    ModelInfoRequest,
    RouterClient,
    RpcError,
    ToolResult,
    TurnAlreadyClosed,
    TurnClosed,
)
from mcpl_router.jsonrpc import METHOD_NOT_FOUND, Inbound, MethodTable, NdjsonStream, Peer

OPENED = {
    "turnId": "t-1",
    "inferenceId": "inf-1",
    "channel": {"serverId": "b", "channelId": "general", "shown": "b:general"},
    "tools": [{"name": "channel_list", "description": "List channels.", "inputSchema": {"type": "object"}}],
    "system": ["a system line"],
    "proseRouting": "locus",
    "notices": [],
    "shown": {"channel": "b:general", "locus": "b:general", "routing": "[routing] b:general"},
}
DELIVERY = {"serverId": "b", "channelId": "general", "shown": "b:general", "outcome": "delivered", "round": 0, "messageId": "m-1"}


def closed_answer(outcome: str) -> dict[str, Any]:
    return {
        "receipt": {"text": f"[delivered] plain speech → b:general ({outcome})", "delivered": [DELIVERY], "held": 0,
                    "private": 0, "suppressed": 0, "kept": 0},
        "deliveries": [DELIVERY],
        "drafts": [],
        "notices": [],
        "again": False,
    }


class StandIn:
    """Canned answers by method; every call's params, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        #: Methods answered with an error instead.
        self.failing: dict[str, RpcError] = {}
        self.answers: dict[str, Any] = {
            "turn/open": OPENED,
            "turn/context": {"injections": {"system": [], "beforeUser": [{"serverId": "inj", "namespace": "inj",
                             "content": "x", "metadata": None}], "afterUser": []}, "servers": {"inj": "ok"}},
            "turn/text": {},
            "turn/round": {"deliveries": [DELIVERY], "notices": ["[routing] note"]},
            "turn/tool": {"content": [{"type": "text", "text": "two channels"}], "isError": False,
                          "structuredContent": {"serverId": "b"}, "_meta": {"mcpl-router": {"serverId": "b"}}},
            "session/hello": {"daemonVersion": "0.1.0", "servers": [], "agents": [{"name": "kai", "proseRouting": "locus",
                              "allowedTools": None, "wake": {"channels": [], "servers": []}, "homeChannel": None,
                              "configured": False, "subconsciousFor": None}], "wakeSeq": 3},
            "wake/ack": {"acked": 1},
        }
        #: Methods answered by a handler of the test's own (it records the call, or not).
        self.handlers: dict[str, Any] = {}

    def table(self) -> MethodTable:
        table = MethodTable()
        for method in {*self.answers, *self.handlers}:
            table.add(method, self.handlers.get(method, self._answer))
        return table

    async def _answer(self, params: Any, inbound: Inbound) -> Any:
        decoded = msgspec.json.decode(params) if params is not None else None
        self.calls.append((inbound.method, decoded))
        if inbound.method in self.failing:
            raise self.failing[inbound.method]
        if inbound.method == "turn/close":
            return closed_answer(decoded["outcome"])
        return self.answers[inbound.method]

    def sent(self, method: str) -> list[Any]:
        return [params for name, params in self.calls if name == method]


@asynccontextmanager
async def connected(stand_in: StandIn, **options: Any) -> AsyncIterator[tuple[RouterClient, Peer]]:
    stand_in.answers.setdefault("turn/close", None)
    client_end, daemon_end = trio.testing.memory_stream_pair()
    daemon = Peer(NdjsonStream(daemon_end, daemon_end, skip_log_lines=False), stand_in.table())
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        async with RouterClient.connect_stream(NdjsonStream(client_end, client_end), timeout=5, **options) as client:
            yield client, daemon
        await daemon.aclose("test done")
        nursery.cancel_scope.cancel()


# ------------------------------------------------------------------ the turn helper


async def test_a_block_that_ends_closes_completed_with_rounds_numbered_for_the_host() -> None:
    stand_in = StandIn()
    async with connected(stand_in) as (client, _daemon):
        async with client.turn("kai", wakes=[7]) as turn:
            assert turn.turn_id == "t-1" and turn.inference_id == "inf-1"
            assert [tool.name for tool in turn.tools] == ["channel_list"]
            assert turn.tools[0].input_schema == {"type": "object"}
            assert turn.system == ["a system line"]
            assert turn.shown.routing == "[routing] b:general" and turn.channel is not None and turn.channel.server_id == "b"
            context = await turn.context(user_message={"text": "hi"}, model="m")
            assert isinstance(context, ContextResult)
            assert context.injections.before_user[0].server_id == "inj" and context.servers == {"inj": "ok"}
            assert turn.round_number == 0
            await turn.text("looking")
            routed = await turn.end_round(tool_calls=[{"name": "channel_list", "arguments": {}}])
            assert routed.deliveries[0].message_id == "m-1" and routed.notices == ["[routing] note"]
            assert turn.round_number == 1
            result = await turn.tool("channel_list", {})
            assert isinstance(result, ToolResult) and result.text == "two channels"
            assert result.meta == {"mcpl-router": {"serverId": "b"}} and not result.is_error
            await turn.text("done")
            assert turn.receipt is None
        assert turn.is_closed and turn.receipt is not None
        assert turn.receipt.text is not None and "(completed)" in turn.receipt.text
        assert turn.receipt.delivered[0].shown == "b:general"
    assert stand_in.sent("turn/open") == [{"agent": "kai", "wakes": [7]}]
    assert stand_in.sent("turn/context") == [{"turnId": "t-1", "userMessage": {"text": "hi"}, "model": "m"}]
    assert [(p["round"], p["delta"]) for p in stand_in.sent("turn/text")] == [(0, "looking"), (1, "done")]
    assert stand_in.sent("turn/round") == [{"turnId": "t-1", "round": 0, "toolCalls": [{"name": "channel_list", "arguments": {}}]}]
    [tool_call] = stand_in.sent("turn/tool")
    assert tool_call["turnId"] == "t-1" and tool_call["name"] == "channel_list" and tool_call["callId"]
    assert stand_in.sent("turn/close") == [{"turnId": "t-1", "outcome": "completed"}]


async def test_an_exception_in_the_block_closes_aborted_and_is_re_raised() -> None:
    stand_in = StandIn()
    async with connected(stand_in) as (client, _daemon):
        with pytest.raises(KeyError, match="model fell over"):
            async with client.turn("kai", channel="b:general") as turn:
                await turn.text("half a thought")
                raise KeyError("model fell over")
        assert turn.closed is not None and "(aborted)" in (turn.receipt.text if turn.receipt else "")
    assert stand_in.sent("turn/open") == [{"agent": "kai", "channel": "b:general"}]
    assert [p["outcome"] for p in stand_in.sent("turn/close")] == ["aborted"]


async def test_a_cancelled_block_still_closes_aborted() -> None:
    stand_in = StandIn()
    async with connected(stand_in) as (client, _daemon):
        with trio.move_on_after(0.05):
            async with client.turn("kai") as turn:
                await trio.sleep_forever()
        assert turn.is_closed
    assert [p["outcome"] for p in stand_in.sent("turn/close")] == ["aborted"]


async def test_an_explicit_close_ends_the_turn_early_and_the_block_closes_nothing_more() -> None:
    stand_in = StandIn()
    async with connected(stand_in) as (client, _daemon):
        async with client.turn("kai", channel={"serverId": "b", "channelId": "general"}) as turn:
            closed = await turn.close("refused", usage={"inputTokens": 3})
            assert isinstance(closed, TurnClosed) and turn.closed is closed
            with pytest.raises(TurnAlreadyClosed):
                await turn.text("too late")
    assert stand_in.sent("turn/open") == [{"agent": "kai", "channel": {"serverId": "b", "channelId": "general"}}]
    assert stand_in.sent("turn/close") == [{"turnId": "t-1", "outcome": "refused", "usage": {"inputTokens": 3}}]


async def test_a_refused_open_raises_rpc_error_and_opens_nothing() -> None:
    stand_in = StandIn()
    stand_in.failing["turn/open"] = RpcError(-32051, "no such wake", {"seq": 99})
    async with connected(stand_in) as (client, _daemon):
        with pytest.raises(RpcError) as raised:
            async with client.turn("kai", wakes=[99]):
                pytest.fail("the block must not run")
    assert raised.value.code == -32051 and raised.value.data == {"seq": 99}
    assert stand_in.sent("turn/close") == []


async def test_a_close_the_daemon_refuses_on_the_way_out_does_not_mask_the_blocks_error() -> None:
    stand_in = StandIn()
    stand_in.failing["turn/close"] = RpcError(-32050, "the turn is not open")
    async with connected(stand_in) as (client, _daemon):
        with pytest.raises(ValueError, match="boom"):
            async with client.turn("kai"):
                raise ValueError("boom")
        # On a normal exit the refusal is the host's to see.
        with pytest.raises(RpcError) as raised:
            async with client.turn("kai"):
                pass
        assert raised.value.code == -32050
    assert [p["outcome"] for p in stand_in.sent("turn/close")] == ["aborted", "completed"]


async def test_hello_is_typed_and_ack_counts() -> None:
    stand_in = StandIn()
    async with connected(stand_in) as (client, _daemon):
        hello = await client.hello("h", ["kai"], resume_from=2)
        assert hello.daemon_version == "0.1.0" and hello.wake_seq == 3 and hello.agents[0].name == "kai"
        assert hello.agents[0].allowed_tools is None and hello.agents[0].home_channel is None
        assert await client.ack([3]) == 1
    assert stand_in.sent("session/hello") == [{"host": "h", "agents": [{"name": "kai"}], "resumeFrom": 2}]


async def test_acks_issued_while_one_is_in_flight_share_the_next_request() -> None:
    stand_in = StandIn()
    release = trio.Event()
    answers = iter([{"acked": 1}, {"acked": 9}])

    async def slow_ack(params: Any, inbound: Inbound) -> Any:
        stand_in.calls.append((inbound.method, msgspec.json.decode(params)))
        await release.wait()
        return next(answers)

    stand_in.handlers["wake/ack"] = slow_ack  # answered only once the test releases it
    async with connected(stand_in) as (client, _daemon):
        returned: dict[int, int] = {}

        async def ack(seq: int) -> None:
            returned[seq] = await client.ack([seq])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ack, 1)
            await trio.testing.wait_all_tasks_blocked()
            for seq in range(2, 11):  # issued while seq 1's request is on its way
                nursery.start_soon(ack, seq)
            await trio.testing.wait_all_tasks_blocked()
            release.set()
        # Ten acks, two requests: the first alone, the nine issued meanwhile together.
        first, shared = stand_in.sent("wake/ack")
        assert first == {"seqs": [1]} and sorted(shared["seqs"]) == list(range(2, 11))
        assert returned == {1: 1, **{seq: 9 for seq in range(2, 11)}}
        statistics = client.statistics()
        assert (statistics.acks, statistics.ack_requests) == (10, 2)
        # With nothing in flight an ack goes out at once, alone, with its own count.
        answers = iter([{"acked": 1}])
        assert await client.ack([11]) == 1
        assert stand_in.sent("wake/ack")[-1] == {"seqs": [11]}


async def test_a_shared_acks_error_reaches_each_caller_and_agents_never_share() -> None:
    stand_in = StandIn()
    release = trio.Event()

    async def ack_answer(params: Any, inbound: Inbound) -> Any:
        decoded = msgspec.json.decode(params)
        stand_in.calls.append((inbound.method, decoded))
        await release.wait()
        if decoded.get("agent") == "stranger":
            raise RpcError(-32010, "agent not owned", {"agent": "stranger"})
        if 13 in decoded["seqs"]:
            raise RpcError(-32603, "the ack was not recorded")
        return {"acked": len(decoded["seqs"]) + 1}

    stand_in.handlers["wake/ack"] = ack_answer
    async with connected(stand_in) as (client, _daemon):
        outcomes: dict[str, object] = {}

        async def ack(name: str, seqs: list[int], agent: str | None = None) -> None:
            try:
                outcomes[name] = await client.ack(seqs, agent=agent)
            except RpcError as exc:
                outcomes[name] = exc.code

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ack, "first", [1])
            await trio.testing.wait_all_tasks_blocked()
            for name, seqs, agent in (("kai-a", [12, 13], "kai"), ("stranger", [14], "stranger"), ("plain-a", [13], None),
                                      ("plain-b", [15], None), ("kai-b", [16], "kai")):
                nursery.start_soon(ack, name, seqs, agent)
                await trio.testing.wait_all_tasks_blocked()
            release.set()
    # Each agent argument has its own requests (kai's and the stranger's went at once, their
    # lanes idle): the stranger's refusal is its own, kai's second ack is not failed by its
    # first; the failed shared request's error reaches both acks it carried.
    assert outcomes == {"first": 2, "kai-a": -32603, "kai-b": 2, "stranger": -32010, "plain-a": -32603, "plain-b": -32603}
    sent = stand_in.sent("wake/ack")
    assert sorted(map(str, sent)) == sorted(map(str, [{"seqs": [1]}, {"seqs": [12, 13], "agent": "kai"}, {"seqs": [16], "agent": "kai"},
                                                      {"seqs": [14], "agent": "stranger"}, {"seqs": [13, 15]}]))


async def test_a_cancelled_acker_leaves_its_shared_ack_to_the_others() -> None:
    stand_in = StandIn()
    gates = [trio.Event(), trio.Event(), trio.Event()]

    async def ack_answer(params: Any, inbound: Inbound) -> Any:
        stand_in.calls.append((inbound.method, msgspec.json.decode(params)))
        await gates[len(stand_in.sent("wake/ack")) - 1].wait()
        return {"acked": 2}

    stand_in.handlers["wake/ack"] = ack_answer
    async with connected(stand_in) as (client, _daemon):
        returned: dict[int, int] = {}

        async def ack(seq: int, task_status: trio.TaskStatus[trio.CancelScope] = trio.TASK_STATUS_IGNORED) -> None:
            with trio.CancelScope() as scope:
                task_status.started(scope)
                returned[seq] = await client.ack([seq])

        async with trio.open_nursery() as nursery:
            await nursery.start(ack, 1)
            await trio.testing.wait_all_tasks_blocked()
            carrier = await nursery.start(ack, 2)  # the first of the next batch: it carries it
            await trio.testing.wait_all_tasks_blocked()
            await nursery.start(ack, 3)
            await trio.testing.wait_all_tasks_blocked()
            gates[0].set()
            await trio.testing.wait_all_tasks_blocked()
            assert stand_in.sent("wake/ack") == [{"seqs": [1]}, {"seqs": [2, 3]}]
            carrier.cancel()  # on the wire, its answer not back: seq 3's caller sends it again
            await trio.testing.wait_all_tasks_blocked()
            gates[1].set()
            gates[2].set()
    assert stand_in.sent("wake/ack") == [{"seqs": [1]}, {"seqs": [2, 3]}, {"seqs": [2, 3]}]
    assert returned == {1: 2, 3: 2}


# ------------------------------------------------------------------ daemon→host requests


async def test_an_unregistered_daemon_request_is_answered_method_not_found() -> None:
    async with connected(StandIn()) as (client, daemon):
        for method in ("inference/request", "model/info", "something/else"):
            with pytest.raises(RpcError) as raised:
                await daemon.request(method, {"requestId": "r-1", "agent": "kai"}, timeout=5)
            assert raised.value.code == METHOD_NOT_FOUND
        assert client.statistics().requests_unhandled == {"inference/request": 1, "model/info": 1, "something/else": 1}


async def test_inference_is_served_with_chunks_and_hello_says_what_is_served() -> None:
    stand_in = StandIn()
    chunks: list[Any] = []
    stand_in.answers["inference/chunk"] = None
    seen: list[InferenceRequest] = []

    async def infer(request: InferenceRequest) -> dict[str, Any]:
        seen.append(request)
        for piece in ("ec", "ho"):
            await request.send_chunk({"delta": piece})
        return {"content": [{"type": "text", "text": "echo"}], "stopReason": "end_turn"}

    def model_info(request: ModelInfoRequest) -> dict[str, Any]:
        return {"model": "stand-in", "agent": request.agent}

    async def record_chunk(params: Any, _inbound: Inbound) -> None:
        chunks.append(msgspec.json.decode(params))

    table = stand_in.table()
    table.add("inference/chunk", record_chunk)
    client_end, daemon_end = trio.testing.memory_stream_pair()
    daemon = Peer(NdjsonStream(daemon_end, daemon_end, skip_log_lines=False), table)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        async with RouterClient.connect_stream(NdjsonStream(client_end, client_end), timeout=5) as client:
            client.serve_inference(infer)
            client.serve_model_info(model_info)
            await client.hello("h", ["kai"])
            params = {"requestId": "r-1", "agent": "kai", "serverId": "s", "stream": True,
                      "request": {"messages": [{"role": "user", "content": {"type": "text", "text": "echo"}}]}}
            answer = await daemon.request("inference/request", params, timeout=5)
            assert answer == {"content": [{"type": "text", "text": "echo"}], "stopReason": "end_turn"}
            info = await daemon.request("model/info", {"requestId": "r-2", "agent": "kai", "serverId": "s"}, timeout=5)
            assert info == {"model": "stand-in", "agent": "kai"}
            stats = client.statistics()
            assert stats.requests_served == {"inference/request": 1, "model/info": 1} and stats.chunks_sent == 2
        await daemon.aclose("test done")
        nursery.cancel_scope.cancel()
    hello = stand_in.sent("session/hello")[0]
    assert hello["serves"] == {"inference": [spec["name"] for spec in hello["agents"]], "modelInfo": [spec["name"] for spec in hello["agents"]]}
    assert seen[0].request_id == "r-1" and seen[0].stream and seen[0].server_id == "s"
    # Chunks are notifications sent before the answer, so they arrived first, in order.
    assert chunks == [{"requestId": "r-1", "chunk": {"delta": "ec"}}, {"requestId": "r-1", "chunk": {"delta": "ho"}}]


async def test_a_failing_handler_answers_an_error_and_a_long_one_holds_no_wakes() -> None:
    release = trio.Event()

    async def infer(request: InferenceRequest) -> Any:
        if request.request == "fail":
            raise RpcError(-32001, "the model refused")
        await release.wait()
        return {"done": True}

    async with connected(StandIn()) as (client, daemon):
        client.serve_inference(infer)
        with pytest.raises(RpcError) as raised:
            await daemon.request("inference/request", {"requestId": "r-1", "agent": "kai", "request": "fail"}, timeout=5)
        assert raised.value.code == -32001
        async with trio.open_nursery() as nursery:
            answers: list[Any] = []

            async def ask() -> None:
                answers.append(await daemon.request("inference/request", {"requestId": "r-2", "agent": "kai"}, timeout=5))

            nursery.start_soon(ask)
            await trio.sleep(0.05)
            # The inference is still running; a wake sent meanwhile is readable at once.
            await daemon.notify("wake", {"seq": 1, "agent": "kai", "reason": "push", "channel": None, "tags": [], "addressed": False})
            with trio.fail_after(2):
                wake = await client.next_wake()
            assert wake.seq == 1 and not answers
            release.set()
        assert answers == [{"done": True}]
        assert client.statistics().requests_failed == {"inference/request": 1}


# ------------------------------------------------------------------ buffering through the client


async def test_unread_notifications_are_dropped_oldest_first_and_calls_keep_their_answers() -> None:
    async with connected(StandIn(), max_notifications=100, max_wakes=50) as (client, daemon):
        for n in range(500):
            await daemon.notify("server/state", {"serverId": "a", "old": "ready", "state": "retrying", "n": n})
        for seq in range(1, 11):
            await daemon.notify("wake", {"seq": seq, "agent": "kai", "reason": "push", "channel": None, "tags": [], "addressed": False})
        # The host read nothing; its read loop still runs, so a call is answered.
        with trio.fail_after(5):
            assert await client.ack([1]) == 1
        stats = client.statistics().notifications
        assert stats.notifications_buffered == 100 and stats.dropped == 400 and stats.dropped_by_method == {"server/state": 400}
        assert stats.wakes_buffered == 10
        assert [(await client.next_wake()).seq for _ in range(10)] == list(range(1, 11))
        assert (await client.next_notification("server/state")).params["n"] == 400


# ------------------------------------------------------------------ the default socket


async def test_connect_default_finds_the_daemons_default_socket() -> None:
    import os
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="mr-", dir="/tmp") as runtime:
        environ = {"XDG_RUNTIME_DIR": runtime}
        path = RouterClient.default_socket_path(environ)
        assert path == Path(runtime) / f"mcpl-router-{os.getuid()}" / "host.sock"
        path.parent.mkdir(mode=0o700)
        table = MethodTable()

        async def status(_params: Any, _inbound: Inbound) -> Any:
            return {"version": "default-socket"}

        table.add("status", status)

        async def serve(stream: trio.SocketStream) -> None:
            await Peer(NdjsonStream(stream, stream, skip_log_lines=False), table).run()

        sock = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await sock.bind(str(path))
        sock.listen()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, serve, [trio.SocketListener(sock)])
            async with RouterClient.connect_default(environ=environ, timeout=5) as client:
                assert (await client.status()).version == "default-socket"
            nursery.cancel_scope.cancel()
