"""The bench's journal floor (``bench/forwarder.py --journal``) keeps the promises it stands for.

The inbound and latency targets are read against it (docs/performance.md), so a floor that
answered ``accepted`` or sent a wake before its commit, lost or reordered a wake, or answered an
ack before committing it would make every target look nearer than it is. Real processes: a
fixture server over TCP sends to it; the floor is its own process; a host on its Unix socket
reads and acks; the test holds the SQLite file's write lock to keep a commit from happening.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.jsonrpc import NdjsonStream
from mcpl_router.testing.control import FixtureProcess, wait_until

pytestmark = pytest.mark.integration

FORWARDER = Path(__file__).resolve().parents[2] / "bench" / "forwarder.py"
#: Past the floor's outbox bound (4,096 messages), so wakes wait in the floor for room.
MESSAGES = 6000
#: How long a call is watched for an answer that must not come while the commit is held (the
#: floor's connection waits up to 5 s for the lock, so it is still waiting, not failed).
HELD = 0.5


def count(journal: Path, sql: str) -> int:
    with sqlite3.connect(journal) as db:
        return int(db.execute(sql).fetchone()[0])


@contextmanager
def commits_held(journal: Path) -> Iterator[None]:
    """The journal's write lock, taken by the test: no commit of the floor's lands until it goes."""
    db = sqlite3.connect(journal, isolation_level=None)
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        db.execute("ROLLBACK")
        db.close()


async def held_then_done(journal: Path, *calls: Callable[[], Awaitable[Any]]) -> list[Any]:
    """Run ``calls`` at once while commits are held: none may finish; once they're let go, all do."""
    results: dict[int, Any] = {}
    async with trio.open_nursery() as nursery:
        with commits_held(journal):

            async def run(index: int, call: Callable[[], Awaitable[Any]]) -> None:
                results[index] = await call()

            for index, call in enumerate(calls):
                nursery.start_soon(run, index, call)
            await trio.sleep(HELD)
            assert not results, "answered (or woken) before the commit holding it was durable"
    return [results[index] for index in range(len(calls))]


@asynccontextmanager
async def floor_running(directory: Path, server: FixtureProcess) -> AsyncIterator[tuple[Path, Path]]:
    socket, journal = directory / "floor.sock", directory / "floor.sqlite3"
    with (directory / "floor.log").open("ab") as log:
        # Started as a shell's background job starts it (a CI job's, say): SIGINT ignored, which
        # a process inherits; the floor must still stop on the SIGINT below.
        floor = await trio.lowlevel.open_process(
            ["sh", "-c", 'trap "" INT; exec "$@"', "sh",
             sys.executable, str(FORWARDER), "--socket", str(socket), "--journal", str(journal), str(server.listen_port)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
        )
    async def listening() -> bool:
        # The socket's file appears at bind, a moment before listen: a connect in between is
        # refused, so the floor is ready only once one is taken.
        try:
            probe = await trio.open_unix_socket(str(socket))
        except OSError:
            return False
        await probe.aclose()
        return True

    try:
        await wait_until(listening, timeout=30, interval=0.05)
        yield socket, journal
    finally:
        with trio.CancelScope(shield=True):
            floor.send_signal(signal.SIGINT)  # KeyboardInterrupt: it removes its socket on the way out
            with trio.move_on_after(10):
                await floor.wait()
            if floor.poll() is None:
                floor.kill()
                await floor.wait()
    assert not socket.exists()


async def test_the_journal_floor_commits_before_accepted_and_the_wake_and_before_an_acks_answer(short_tmp: Path) -> None:
    with trio.fail_after(60):
        async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp) as server, floor_running(
            short_tmp, server
        ) as (socket, journal), RouterClient.connect_unix(str(socket)) as host:
            await host.hello("test", ["bench"])

            answer, wake = await held_then_done(journal, lambda: server.incoming([{"channelId": "general", "text": "hello"}]), host.next_wake)
            assert answer["results"][0]["accepted"] is True and wake.seq == 1
            assert count(journal, "SELECT COUNT(*) FROM inbound") == 1

            assert await held_then_done(journal, lambda: host.ack([1])) == [0]
            assert count(journal, "SELECT COUNT(*) FROM deliveries WHERE acked = 1") == 1
            assert count(journal, "SELECT COUNT(*) FROM inbound WHERE acked = 1") == 1


async def test_the_journal_floor_wakes_each_message_once_in_seq_order_past_a_full_outbox(short_tmp: Path) -> None:
    """A host that reads slowly while a flood goes on: the floor's outbox (4,096 messages) fills,
    wakes wait in the floor while room comes and goes, and each still reaches the host once, in
    seq order."""
    with trio.fail_after(90):
        async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp) as server, floor_running(
            short_tmp, server
        ) as (socket, journal):
            stream = await trio.open_unix_socket(str(socket))
            seqs: list[int] = []
            async with stream, trio.open_nursery() as nursery:
                await stream.send_all(b'{"jsonrpc":"2.0","id":1,"method":"session/hello","params":{"host":"test","agents":["bench"]}}\n')

                async def read_slowly() -> None:
                    framed = NdjsonStream(stream, stream, skip_log_lines=False)
                    await trio.sleep(0.5)  # long enough for the outbox to fill
                    while len(seqs) < MESSAGES:
                        line = json.loads(await framed.receive_message())
                        if line.get("method") == "wake":
                            seqs.append(line["params"]["seq"])
                            if len(seqs) % 50 == 0:
                                await trio.sleep(0.002)  # room comes and goes while commits land

                nursery.start_soon(read_slowly)
                flooded = await server.flood(MESSAGES, outstanding=64)
                assert flooded["accepted"] == MESSAGES
            assert count(journal, "SELECT COUNT(*) FROM inbound") == MESSAGES
            assert seqs == list(range(1, MESSAGES + 1)), "each wake once, in seq order"
