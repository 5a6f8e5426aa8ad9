"""Issue 11: the real MCPL servers' wire habits, each held by the fixture personality that plays it.

Every test runs the daemon on its default config (``legacy = "auto"``) against a real fixture
process: ``discord`` (discord-mcpl), ``editor`` (mcpl-editor), ``legacy`` (heartbeat-mcpl). What
the server did with what it got is read from its own state (``reactions``, ``historyRequests``,
``chatStore``) and recordings, i.e. as the real server would have read it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.daemon import Daemon
from mcpl_router.testing.control import FixtureControl, FixtureProcess, wait_until

from .conftest import control_of, daemon_process, dialled_server, running_daemon, stdio_server, wait_channel, wait_ready
from .conftest import host_session as host

pytestmark = pytest.mark.integration

AGENT = "ann"
DISCORD_CHANNEL = "discord:1:2"
EDITOR_CHANNEL = "editor:chat"


@asynccontextmanager
async def dialled(
    workdir: Path, personality: str, transport: str, channels: list[str]
) -> AsyncIterator[tuple[Daemon, FixtureProcess]]:
    """One fixture ``s`` the daemon dials, default config, host Unix socket on."""
    async with FixtureProcess.start(
        transport=transport, personality=personality, channels=channels, control_dir=workdir, grace=1
    ) as fixture:
        async with running_daemon(workdir, {"s": dialled_server(fixture)}, unix_socket=True) as daemon:
            yield daemon, fixture


async def tool(client: RouterClient, turn_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return await client.call("turn/tool", {"turnId": turn_id, "callId": f"c-{name}", "name": name, "arguments": arguments})


async def woken_turn(client: RouterClient, server: FixtureControl, channel_id: str, **message: Any) -> dict[str, Any]:
    await server.incoming([{"channelId": channel_id, "text": "hi ann", **message}])
    wake = await client.next_wake()
    return await client.call("turn/open", {"agent": AGENT, "wakes": [wake.seq]})


async def state_field(server: FixtureControl, field: str) -> list[Any] | None:
    return (await server.state()).get(field) or None


# ---------------------------------------------------------------------- discord-mcpl


async def test_1_discords_bracketed_stdout_log_line_is_skipped_never_answered(tmp_path: Path) -> None:
    with trio.fail_after(40):
        control_file = tmp_path / "s.control.json"
        entry = stdio_server(control_file, "discord", (DISCORD_CHANNEL,), grace=1)
        async with running_daemon(tmp_path, {"s": entry}) as daemon, control_of(control_file) as server:
            await wait_ready(daemon, "s")
            await wait_channel(daemon, "s", DISCORD_CHANNEL)
            link = daemon.links["s"]
            await wait_until(lambda: (link.peer_statistics() or _zero()).skipped_lines >= 1, timeout=10)
            stats = link.peer_statistics()
            assert stats is not None and stats.malformed_messages == 0
            # A round trip after the log line, so an answer to it would have arrived by now.
            answer = await server.register([{"id": "after-log-line"}])
            assert answer["results"][0]["accepted"] is True
            # Nothing answered the log line: no error with a null id reached the server.
            assert [e for e in await server.recorded() if e["kind"] == "answer" and e["id"] is None] == []


@pytest.mark.parametrize("transport", ["stdio", "tcp"])
async def test_2_decline_acknowledges_with_the_reaction_discord_reads(tmp_path: Path, transport: str) -> None:
    with trio.fail_after(60):
        async with _discord(tmp_path, transport) as (daemon, server):
            async with host(daemon) as client:
                turn = await woken_turn(client, server, DISCORD_CHANNEL, tags=["chat:mention"])
                declined = await tool(client, turn["turnId"], "channel_decline", {"channelId": DISCORD_CHANNEL, "acknowledge": "👍"})
                assert declined["structuredContent"]["acknowledged"] is True, declined
                [reaction] = await wait_until(lambda: state_field(server, "reactions"), timeout=10)
                # Asked for 👍, the platform got 👍 (not discord's 👀 fallback).
                assert reaction["representation"] == "👍"
                assert reaction["intent"] == "seen-not-opening" and reaction["channelId"] == DISCORD_CHANNEL
                [sent] = await server.recorded("channels/acknowledge")
                assert sent["kind"] == "request"
                assert sent["params"] == {"channelId": DISCORD_CHANNEL, "messageId": reaction["messageId"], "intent": "seen-not-opening", "value": "👍"}


async def test_2_a_push_for_a_closed_channel_is_acknowledged_on_the_message_it_names(tmp_path: Path) -> None:
    # Found in the by-hand run: discord-mcpl pushes a message in a closed channel as push/event
    # naming it in origin.messageId (src/server.ts:3176); the decline marks that message.
    with trio.fail_after(60):
        async with _discord(tmp_path, "tcp") as (daemon, server):
            async with host(daemon) as client:
                origin = {"source": "discord", "messageId": "1234", "channelId": "2", "mcplChannelId": DISCORD_CHANNEL}
                await server.push(origin=origin, tags=["chat:mention"])
                wake = await client.next_wake()
                assert wake.reason == "push"
                turn = await client.call("turn/open", {"agent": AGENT, "wakes": [wake.seq]})
                declined = await tool(client, turn["turnId"], "channel_decline", {"channelId": DISCORD_CHANNEL, "acknowledge": "👍"})
                assert declined["structuredContent"]["acknowledged"] is True, declined
                [reaction] = await wait_until(lambda: state_field(server, "reactions"), timeout=10)
                assert (reaction["messageId"], reaction["representation"]) == ("1234", "👍")


async def test_3_refusal_reaction_is_a_request_discord_handles(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with _discord(tmp_path, "tcp") as (daemon, server):
            async with host(daemon) as client:
                turn = await woken_turn(client, server, DISCORD_CHANNEL, tags=["chat:mention"])
                await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "refused"})
                [reaction] = await wait_until(lambda: state_field(server, "reactions"), timeout=10)
                assert reaction["representation"] == "🚫" and reaction["intent"] == "refused"
                assert [e["kind"] for e in await server.recorded("channels/acknowledge")] == ["request"]


async def test_4_channel_open_backscroll_reaches_discord_as_history_limit(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with _discord(tmp_path, "tcp") as (daemon, server):
            async with host(daemon) as client:
                turn = await woken_turn(client, server, DISCORD_CHANNEL, tags=["chat:mention"])
                opened = await tool(client, turn["turnId"], "channel_open",
                                    {"channelId": DISCORD_CHANNEL, "backscroll": 5, "setSpeechTarget": False})
                assert opened["isError"] is False, opened
                assert (await server.state())["historyRequests"] == [{"epoch": 1, "channelId": DISCORD_CHANNEL, "limit": 5}]
                [sent] = await server.recorded("channels/open")
                assert sent["params"] == {"channelId": DISCORD_CHANNEL, "history": {"limit": 5}}


@asynccontextmanager
async def _discord(workdir: Path, transport: str) -> AsyncIterator[tuple[Daemon, FixtureControl]]:
    if transport == "stdio":
        control_file = workdir / "s.control.json"
        entry = stdio_server(control_file, "discord", (DISCORD_CHANNEL,), grace=1)
        async with running_daemon(workdir, {"s": entry}, unix_socket=True) as daemon, control_of(control_file) as server:
            await wait_channel(daemon, "s", DISCORD_CHANNEL)
            yield daemon, server
        return
    async with dialled(workdir, "discord", transport, [DISCORD_CHANNEL]) as (daemon, server):
        await wait_channel(daemon, "s", DISCORD_CHANNEL)
        yield daemon, server


# ---------------------------------------------------------------------- mcpl-editor


async def test_5_editor_that_waits_on_its_register_becomes_ready_under_auto(tmp_path: Path) -> None:
    # Far below the 30 s policy deadline the deadlock used to hit: ready, registered, no wait.
    with trio.fail_after(20):
        async with dialled(tmp_path, "editor", "ws", [EDITOR_CHANNEL]) as (daemon, server):
            await wait_ready(daemon, "s")
            await wait_channel(daemon, "s", EDITOR_CHANNEL)
            link = daemon.links["s"]
            assert link.legacy is True
            state = await server.state()
            assert [a.get("error") for a in state["autoAnswers"]] == [None]
            # The policy went as a Request (-32601 from the editor), then as the Notification it reads.
            updates = await server.recorded("featureSets/update")
            assert [u["kind"] for u in updates] == ["request", "notification"]
            assert state["grant"]["enabled"] == sorted(link.grant.enabled_feature_sets)
            # And again in the next epoch.
            await server.disconnect()
            await wait_ready(daemon, "s", epoch=2)
            await wait_channel(daemon, "s", EDITOR_CHANNEL)


async def test_6_editor_chat_wakes_an_agent_and_the_reply_lands_in_its_chat_store(tmp_path: Path) -> None:
    with trio.fail_after(40):
        async with dialled(tmp_path, "editor", "ws", [EDITOR_CHANNEL]) as (daemon, server):
            await wait_channel(daemon, "s", EDITOR_CHANNEL)
            link = daemon.links["s"]
            # Its 0.4 name for inbound chat is read as the 0.5 leaf, and that is shown.
            assert link.legacy_mapping == {"channels.observe": "channels.incoming"}
            assert link.grant.allows("channels.incoming")
            assert "editor.chat" in link.grant.enabled_feature_sets
            agent = {"name": AGENT, "wake": {"servers": ["s"]}}  # its chat carries no tags
            async with host(daemon, agent) as client:
                listed = await client.call("servers/list", {})
                [row] = [r for r in listed["servers"] if r["serverId"] == "s"]
                assert row["legacy"] is True and row["legacyMapping"] == {"channels.observe": "channels.incoming"}

                turn = await woken_turn(client, server, EDITOR_CHANNEL)
                await client.call("turn/text", {"turnId": turn["turnId"], "round": 1, "delta": "hello from ann"})
                closed = await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
                assert [d["channelId"] for d in closed["deliveries"]] == [EDITOR_CHANNEL]
                [stored] = await wait_until(lambda: state_field(server, "chatStore"), timeout=10)
                assert stored["text"] == "hello from ann"
                assert [e["kind"] for e in await server.recorded("channels/publish")] == ["request", "notification"]
                # Learned for the epoch: the next publish goes straight as a Notification.
                again = await client.call("channels/publish", {"agent": AGENT, "channel": EDITOR_CHANNEL, "content": "and again"})
                assert again["delivered"] is False and again["reason"] == "unconfirmed"
                stored = await wait_until(lambda: _stored(server, 2), timeout=10)
                assert [m["text"] for m in stored] == ["hello from ann", "and again"]
                assert [e["kind"] for e in await server.recorded("channels/publish")] == ["request", "notification", "notification"]
                # It has no typing handler and advertised none: never granted, never sent.
                assert not link.grant.allows("channels.typing")
                assert await server.recorded("channels/typing") == []


async def test_6_a_strict_05_server_is_not_mapped(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with dialled(tmp_path, "strict", "tcp", ["general"]) as (daemon, _server):
            await wait_ready(daemon, "s")
            link = daemon.links["s"]
            assert link.legacy is False and link.legacy_mapping == {}
            assert link.status().to_wire()["legacyMapping"] == {}


# ---------------------------------------------------------------------- heartbeat-mcpl


async def test_heartbeat_answers_the_policy_32601_pushes_and_wakes_again_after_kill(tmp_path: Path) -> None:
    with trio.fail_after(60):
        control_file = tmp_path / "s.control.json"
        entry = stdio_server(control_file, "legacy", (), push_on_start=True)
        async with running_daemon(tmp_path, {"s": entry}, unix_socket=True) as daemon:
            async with host(daemon) as client:
                first = await client.next_wake()
                assert first.reason == "push"
                assert daemon.links["s"].legacy is True
                async with control_of(control_file) as server:
                    pid = server.pid
                os.kill(pid, signal.SIGKILL)
                await wait_ready(daemon, "s", epoch=2)
                again = await client.next_wake()
                assert again.reason == "push" and again.seq > first.seq


async def _stored(server: FixtureControl, count: int) -> list[dict[str, Any]] | None:
    stored = (await server.state())["chatStore"]
    return stored if len(stored) >= count else None


def _zero() -> Any:
    from mcpl_router.jsonrpc.peer import PeerStatistics

    return PeerStatistics(0, 0, 0, 0, 0, 0, 0, 0, 0)


# ---------------------------------------------------------------------- connectome-host's file


async def test_connectome_hosts_mcpl_servers_json_runs_unchanged_from_another_directory(tmp_path: Path) -> None:
    """Relative args, ``protocol: "legacy"``, a ``?token=`` WebSocket server and a tombstone."""
    host_dir, elsewhere = tmp_path / "host", tmp_path / "elsewhere"
    (host_dir / "servers").mkdir(parents=True)
    elsewhere.mkdir()
    # A server launched by a script next to the config, named by a ./ argument.
    (host_dir / "servers" / "chat.py").write_text(
        "import sys\nfrom mcpl_router.testing.fixture_server import main\nsys.exit(main())\n"
    )
    chat_control = tmp_path / "chat.control.json"
    with trio.fail_after(90), tempfile.TemporaryDirectory(prefix="mr-ch-", dir="/tmp") as run_dir:
        async with FixtureProcess.start(
            transport="ws", personality="strict", channels=["world:lobby"], control_dir=tmp_path,
            token="s3cret-in-query", token_in="query",
        ) as world:
            config_file = host_dir / "mcpl-servers.json"
            config_file.write_text(json.dumps({"mcplServers": {
                "chat": {
                    "command": sys.executable,
                    "args": ["./servers/chat.py", "--transport", "stdio", "--personality", "discord",
                             "--channel", DISCORD_CHANNEL, "--grace", "1", "--exit-with-parent",
                             "--control-file", str(chat_control)],
                    "protocol": "legacy",
                    "toolPrefix": "chat_",
                    "reconnect": True,
                    "channelSubscription": "auto",
                },
                "world": {"url": world.listen_url, "transport": "websocket", "token": "s3cret-in-query"},
                "gone": {"disabled": True},
            }}, indent=2))
            env = {**os.environ, "XDG_RUNTIME_DIR": run_dir, "MCPL_ROUTER_STATE_DIR": run_dir}
            cli = [sys.executable, "-m", "mcpl_router"]
            checked = await trio.run_process(
                [*cli, "check-config", str(config_file)], cwd=elsewhere, env=env, capture_stdout=True, capture_stderr=True
            )
            summary = checked.stdout.decode()
            assert summary.startswith("OK: 3 servers (chat: stdio, world: websocket, gone: none, disabled)"), summary
            assert "channelSubscription" in summary and "host setting" in summary
            async with daemon_process(config_file, tmp_path / "daemon.log", cwd=elsewhere, env=env) as daemon:
                await daemon.start()

                async def servers() -> dict[str, str] | None:
                    result = await trio.run_process(
                        [*cli, "status", "--json", "--config", str(config_file)],
                        cwd=elsewhere, env=env, capture_stdout=True, capture_stderr=True, check=False,
                    )
                    if result.returncode != 0:
                        return None
                    states = {s["serverId"]: s["state"] for s in json.loads(result.stdout)["servers"]}
                    return states if set(states.values()) == {"ready"} else None

                assert await wait_until(servers, timeout=40, interval=0.3) == {"chat": "ready", "world": "ready"}
                assert (await world.state())["connected"] is True
                async with control_of(chat_control) as chat:
                    assert (await chat.state())["connected"] is True
                assert daemon.process is not None
                daemon.process.send_signal(signal.SIGTERM)
                assert await daemon.wait() == 0


async def test_3_a_refusal_reaction_the_server_never_answers_does_not_hold_the_close(tmp_path: Path) -> None:
    """The reaction goes out after the turn has ended: typing stopped and the close answered at
    once, whatever the server takes to answer the acknowledge (here: never)."""
    with trio.fail_after(60):
        async with FixtureProcess.start(
            transport="tcp", personality="discord", channels=[DISCORD_CHANNEL], control_dir=tmp_path, grace=1,
            never_answer=["channels/acknowledge"],
        ) as server:
            entry = dialled_server(server, requestTimeout=30)
            async with running_daemon(tmp_path, {"s": entry}, unix_socket=True) as daemon:
                await wait_channel(daemon, "s", DISCORD_CHANNEL)
                async with host(daemon) as client:
                    turn = await woken_turn(client, server, DISCORD_CHANNEL, tags=["chat:mention"])
                    with trio.fail_after(5):  # far below the server's 30 s requestTimeout
                        await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "refused"})
                    # The stop is queued on the server's connection before the close is answered on
                    # the host's; the two writes are separate, so it may land a moment after.
                    assert await wait_until(lambda: _typing_stopped(server), timeout=5)
                    await wait_until(lambda: _acknowledge_sent(server), timeout=10)


async def _acknowledge_sent(server: Any) -> bool:
    return bool(await server.recorded("channels/acknowledge"))


async def _typing_stopped(server: Any) -> bool:
    ops = [e["params"].get("op") for e in await server.recorded("channels/typing")]
    return bool(ops) and ops[-1] == "stop"
