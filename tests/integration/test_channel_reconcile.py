"""A channel an agent opened stays open across a restart of either side (issue 25 items 1, 2).

The fixture servers here keep no subscriptions of their own, as discord-mcpl does ("desired
state is host-owned"): a new process or a new host connection starts with none, registers its
channels closed, and sends nothing said in a channel the host has not opened on that connection
(``--host-owns-subscriptions``: the message comes back as ``notSent``). So a message after the
restart wakes the agent only if the daemon opened the channel again.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.daemon import Daemon
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.testing.control import FixtureControl, FixtureProcess, wait_until
from mcpl_router.testing.descriptors import channel_descriptor

from .conftest import control_of, daemon_config, daemon_running, dialled_server, running_daemon, stdio_server, wait_channel, wait_ready

pytestmark = pytest.mark.integration

AGENT = "ann"


@asynccontextmanager
async def host(daemon: Daemon) -> AsyncIterator[RouterClient]:
    assert daemon.host_socket_path is not None
    async with RouterClient.connect_unix(daemon.host_socket_path) as client:
        await client.hello("test-host", [AGENT])
        yield client


async def in_turn(client: RouterClient, name: str, arguments: dict[str, Any]) -> Any:
    """One tool call in a turn of its own."""
    turn = await client.call("turn/open", {"agent": AGENT})
    result = await client.call("turn/tool", {"turnId": turn["turnId"], "callId": "c1", "name": name, "arguments": arguments})
    await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
    return result


async def opens_of(server: FixtureControl, channel_id: str, epoch: int | None = None) -> list[dict[str, Any]]:
    return [entry for entry in await server.recorded("channels/open", epoch=epoch) if entry["params"]["channelId"] == channel_id]


async def closes_of(server: FixtureControl, channel_id: str, epoch: int) -> list[dict[str, Any]]:
    return [entry for entry in await server.recorded("channels/close", epoch=epoch) if entry["params"]["channelId"] == channel_id]


async def woken_by(client: RouterClient, server: FixtureControl, channel_id: str, text: str) -> None:
    """A mention sent in ``channel_id`` goes out (the server has it open) and wakes the agent."""
    answer = await server.incoming([{"channelId": channel_id, "text": text, "tags": ["chat:mention"]}])
    assert not answer.get("notSent"), f"the server has {channel_id} closed: {answer}"
    wake = await client.next_wake()
    assert wake.channel is not None and wake.channel.channel_id == channel_id and wake.message_text == text
    await client.ack([wake.seq])


async def test_a_channel_opened_by_an_agent_is_open_again_after_its_server_restarts(tmp_path: Path) -> None:
    control_file = tmp_path / "s.control.json"
    entry = stdio_server(control_file, "strict", ("general", "c2"), host_owns_subscriptions=True)
    with trio.fail_after(60):
        async with running_daemon(tmp_path, {"s": entry}, unix_socket=True) as daemon, host(daemon) as client:
            await wait_ready(daemon, "s")
            await wait_channel(daemon, "s", "c2")
            opened = await in_turn(client, "channel_open", {"channelId": "c2", "setSpeechTarget": False})
            assert opened["isError"] is False, opened
            async with control_of(control_file) as first:
                first_pid = first.pid
                await woken_by(client, first, "c2", "before")
            os.kill(first_pid, signal.SIGKILL)
            await wait_ready(daemon, "s", epoch=2)
            async with FixtureControl.connect(control_file, timeout=15, stale_pid=first_pid) as second:
                # Registered closed again by the new process; the daemon opens it again, once,
                # without asking for history again.
                await wait_until(lambda: opens_of(second, "c2"), timeout=15)
                [reopen] = await opens_of(second, "c2")
                assert "history" not in reopen["params"]
                # The daemon marks it open once the server's answer is read.
                await wait_until(lambda: daemon.router.registry.get(ChannelRef("s", "c2")).open, timeout=15)
                await woken_by(client, second, "c2", "after")
                # general was never opened by anyone: it stays as the server registered it.
                assert await opens_of(second, "general") == []
            decisions = daemon.status()["channelDecisions"]
            assert decisions["reconciled"] == {"open-done": 1} and decisions["diverging"] == []
            shown = await trio.run_process(
                [sys.executable, "-m", "mcpl_router", "status", "--socket", str(daemon.host_socket_path)],
                capture_stdout=True, check=False,
            )
            assert "channel decisions: 1 reopened" in shown.stdout.decode(), shown.stdout
            scraped = daemon.metrics.render().decode()
            assert 'mcpl_router_channel_reconciles_total{action="open",outcome="done",server="s"} 1.0' in scraped


async def test_a_channel_opened_by_an_agent_is_open_again_after_the_daemon_restarts(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with FixtureProcess.start(
            transport="tcp", personality="strict", channels=["general", "c2"], control_dir=tmp_path, host_owns_subscriptions=True
        ) as server:
            config = daemon_config(tmp_path, {"s": dialled_server(server)}, unix_socket=True)
            async with daemon_running(config) as daemon, host(daemon) as client:
                await wait_ready(daemon, "s")
                await wait_channel(daemon, "s", "c2")
                assert (await in_turn(client, "channel_open", {"channelId": "c2", "setSpeechTarget": False}))["isError"] is False
                await woken_by(client, server, "c2", "before")
            # A second daemon on the same journal: the server's new host connection starts
            # with nothing open; the journaled decision opens c2 again.
            async with daemon_running(config) as daemon, host(daemon) as client:
                await wait_ready(daemon, "s")
                epoch = (await server.state())["epoch"]
                await wait_until(lambda: opens_of(server, "c2", epoch), timeout=15)
                await woken_by(client, server, "c2", "after the daemon restarted")


async def test_a_connector_send_that_opened_a_channel_opened_it_and_keeps_it_open(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with FixtureProcess.start(
            transport="tcp", personality="strict", channels=["general", "c1"], control_dir=tmp_path, host_owns_subscriptions=True
        ) as server:
            async with running_daemon(tmp_path, {"s": dialled_server(server)}, unix_socket=True) as daemon, host(daemon) as client:
                await wait_ready(daemon, "s")
                await wait_channel(daemon, "s", "c1")
                await wait_until(lambda: daemon.connector_tools.tools_of("s"), timeout=10)
                sent = await in_turn(client, "mcpl--s--send_message", {"channelId": "c1", "text": "hello"})
                assert sent["isError"] is False, sent
                # What the notice says is what happened on the wire.
                assert sent["content"][-1]["text"].startswith("[channels] c1 was closed; your send opened it")
                assert len(await opens_of(server, "c1")) == 1
                await woken_by(client, server, "c1", "a reply in c1")
                # The server hangs up and comes back (a restart, to its host): c1 is opened again.
                epoch = (await server.call("disconnect"))["epoch"]
                await wait_ready(daemon, "s", epoch=2)
                await wait_until(lambda: opens_of(server, "c1", epoch + 1), timeout=15)
                await woken_by(client, server, "c1", "after the server came back")


@pytest.mark.parametrize("first", ["a", "b"])
async def test_only_the_opened_servers_channel_is_reopened_where_two_servers_share_its_id(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with AsyncExitStack() as stack:
            servers: dict[str, FixtureProcess] = {}
            for name in ("a", "b"):
                servers[name] = await stack.enter_async_context(
                    FixtureProcess.start(transport="tcp", personality="strict", control_dir=tmp_path, server_name=name,
                                         host_owns_subscriptions=True)
                )
            config = {name: dialled_server(fixture) for name, fixture in servers.items()}
            daemon = await stack.enter_async_context(running_daemon(tmp_path, config, unix_socket=True))
            second = "b" if first == "a" else "a"
            for name in (first, second):
                await wait_ready(daemon, name)
                await servers[name].register(["general"])  # closed, as a restarted server registers it
                await wait_channel(daemon, name, "general")
            client = await stack.enter_async_context(host(daemon))
            assert (await in_turn(client, "channel_open", {"channelId": "b:general", "setSpeechTarget": False}))["isError"] is False
            # b restarts (to its host): its channels are registered again, closed.
            epoch = (await servers["b"].call("disconnect"))["epoch"]
            await wait_ready(daemon, "b", epoch=2)
            await servers["b"].register(["general"])
            await wait_until(lambda: opens_of(servers["b"], "general", epoch + 1), timeout=15)
            await woken_by(client, servers["b"], "general", "on b")
            # a's general, same id, was never opened: nothing was sent to a, nothing reaches ann.
            assert await opens_of(servers["a"], "general") == []
            unsent = await servers["a"].incoming([{"channelId": "general", "text": "on a", "tags": ["chat:mention"]}])
            assert unsent.get("notSent")


async def test_a_server_that_refuses_the_reopen_tells_the_agent_once(tmp_path: Path) -> None:
    control_file = tmp_path / "s.control.json"
    with trio.fail_after(60):
        async with FixtureProcess.start(
            transport="tcp", personality="strict", channels=["general", "c2"], control_dir=tmp_path, host_owns_subscriptions=True
        ) as server:
            async with running_daemon(tmp_path, {"s": dialled_server(server)}, unix_socket=True) as daemon, host(daemon) as client:
                await wait_ready(daemon, "s")
                await wait_channel(daemon, "s", "c2")
                assert (await in_turn(client, "channel_open", {"channelId": "c2", "setSpeechTarget": False}))["isError"] is False
                # From now on the server answers channels/open with an error.
                await server.configure(open={"error": {"code": -32000, "message": "no such channel here"}})
                for round_ in (1, 2):
                    epoch = (await server.call("disconnect"))["epoch"]
                    await wait_ready(daemon, "s", epoch=epoch + 1)
                    await wait_until(lambda: daemon.status()["channelDecisions"]["reconciled"].get("open-failed") == round_, timeout=15)
                told = await client.call("turn/open", {"agent": AGENT})
                assert [n for n in told["notices"] if "c2" in n and "opening it again failed" in n] != []
                await client.call("turn/close", {"turnId": told["turnId"], "outcome": "completed"})
                again = await client.call("turn/open", {"agent": AGENT})
                assert not [n for n in again["notices"] if "opening it again failed" in n]
                await client.call("turn/close", {"turnId": again["turnId"], "outcome": "completed"})
                [diverging] = daemon.status()["channelDecisions"]["diverging"]
                assert diverging["channelId"] == "c2" and diverging["desired"] == "open" and diverging["registered"] == "closed"
                # What an operator sees: the refusals, and the channel that differs, with why.
                shown = await trio.run_process(
                    [sys.executable, "-m", "mcpl_router", "status", "--socket", str(daemon.host_socket_path)],
                    capture_stdout=True, check=False,
                )
                text = shown.stdout.decode()
                assert "channel decisions: 2 reopen refused" in text, text
                assert "! s:c2 desired open, registered closed; last open refused: server-refused" in text, text


async def test_a_channel_registered_before_the_link_is_ready_is_opened_again_once_it_is(tmp_path: Path) -> None:
    # discord-mcpl registers its channels as soon as it is initialized when the policy is slow
    # (its grace), before the daemon's featureSets/update is answered: the link is not ready
    # yet when the registration arrives, and the reopen must wait for it, not be skipped.
    with trio.fail_after(60):
        async with FixtureProcess.start(
            transport="tcp", personality="discord", channels=["general", "c2"], control_dir=tmp_path,
            host_owns_subscriptions=True, grace=0,
        ) as server:
            async with running_daemon(tmp_path, {"s": dialled_server(server)}, unix_socket=True) as daemon, host(daemon) as client:
                await wait_ready(daemon, "s")
                await wait_channel(daemon, "s", "c2")
                assert (await in_turn(client, "channel_open", {"channelId": "c2", "setSpeechTarget": False}))["isError"] is False
                await woken_by(client, server, "c2", "before")
                # From now on the server holds its policy answer a moment: each registration
                # (sent before it) arrives while the link is still shaking hands.
                await server.configure(policy_delay_ms=300)
                epoch = (await server.call("disconnect"))["epoch"]
                await wait_ready(daemon, "s", epoch=2)
                await wait_until(lambda: opens_of(server, "c2", epoch + 1), timeout=15)
                await woken_by(client, server, "c2", "after the server came back")


async def test_a_refused_reopen_is_not_asked_again_at_each_registration_of_the_same_connection(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with FixtureProcess.start(
            transport="tcp", personality="strict", channels=["general", "c2"], control_dir=tmp_path, host_owns_subscriptions=True
        ) as server:
            async with running_daemon(tmp_path, {"s": dialled_server(server)}, unix_socket=True) as daemon, host(daemon) as client:
                await wait_ready(daemon, "s")
                await wait_channel(daemon, "s", "c2")
                assert (await in_turn(client, "channel_open", {"channelId": "c2", "setSpeechTarget": False}))["isError"] is False
                await server.configure(open={"error": {"code": -32000, "message": "no such channel here"}})
                epoch = (await server.call("disconnect"))["epoch"] + 1
                await wait_ready(daemon, "s", epoch=2)
                await wait_until(lambda: daemon.status()["channelDecisions"]["reconciled"].get("open-failed") == 1, timeout=15)
                # A registration storm on the same connection: c2 withdrawn and registered again,
                # five times. The server refused on this connection: it is not asked again.
                for _ in range(5):
                    await server.withdraw(["c2"])
                    await server.register(["c2"])
                    await wait_channel(daemon, "s", "c2")
                # Every registration was checked (the last one too); a reopen asked of the server
                # would have reached it within the wait.
                await wait_until(lambda: daemon.status()["channelDecisions"]["pending"] == 0, timeout=10)
                await trio.sleep(0.5)
                assert len(await opens_of(server, "c2", epoch)) == 1
                assert daemon.status()["channelDecisions"]["reconciled"] == {"open-failed": 1}
                # The agent deciding again is a new question: asked once more.
                await server.configure(open={})
                assert (await in_turn(client, "channel_open", {"channelId": "c2", "setSpeechTarget": False}))["isError"] is False
                await woken_by(client, server, "c2", "after the agent opened it again")


async def test_a_channel_an_agent_closed_is_closed_again_when_its_server_registers_it_open(tmp_path: Path) -> None:
    opened_c2 = {**channel_descriptor("c2"), "initiallyOpen": True}
    with trio.fail_after(60):
        async with FixtureProcess.start(transport="tcp", personality="strict", channels=["general"], control_dir=tmp_path) as server:
            async with running_daemon(tmp_path, {"s": dialled_server(server)}, unix_socket=True) as daemon, host(daemon) as client:
                await wait_ready(daemon, "s")
                await server.register([opened_c2])
                await wait_channel(daemon, "s", "c2")
                assert daemon.router.registry.get(ChannelRef("s", "c2")).open
                assert (await in_turn(client, "channel_close", {"channelId": "c2"}))["isError"] is False
                epoch = (await server.call("disconnect"))["epoch"] + 1
                await wait_ready(daemon, "s", epoch=2)
                await server.register([opened_c2])  # open again, as the restarted server has it
                await wait_until(lambda: closes_of(server, "c2", epoch), timeout=15)
                # The server has the close; the daemon marks it closed once the answer is read.
                await wait_until(lambda: daemon.status()["channelDecisions"]["reconciled"] == {"close-done": 1}, timeout=15)
                assert len(await closes_of(server, "c2", epoch)) == 1
                assert not daemon.router.registry.get(ChannelRef("s", "c2")).open


@pytest.mark.parametrize("first", ["a", "b"])
async def test_after_the_daemon_restarts_only_the_opened_servers_channel_is_reopened_where_two_share_its_id(
    tmp_path: Path, first: str
) -> None:
    second = "b" if first == "a" else "a"
    with trio.fail_after(60):
        async with AsyncExitStack() as stack:
            servers: dict[str, FixtureProcess] = {}
            for name in ("a", "b"):
                servers[name] = await stack.enter_async_context(
                    FixtureProcess.start(transport="tcp", personality="strict", control_dir=tmp_path, server_name=name,
                                         host_owns_subscriptions=True)
                )
            config = daemon_config(tmp_path, {name: dialled_server(fixture) for name, fixture in servers.items()}, unix_socket=True)
            async with daemon_running(config) as daemon, host(daemon) as client:
                for name in ("a", "b"):
                    await wait_ready(daemon, name)
                    await servers[name].register(["general"])
                    await wait_channel(daemon, name, "general")
                assert (await in_turn(client, "channel_open", {"channelId": "b:general", "setSpeechTarget": False}))["isError"] is False
            # A new daemon on the same journal; the servers register general again, closed, in
            # the order this run picks.
            async with daemon_running(config) as daemon, host(daemon) as client:
                epochs = {}
                for name in (first, second):
                    await wait_ready(daemon, name)
                    epochs[name] = (await servers[name].state())["epoch"]
                    await servers[name].register(["general"])
                    await wait_channel(daemon, name, "general")
                await wait_until(lambda: opens_of(servers["b"], "general", epochs["b"]), timeout=15)
                await woken_by(client, servers["b"], "general", "on b")
                await wait_until(lambda: daemon.status()["channelDecisions"]["pending"] == 0, timeout=10)
                assert await opens_of(servers["a"], "general") == []
                assert (await servers["a"].incoming([{"channelId": "general", "text": "on a", "tags": ["chat:mention"]}])).get("notSent")
                assert daemon.status()["channelDecisions"]["reconciled"] == {"open-done": 1}


async def test_a_reload_that_grants_the_lifecycle_holds_the_server_to_the_decision_at_once(tmp_path: Path) -> None:
    # Without channels.lifecycle the reconcile is skipped (the server decides alone); a reload
    # granting it must not wait for the server's next connection to reopen what ann opened.
    opened_c2 = {**channel_descriptor("c2"), "initiallyOpen": True}
    with trio.fail_after(60):
        async with FixtureProcess.start(transport="tcp", personality="strict", channels=["general"], control_dir=tmp_path,
                                        host_owns_subscriptions=True) as server:
            narrow = {"s": dialled_server(server, disabledCapabilities=["channels.lifecycle"])}
            async with daemon_running(daemon_config(tmp_path, narrow, unix_socket=True)) as daemon, host(daemon) as client:
                await wait_ready(daemon, "s")
                await server.register([opened_c2])
                await wait_channel(daemon, "s", "c2")
                # Open already, and not granted the lifecycle: ann's decision is kept, nothing asked.
                assert (await in_turn(client, "channel_open", {"channelId": "c2", "setSpeechTarget": False}))["isError"] is False
                epoch = (await server.call("disconnect"))["epoch"] + 1
                await wait_ready(daemon, "s", epoch=2)
                await server.register(["c2"])  # the new connection has it closed
                await wait_until(lambda: daemon.router.registry.get(ChannelRef("s", "c2")) is not None, timeout=15)
                assert await opens_of(server, "c2", epoch) == []  # not granted: skipped
                result = await daemon.reload(daemon_config(tmp_path, {"s": dialled_server(server)}, unix_socket=True))
                assert result["outcome"] == "applied" and result["regranted"] == ["s"]
                await wait_until(lambda: opens_of(server, "c2", epoch), timeout=15)
                await wait_until(lambda: daemon.router.registry.get(ChannelRef("s", "c2")).open, timeout=15)
                await woken_by(client, server, "c2", "after the reload granted the lifecycle")
