"""The host client given several nodes' addresses (issue 29 item 4): it connects to the first
that accepts, and when its node dies it moves to the next by itself, says hello again and goes
on yielding wakes: none accepted is lost, none acked (answered) is woken again.

The daemons run as real processes (``python -m mcpl_router run``) so one can be killed with
SIGKILL; two of them take turns on one SQLite journal file, as two nodes of a cluster do on one
PostgreSQL journal (one serves hosts at a time; the other doesn't listen). The MCPL server is
the fixture over TCP, flooding at a fixed rate.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from mcpl_router.client import ConnectionLost, FailoverClient, NoNodeReachable, WakeNotice
from mcpl_router.testing.control import FixtureProcess, wait_until
from mcpl_router.testing.descriptors import channel_descriptor
from mcpl_router.testing.journal import JournalPlace

from .conftest import DaemonProcess, daemon_process, servers_and_daemon, wait_channel, wait_daemon_ready, write_config

pytestmark = pytest.mark.integration

FLOOD = 3000
#: Messages a second: the flood lasts 3 s, so the kill lands in the middle of it.
RATE = 1000
#: The host's work on one wake: it falls behind the flood, so at the kill some accepted
#: messages are not woken yet, some woken ones are not acked, some acks are on their way.
WORK = 0.004


def _message_id(wake: WakeNotice) -> str:
    return str(wake.messages[0]["messageId"])


@contextlib.asynccontextmanager
async def two_nodes_on_one_journal(short_tmp: Path) -> AsyncIterator[tuple[FixtureProcess, DaemonProcess, DaemonProcess, Path, Path]]:
    """The fixture server, and two daemons on one SQLite journal file (sockets ``a.sock`` and
    ``b.sock``): the first started and ready, the second made and not started (it may run only
    once the first is gone)."""
    journal = JournalPlace(path=short_tmp / "journal.sqlite3")
    socket_a, socket_b = short_tmp / "a.sock", short_tmp / "b.sock"
    async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp, grace=1) as server:
        assert server.listen_url is not None
        config_a = write_config(short_tmp / "n1", server.listen_url, host={"unixSocket": str(socket_a)}, journal=journal)
        config_b = write_config(short_tmp / "n2", server.listen_url, host={"unixSocket": str(socket_b)}, journal=journal)
        async with daemon_process(config_a, short_tmp / "n1.log") as first, daemon_process(config_b, short_tmp / "n2.log") as second:
            await first.start()
            await wait_daemon_ready(str(socket_a))
            yield server, first, second, socket_a, socket_b


@pytest.mark.parametrize("stop", ["kill -9", "SIGTERM"])
async def test_a_host_given_two_nodes_follows_the_first_nodes_end_to_the_second_losing_nothing_and_rewaking_nothing_acked(
    short_tmp: Path, stop: str
) -> None:
    """kill -9: the connection just breaks. SIGTERM: the node drains (``daemon/shutdown``,
    then the connection closes). Either way the client finds the second node by itself."""
    with trio.fail_after(150):
        async with two_nodes_on_one_journal(short_tmp) as (server, first, second, socket_a, socket_b):
            woken: list[WakeNotice] = []
            answered_before_kill: set[int] = set()
            killed = trio.Event()
            async with FailoverClient.connect([socket_a, socket_b], backoff=(0.05, 0.5)) as client:
                await client.hello("host", ["kai"])

                async def ack(seq: int) -> None:
                    await client.ack([seq])
                    if not killed.is_set():
                        answered_before_kill.add(seq)

                async def host() -> None:
                    # Acks from tasks of its own, as it goes: they share wake/acks.
                    async with trio.open_nursery() as acks, contextlib.aclosing(client.wakes()) as wakes:
                        async for wake in wakes:
                            woken.append(wake)
                            await trio.sleep(WORK)
                            acks.start_soon(ack, wake.seq)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(host)
                    flooding = trio.Event()
                    flooded: dict[str, object] = {}

                    async def flood() -> None:
                        flooded.update(await server.flood(FLOOD, outstanding=16, rate=RATE, prefix="f", ids=True))
                        flooding.set()

                    nursery.start_soon(flood)
                    await wait_until(lambda: len(answered_before_kill) >= 100, timeout=30)
                    killed.set()
                    woken_at_kill = len(woken)
                    if stop == "kill -9":
                        first.kill9()
                        assert await first.wait() == -signal.SIGKILL
                    else:
                        assert first.process is not None
                        first.process.send_signal(signal.SIGTERM)
                        assert await first.wait() == 0
                    await flooding.wait()
                    accepted = set(flooded["acceptedIds"])  # type: ignore[arg-type]
                    assert flooded["failed"], f"the kill was not mid-flood: {flooded}"
                    assert len(accepted) > woken_at_kill

                    # The second node comes up on its own address; the client finds it itself.
                    await second.start()
                    await wait_until(lambda: accepted <= {_message_id(wake) for wake in woken}, timeout=60)
                    # The flood goes on through the second node, to the same host.
                    more = await server.flood(50, outstanding=8, prefix="g", ids=True)
                    assert more["accepted"] == 50
                    await wait_until(lambda: set(more["acceptedIds"]) <= {_message_id(wake) for wake in woken}, timeout=30)
                    nursery.cancel_scope.cancel()

                again = [wake.seq for wake in woken[woken_at_kill:] if wake.seq in answered_before_kill]
                assert again == [], f"{len(again)} wakes woken again after their ack was answered"
                statistics = client.statistics()
                assert (statistics.address, statistics.failovers) == (str(socket_b), 1)
                assert not (accepted - {_message_id(wake) for wake in woken})


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_refused_addresses_are_passed_over_for_the_first_that_accepts(short_tmp: Path) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(short_tmp, ["s"]) as (daemon, servers):
            assert daemon.host_socket_path is not None
            refused_ws = f"ws://127.0.0.1:{_closed_port()}/"
            nobody = short_tmp / "nobody.sock"  # ENOENT, as a standby's socket path
            async with FailoverClient.connect([refused_ws, nobody, daemon.host_socket_path]) as client:
                statistics = client.statistics()
                assert (statistics.address, statistics.attempts_failed, statistics.connects) == (str(daemon.host_socket_path), 2, 1)
                await client.hello("host", ["kai"])
                await servers["s"].register([{**channel_descriptor("general"), "initiallyOpen": True}])
                await wait_channel(daemon, "s", "general")
                await servers["s"].incoming([{"channelId": "general", "messageId": "m-1", "text": "hi", "tags": ["chat:mention"]}])
                wake = await client.next_wake()
                assert _message_id(wake) == "m-1"
                assert await client.ack([wake.seq]) == 1


async def test_no_address_accepting_is_a_clear_error_naming_each(short_tmp: Path) -> None:
    with trio.fail_after(20):
        refused_ws = f"ws://127.0.0.1:{_closed_port()}/"
        nobody = short_tmp / "nobody.sock"
        with pytest.raises(NoNodeReachable) as raised:
            async with FailoverClient.connect([nobody, refused_ws], backoff=(0.05, 0.1), give_up_after=0.5):
                pass
        assert set(raised.value.errors) == {str(nobody), refused_ws}
        assert "no node accepted a connection" in str(raised.value)


async def test_a_turn_open_on_a_lost_connection_fails_with_connection_lost_and_the_wake_comes_again(short_tmp: Path) -> None:
    with trio.fail_after(90):
        async with two_nodes_on_one_journal(short_tmp) as (server, first, second, socket_a, socket_b):
            async with FailoverClient.connect([socket_a, socket_b], backoff=(0.05, 0.5)) as client:
                await client.hello("host", ["kai"])
                await server.incoming([{"channelId": "general", "messageId": "m-1", "text": "hi", "tags": ["chat:mention"]}])
                wake = await client.next_wake()
                with pytest.raises(ConnectionLost) as raised:
                    async with client.turn(wake.agent, wakes=[wake.seq]) as turn:
                        first.kill9()
                        await first.wait()
                        await wait_until(lambda: client.address is None, timeout=10)
                        await turn.text("lost")
                        await turn.end_round()
                assert raised.value.address == str(socket_a)
                await second.start()
                again = await client.next_wake()
                assert (again.seq, _message_id(again)) == (wake.seq, "m-1")
                async with client.turn(again.agent, wakes=[again.seq]) as turn:
                    await turn.text("On it.")
                assert turn.receipt is not None
                assert await client.ack([again.seq]) == 1


async def test_acks_across_a_failover_an_unanswered_one_goes_to_the_next_node_and_no_acked_wake_is_yielded_again(short_tmp: Path) -> None:
    """m-1's ack is on its way when the node dies (stopped first, so it is never answered):
    the client sends it to the next node. m-2 was given and not acked: the next node sends it
    again, and the host acks it (answered) before reading that copy: the copy is not yielded."""
    with trio.fail_after(90):
        async with two_nodes_on_one_journal(short_tmp) as (server, first, second, socket_a, socket_b):
            async with FailoverClient.connect([socket_a, socket_b], backoff=(0.05, 0.5)) as client:
                await client.hello("host", ["kai"])
                for message_id in ("m-1", "m-2"):
                    await server.incoming([{"channelId": "general", "messageId": message_id, "text": "hi", "tags": ["chat:mention"]}])
                one, two = await client.next_wake(), await client.next_wake()
                assert (_message_id(one), _message_id(two)) == ("m-1", "m-2")
                assert first.process is not None
                # Stopped, the node reads no more: m-1's ack goes out and is never answered.
                os.kill(first.process.pid, signal.SIGSTOP)
                answers: list[int] = []

                def acks_sent() -> int:
                    connection = client.statistics().connection
                    return 0 if connection is None else connection.acks

                async with trio.open_nursery() as nursery:

                    async def ack_one() -> None:
                        answers.append(await client.ack([one.seq]))

                    nursery.start_soon(ack_one)
                    await wait_until(lambda: acks_sent() == 1, timeout=10)
                    first.kill9()
                    await first.wait()
                    await second.start()
                assert answers == [1]  # answered by the second node

                def held() -> int:
                    connection = client.statistics().connection
                    return 0 if connection is None else connection.notifications.wakes_buffered

                # The second node sends m-2 again (unacked); acked now, that copy is not yielded.
                await wait_until(lambda: held() >= 1, timeout=10)
                assert await client.ack([two.seq]) == 1
                await server.incoming([{"channelId": "general", "messageId": "m-3", "text": "next", "tags": ["chat:mention"]}])
                following = await client.next_wake()
                assert _message_id(following) == "m-3"
                statistics = client.statistics()
                assert (statistics.address, statistics.acks_resent) == (str(socket_b), 1)
                assert statistics.wakes_suppressed >= 1  # m-2's copy (m-1's too, had it come before its ack)


# -- the liveness probe: a node that stops answering without closing ---------------------------


async def test_a_busy_connection_is_never_probed_and_a_quiet_one_is_probed_and_kept(short_tmp: Path) -> None:
    """Wakes arriving every ~0.1 s for 3 s: no probe (nothing to add while traffic flows).
    Then quiet: a probe each ``probe_after``, each answered, and the connection stays."""
    with trio.fail_after(60):
        async with servers_and_daemon(short_tmp, ["s"]) as (daemon, servers):
            assert daemon.host_socket_path is not None
            await servers["s"].register([{**channel_descriptor("general"), "initiallyOpen": True}])
            await wait_channel(daemon, "s", "general")
            async with FailoverClient.connect([daemon.host_socket_path], probe_after=1.0, probe_timeout=2.0) as client:
                await client.hello("host", ["kai"])
                woken: list[str] = []

                async def host() -> None:
                    while True:
                        wake = await client.next_wake()
                        woken.append(_message_id(wake))
                        await client.ack([wake.seq])

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(host)
                    busy_until = trio.current_time() + 3.0
                    sent = 0
                    while trio.current_time() < busy_until:
                        await servers["s"].incoming(
                            [{"channelId": "general", "messageId": f"m-{sent}", "text": "hi", "tags": ["chat:mention"]}]
                        )
                        sent += 1
                        await trio.sleep(0.1)
                    await wait_until(lambda: len(woken) == sent, timeout=10)
                    busy = client.statistics()
                    await trio.sleep(3.5)  # quiet: a probe a second, after the first second
                    quiet = client.statistics()
                    nursery.cancel_scope.cancel()
    assert sent >= 10
    assert (busy.probes, busy.probes_unanswered) == (0, 0), busy
    assert quiet.probes >= 2 and quiet.probes_unanswered == 0, quiet
    assert (quiet.address, quiet.connects, quiet.failovers) == (str(daemon.host_socket_path), 1, 0)


async def test_an_address_that_accepts_and_never_answers_is_left_within_the_probe_bounds(short_tmp: Path) -> None:
    """A listening socket nobody accepts on: the kernel completes the connect, and the hello is
    never answered, as with a SIGSTOPped node. Probed and closed, the next address serves."""
    with trio.fail_after(60):
        async with servers_and_daemon(short_tmp, ["s"]) as (daemon, _servers):
            assert daemon.host_socket_path is not None
            silent_path = short_tmp / "silent.sock"
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
                silent.bind(str(silent_path))
                silent.listen(8)
                started = trio.current_time()
                async with FailoverClient.connect([silent_path, daemon.host_socket_path], probe_after=0.5, probe_timeout=0.5) as client:
                    await client.hello("host", ["kai"])
                    took = trio.current_time() - started
                    statistics = client.statistics()
    # The first connect knows no hello yet: "connected" to the silent one, the caller's hello
    # waited there until the probe closed it, then went to the next.
    assert (statistics.address, statistics.connects, statistics.failovers) == (str(daemon.host_socket_path), 2, 1)
    assert (statistics.probes, statistics.probes_unanswered) == (1, 1)  # one probe, then on: not the kernel's timeout
    print(f"\nthe silent node left {took:.2f} s after the connect (probe after 0.5 s, its answer awaited 0.5 s)")


async def test_a_host_that_does_not_read_its_wakes_is_not_taken_for_a_dead_node(short_tmp: Path) -> None:
    """The wake buffer full (2 held, the rest waiting in their lane): the connection reads on,
    so the probes' answers arrive and nothing is closed; no wake is lost meanwhile."""
    with trio.fail_after(60):
        async with servers_and_daemon(short_tmp, ["s"]) as (daemon, servers):
            assert daemon.host_socket_path is not None
            await servers["s"].register([{**channel_descriptor("general"), "initiallyOpen": True}])
            await wait_channel(daemon, "s", "general")
            async with FailoverClient.connect([daemon.host_socket_path], probe_after=0.3, probe_timeout=0.3, max_wakes=2) as client:
                await client.hello("host", ["kai"])
                for n in range(4):
                    await servers["s"].incoming([{"channelId": "general", "messageId": f"m-{n}", "text": "hi", "tags": ["chat:mention"]}])

                def held() -> int:
                    connection = client.statistics().connection
                    return 0 if connection is None else connection.notifications.wakes_buffered

                await wait_until(lambda: held() == 2, timeout=10)
                await trio.sleep(2.0)  # more than six probe periods, the host reading nothing
                unread = client.statistics()
                ids = []
                for _ in range(4):
                    wake = await client.next_wake()
                    ids.append(_message_id(wake))
                    await client.ack([wake.seq])
    assert unread.probes >= 1 and (unread.probes_unanswered, unread.connects, unread.wakes_left_behind) == (0, 1, 0), unread
    assert ids == ["m-0", "m-1", "m-2", "m-3"]
