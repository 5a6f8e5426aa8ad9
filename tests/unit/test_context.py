"""``context/beforeInference`` fan-out and ``inference/lifecycle`` over test-double links.

The doubles stand in for :class:`~mcpl_router.mcpl.link.ServerLink`: a server id, a state, the
grant current at each moment, an epoch, and ``call``/``send_notification``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import msgspec
import trio
from structlog.testing import capture_logs

from mcpl_router.jsonrpc import RequestTimeout, RpcError
from mcpl_router.mcpl.context import HookFacts, before_inference, channel_context_for, send_lifecycle
from mcpl_router.mcpl.grants import Grant
from mcpl_router.mcpl.link import LinkState
from mcpl_router.mcpl.session import LifecycleParams, ServerSession
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import ChannelRegistry, RegistrationPolicy

ALL_HOOKS = frozenset(
    {
        "contextHooks.beforeInference.observe",
        "contextHooks.beforeInference.inject.system",
        "contextHooks.beforeInference.inject.beforeUser",
        "contextHooks.beforeInference.inject.afterUser",
        "inferenceLifecycle",
    }
)


@attrs.define
class FakePort:
    """A server connection (the session's port) that answers as told and records each
    message's params as the wire has them."""

    server_id: str
    grant: Grant = attrs.field(factory=lambda: Grant(effective=ALL_HOOKS))
    state: LinkState = LinkState.READY
    epoch: int = 1
    answer: Callable[[FakePort, dict[str, Any]], Any] | None = None
    calls: list[tuple[str, Any]] = attrs.field(factory=list)
    notes: list[tuple[str, Any]] = attrs.field(factory=list)

    async def call(self, method: str, params: Any = None, *, capability: str | None, timeout: float | None = None, result_type: Any = None) -> Any:
        params = msgspec.to_builtins(params)
        self.calls.append((method, params))
        assert self.answer is not None
        outcome = self.answer(self, params)
        if isinstance(outcome, Exception):
            raise outcome
        if callable(outcome):
            return await outcome()
        return outcome

    @property
    def request_timeout(self) -> float:
        return 30.0

    async def send_notification(self, method: str, params: Any = None, *, capability: str | None) -> None:
        self.notes.append((method, msgspec.to_builtins(params)))

    def send_notification_nowait(self, method: str, params: Any = None, *, capability: str | None) -> bool:
        self.notes.append((method, msgspec.to_builtins(params)))
        return True


def sessions(*ports: FakePort) -> list[ServerSession]:
    return [ServerSession(port) for port in ports]  # type: ignore[arg-type]


def lifecycle(phase: str) -> LifecycleParams:
    return LifecycleParams(inference_id="inf-1", conversation_id="ann", turn_index=0, phase=phase)


def registry_of(*refs: ChannelRef, closed: tuple[ChannelRef, ...] = ()) -> ChannelRegistry:
    registry = ChannelRegistry()
    for ref in refs:
        registry.register(ref.server_id, [{"id": ref.channel_id, "initiallyOpen": ref not in closed}], RegistrationPolicy.permissive())
    return registry


def facts(**changes: Any) -> HookFacts:
    base = HookFacts(
        inference_id="inf-1",
        conversation_id="ann",
        turn_index=0,
        model="m",
        user_message={"role": "user", "content": "hi"},
        incoming=ChannelRef("b", "general"),
        incoming_message_id="in-1",
        default_outgoing=ChannelRef("b", "general"),
    )
    return attrs.evolve(base, **changes)


def injection(position: str, text: str) -> dict[str, Any]:
    return {"namespace": "ns", "position": position, "content": text, "metadata": {}}


def test_each_server_is_told_only_its_own_channels() -> None:
    registry = registry_of(
        ChannelRef("a", "general"), ChannelRef("b", "general"), ChannelRef("b", "random"), closed=(ChannelRef("b", "random"),)
    )
    registry.set_open(ChannelRef("a", "general"), True)
    registry.set_open(ChannelRef("b", "general"), True)
    b = msgspec.to_builtins(channel_context_for("b", facts(), registry))
    assert b == {
        "incoming": {"channelId": "general", "messageId": "in-1", "threadId": None},
        "defaultOutgoing": {"channelId": "general"},
        "candidates": ["general"],
    }
    assert msgspec.to_builtins(channel_context_for("a", facts(), registry)) == {"candidates": ["general"]}
    assert msgspec.to_builtins(channel_context_for("c", facts(), registry)) == {"candidates": []}


async def test_one_failure_fails_that_server_alone_and_ungranted_injections_are_dropped() -> None:
    registry = registry_of(ChannelRef("ok", "x"))
    ok = FakePort("ok", answer=lambda link, p: {"contextInjections": [injection("system", "S"), injection("afterUser", "A")]})
    erroring = FakePort("err", answer=lambda link, p: RpcError(-32603, "boom"))
    slow = FakePort("slow", answer=lambda link, p: RequestTimeout("context/beforeInference", 0.1, sent=True))
    crashing = FakePort("crash", answer=lambda link, p: ValueError("bad"))
    malformed = FakePort("bad", answer=lambda link, p: {"contextInjections": "nope"})
    partial = FakePort(
        "partial",
        grant=Grant(effective=frozenset({"contextHooks.beforeInference.inject.beforeUser"})),
        answer=lambda link, p: {"contextInjections": [injection("system", "no"), injection("beforeUser", "yes"), injection("sideways", "no")]},
    )
    unhooked = FakePort("none", grant=Grant(effective=frozenset({"inferenceLifecycle"})))
    down = FakePort("down", state=LinkState.RETRYING)
    with capture_logs() as logs:
        result = await before_inference(sessions(ok, erroring, slow, crashing, malformed, partial, unhooked, down), facts(), registry)
    assert result.servers == {
        "ok": "ok", "err": "error", "slow": "timeout", "crash": "error", "bad": "error",
        "partial": "ok", "none": "skipped", "down": "skipped",
    }
    assert [i["content"] for i in result.injections["system"]] == ["S"]
    assert [i["content"] for i in result.injections["beforeUser"]] == ["yes"]
    assert [(i["serverId"], i["content"]) for i in result.injections["afterUser"]] == [("ok", "A")]
    dropped = [entry for entry in logs if entry["event"] == "context.injection.dropped"]
    assert {(d["server"], d["position"], d["reason"]) for d in dropped} == {
        ("partial", "system", "not-granted"),
        ("partial", "sideways", "unknown-position"),
    }
    # The user message only to a server granted observe.
    assert partial.calls[0][1]["userMessage"] is None
    assert ok.calls[0][1]["userMessage"] == {"role": "user", "content": "hi"}
    assert unhooked.calls == [] and down.calls == []


async def test_injections_are_authorized_against_the_grant_current_at_receipt() -> None:
    registry = registry_of()

    def narrowing_answer(link: FakePort, params: dict[str, Any]) -> Any:
        async def later() -> Any:
            # The grant narrows while the request is in flight.
            link.grant = Grant(effective=frozenset({"contextHooks.beforeInference.inject.afterUser"}))
            await trio.lowlevel.checkpoint()
            return {"contextInjections": [injection("system", "S"), injection("afterUser", "A")]}

        return later

    link = FakePort("n", answer=narrowing_answer)
    result = await before_inference(sessions(link), facts(), registry)
    assert result.injections["system"] == []
    assert [i["content"] for i in result.injections["afterUser"]] == ["A"]


async def test_lifecycle_terminal_goes_exactly_where_started_went_in_that_epoch() -> None:
    a = FakePort("a")
    b = FakePort("b")
    c = FakePort("c", grant=Grant(effective=frozenset({"contextHooks.beforeInference.observe"})))
    servers = sessions(a, b, c)
    started = await send_lifecycle(servers, lifecycle("started"))
    assert started == {"a": 1, "b": 1}
    b.epoch = 2  # b reconnected: its new connection never saw "started"
    await send_lifecycle(servers, lifecycle("completed"), only=started)
    assert [p["phase"] for _, p in a.notes] == ["started", "completed"]
    assert [p["phase"] for _, p in b.notes] == ["started"]
    assert c.notes == []
