"""The typed MCPL session (issue 27 item 4): each request and notification the daemon sends a
server is built in one place, in the shape the real servers read, over a small port that the
tests' stand-ins implement (here: one that records what reached it)."""

from __future__ import annotations

from typing import Any

import attrs
import msgspec
import pytest
import trio

from mcpl_router.jsonrpc import PeerClosed, RequestTimeout, RpcError
from mcpl_router.mcpl.grants import Grant
from mcpl_router.mcpl.link import LinkState
from mcpl_router.mcpl.session import (
    AcknowledgeParams,
    BeforeInferenceParams,
    ChannelContext,
    ChunkParams,
    CloseParams,
    CompleteParams,
    HistoryParams,
    HookAnswered,
    HookFailed,
    HookTimedOut,
    IncomingContext,
    LifecycleParams,
    OpenParams,
    OutgoingContext,
    PublishOutcome,
    PublishParams,
    Queued,
    ServerSession,
    TextContent,
    ToolAnswered,
    ToolCallParams,
    ToolNotSent,
    ToolRefused,
    ToolsListParams,
    ToolUnconfirmed,
    TypingParams,
    Unsent,
)

EVERYTHING = frozenset({"channels.publish", "channels.acknowledge", "channels.lifecycle", "channels.typing", "channels.streaming",
                        "tools", "inferenceRequest.streaming", "inferenceLifecycle", "contextHooks.beforeInference.observe"})


@attrs.define
class RecordingPort:
    """A server connection that records each message as its wire JSON and answers as told."""

    server_id: str = "a"
    state: LinkState = LinkState.READY
    grant: Grant = attrs.field(factory=lambda: Grant(effective=EVERYTHING))
    epoch: int = 1
    answer: Any = attrs.field(factory=dict)
    room: bool = True
    wire: list[tuple[str, str, Any]] = attrs.field(factory=list)

    @property
    def request_timeout(self) -> float:
        return 5.0

    def _record(self, form: str, method: str, params: Any) -> None:
        # As the peer encodes it: the JSON a server reads.
        self.wire.append((form, method, msgspec.json.decode(msgspec.json.encode(params))))

    async def call(self, method: str, params: Any = None, *, capability: str | None, timeout: float | None = None,
                   result_type: type | None = None) -> Any:
        await trio.lowlevel.checkpoint()
        self._record("request", method, params)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    async def send_notification(self, method: str, params: Any = None, *, capability: str | None) -> None:
        await trio.lowlevel.checkpoint()
        if isinstance(self.answer, PeerClosed):
            raise self.answer
        self._record("notification", method, params)

    def send_notification_nowait(self, method: str, params: Any = None, *, capability: str | None) -> bool:
        if isinstance(self.answer, PeerClosed):
            raise self.answer
        if not self.room:
            return False
        self._record("notification", method, params)
        return True


async def test_each_message_has_the_shape_the_servers_read() -> None:
    port = RecordingPort(answer={"delivered": True, "messageId": "m1"})
    session = ServerSession(port)
    await session.publish(PublishParams(conversation_id="ann", channel_id="general", content=(TextContent(type="text", text="hi"),)))
    await session.publish(PublishParams(conversation_id="ann", channel_id="general", content=(TextContent(type="text", text="t"),),
                                        thread_id="th"))
    port.answer = {}
    await session.acknowledge(AcknowledgeParams(channel_id="general", message_id="m1", intent="refused", value="🚫"), timeout=1)
    await session.acknowledge(AcknowledgeParams(channel_id="general", message_id="m1", intent="seen-not-opening"), timeout=1)
    await session.open_channel(OpenParams(channel_id="general", history=HistoryParams(limit=20, before_message_id="m0"),
                                          thread_id="th"), timeout=1)
    await session.open_channel(OpenParams(channel_id="general"), timeout=1)
    await session.close_channel(CloseParams(channel_id="general"), timeout=1)
    await session.typing(TypingParams(channel_id="general", op="start"))
    session.typing_nowait(TypingParams(channel_id="general", op="stop"))
    await session.stream_chunk(ChunkParams(inference_id="i", conversation_id="ann", channel_id="general", index=0, delta="w"))
    await session.stream_complete(CompleteParams(inference_id="i", conversation_id="ann", channel_id="general", content="w"))
    await session.list_tools(ToolsListParams(), timeout=1)
    await session.list_tools(ToolsListParams(cursor="c2"), timeout=1)
    await session.call_tool(ToolCallParams(name="send_message", arguments={"channelId": "general", "text": "x"}), timeout=1)
    assert port.wire == [
        ("request", "channels/publish", {"conversationId": "ann", "channelId": "general", "content": [{"type": "text", "text": "hi"}]}),
        ("request", "channels/publish",
         {"conversationId": "ann", "channelId": "general", "content": [{"type": "text", "text": "t"}], "threadId": "th"}),
        ("request", "channels/acknowledge", {"channelId": "general", "messageId": "m1", "intent": "refused", "value": "🚫"}),
        ("request", "channels/acknowledge", {"channelId": "general", "messageId": "m1", "intent": "seen-not-opening"}),
        ("request", "channels/open",
         {"channelId": "general", "history": {"limit": 20, "beforeMessageId": "m0"}, "threadId": "th"}),
        ("request", "channels/open", {"channelId": "general"}),
        ("request", "channels/close", {"channelId": "general"}),
        ("notification", "channels/typing", {"channelId": "general", "op": "start"}),
        ("notification", "channels/typing", {"channelId": "general", "op": "stop"}),
        ("notification", "channels/outgoing/chunk",
         {"inferenceId": "i", "conversationId": "ann", "channelId": "general", "index": 0, "delta": "w"}),
        ("notification", "channels/outgoing/complete", {"inferenceId": "i", "conversationId": "ann", "channelId": "general", "content": "w"}),
        ("request", "tools/list", {}),
        ("request", "tools/list", {"cursor": "c2"}),
        ("request", "tools/call", {"name": "send_message", "arguments": {"channelId": "general", "text": "x"}}),
    ]


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        ({"delivered": True, "messageId": "m-1"}, PublishOutcome("delivered", message_id="m-1")),
        ({"delivered": False}, PublishOutcome("failed", "not-delivered")),
        (RpcError(-32603, "no"), PublishOutcome("failed", "server-refused")),
        (RequestTimeout("channels/publish", 1, sent=True), PublishOutcome("unknown", "timeout")),
        (RequestTimeout("channels/publish", 1, sent=False), PublishOutcome("failed", "timeout")),
        (PeerClosed("gone"), PublishOutcome("unknown", "no-receipt")),
        ({"ok": 1}, PublishOutcome("unknown", "malformed-receipt")),
    ],
)
async def test_a_publish_outcome_is_a_value(answer: Any, outcome: PublishOutcome) -> None:
    session = ServerSession(RecordingPort(answer=answer))
    params = PublishParams(conversation_id="ann", channel_id="general", content=(TextContent(type="text", text="hi"),))
    assert await session.publish(params) == outcome


async def test_nothing_is_sent_to_a_server_not_ready_or_not_granted() -> None:
    params = PublishParams(conversation_id="ann", channel_id="general", content=(TextContent(type="text", text="hi"),))
    down = RecordingPort(state=LinkState.RETRYING)
    ungranted = RecordingPort(grant=Grant(effective=frozenset({"tools"})))
    assert await ServerSession(down).publish(params) == PublishOutcome("failed", "server-unavailable")
    assert await ServerSession(ungranted).publish(params) == PublishOutcome("failed", "not-permitted")
    assert down.wire == ungranted.wire == []
    assert ServerSession(down).unusable("channels.typing") == "server-unavailable"
    assert ServerSession(ungranted).unusable("channels.typing") == "not-permitted"
    assert ServerSession(ungranted).unusable("tools") is None


async def test_a_notification_only_method_is_learned_per_connection_epoch() -> None:
    port = RecordingPort(answer=RpcError(-32601, "notifications only"))
    session = ServerSession(port)
    params = PublishParams(conversation_id="ann", channel_id="general", content=(TextContent(type="text", text="hi"),))
    assert await session.publish(params) == PublishOutcome("unknown", "no-receipt")
    assert await session.publish(params) == PublishOutcome("unknown", "no-receipt")
    assert [form for form, _, _ in port.wire] == ["request", "notification", "notification"]
    # A reconnect may be another build of the server: it is asked as a Request again.
    port.epoch, port.answer = 2, {"delivered": True}
    assert (await session.publish(params)).outcome == "delivered"
    assert [form for form, _, _ in port.wire][-1] == "request"


async def test_queued_notifications_say_queued_full_or_gone() -> None:
    port = RecordingPort()
    session = ServerSession(port)
    typing = TypingParams(channel_id="general", op="start")
    assert session.typing_nowait(typing) is Queued.QUEUED
    port.room = False
    assert session.typing_nowait(typing) is Queued.FULL
    port.answer = PeerClosed("gone")
    assert session.typing_nowait(typing) is Queued.GONE
    assert await session.typing(typing) is False


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        ({"content": [{"type": "text", "text": "ok"}]}, ToolAnswered({"content": [{"type": "text", "text": "ok"}]})),
        ("not a mapping", ToolAnswered({"content": [], "isError": False})),
        (RpcError(-32602, "bad arguments"), ToolRefused(-32602, "bad arguments")),
        (RequestTimeout("tools/call", 1, sent=True), ToolUnconfirmed("timeout")),
        (RequestTimeout("tools/call", 1, sent=False), ToolNotSent()),
        (PeerClosed("gone"), ToolUnconfirmed("connection lost")),
    ],
)
async def test_a_tool_call_outcome_is_a_value(answer: Any, outcome: Any) -> None:
    session = ServerSession(RecordingPort(answer=answer))
    assert await session.call_tool(ToolCallParams(name="send_message", arguments={}), timeout=1) == outcome


async def test_the_inference_hooks_and_lifecycle_go_byte_for_byte_as_the_dicts_they_replaced() -> None:
    # The bytes the daemon sent before these were typed: the same keys, in the same order,
    # null where a value is absent but the key is always sent, no key where it is omitted.
    port = RecordingPort(answer={"contextInjections": []})
    session = ServerSession(port)
    hook = BeforeInferenceParams(
        inference_id="i", conversation_id="ann", turn_index=2, user_message={"role": "user", "content": "hi"}, model=None,
        channels=ChannelContext(incoming=IncomingContext(channel_id="general", message_id="m1", thread_id=None),
                                default_outgoing=OutgoingContext(channel_id="general"), candidates=["general"]),
    )
    assert msgspec.json.encode(hook) == msgspec.json.encode({
        "inferenceId": "i", "conversationId": "ann", "turnIndex": 2, "userMessage": {"role": "user", "content": "hi"},
        "model": None,
        "channels": {"incoming": {"channelId": "general", "messageId": "m1", "threadId": None},
                     "defaultOutgoing": {"channelId": "general"}, "candidates": ["general"]},
    })
    unobserved = BeforeInferenceParams(inference_id="i", conversation_id="ann", turn_index=0, user_message=None, model="m",
                                       channels=ChannelContext(candidates=[]))
    assert msgspec.json.encode(unobserved) == msgspec.json.encode({
        "inferenceId": "i", "conversationId": "ann", "turnIndex": 0, "userMessage": None, "model": "m", "channels": {"candidates": []},
    })
    started = LifecycleParams(inference_id="i", conversation_id="ann", turn_index=2, phase="started")
    ended = LifecycleParams(inference_id="i", conversation_id="ann", turn_index=2, phase="completed", usage={"outputTokens": 3})
    assert msgspec.json.encode(started) == msgspec.json.encode({"inferenceId": "i", "conversationId": "ann", "turnIndex": 2, "phase": "started"})
    assert msgspec.json.encode(ended) == msgspec.json.encode(
        {"inferenceId": "i", "conversationId": "ann", "turnIndex": 2, "phase": "completed", "usage": {"outputTokens": 3}})

    assert await session.before_inference(hook, timeout=1) == HookAnswered({"contextInjections": []})
    assert session.lifecycle_nowait(started) is Queued.QUEUED
    assert await session.lifecycle(ended) is None
    assert [(form, method) for form, method, _ in port.wire] == [
        ("request", "context/beforeInference"), ("notification", "inference/lifecycle"), ("notification", "inference/lifecycle"),
    ]


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [
        (RequestTimeout("context/beforeInference", 1, sent=True), HookTimedOut()),
        (RpcError(-32603, "hook exploded"), HookFailed("JSON-RPC error -32603: hook exploded")),
        (PeerClosed("gone"), HookFailed("gone")),
    ],
)
async def test_a_hook_outcome_is_a_value(answer: Any, outcome: Any) -> None:
    session = ServerSession(RecordingPort(answer=answer))
    params = BeforeInferenceParams(inference_id="i", conversation_id="ann", turn_index=0, user_message=None, model=None,
                                   channels=ChannelContext(candidates=[]))
    assert await session.before_inference(params, timeout=1) == outcome


async def test_a_lifecycle_notice_that_cannot_leave_says_why() -> None:
    port = RecordingPort(answer=PeerClosed("connection closed"))
    session = ServerSession(port)
    params = LifecycleParams(inference_id="i", conversation_id="ann", turn_index=0, phase="started")
    assert session.lifecycle_nowait(params) == Unsent("connection closed")
    assert await session.lifecycle(params) == Unsent("connection closed")
    port.answer, port.room = {}, False
    assert session.lifecycle_nowait(params) is Queued.FULL
    assert port.wire == []


async def test_every_publish_outcome_is_counted_on_its_session() -> None:
    # /metrics reads these counts: the refusals decided before sending count too.
    params = PublishParams(conversation_id="ann", channel_id="general", content=(TextContent(type="text", text="hi"),))
    port = RecordingPort(answer={"delivered": True, "messageId": "m1"})
    session = ServerSession(port)
    await session.publish(params)
    await session.publish(params, registered=False)
    port.state = LinkState.RETRYING
    await session.publish(params)
    assert dict(session.publishes) == {
        ("delivered", None): 1, ("failed", "channel-not-registered"): 1, ("failed", "server-unavailable"): 1,
    }
    assert len(port.wire) == 1  # only the registered one, on a ready link, left
