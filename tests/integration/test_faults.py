"""Fault injection: the daemon keeps its promises when processes die, flap, stall or hang.

Real processes throughout, every test bounded by ``fail_after``:
- the daemon ``kill -9``ed at random points of a stream of inbound messages, and restarted;
- a stdio server killed every second while traffic flows (no leaked task, fd or child);
- a host dropping mid-turn and mid-stream;
- a host that stops reading (bounded memory, then the documented disconnect, wakes kept);
- servers that never answer ``initialize``, ``featureSets/update``,
  ``context/beforeInference`` or ``channels/publish`` (deadlines fire; the others go on).
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.jsonrpc import PeerClosed
from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import (
    FAST_RECONNECT,
    daemon_process,
    dialled_server,
    running_daemon,
    servers_and_daemon,
    stdio_server,
    wait_channel,
    wait_daemon_ready,
    wait_ready,
    write_config,
)

pytestmark = pytest.mark.integration


def message(n: int) -> dict[str, Any]:
    return {"channelId": "general", "messageId": f"m-{n}", "text": f"n{n}", "tags": ["chat:mention"]}


@pytest.mark.parametrize("seed", [1, 2])
async def test_kill9_at_random_points_every_accepted_message_wakes_and_none_after_its_ack(short_tmp: Path, seed: int) -> None:
    rng = random.Random(seed)
    total = 120
    kills = sorted(rng.sample(range(10, total - 10), 3))
    accepted: set[str] = set()
    acked_at: dict[str, int] = {}  # messageId → the run in which its ack was answered
    woken: list[tuple[int, str]] = []  # (run, messageId)
    with trio.fail_after(150):
        async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp) as server:
            assert server.listen_url is not None
            config = write_config(short_tmp, server.listen_url)
            socket = str(short_tmp / "run" / "host.sock")
            async with daemon_process(config, short_tmp / "daemon.log") as daemon:
                run = 0
                sent = 0
                while sent < total or len(accepted) < total:
                    run += 1
                    await daemon.start()
                    await wait_daemon_ready(socket)
                    async with RouterClient.connect_unix(socket) as host:
                        await host.hello("host", ["kai"])
                        async with trio.open_nursery() as nursery:

                            async def read(this_run: int = run) -> None:
                                try:
                                    while True:
                                        wake = await host.next_wake()
                                        message_id = wake.messages[0]["messageId"]
                                        woken.append((this_run, message_id))
                                        await host.ack([wake.seq])
                                        acked_at.setdefault(message_id, this_run)
                                except (trio.EndOfChannel, PeerClosed, trio.BrokenResourceError):
                                    return

                            nursery.start_soon(read)
                            stop_at = next((k for k in kills if k > sent), None)
                            # A real server re-sends what it never heard "accepted" for.
                            pending = [n for n in range(total) if f"m-{n}" not in accepted]
                            for n in pending:
                                if stop_at is not None and sent >= stop_at:
                                    break
                                try:
                                    answer = await server.incoming([message(n)])
                                except Exception:
                                    break  # the daemon died under it: re-sent in the next run
                                if answer["results"][0]["accepted"]:
                                    accepted.add(f"m-{n}")
                                sent = max(sent, n + 1)
                            if stop_at is not None and sent >= stop_at:
                                await trio.sleep(rng.random() * 0.05)  # a random point
                                daemon.kill9()
                                await daemon.wait()
                                kills.remove(stop_at)
                            else:
                                # Last run: let every wake arrive, then stop cleanly.
                                await wait_until(lambda: accepted <= {m for _, m in woken}, timeout=30)
                            nursery.cancel_scope.cancel()
                    if not kills and accepted >= {f"m-{n}" for n in range(total)} and accepted <= {m for _, m in woken}:
                        break
    assert accepted == {f"m-{n}" for n in range(total)}
    assert accepted <= {message_id for _, message_id in woken}  # every accepted message woke the host
    for message_id, first_acked in acked_at.items():
        # Once its ack was answered, never woken again in a later run (a wake not acked before
        # the kill comes back, which is at-least-once).
        later = [r for r, m in woken if m == message_id and r > first_acked]
        assert not later, (message_id, first_acked, later)
    assert acked_at, "the host acked nothing: the test checked nothing"


def _children() -> set[int]:
    mine = os.getpid()
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == mine:
            found.add(int(entry))
    return found


def _tasks() -> int:
    def count(task: Any) -> int:
        return 1 + sum(count(child) for nursery in task.child_nurseries for child in nursery.child_tasks)

    return count(trio.lowlevel.current_root_task())


async def test_a_stdio_server_killed_every_second_leaks_no_task_fd_or_child(short_tmp: Path) -> None:
    control_file = short_tmp / "flappy.json"
    with trio.fail_after(90):
        async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp, server_name="steady") as steady:
            servers = {"flappy": stdio_server(control_file, channels=("general",)), "steady": dialled_server(steady)}
            async with running_daemon(short_tmp, servers, unix_socket=True) as daemon:
                await wait_ready(daemon, "flappy")
                await wait_ready(daemon, "steady")
                await wait_channel(daemon, "steady", "general")
                assert daemon.host_socket_path is not None
                async with RouterClient.connect_unix(daemon.host_socket_path) as host:
                    await host.hello("host", ["kai"])
                    received = 0
                    baseline: tuple[int, int, int] | None = None
                    for round_ in range(7):
                        if round_ == 1:
                            # After one full cycle (a kill, a respawn that registered again, a
                            # wake): every part that lives as long as its connection (a lane, an
                            # outbox) exists now.
                            await wait_channel(daemon, "flappy", "general")
                            baseline = (_tasks(), len(os.listdir("/proc/self/fd")), len(_children()))
                        epoch = daemon.links["flappy"].epoch
                        pid = json.loads(control_file.read_text())["pid"]
                        os.kill(pid, 9)
                        # Traffic on the steady server flows while the other flaps.
                        await steady.incoming([message(round_)])
                        wake = await host.next_wake()
                        await host.ack([wake.seq])
                        received += 1
                        await wait_ready(daemon, "flappy", epoch=epoch + 1, timeout=20)
                        await trio.sleep(1.0 - 0.1 * (round_ % 2))
                    await wait_channel(daemon, "flappy", "general")
                    assert received == 7 and daemon.links["flappy"].epoch >= 8

                    def settled() -> bool:
                        # A respawn's own short tasks (its tool listing, …) end on their own;
                        # a leaked task, fd or child never would.
                        return (_tasks(), len(os.listdir("/proc/self/fd")), len(_children())) == baseline

                    try:
                        await wait_until(settled, timeout=15)
                    except trio.TooSlowError:
                        after = (_tasks(), len(os.listdir("/proc/self/fd")), len(_children()))
                        raise AssertionError(f"tasks, fds, children: before {baseline}, after {after}") from None


async def test_a_host_dropping_mid_stream_ends_the_turn_typing_lifecycle_and_stream(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["b"]) as (daemon, servers):
            server = servers["b"]
            daemon.turns.typing_interval = 0.2
            await server.register([{"id": "general", "label": "general", "initiallyOpen": True}])
            await wait_channel(daemon, "b", "general")
            assert daemon.host_socket_path is not None
            async with RouterClient.connect_unix(daemon.host_socket_path) as host:
                await host.hello("host", ["ann"])
                await server.incoming([{"channelId": "general", "text": "hi ann", "tags": ["chat:mention"]}])
                wake = await host.next_wake()
                opened = await host.call("turn/open", {"agent": "ann", "wakes": [wake.seq]})
                turn_id = opened["turnId"]
                await host.call("turn/context", {"turnId": turn_id})
                await host.call("turn/text", {"turnId": turn_id, "round": 1, "delta": "streamed words"})
                await host.call("turn/round", {"turnId": turn_id, "round": 1})
                await host.call("turn/text", {"turnId": turn_id, "round": 2, "delta": "more words, never finished"})
                # The host process is gone mid-round: no turn/close ever comes.

            async def ended() -> list[dict[str, Any]]:
                entries = await server.recorded()
                phases = [e["params"].get("phase") for e in entries if e["method"] == "inference/lifecycle"]
                complete = [e for e in entries if e["method"] == "channels/outgoing/complete"]
                return entries if phases and phases[-1] in ("aborted", "failed") and complete else []

            entries = await wait_until(ended, timeout=15)
            assert daemon.turns.table.all() == []
            typing = [e["params"].get("op") for e in entries if e["method"] == "channels/typing"]
            assert typing and typing[-1] == "stop"
            [complete] = [e for e in entries if e["method"] == "channels/outgoing/complete"]
            assert complete["params"]["content"] == "streamed words"  # only the words that were delivered


async def test_a_stalled_host_is_disconnected_after_the_stall_timeout_and_its_wakes_are_kept(short_tmp: Path) -> None:
    with trio.fail_after(90):
        async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp) as server:
            servers = {"s": dialled_server(server)}
            async with running_daemon(short_tmp, servers, unix_socket=True, host={"stallTimeout": 1}) as daemon:
                await wait_channel(daemon, "s", "general")
                assert daemon.host_socket_path is not None
                # A host that says hello and then never reads again.
                stream = await trio.open_unix_socket(daemon.host_socket_path)
                hello = {"jsonrpc": "2.0", "id": 1, "method": "session/hello", "params": {"host": "h", "agents": [{"name": "kai"}]}}
                await stream.send_all(json.dumps(hello).encode() + b"\n")
                big = "x" * 4000
                result = await server.flood(3000, outstanding=64, per_request=1, prefix="stall", text=big)
                assert result["accepted"] == 3000
                await wait_until(lambda: daemon.sessions.host_statistics()["stalledDisconnects"] == 1, timeout=20)
                hosts = daemon.sessions.host_statistics()
                assert hosts["outboxHighWaterBytes"] <= 8 * 1024 * 1024 + 256 * 1024
                # Nothing is lost: every wake is still owed, and a host that reads gets them.
                assert daemon.journal.unacked_count("kai") == 3000
                await stream.aclose()
                async with RouterClient.connect_unix(daemon.host_socket_path) as host:
                    await host.hello("h", ["kai"])
                    first = await host.next_wake()
                    assert first.messages[0]["messageId"].startswith("stall-")


@pytest.mark.parametrize("method", ["initialize", "featureSets/update", "context/beforeInference", "channels/publish"])
async def test_a_server_that_never_answers_hits_a_deadline_and_the_others_go_on(tmp_path: Path, method: str) -> None:
    with trio.fail_after(90):
        async with (
            FixtureProcess.start(transport="tcp", channels=["general"], control_dir=tmp_path, server_name="hung", never_answer=[method]) as hung,
            FixtureProcess.start(transport="tcp", channels=["general"], control_dir=tmp_path, server_name="fine") as fine,
        ):
            servers = {
                "hung": {"url": hung.listen_url, "reconnect": FAST_RECONNECT, "requestTimeout": 1},
                "fine": {"url": fine.listen_url, "reconnect": FAST_RECONNECT},
            }
            async with running_daemon(tmp_path, servers, unix_socket=True) as daemon:
                await wait_ready(daemon, "fine")
                await wait_channel(daemon, "fine", "general")
                link = daemon.links["hung"]
                if method in ("initialize", "featureSets/update"):
                    # The handshake's deadline fires, the link retries; it is never ready.
                    await wait_until(lambda: link.attempts >= 2, timeout=20)
                    assert link.state.value != "ready" and "no answer" in (link.last_error or "")
                else:
                    await wait_ready(daemon, "hung")
                    await wait_channel(daemon, "hung", "general")
                assert daemon.host_socket_path is not None
                async with RouterClient.connect_unix(daemon.host_socket_path) as host:
                    await host.hello("host", ["kai"])
                    await fine.incoming([message(1)])
                    wake = await host.next_wake()
                    assert wake.channel is not None and wake.channel.server_id == "fine"
                    opened = await host.call("turn/open", {"agent": "kai", "wakes": [wake.seq]})
                    context = await host.call("turn/context", {"turnId": opened["turnId"]})
                    assert isinstance(context, dict)  # answered within the hook's deadline, hung or not
                    await host.notify("turn/text", {"turnId": opened["turnId"], "round": 1, "delta": "to fine"})
                    await host.call("turn/round", {"turnId": opened["turnId"], "round": 1})
                    closed = await host.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
                    assert closed["deliveries"] and closed["deliveries"][0]["outcome"] == "delivered"
                    if method == "channels/publish":
                        # A publish to the hung server: its deadline (requestTimeout, 1 s) fires;
                        # the outcome is unknown, said so, and the call returns.
                        answer = await host.call(
                            "channels/publish", {"agent": "kai", "channel": "hung:general", "content": "hello?"}
                        )
                        assert answer["delivered"] is False and answer["reason"] == "unconfirmed"
                published = await fine.recorded("channels/publish")
                assert [e["params"]["content"][0]["text"] for e in published] == ["to fine"]
