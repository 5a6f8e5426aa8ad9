"""``mcpl-router journal copy``: a SQLite journal moved to PostgreSQL whole, run as the CLI.

What a daemon would read back from the copy is what it would have read from the file: the
unacked wakes, drafts, tune-outs with what they hold, channel decisions and declines, fork
generations, host-declared agents, and the seqs given (a pruned newest seq is never given again).
A target that holds anything, and a journal a daemon runs on, are refused in one line.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from mcpl_router.store.records import EventKind
from mcpl_router.store.journal import Delivery, InboundEvent, SavedTuneOut
from mcpl_router.testing import postgres
from mcpl_router.testing.journal import JournalPlace, open_journal

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KAI = Delivery("kai", "message", ("chat:mention",), True)


def event(server: str, message_id: str) -> InboundEvent:
    return InboundEvent(server, "general", EventKind.MESSAGE, message_id, {"channelId": "general", "messageId": message_id})


def journal_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mcpl_router", "journal", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


async def test_a_sqlite_journal_copied_to_postgres_reads_back_the_same(tmp_path: Path, postgres_server: postgres.Server) -> None:
    path = tmp_path / "journal.sqlite3"
    source = JournalPlace(path=path)
    async with open_journal(source, retention=0.05) as journal:
        recorded = await journal.record_inbound([(event("a", f"m-{n}"), [KAI]) for n in range(5)] + [(event("b", "m-0"), [KAI])])
        seqs = [r.seq for r in recorded]
        # The newest is acked and pruned: the copy must still never give its seq again.
        await journal.ack_deliveries(["kai"], [seqs[0], seqs[-1]])
        await trio.sleep(0.1)
        await journal._prune()
        journal.save_agent("mo", {"name": "mo", "mode": "named"})
        journal.record_channel_decision("kai", "a", "general", "open")
        journal.record_channel_decision("kai", "b", "general", "closed")
        journal.record_decline("mo", "b", "general")
        journal.raise_fork_generation("kai", "a", "dm-1", 3)
        journal.save_tune_out(SavedTuneOut("kai", "a", "general", 60.0, 10, None, None, 1000.0, None, handed_through=seqs[1]))
        journal.save_draft({"id": "d-aaaaa", "agent": "kai", "createdAt": 1.0, "text": "held words", "state": "held"})
        await journal.flush()
        expected_last = journal.last_seq()
    dsn = postgres.fresh_database(postgres_server, "copy_target")
    copied = journal_cli("copy", "--from", f"sqlite:{path}", "--to", f"postgres:{dsn}")
    assert copied.returncode == 0, copied.stderr
    assert "unacked wakes: 4" in copied.stdout and f"last seq given: {expected_last}" in copied.stdout

    async with open_journal(JournalPlace(dsn=dsn)) as copy:
        assert copy.unacked_count("kai") == 4
        assert [d.event.seq for d in await copy.unacked_deliveries("kai")] == seqs[1:5]
        assert copy.saved_agents() == {"mo": {"name": "mo", "mode": "named"}}
        assert sorted(copy.channel_decisions()) == [("kai", "a", "general", "open"), ("kai", "b", "general", "closed")]
        assert copy.declines() == [("mo", "b", "general")]
        assert copy.fork_generations() == [("kai", "a", "dm-1", 3)]
        [tune_out] = await copy.saved_tune_outs()
        assert (tune_out.server_id, tune_out.held) == ("a", tuple(seqs[2:5]))
        assert [row["text"] for row in copy.drafts_of("kai")] == ["held words"]
        # The same message again is a duplicate there too; a new one numbers after the source.
        [again] = await copy.record_inbound([(event("a", "m-3"), [KAI])])
        assert again.duplicate and again.seq == seqs[3]
        [new] = await copy.record_inbound([(event("a", "m-new"), [KAI])])
        assert new.seq == expected_last + 1

    # journal check on a config naming the database: read without its lock, what it holds.
    config = tmp_path / "router.json"
    config.write_text(json.dumps({"journal": {"backend": "postgres", "dsn": dsn, "path": str(tmp_path / "unused")}}))
    checked = journal_cli("check", "--config", str(config))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "OK (schema 1)" in checked.stdout and f"last seq given: {expected_last + 1}" in checked.stdout
    assert "wakes not acked: 5" in checked.stdout and "no daemon holds it now" in checked.stdout

    # A target that holds a journal is never overwritten.
    refused = journal_cli("copy", "--from", f"sqlite:{path}", "--to", f"postgres:{dsn}")
    assert refused.returncode == 3 and "already holds a journal" in refused.stderr, refused.stderr


async def test_a_journal_a_daemon_holds_is_not_copied(tmp_path: Path, postgres_server: postgres.Server) -> None:
    path = tmp_path / "journal.sqlite3"
    async with open_journal(JournalPlace(path=path)):
        refused = journal_cli("copy", "--from", f"sqlite:{path}", "--to", f"postgres:{postgres.fresh_database(postgres_server, 'copy_locked')}")
    assert refused.returncode == 3 and "in use by another daemon" in refused.stderr, refused.stderr
    wrong = journal_cli("copy", "--from", f"mysql:{path}", "--to", "sqlite:/tmp/x")
    assert wrong.returncode == 3 and "Write sqlite:PATH or postgres:DSN" in wrong.stderr
