"""Durable wakes: journaled before ``accepted``, re-sent until acked, never woken twice.

The daemon runs as a real subprocess (``python -m mcpl_router run --config FILE``) so it can be
killed with SIGKILL; the MCPL server is the fixture over TCP; the host is the Python client on
the daemon's Unix socket.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio

from mcpl_router.store.records import EventKind
from mcpl_router.client import RouterClient, WakeNotice
from mcpl_router.store.journal import Delivery, InboundEvent, JournalFailure
from mcpl_router.testing.journal import JournalPlace, open_journal
from mcpl_router.testing.control import FixtureProcess

from .conftest import control_of, daemon_process, running_daemon, stdio_server, wait_channel, wait_daemon_ready, write_config

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


async def test_kill9_after_accepted_then_wake_exactly_once(short_tmp: Path, journal_place: JournalPlace) -> None:
    with trio.fail_after(60):
        async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp, grace=1) as server:
            assert server.listen_url is not None
            config = write_config(short_tmp, server.listen_url, journal=journal_place)
            socket = str(short_tmp / "run" / "host.sock")
            async with daemon_process(config, short_tmp / "daemon.log") as daemon:
                await daemon.start()
                await wait_daemon_ready(socket)
                async with RouterClient.connect_unix(socket) as host:
                    await host.hello("host", ["kai"])
                    answer = await server.incoming(
                        [{"channelId": "general", "messageId": "m-1", "text": "survive this", "tags": ["chat:mention"]}]
                    )
                    assert answer["results"][0]["accepted"] is True
                    # Right after "accepted", before the host acks: the daemon dies hard.
                    daemon.kill9()
                    assert await daemon.wait() == -signal.SIGKILL

                await daemon.start()
                await wait_daemon_ready(socket)
                async with RouterClient.connect_unix(socket) as host:
                    await host.hello("host", ["kai"])
                    wake = await host.next_wake()
                    assert (wake.agent, wake.reason) == ("kai", "message")
                    assert wake.messages[0]["messageId"] == "m-1"
                    assert wake.channel is not None and (wake.channel.server_id, wake.channel.channel_id) == ("s", "general")
                    first_seq = wake.seq

                    # The server re-sends it (it never trusts one answer): accepted, not woken again.
                    again = await server.incoming(
                        [{"channelId": "general", "messageId": "m-1", "text": "survive this", "tags": ["chat:mention"]}]
                    )
                    assert again["results"][0]["accepted"] is True
                    await server.incoming([{"channelId": "general", "messageId": "m-2", "text": "next", "tags": ["chat:mention"]}])
                    following = await host.next_wake()
                    # The next wake is the new message: the duplicate woke nobody.
                    assert following.messages[0]["messageId"] == "m-2" and following.seq > first_seq
                    assert await host.ack([first_seq, following.seq]) == 2

                # Acked: a later session gets nothing re-sent.
                async with RouterClient.connect_unix(socket) as host:
                    await host.hello("host", ["kai"])
                    await server.incoming([{"channelId": "general", "messageId": "m-3", "text": "third", "tags": ["chat:mention"]}])
                    assert (await host.next_wake()).messages[0]["messageId"] == "m-3"


async def test_host_disconnecting_mid_stream_gets_every_unacked_wake_in_order(short_tmp: Path, journal_place: JournalPlace) -> None:
    with trio.fail_after(40):
        control_file = short_tmp / "s.control.json"
        servers = {"s": stdio_server(control_file, channels=("general",), grace=1)}
        async with running_daemon(short_tmp, servers, unix_socket=True, journal=journal_place) as daemon, control_of(control_file) as server:
            await wait_channel(daemon, "s", "general")
            socket = daemon.host_socket_path
            assert socket is not None
            received: list[WakeNotice] = []
            async with RouterClient.connect_unix(socket) as host:
                await host.hello("host", ["kai"])
                for index in range(5):
                    await server.incoming([{"channelId": "general", "messageId": f"m-{index}", "tags": ["chat:dm"], "text": f"#{index}"}])
                for _ in range(5):
                    received.append(await host.next_wake())
                seqs = [wake.seq for wake in received]
                assert seqs == sorted(seqs)
                await host.ack([seqs[0], seqs[2]])
            # Same host, within the grace: it reclaims kai and gets exactly the unacked ones.
            async with RouterClient.connect_unix(socket) as host:
                await host.hello("host", ["kai"])
                resent = [await host.next_wake() for _ in range(3)]
                assert [wake.seq for wake in resent] == [seqs[1], seqs[3], seqs[4]]
                assert [wake.messages[0]["messageId"] for wake in resent] == ["m-1", "m-3", "m-4"]
                assert await host.ack([wake.seq for wake in resent]) == 3
                await server.incoming([{"channelId": "general", "messageId": "m-5", "tags": ["chat:dm"]}])
                assert (await host.next_wake()).messages[0]["messageId"] == "m-5"


# -- the journal's half of the invariant, without processes ------------------------------------


def _event(message_id: str) -> InboundEvent:
    return InboundEvent("s", "general", EventKind.MESSAGE, message_id, {"messageId": message_id, "tags": ["chat:mention"]})


async def test_deliveries_commit_with_their_event_or_not_at_all(journal_place: JournalPlace) -> None:
    path = journal_place
    both = [Delivery("kai", "message", ("chat:addressed",), True), Delivery("bo", "message", (), False)]
    async with open_journal(path) as journal:
        [first] = await journal.record_inbound([(_event("m-1"), both)])
        # A batch whose statement fails leaves nothing behind: no event, no delivery.
        with pytest.raises(JournalFailure):
            await journal.record_inbound([(_event("m-2"), [Delivery("kai", "message", (), False)] * 2), (_event("m-3"), None)])  # type: ignore[list-item]
        assert journal.last_seq() == first.seq
        [duplicate] = await journal.record_inbound([(_event("m-1"), [Delivery("kai", "message", (), False)])])
        assert duplicate.duplicate and duplicate.seq == first.seq

    async with open_journal(path) as reopened:
        [kept] = await reopened.unacked_deliveries("kai")
        assert kept.event.seq == first.seq and kept.delivery.tags == ("chat:addressed",) and kept.delivery.addressed
        assert reopened.unacked_count("kai") == 1 and reopened.unacked_count("bo") == 1
        assert await reopened.ack_deliveries(["kai"], [first.seq]) == 1
        assert await reopened.ack_deliveries(["kai"], [first.seq]) == 0
        assert await reopened.unacked_deliveries("kai") == []
        # The event stays unacked while another agent's delivery of it is.
        assert [e.seq for e in reopened.events(unacked_only=True)] == [first.seq]
        assert await reopened.ack_deliveries(["bo"], [first.seq]) == 1
        assert reopened.events(unacked_only=True) == []
        stored = await reopened.delivery(first.seq, "bo")
        assert stored is not None and stored.event.payload["messageId"] == "m-1"