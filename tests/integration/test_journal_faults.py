"""Nothing accepted is silently lost, whatever happens to the journal's file (issue 26 items 1-3),
through ``mcpl-router run`` as a real process: a damaged, foreign, newer, read-only, vanished or
emptied journal is refused at start in one line naming the file and the fix (exit 2, no
traceback); ``mcpl-router journal check`` says the same; a journal removed under a running daemon
stops it accepting and makes ``/readyz`` 503; a full disk at start still delivers the backlog.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.query import http_get
from mcpl_router.store.journal import Delivery, InboundEvent
from mcpl_router.store.records import EventKind
from mcpl_router.testing.control import FixtureProcess, wait_until
from mcpl_router.testing.journal import open_journal

from .conftest import FAST_RECONNECT, daemon_process, wait_daemon_ready, write_config

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "mcpl_router"]
MESSAGES = 200


async def _journal_with_messages(path: Path, count: int = MESSAGES) -> None:
    """A journal holding ``count`` messages that woke ``ann``, none acked (as a daemon leaves it)."""
    async with open_journal(path) as journal:
        for index in range(count):
            event = InboundEvent(server_id="s", channel_id="general", kind=EventKind.MESSAGE, dedup_key=f"m-{index}",
                                 payload={"messageId": f"m-{index}", "content": [{"type": "text", "text": "x" * 200}]})
            await journal.record_inbound([(event, [Delivery(agent="ann", reason="message", tags=(), addressed=True)])])


def _run(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "run", "--config", str(config)], capture_output=True, text=True, timeout=60)


def _check(journal: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "journal", "check", "--journal", str(journal)], capture_output=True, text=True, timeout=60)


def _page_size(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return int(db.execute("PRAGMA page_size").fetchone()[0])


def _scribble(path: Path, offset: int, length: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(os.urandom(length))


def _truncate(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2 + 100)


def _garbage_header(path: Path) -> None:
    _scribble(path, 0, 100)


def _text_file(path: Path) -> None:
    path.write_text("this is not a journal\n" * 50)


def _middle_pages(path: Path) -> None:
    size, page = path.stat().st_size, _page_size(path)
    _scribble(path, (size // page // 2) * page, page * 2)


def _last_page(path: Path) -> None:
    size, page = path.stat().st_size, _page_size(path)
    _scribble(path, size - page, page)


def _emptied(path: Path) -> None:
    path.write_bytes(b"")


def _removed(path: Path) -> None:
    path.unlink()


def _newer_schema(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("PRAGMA user_version = 99")
        db.commit()


def _a_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "truncated": (_truncate, "damaged"),
    "garbage header": (_garbage_header, "not an SQLite database"),
    "a text file": (_text_file, "not an SQLite database"),
    "garbage in middle pages": (_middle_pages, "damaged"),
    "garbage in the last page": (_last_page, "damaged"),
    "emptied": (_emptied, "is empty, but"),
    "removed": (_removed, "is missing, but"),
    "a newer schema": (_newer_schema, "newer mcpl-router (schema 99"),
    "a directory": (_a_directory, "is a directory"),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
async def test_a_journal_not_to_be_trusted_is_refused_in_one_line(tmp_path: Path, damage: str) -> None:
    config = write_config(tmp_path, None)
    journal = tmp_path / "journal.sqlite3"
    await _journal_with_messages(journal)
    harm, said = DAMAGE[damage]
    harm(journal)
    started = await trio.to_thread.run_sync(_run, config)
    assert started.returncode == 2, started.stderr
    lines = started.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in started.stderr, started.stderr
    assert str(journal) in lines[0] and said in lines[0], lines[0]
    # The same, read-only, from the checker (exit 3: it would refuse it).
    checked = await trio.to_thread.run_sync(_check, journal)
    assert checked.returncode == 3 and said in checked.stdout, checked.stdout + checked.stderr
    if damage == "a newer schema":
        with contextlib.closing(sqlite3.connect(journal)) as db:
            assert db.execute("PRAGMA user_version").fetchone()[0] == 99  # never downgraded


async def test_a_journal_check_of_a_sound_journal_says_what_it_holds(tmp_path: Path) -> None:
    journal = tmp_path / "journal.sqlite3"
    await _journal_with_messages(journal, 3)
    checked = await trio.to_thread.run_sync(_check, journal)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "OK (SQLite quick_check ok" in checked.stdout and "wakes not acked: 3" in checked.stdout
    # The marker: a start that finds the file gone refuses instead of starting afresh.
    assert json.loads(Path(f"{journal}.state").read_text())["lastSeq"] == 3


@contextlib.contextmanager
def _mounted_tmpfs(where: Path, options: str) -> Iterator[Path]:
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"can't mount a tmpfs here ({mounted.stderr.strip()}): run as root on Linux")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


async def test_a_read_only_journal_directory_is_refused_in_one_line(tmp_path: Path) -> None:
    with _mounted_tmpfs(tmp_path / "ro", "ro,size=1m") as directory:
        config = write_config(tmp_path, None)
        data = json.loads(config.read_text())
        data["journal"]["path"] = str(directory / "journal.sqlite3")
        config.write_text(json.dumps(data))
        started = await trio.to_thread.run_sync(_run, config)
    assert started.returncode == 2 and "Traceback" not in started.stderr, started.stderr
    [line] = started.stderr.strip().splitlines()
    assert str(directory) in line and "not writable" in line, line


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_a_journal_removed_under_a_running_daemon_stops_it_accepting(short_tmp: Path) -> None:
    port = _free_port()
    with trio.fail_after(90):
        async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp) as fixture:
            config = write_config(short_tmp, None, servers={"s": {"url": fixture.listen_url, "reconnect": FAST_RECONNECT}})
            data = json.loads(config.read_text())
            data["health"] = {"enabled": True, "bind": "127.0.0.1", "port": port}
            config.write_text(json.dumps(data))
            socket_path = str(short_tmp / "run" / "host.sock")
            journal = short_tmp / "journal.sqlite3"
            async with daemon_process(config, short_tmp / "daemon.log") as daemon:
                await daemon.start()
                await wait_daemon_ready(socket_path)
                before = await fixture.incoming([{"channelId": "general", "text": "kept", "tags": ["chat:mention"]}])
                assert [row["accepted"] for row in before["results"]] == [True]
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{journal}{suffix}").unlink(missing_ok=True)

                async def not_ready() -> bool:
                    status, body = await http_get(f"http://127.0.0.1:{port}/readyz", 5)
                    return status == 503 and b"was removed while the daemon had it open" in body

                await wait_until(not_ready, timeout=10, interval=0.1)
                accepted = 0
                for index in range(20):
                    try:
                        answer = await fixture.incoming([{"channelId": "general", "text": f"after {index}", "tags": ["chat:mention"]}])
                    except Exception:  # the daemon's error answer comes back as the control call's error
                        continue
                    accepted += sum(1 for row in answer.get("results", []) if row.get("accepted"))
                assert accepted == 0, "a message was answered accepted with no journal file to keep it"
                async with RouterClient.connect_unix(socket_path, timeout=5) as probe:
                    status = await probe.status()
                assert status.readiness.ready is False
    log = (short_tmp / "daemon.log").read_text()
    assert '"event":"journal.file.gone"' in log


async def test_a_full_disk_at_start_still_delivers_the_backlog(short_tmp: Path) -> None:
    with _mounted_tmpfs(short_tmp / "disk", "size=4m") as disk:
        journal = disk / "journal.sqlite3"
        await _journal_with_messages(journal, 50)
        # Fill what is left of the disk.
        with open(disk / "filler", "wb") as filler:
            with contextlib.suppress(OSError):
                while True:
                    filler.write(b"\0" * 65536)
                    filler.flush()
        socket_path = str(short_tmp / "run" / "host.sock")
        with trio.fail_after(60):
            async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp) as fixture:
                config = write_config(short_tmp, None, servers={"s": {"url": fixture.listen_url, "reconnect": FAST_RECONNECT}})
                data = json.loads(config.read_text())
                data["journal"]["path"] = str(journal)
                config.write_text(json.dumps(data))
                async with daemon_process(config, short_tmp / "daemon.log") as daemon:
                    await daemon.start()
                    await wait_daemon_ready(socket_path)
                    async with RouterClient.connect_unix(socket_path, timeout=5) as host:
                        await host.hello("t", ["ann"])
                        seqs = []
                        while len(seqs) < 50:
                            seqs.append((await host.next_wake()).seq)
                        assert seqs == sorted(seqs) and len(set(seqs)) == 50
                        # A new message can't be kept: refused (retryable), not "accepted".
                        with pytest.raises(Exception) as refused:
                            await fixture.incoming([{"channelId": "general", "text": "while full", "tags": ["chat:mention"]}])
                        assert "full" in str(refused.value) or "journal" in str(refused.value), refused.value
                        # Space comes back: the acks are written, and messages accepted again.
                        (disk / "filler").unlink()
                        assert await host.ack(seqs) == 50

                        async def accepted() -> bool:
                            try:
                                answer = await fixture.incoming([{"channelId": "general", "text": "room again", "tags": ["chat:mention"]}])
                            except Exception:
                                return False
                            return bool(answer["results"][0]["accepted"])

                        await wait_until(accepted, timeout=10)
        assert "Traceback" not in (short_tmp / "daemon.log").read_text()
