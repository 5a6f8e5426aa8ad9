"""Turns end to end: real fixture server processes, the daemon in-process, a host on the socket.

Issue 4's acceptance for turns, typing, context and traces: servers ``a`` and ``b`` both
register ``general``; a message on ``b``'s wakes the host; the reply, the typing and
``inference:started`` name ``b``, and nothing of the turn reaches ``a`` (in both registration
orders). ``context/beforeInference`` tells each server only its own channels, and one server's
error, timeout or ungranted injection costs that server alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from structlog.testing import capture_logs

from mcpl_router.client import RouterClient
from mcpl_router.daemon import Daemon
from mcpl_router.jsonrpc import RpcError
from mcpl_router.testing.control import FixtureProcess, wait_until
from mcpl_router.testing.descriptors import channel_descriptor

from .conftest import servers_and_daemon, wait_channel

pytestmark = pytest.mark.integration

AGENT = "ann"


def open_channel(channel_id: str) -> dict[str, Any]:
    return {**channel_descriptor(channel_id), "initiallyOpen": True}




@asynccontextmanager
async def host(daemon: Daemon) -> AsyncIterator[RouterClient]:
    assert daemon.host_socket_path is not None
    async with RouterClient.connect_unix(daemon.host_socket_path) as client:
        await client.hello("test-host", [AGENT])
        yield client


async def recorded_since(server: FixtureProcess, baseline: int) -> list[dict[str, Any]]:
    return [entry for entry in await server.recorded() if entry["seq"] > baseline]


async def last_seq(server: FixtureProcess) -> int:
    recorded = await server.recorded()
    return recorded[-1]["seq"] if recorded else 0


def typing_ops(entries: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["params"]["channelId"], e["params"].get("op")) for e in entries if e["method"] == "channels/typing"]


@pytest.mark.parametrize("first", ["a", "b"])
async def test_reply_typing_and_trace_land_on_b_and_nothing_of_the_turn_reaches_a(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"]) as (daemon, servers):
            daemon.turns.typing_interval = 0.2
            # Registration phase: the first server's general is registered before the other's.
            for name in (first, "b" if first == "a" else "a"):
                await servers[name].register([open_channel("general")])
                await wait_channel(daemon, name, "general")
            a_baseline = await last_seq(servers["a"])

            async with host(daemon) as client:
                await servers["b"].incoming([{"channelId": "general", "text": "hi ann", "tags": ["chat:mention"]}])
                wake = await client.next_wake()
                assert wake.channel is not None
                assert (wake.channel.server_id, wake.channel.channel_id, wake.channel.shown) == ("b", "general", "b:general")

                opened = await client.call("turn/open", {"agent": AGENT, "wakes": [wake.seq]})
                turn_id = opened["turnId"]
                assert opened["channel"] == {"serverId": "b", "channelId": "general", "shown": "b:general"}
                # Tools: the servers' own (connector tools) and the daemon's; tested with those.
                assert opened["system"] == []
                assert opened["shown"]["locus"] == "b:general"

                context = await client.call("turn/context", {"turnId": turn_id, "model": "test-model", "userMessage": {"text": "hi"}})
                assert context["servers"] == {"a": "ok", "b": "ok"}
                trace = await client.next_notification("inference:started")
                assert trace.params["agent"] == AGENT and trace.params["turnId"] == turn_id
                assert (trace.params["serverId"], trace.params["channelId"]) == ("b", "general")

                # Typing shows on b's general and is refreshed while the turn runs.
                async def refreshed() -> bool:
                    return typing_ops(await servers["b"].recorded("channels/typing")).count(("general", "start")) >= 2

                await wait_until(refreshed, timeout=10)

                await client.call("turn/text", {"turnId": turn_id, "round": 1, "delta": "Hello "})
                await client.call("turn/text", {"turnId": turn_id, "round": 1, "delta": "from ann"})
                routed = await client.call("turn/round", {"turnId": turn_id, "round": 1})
                [delivery] = routed["deliveries"]
                assert (delivery["serverId"], delivery["channelId"], delivery["shown"]) == ("b", "general", "b:general")
                assert delivery["outcome"] == "delivered" and delivery["messageId"]

                await client.call("turn/text", {"turnId": turn_id, "round": 2, "delta": "Bye."})
                closed = await client.call("turn/close", {"turnId": turn_id, "outcome": "completed"})
                assert [d["outcome"] for d in closed["deliveries"]] == ["delivered", "delivered"]
                assert closed["drafts"] == []
                assert closed["receipt"]["text"] == "[delivered] plain speech → b:general"

                # The terminal is a notification: wait for it to arrive, not for the close.
                async def terminal_arrived() -> bool:
                    return any(e["params"].get("phase") == "completed" for e in await servers["b"].recorded("inference/lifecycle"))

                await wait_until(terminal_arrived, timeout=10)
                b_entries = await servers["b"].recorded()
                publishes = [e for e in b_entries if e["method"] == "channels/publish"]
                assert [(p["kind"], p["params"]["channelId"], p["params"]["content"][0]["text"]) for p in publishes] == [
                    ("request", "general", "Hello from ann"),
                    ("request", "general", "Bye."),
                ]
                ops = typing_ops(b_entries)
                assert ops[-1] == ("general", "stop") and ops.count(("general", "stop")) == 1
                phases = [
                    e["params"]["phase"]
                    for e in b_entries
                    if e["method"] == "inference/lifecycle" and e["params"]["inferenceId"] == opened["inferenceId"]
                ]
                assert phases == ["started", "completed"]

                # a: no publish, no typing, no incoming/defaultOutgoing; its own context call
                # names only its own channel. inference/lifecycle goes to every server granted
                # it (PROTOCOL §4) and names no channel and no content.
                a_entries = await recorded_since(servers["a"], a_baseline)
                assert {e["method"] for e in a_entries} <= {"context/beforeInference", "inference/lifecycle"}
                [a_context] = [e for e in a_entries if e["method"] == "context/beforeInference"]
                assert a_context["params"]["channels"] == {"candidates": ["general"]}
                for entry in a_entries:
                    if entry["method"] == "inference/lifecycle":
                        assert set(entry["params"]) == {"inferenceId", "conversationId", "turnIndex", "phase"}
                b_context = next(e for e in b_entries if e["method"] == "context/beforeInference")
                assert b_context["params"]["channels"]["incoming"]["channelId"] == "general"
                assert b_context["params"]["channels"]["defaultOutgoing"] == {"channelId": "general"}
                assert b_context["params"]["channels"]["candidates"] == ["general"]
                assert daemon.turns.open_turns() == []


async def test_a_turn_ending_on_one_server_reaches_it_stop_complete_terminal_in_order_once_each(tmp_path: Path) -> None:
    """The common end (one server heard the turn, its outbox has room) is queued inside
    ``turn/close``: the typing stop, the stream's complete, the lifecycle terminal, in that
    order, each once, and nothing of the turn after them."""
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a"]) as (daemon, servers):
            await servers["a"].register([open_channel("general")])
            await wait_channel(daemon, "a", "general")
            async with host(daemon) as client:
                for turn in range(3):  # later turns end on a link that has carried whole turns
                    await servers["a"].incoming([{"channelId": "general", "text": f"hi ann {turn}", "tags": ["chat:mention"]}])
                    wake = await client.next_wake()
                    baseline = await last_seq(servers["a"])
                    opened = await client.call("turn/open", {"agent": AGENT, "wakes": [wake.seq]})
                    await client.call("turn/context", {"turnId": opened["turnId"]})
                    await client.call("turn/text", {"turnId": opened["turnId"], "round": 1, "delta": f"reply {turn}"})
                    closed = await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
                    assert [d["outcome"] for d in closed["deliveries"]] == ["delivered"]

                    async def ended() -> list[dict[str, Any]]:
                        entries = await recorded_since(servers["a"], baseline)
                        done = any(e["method"] == "inference/lifecycle" and e["params"]["phase"] == "completed" for e in entries)
                        return entries if done else []

                    entries = await wait_until(ended, timeout=10)
                    publish = max(i for i, e in enumerate(entries) if e["method"] == "channels/publish")
                    end = [
                        (e["method"], e["params"].get("op") or e["params"].get("content") or e["params"].get("phase"))
                        for e in entries[publish + 1:]
                        if e["method"] in ("channels/typing", "channels/outgoing/complete", "inference/lifecycle")
                    ]
                    assert end == [
                        ("channels/typing", "stop"),
                        ("channels/outgoing/complete", f"reply {turn}"),
                        ("inference/lifecycle", "completed"),
                    ]
                    lifecycle = [e["params"]["phase"] for e in entries if e["method"] == "inference/lifecycle"]
                    assert lifecycle == ["started", "completed"]
                    assert typing_ops(entries).count(("general", "stop")) == 1
            assert daemon.turns.open_turns() == []


async def test_before_inference_isolates_each_servers_failure_and_drops_ungranted_injections(tmp_path: Path) -> None:
    options = {"inj": {"disabledCapabilities": ["contextHooks.beforeInference.inject.system"]}}
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["err", "slow", "inj"], options) as (daemon, servers):
            daemon.turns.context_timeout = 0.5
            await servers["err"].configure(before_inference={"error": {"code": -32603, "message": "hook exploded"}})
            await servers["slow"].configure(before_inference={"delayMs": 3000, "injections": [
                {"namespace": "slow", "position": "system", "content": "too late"}]})
            await servers["inj"].configure(before_inference={"injections": [
                {"namespace": "inj", "position": "system", "content": "ungranted system"},
                {"namespace": "inj", "position": "beforeUser", "content": "granted beforeUser"},
            ]})
            for name, extra in (("err", "err-room"), ("slow", "slow-room"), ("inj", "inj-room")):
                await servers[name].register([open_channel("general"), open_channel(extra)])
                await wait_channel(daemon, name, extra)

            async with host(daemon) as client:
                await servers["inj"].incoming([{"channelId": "general", "text": "hi ann", "tags": ["chat:mention"]}])
                wake = await client.next_wake()
                opened = await client.call("turn/open", {"agent": AGENT, "wakes": [wake.seq]})
                context = await client.call("turn/context", {"turnId": opened["turnId"], "model": "m", "userMessage": "hi"})
                assert context["servers"] == {"err": "error", "slow": "timeout", "inj": "ok"}
                assert context["injections"]["system"] == []
                assert context["injections"]["afterUser"] == []
                assert [(i["serverId"], i["content"]) for i in context["injections"]["beforeUser"]] == [("inj", "granted beforeUser")]
                await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})

            asked = {name: (await servers[name].recorded("context/beforeInference"))[-1]["params"] for name in servers}
            inj_channels = asked["inj"]["channels"]
            assert inj_channels["incoming"]["channelId"] == "general" and inj_channels["incoming"]["messageId"]
            assert inj_channels["defaultOutgoing"] == {"channelId": "general"}
            assert inj_channels["candidates"] == ["general", "inj-room"]
            assert asked["err"]["channels"] == {"candidates": ["general", "err-room"]}
            assert asked["slow"]["channels"] == {"candidates": ["general", "slow-room"]}
            assert {params["inferenceId"] for params in asked.values()} == {opened["inferenceId"]}


async def test_a_host_turn_naming_a_shared_id_has_no_channel_and_no_fallback(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"]) as (daemon, servers):
            daemon.turns.typing_interval = 0.2
            for name in ("a", "b"):
                await servers[name].register([open_channel("general")])
                await wait_channel(daemon, name, "general")
            # A message on b's general happened: the latest inbound channel is NOT a fallback.
            async with host(daemon) as client:
                await servers["b"].incoming([{"channelId": "general", "text": "hi", "tags": ["chat:mention"]}])
                await client.next_wake()
                opened = await client.call("turn/open", {"agent": AGENT, "channel": "general"})
                assert opened["channel"] is None and opened["shown"]["locus"] is None
                await client.call("turn/context", {"turnId": opened["turnId"], "model": "m"})
                trace = await client.next_notification("inference:started")
                assert trace.params["serverId"] is None and trace.params["channelId"] is None
                await client.call("turn/text", {"turnId": opened["turnId"], "round": 1, "delta": "thinking aloud"})
                closed = await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
                assert closed["deliveries"] == [] and closed["receipt"]["held"] == 1

                # A qualified name or a ref names one channel; an empty serverId is malformed.
                named = await client.call("turn/open", {"agent": AGENT, "channel": "b:general"})
                assert named["channel"]["serverId"] == "b"
                await client.call("turn/close", {"turnId": named["turnId"], "outcome": "aborted"})
                with pytest.raises(RpcError) as refused:
                    await client.call("turn/open", {"agent": AGENT, "channel": {"serverId": "", "channelId": "general"}})
                assert refused.value.code == -32602

            for name in ("a", "b"):
                entries = await servers[name].recorded()
                assert not any(e["method"] in ("channels/publish",) for e in entries)
                first_context = next(e for e in entries if e["method"] == "context/beforeInference")
                assert first_context["params"]["channels"] == {"candidates": ["general"]}
            assert typing_ops(await servers["a"].recorded()) == []
            # b saw typing only for the turn that named b:general.
            assert set(typing_ops(await servers["b"].recorded())) <= {("general", "start"), ("general", "stop")}


async def test_host_typing_by_bare_id_fans_out_and_by_qualified_name_stays(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"]) as (daemon, servers):
            for name in ("a", "b"):
                await servers[name].register([open_channel("general")])
                await wait_channel(daemon, name, "general")
            async with host(daemon) as client:
                only_b = await client.call("channels/typing", {"channel": "b:general", "op": "start"})
                assert [(row["serverId"], row["sent"]) for row in only_b["typing"]] == [("b", True)]
                both = await client.call("channels/typing", {"channel": "general", "op": "stop"})
                assert {(row["serverId"], row["sent"]) for row in both["typing"]} == {("a", True), ("b", True)}
            # The stops are notifications: each server records its own when it reads it.
            for name, count in (("a", 1), ("b", 2)):
                with trio.move_on_after(5):
                    while len(typing_ops(await servers[name].recorded())) < count:
                        await trio.sleep(0.05)
            assert typing_ops(await servers["a"].recorded()) == [("general", "stop")]
            assert typing_ops(await servers["b"].recorded()) == [("general", "start"), ("general", "stop")]


async def test_lease_expiry_and_host_gone_stop_typing_and_end_inference(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"]) as (daemon, servers):
            daemon.turns.lease = 0.5
            daemon.turns.typing_interval = 0.1
            for name in ("a", "b"):
                await servers[name].register([open_channel("general")])
                await wait_channel(daemon, name, "general")
            async with host(daemon) as client:
                opened = await client.call("turn/open", {"agent": AGENT, "channel": {"serverId": "b", "channelId": "general"}})
                await client.call("turn/context", {"turnId": opened["turnId"], "model": "m"})
                # The host goes quiet: the lease ends the turn.
                await wait_until(lambda: not daemon.turns.open_turns(), timeout=10)
                with pytest.raises(RpcError) as gone:
                    await client.call("turn/round", {"turnId": opened["turnId"], "round": 1})
                assert gone.value.code == -32050

                daemon.turns.lease = 60
                second = await client.call("turn/open", {"agent": AGENT, "channel": "b:general"})
                await wait_until(lambda: daemon.turns.run_of(second["turnId"]).typing_sent is not None, timeout=10)
            # The host connection is gone: its turn ends within a poll.
            await wait_until(lambda: not daemon.turns.open_turns(), timeout=10)

            async def stopped_twice() -> bool:
                return typing_ops(await servers["b"].recorded()).count(("general", "stop")) == 2

            await wait_until(stopped_twice, timeout=10)
            phases = [e["params"]["phase"] for e in await servers["b"].recorded("inference/lifecycle")]
            assert phases == ["started", "aborted"]  # the second turn never started inference
            assert typing_ops(await servers["a"].recorded()) == []


async def test_withdrawing_as_general_leaves_bs_typing_alone(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"]) as (daemon, servers):
            daemon.turns.typing_interval = 0.1
            for name in ("a", "b"):
                await servers[name].register([open_channel("general")])
                await wait_channel(daemon, name, "general")
            async with host(daemon) as client:
                opened = await client.call("turn/open", {"agent": AGENT, "channel": "b:general"})
                await servers["a"].withdraw(["general"])
                await wait_until(lambda: not daemon.router.registry.channels_for("a"), timeout=10)
                before = len(typing_ops(await servers["b"].recorded()))

                async def still_refreshed() -> bool:
                    return len(typing_ops(await servers["b"].recorded())) >= before + 2

                await wait_until(still_refreshed, timeout=10)
                await servers["b"].withdraw(["general"])
                await wait_until(lambda: daemon.turns.run_of(opened["turnId"]).turn.routing.typing_channel is None, timeout=10)
                await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
            assert typing_ops(await servers["a"].recorded()) == []


async def test_a_new_turn_supersedes_the_open_one_and_an_old_turns_call_moves_nothing(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"]) as (daemon, servers):
            for name in ("a", "b"):
                await servers[name].register([open_channel("general")])
                await wait_channel(daemon, name, "general")
            async with host(daemon) as client:
                first = await client.call("turn/open", {"agent": AGENT, "channel": "b:general"})
                await client.call("turn/context", {"turnId": first["turnId"], "model": "m"})
                second = await client.call("turn/open", {"agent": AGENT, "channel": "a:general"})
                assert [turn.turn_id for turn in daemon.turns.open_turns()] == [second["turnId"]]
                with capture_logs() as logs:
                    # A script the first turn started calls a tool during the second turn.
                    result = await client.call(
                        "turn/tool",
                        {"turnId": second["turnId"], "callId": "c1", "name": "no_such_tool",
                         "arguments": {"channelId": "general"}, "callerTurnId": first["turnId"]},
                    )
                    inside = await client.call(
                        "turn/tool", {"turnId": second["turnId"], "callId": "c2", "name": "nope", "arguments": {}}
                    )
                assert result["isError"] is True and result["reason"] == "unknown-tool"
                assert inside["isError"] is True
                calls = [entry for entry in logs if entry["event"] == "turn.tool.unknown"]
                assert [entry["calling_turn"] for entry in calls] == [None, second["turnId"]]
                await client.call("turn/close", {"turnId": second["turnId"], "outcome": "failed"})

            b_lifecycle = [e["params"] for e in await servers["b"].recorded("inference/lifecycle")]
            assert [(p["inferenceId"], p["phase"]) for p in b_lifecycle] == [
                (first["inferenceId"], "started"), (first["inferenceId"], "aborted")
            ]
            assert typing_ops(await servers["b"].recorded())[-1] == ("general", "stop")
            assert typing_ops(await servers["a"].recorded())[-1] == ("general", "stop")
