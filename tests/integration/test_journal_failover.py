"""The journal on PostgreSQL loses nothing when its primary is lost (issue 28 item 6).

Real processes throughout: a PostgreSQL primary with a synchronous standby (started by the
test from Debian's ``postgresql-15``), the daemon as ``mcpl-router run`` on a multi-host DSN
(``target_session_attrs=read-write``), the fixture server over TCP re-sending what it never
heard ``accepted`` for (as a real server does), and a host on the Unix socket that acks every
wake, retrying an ack that failed.

- The primary ``kill -9``ed during a flood, the standby promoted (as an HA manager would):
  every message the daemon answered ``accepted`` wakes the host after the failover, and none
  is woken again once its ack was answered.
- The daemon ``kill -9``ed during a flood and restarted on the same PostgreSQL journal: the same.

The figures (messages, the failover's window) are printed (``pytest -s``) for the closing note.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import pytest
import trio

from mcpl_router.store.records import EventKind
from mcpl_router.client import RouterClient, WakeNotice
from mcpl_router.testing import postgres
from mcpl_router.testing.control import FixtureProcess, wait_until
from mcpl_router.testing.journal import JournalPlace

from .conftest import DaemonProcess, daemon_process, wait_daemon_ready, write_config

pytestmark = pytest.mark.integration

TOTAL = 600
SENDERS = 6


def message(n: int) -> dict[str, Any]:
    return {"channelId": "general", "messageId": f"m-{n}", "text": f"n{n}", "tags": ["chat:mention"]}


class Ledger:
    """What the server was told and what the host saw, by message id."""

    def __init__(self) -> None:
        self.accepted: set[str] = set()
        self.accepted_at: dict[str, float] = {}
        self.refused = 0
        self.woken: list[tuple[float, str]] = []
        self.ack_answered_at: dict[str, float] = {}

    def woken_after_ack(self) -> list[tuple[str, float, float]]:
        return [(m, self.ack_answered_at[m], at) for at, m in self.woken if m in self.ack_answered_at and at > self.ack_answered_at[m]]


async def send_all(server: FixtureProcess, ledger: Ledger, numbers: list[int]) -> None:
    """Send each message until it is answered ``accepted`` (a refusal or an error: again, later)."""
    pending = list(numbers)
    while pending:
        n = pending.pop(0)
        try:
            answer = await server.incoming([message(n)])
            accepted = bool(answer["results"][0]["accepted"])
        except Exception:
            accepted = False
        if accepted:
            ledger.accepted.add(f"m-{n}")
            ledger.accepted_at.setdefault(f"m-{n}", time.monotonic())
        else:
            ledger.refused += 1
            pending.append(n)
            await trio.sleep(0.02)


class Acking(Protocol):
    async def next_wake(self) -> WakeNotice: ...

    async def ack(self, seqs: Sequence[int], *, agent: str | None = None) -> int: ...


async def read_and_ack(host: Acking, ledger: Ledger) -> None:
    """Every wake noted as it comes, then acked, an ack the daemon could not record (its journal
    failing over, its node gone) tried again until it is answered."""
    while True:
        wake = await host.next_wake()
        message_id = wake.messages[0]["messageId"]
        ledger.woken.append((time.monotonic(), message_id))
        while True:
            try:
                await host.ack([wake.seq])
            except Exception:
                await trio.sleep(0.05)
                continue
            ledger.ack_answered_at.setdefault(message_id, time.monotonic())
            break


async def host_reading(socket: str, ledger: Ledger, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """A host that acks every wake, retrying an ack the daemon could not record."""
    async with RouterClient.connect_unix(socket) as host:
        await host.hello("host", ["kai"])
        task_status.started()
        await read_and_ack(host, ledger)


async def wait_all_woken(ledger: Ledger, log: Path, *, timeout: float = 60) -> None:
    """Until every message woke the host; if one never does, the failure says which, and what
    the daemon logged about it."""
    every = {f"m-{n}" for n in range(TOTAL)}
    try:
        await wait_until(lambda: every <= {m for _, m in ledger.woken}, timeout=timeout)
    except trio.TooSlowError:
        missing = sorted(every - {m for _, m in ledger.woken})
        lines = [line for line in log.read_text(errors="replace").splitlines() if any(f'"{m}"' in line for m in missing[:3])
                 or '"level":"error"' in line or '"level":"warning"' in line]
        raise AssertionError(f"never woken: {missing[:20]} ({len(missing)}); the daemon said:\n" + "\n".join(lines[-40:])) from None


def check(ledger: Ledger) -> None:
    every = {f"m-{n}" for n in range(TOTAL)}
    assert ledger.accepted == every
    assert every <= {m for _, m in ledger.woken}, sorted(every - {m for _, m in ledger.woken})[:10]
    assert ledger.woken_after_ack() == []


@asynccontextmanager
async def flooded_daemon(workdir: Path, place: JournalPlace) -> AsyncIterator[tuple[FixtureProcess, DaemonProcess, str]]:
    """The fixture server over TCP and the daemon as a process on ``place``'s journal, ready;
    yields the server, the daemon and its host socket."""
    async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=workdir) as server:
        assert server.listen_url is not None
        config = write_config(workdir, server.listen_url, journal=place)
        socket = str(workdir / "run" / "host.sock")
        async with daemon_process(config, workdir / "daemon.log") as daemon:
            await daemon.start()
            await wait_daemon_ready(socket)
            yield server, daemon, socket


async def test_the_primary_killed_during_a_flood_loses_no_accepted_message(short_tmp: Path) -> None:
    postgres.require()
    ledger = Ledger()
    with postgres.postgres_pair() as pair:
        with trio.fail_after(180):
            async with flooded_daemon(short_tmp, JournalPlace(dsn=pair.multi_host_dsn)) as (server, _daemon, socket):
                async with trio.open_nursery() as nursery:
                    await nursery.start(host_reading, socket, ledger)
                    async with trio.open_nursery() as senders:
                        for index in range(SENDERS):
                            senders.start_soon(send_all, server, ledger, list(range(index, TOTAL, SENDERS)))
                        await wait_until(lambda: len(ledger.accepted) >= TOTAL // 3, timeout=60)
                        killed_at = time.monotonic()
                        accepted_before = len(ledger.accepted)
                        pair.primary.kill()  # mid-flood: commits in flight on a primary that is gone
                        await trio.sleep(0.5)  # the HA manager notices
                        await trio.to_thread.run_sync(pair.promote)
                        promoted_at = time.monotonic()
                    await wait_all_woken(ledger, short_tmp / "daemon.log")
                    nursery.cancel_scope.cancel()
    times = sorted(ledger.accepted_at.values())
    # The failover's window: the longest time around the kill in which nothing was accepted.
    window = max(later - earlier for earlier, later in zip(times, times[1:], strict=False) if later > killed_at - 1)
    log = (short_tmp / "daemon.log").read_text()
    print(
        f"\nprimary loss: {TOTAL} messages, {accepted_before} accepted before the kill, {ledger.refused} answers"
        f" not accepted (re-sent); standby promoted {promoted_at - killed_at:.2f} s after the kill; nothing"
        f" accepted for {window:.2f} s; {log.count('journal.commit.failed')} commits failed,"
        f" {log.count('journal.recorded_again')} found written after all; {len(ledger.woken)} wakes for {TOTAL} messages"
    )
    check(ledger)


async def test_the_daemon_killed_during_a_flood_on_postgres_loses_no_accepted_message(short_tmp: Path, postgres_server: postgres.Server) -> None:
    ledger = Ledger()
    place = JournalPlace(dsn=postgres.fresh_database(postgres_server, "daemon_kill9"))
    with trio.fail_after(180):
        async with flooded_daemon(short_tmp, place) as (server, daemon, socket):
            async with trio.open_nursery() as nursery:
                reader = trio.CancelScope()

                async def read(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
                    with reader:
                        try:
                            await host_reading(socket, ledger, task_status=task_status)
                        except Exception:
                            await trio.sleep_forever()  # the daemon died under it

                # Its hello first: an agent a host declares is woken only once it has declared it.
                await nursery.start(read)
                async with trio.open_nursery() as senders:
                    for index in range(SENDERS):
                        senders.start_soon(send_all, server, ledger, list(range(index, TOTAL, SENDERS)))
                    await wait_until(lambda: len(ledger.accepted) >= TOTAL // 3, timeout=60)
                    daemon.kill9()
                    await daemon.wait()
                    reader.cancel()
                    await daemon.start()
                    await wait_daemon_ready(socket)
                    nursery.start_soon(host_reading, socket, ledger)
                await wait_all_woken(ledger, short_tmp / "daemon.log")
                nursery.cancel_scope.cancel()
    check(ledger)


async def test_a_commit_whose_wait_for_the_standby_was_cancelled_fails_and_its_resend_wakes_once() -> None:
    """CLUSTER.md's trap: a commit whose synchronous wait is cancelled returns with only a
    warning, its row on the primary alone. The journal counts it as failed (no ``accepted``);
    the server's re-send finds the row and is recorded then, waking once; a further re-send is a
    duplicate."""
    postgres.require()
    import psycopg

    from mcpl_router.store.journal import Delivery, InboundEvent, JournalFailure
    from mcpl_router.testing.journal import open_journal

    kai = Delivery("kai", "message", ("chat:mention",), True)

    def event(message_id: str) -> InboundEvent:
        return InboundEvent("s", "general", EventKind.MESSAGE, message_id, message(int(message_id[2:])))

    with postgres.postgres_pair() as pair:
        async with open_journal(JournalPlace(dsn=pair.primary.dsn)) as journal:
            [first] = await journal.record_inbound([(event("m-1"), [kai])])
            pair.standby.pause()  # the standby stops confirming: commits wait for it
            try:
                wait = await journal.submit_inbound([(event("m-2"), [kai])])

                def cancel_the_wait() -> int:
                    with psycopg.connect(pair.primary.dsn, autocommit=True) as conn:
                        row = conn.execute(
                            "SELECT pid FROM pg_stat_activity WHERE application_name = 'mcpl-router' AND wait_event = 'SyncRep'"
                        ).fetchone()
                        if row is None:
                            return 0
                        conn.execute("SELECT pg_cancel_backend(%s)", (row[0],))
                        return int(row[0])

                with trio.fail_after(20):
                    while not await trio.to_thread.run_sync(cancel_the_wait):
                        await trio.sleep(0.02)
                    with pytest.raises(JournalFailure, match="synchronous replication"):
                        await wait()
            finally:
                pair.standby.resume()
            assert journal.unacked_count("kai") == 1 and journal.statistics().failed_commits == 1
            # Another server's message commits meanwhile, and its wake goes to the host.
            [other] = await journal.record_inbound([(event("m-3"), [kai])])
            # m-2's row is there all the same (on the primary; the standby has it once resumed):
            # its re-send records it, under a seq after every one given (a host's outbox never
            # takes a seq at or below one it sent), and it wakes once.
            [again] = await journal.record_inbound([(event("m-2"), [kai])])
            assert not again.duplicate and again.seq > other.seq > first.seq
            assert journal.unacked_count("kai") == 3 and journal.statistics().recorded_again == 1
            [third] = await journal.record_inbound([(event("m-2"), [kai])])
            assert third.duplicate and third.seq == again.seq
            assert journal.unacked_count("kai") == 3
            assert [d.event.payload["messageId"] for d in await journal.unacked_deliveries("kai")] == ["m-1", "m-3", "m-2"]
