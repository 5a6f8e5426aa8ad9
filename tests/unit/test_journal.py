"""The journal: indexed per-message statements, group commit, pruning, duplicates, the lock."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest
import trio
from structlog.testing import capture_logs

from mcpl_router.store.records import EventKind
from mcpl_router.mcpl.inbound import substance_digest
import mcpl_router.store.writer as writer_module
from mcpl_router.store.journal import Delivery, InboundEvent, Journal, JournalFailure, JournalLocked, SavedTuneOut
from mcpl_router.store.schema import HOT_STATEMENTS, SCHEMA_VERSION
from mcpl_router.testing.journal import JournalPlace, open_journal
from mcpl_router.testing.scheduling import scheduler_passes

KAI = Delivery("kai", "message", ("chat:mention",), True)


def message(message_id: str, text: str = "hi", **extra: object) -> InboundEvent:
    payload = {"channelId": "general", "messageId": message_id, "content": [{"type": "text", "text": text}], **extra}
    return InboundEvent("s", "general", EventKind.MESSAGE, message_id, payload, digest=substance_digest(payload))


@pytest.mark.parametrize("name", sorted(HOT_STATEMENTS))
def test_every_per_message_statement_is_an_indexed_search(tmp_path: Path, name: str) -> None:
    """No statement run per message, per ack or per turn scans a table that grows with history."""
    journal = Journal(tmp_path / "journal.sqlite3")
    try:
        sql, args = HOT_STATEMENTS[name]
        db = sqlite3.connect(str(journal.path))
        plan = [row[3] for row in db.execute(f"EXPLAIN QUERY PLAN {sql}", args)]
        db.close()
    finally:
        journal.close()
    assert plan, name
    # Walking the statement's own JSON array of seqs (json_each) is not a scan of history.
    scans = [step for step in plan if step.startswith("SCAN") and "json_each" not in step]
    assert not scans, f"{name}: {plan}"
    assert any("USING" in step for step in plan), f"{name}: {plan}"


def _postgres_hot_statements() -> dict[str, tuple[str, tuple[object, ...]]]:
    """HOT_STATEMENTS as PostgreSQL runs them: the dialect's own texts, lists as arrays."""
    from mcpl_router.store.postgres_backend import _dialect

    dialect = _dialect()
    own = {
        "find duplicates": (dialect.find_duplicates, ("s", "message", ["k", "l"])),
        "ack deliveries": (dialect.ack_deliveries, ("kai", [1, 2])),
        "ack events": (dialect.ack_events, ([1, 2],)),
    }
    return {name: own.get(name, statement) for name, statement in HOT_STATEMENTS.items()}


def _plan_nodes(node: dict[str, object]) -> list[dict[str, object]]:
    children = node.get("Plans", [])
    assert isinstance(children, list)
    return [node, *(found for child in children for found in _plan_nodes(child))]


#: Statements that walk a range of an index by design (from a point, a chunk at a time).
_RANGE_WALKS = frozenset({"prunable events", "prune cutoff probe", "prune drafts"})


@pytest.mark.parametrize("name", sorted(HOT_STATEMENTS))
def test_every_per_message_statement_is_an_indexed_search_on_postgres(postgres_server: object, name: str) -> None:
    """The same statements on PostgreSQL: with sequential scans priced out, a statement with an
    index to use uses it; one without shows a Seq Scan, or an index walked whole (its first
    column not held to a value), and fails here."""
    from mcpl_router.testing import postgres

    assert isinstance(postgres_server, postgres.Server)
    place = JournalPlace(dsn=postgres.fresh_database(postgres_server, f"plans_{name.replace(' ', '_').replace('-', '_')}"))
    place.open().close()  # the schema
    sql, args = _postgres_hot_statements()[name]
    with place.database() as db:
        # A history to plan against (an empty table's plans are guesses): 20,000 events, most
        # acked, two agents woken by each, then the planner's statistics.
        db.execute(
            "INSERT INTO inbound (seq, server, channel, kind, dedup, digest, payload, received_at, acked)"
            " SELECT n, 's' || (n % 3), 'general', 'message', 'm-' || n, NULL, '\\x7b7d', n, (n < 19900)::int"
            " FROM generate_series(1, 20000) AS n"
        )
        db.execute(
            "INSERT INTO deliveries (seq, agent, reason, tags, addressed, acked)"
            " SELECT n, agent, 'message', '\\x5b5d', 0, (n < 19900)::int FROM generate_series(1, 20000) AS n,"
            " (VALUES ('kai'), ('mo')) AS agents (agent)"
        )
        db.execute("ANALYZE")
        db.execute("SET enable_seqscan = off")
        [[plan]] = db.execute(f"EXPLAIN (FORMAT JSON) {sql}", args).fetchall()
        nodes = _plan_nodes(plan[0]["Plan"])
        first_column = {
            str(node["Index Name"]): db.execute(
                "SELECT a.attname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid"
                " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] WHERE c.relname = ?",
                (node["Index Name"],),
            ).fetchone()[0]
            for node in nodes
            if "Index Name" in node
        }
    scans = [node for node in nodes if node["Node Type"] == "Seq Scan"]
    assert not scans, f"{name}: {plan}"
    searches = [node for node in nodes if "Index Name" in node]
    assert searches, f"{name}: {plan}"
    for node in searches:
        column = first_column[str(node["Index Name"])]
        condition = str(node.get("Index Cond", ""))
        held = f"{column} " if name in _RANGE_WALKS else f"{column} = "
        assert held in condition, f"{name}: {node['Index Name']} is walked, not searched ({condition or 'no condition'})"


async def test_batches_that_arrive_together_share_one_commit(journal_place: JournalPlace) -> None:
    async with open_journal(journal_place) as journal:
        waits = []
        for n in range(50):
            waits.append(await journal.submit_inbound([(message(f"m-{n}"), [KAI])]))
        before = journal.statistics().commits
        results = [await wait() for wait in waits]
        stats = journal.statistics()
    assert [r[0].seq for r in results] == list(range(1, 51))  # in submission order
    assert stats.commits - before < 50 and stats.largest_batch > 1


async def test_a_submission_with_room_lets_no_other_task_run_and_a_cancelled_one_queues_nothing(journal_place: JournalPlace) -> None:
    """Submitting is a cancellation point but, while the queue has room, no scheduling point:
    an inbound request's handler goes on to the next message without a trip through the
    scheduler (and what arrives meanwhile joins the same commit)."""
    async with open_journal(journal_place) as journal:
        async with scheduler_passes() as passes:
            before = passes.count
            waits = [await journal.submit_inbound([(message(f"m-{n}"), [KAI])]) for n in range(20)]
            assert passes.count == before  # nothing else ran while twenty were queued
            with trio.CancelScope() as scope:
                scope.cancel()
                with pytest.raises(trio.Cancelled):
                    await journal.submit_inbound([(message("never"), [KAI])])
        results = [await wait() for wait in waits]
        await journal.flush()
        assert [r[0].seq for r in results] == list(range(1, 21))
        assert journal.unacked_count("kai") == 20  # the cancelled submission was never queued


async def test_a_submission_without_a_waiter_is_queued_only_while_there_is_room(
    journal_place: JournalPlace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``submit_inbound_nowait`` (the hot path's ``channels/incoming``) queues at once while the
    write queue has room and queues nothing when it is full (its caller then waits with
    ``submit_inbound``); what it queued is told through its callbacks, in order."""
    monkeypatch.setattr(writer_module, "WRITE_QUEUE", 3)
    journal = journal_place.open()
    told: list[tuple[str, object]] = []
    try:
        for n in range(3):
            assert journal.submit_inbound_nowait(
                [(message(f"m-{n}"), [KAI])],
                lambda recorded, n=n: told.append((f"committed m-{n}", recorded[0].seq)),
                lambda failure, n=n: told.append((f"done m-{n}", failure)),
            )
        # Full (the writer is not running yet): nothing queued, nothing told.
        assert not journal.submit_inbound_nowait([(message("m-full"), [KAI])], lambda recorded: told.append(("full", 0)),
                                                 lambda failure: told.append(("full", failure)))
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            await journal.flush()
            nursery.cancel_scope.cancel()
        assert told == [(f"{what} m-{n}", n + 1 if what == "committed" else None) for n in range(3) for what in ("committed", "done")]
        assert journal.unacked_count("kai") == 3  # the refused one was never written
    finally:
        journal.close()
    with pytest.raises(JournalFailure):  # closed: the daemon is stopping
        journal.submit_inbound_nowait([(message("m-late"), [KAI])], lambda recorded: None, lambda failure: None)


async def test_the_same_message_again_is_a_duplicate_and_a_new_one_under_its_id_is_new(journal_place: JournalPlace) -> None:
    async with open_journal(journal_place) as journal:
        [first] = await journal.record_inbound([(message("in-1", "hello", timestamp="t1", sentAt=1.0), [KAI])])
        # A retry: the same message (this copy's send time may differ) is the same message.
        [again] = await journal.record_inbound([(message("in-1", "hello", timestamp="t1", sentAt=2.0), [KAI])])
        assert again.duplicate and again.seq == first.seq
        # The same words posted at another time under the old id are another message.
        [later] = await journal.record_inbound([(message("in-1", "hello", timestamp="t9"), [KAI])])
        assert not later.duplicate and later.reused_id
        # A server that restarted its counter: the same id, other content, is a new message.
        [reused] = await journal.record_inbound([(message("in-1", "a different message"), [KAI])])
        assert not reused.duplicate and reused.reused_id and reused.seq > first.seq
        assert journal.unacked_count("kai") == 3


async def test_an_event_whose_kind_is_given_as_its_string_is_the_same_event(journal_place: JournalPlace) -> None:
    """``InboundEvent`` does not convert its kind (a msgspec Struct, built per message): what
    reads it compares by value, so ``"message"`` is read as ``EventKind.MESSAGE``, its re-send
    a duplicate."""
    payload = {"channelId": "general", "messageId": "in-1"}
    typed = InboundEvent("s", "general", EventKind.MESSAGE, "in-1", payload)
    plain = InboundEvent("s", "general", "message", "in-1", payload)  # type: ignore[arg-type]
    assert plain.key == typed.key and hash(plain.key) == hash(typed.key)
    async with open_journal(journal_place) as journal:
        [first] = await journal.record_inbound([(typed, [KAI])])
        [again] = await journal.record_inbound([(plain, [KAI])])
        assert again.duplicate and again.seq == first.seq


def test_a_message_digest_is_the_one_earlier_versions_journaled() -> None:
    """A retry after an upgrade must still meet its digest in the journal: the digest of what a
    message says is a fixed function of it, whatever the fields a copy's send or receipt adds."""
    said = {"channelId": "general", "messageId": "in-1", "content": [{"type": "text", "text": "hello"}], "timestamp": "t1"}
    assert substance_digest(said).hex() == "8c7d761f95f0dc226c210387efa3a761"
    assert substance_digest({**said, "sentAt": 2.0, "receivedAt": "r"}).hex() == "8c7d761f95f0dc226c210387efa3a761"
    assert substance_digest({"receivedAt": "r", **said}) == substance_digest(said)  # key order is not content
    assert substance_digest({**said, "timestamp": "t9"}) != substance_digest(said)


async def test_acked_events_and_settled_drafts_are_pruned_and_live_ones_kept(journal_place: JournalPlace) -> None:
    async with open_journal(journal_place, retention=0.05) as journal:
        [done, owed] = await journal.record_inbound([(message("m-1"), [KAI]), (message("m-2"), [KAI])])
        await journal.ack_deliveries(["kai"], [done.seq])
        journal.save_draft({"id": "d-aaaaa", "agent": "kai", "createdAt": 1.0, "text": "x", "state": "dismissed"})
        journal.save_draft({"id": "d-bbbbb", "agent": "kai", "createdAt": 2.0, "text": "y", "state": "held"})
        await journal.flush()
        await trio.sleep(0.1)
        await journal._prune()
        assert [e.seq for e in journal.events()] == [owed.seq]
        assert [row["id"] for row in journal.drafts_of("kai")] == ["d-bbbbb"]
        assert journal.statistics().pruned_events == 1 and journal.statistics().pruned_drafts == 1
        assert [s.event.seq for s in await journal.unacked_deliveries("kai")] == [owed.seq]


async def test_a_failed_commit_keeps_written_behind_drafts_and_the_flush_says_so(journal_place: JournalPlace) -> None:
    """A passing I/O error must not drop a draft: it is written at the next try, and a flush
    that covered the failed commit fails rather than claim the draft is on disk."""
    async with open_journal(journal_place) as journal:
        real = journal._commit_in_thread
        failures = [OSError("disk I/O error")]

        def flaky(batch: list) -> None:  # type: ignore[type-arg]
            if failures:
                raise failures.pop()
            real(batch)

        journal._commit_in_thread = flaky  # type: ignore[method-assign]
        journal.save_draft({"id": "d-aaaaa", "agent": "kai", "createdAt": 1.0, "text": "x", "state": "held"})
        with pytest.raises(JournalFailure):
            await journal.flush()
        await journal.flush()  # the retry went through
    with journal_place.database() as db:
        assert [row for (row,) in db.execute("SELECT id FROM drafts")] == ["d-aaaaa"]


async def test_pruning_a_large_history_does_not_hold_up_the_next_commit(journal_place: JournalPlace) -> None:
    async with open_journal(journal_place, retention=0.01) as journal:
        events = [(message(f"m-{n}"), [KAI]) for n in range(3 * 5000 + 10)]
        recorded = await journal.record_inbound(events)
        await journal.ack_deliveries(["kai"], [r.seq for r in recorded])
        await trio.sleep(0.05)
        more = await journal._prune_chunk_now()
        # One chunk at a time: the rest waits for the writer's next passes, between commits.
        assert more and journal.statistics().pruned_events == 5000
        await journal._prune()
        assert journal.statistics().pruned_events == len(events)


async def test_a_journal_from_before_digests_is_migrated_in_place(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    db = sqlite3.connect(str(path))
    db.executescript(
        """
        CREATE TABLE inbound (seq INTEGER PRIMARY KEY AUTOINCREMENT, server TEXT NOT NULL, channel TEXT,
            kind TEXT NOT NULL, dedup TEXT NOT NULL, payload BLOB NOT NULL, received_at REAL NOT NULL,
            acked INTEGER NOT NULL DEFAULT 0, UNIQUE (server, kind, dedup));
        CREATE TABLE deliveries (agent TEXT NOT NULL, seq INTEGER NOT NULL REFERENCES inbound (seq), reason TEXT NOT NULL,
            tags BLOB NOT NULL, addressed INTEGER NOT NULL, acked INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (agent, seq));
        CREATE INDEX deliveries_unacked ON deliveries (agent, acked, seq);
        CREATE TABLE drafts (id TEXT PRIMARY KEY, agent TEXT NOT NULL, created_at REAL NOT NULL, row BLOB NOT NULL);
        """
    )
    db.execute("INSERT INTO inbound (server, channel, kind, dedup, payload, received_at) VALUES ('s', 'general', 'message', 'in-1', '{}', ?)", (time.time(),))
    db.execute("INSERT INTO deliveries (agent, seq, reason, tags, addressed) VALUES ('kai', 1, 'message', '[]', 0)")
    db.execute("""INSERT INTO drafts (id, agent, created_at, row) VALUES ('d-sent1', 'kai', 1.0, '{"id":"d-sent1","agent":"kai","createdAt":1.0,"text":"x","state":"delivered"}')""")
    db.commit()
    db.close()
    async with open_journal(path) as journal:
        assert journal.unacked_count("kai") == 1 and journal.last_seq() == 1
        # An event kept without a digest counts a re-sent id as the same message.
        [again] = await journal.record_inbound([(message("in-1"), [KAI])])
        assert again.duplicate and again.seq == 1
        # The deliveries still reference the live inbound table (not the renamed old one).
        await journal.record_inbound([(message("in-2"), [KAI])])
        assert isinstance(journal.draft("d-sent1")["settledAt"], float)  # a settled v0 draft is prunable
    db = sqlite3.connect(str(path))
    assert "inbound_v0" not in db.execute("SELECT sql FROM sqlite_master WHERE name = 'deliveries'").fetchone()[0]
    db.execute("PRAGMA foreign_keys = ON")
    assert db.execute("PRAGMA foreign_key_check").fetchall() == []
    db.close()


# -- tune-outs (schema version 3) --------------------------------------------------------------

ANN = Delivery("ann", "message", (), False)


def on(server: str, message_id: str) -> InboundEvent:
    payload = {"channelId": "general", "messageId": message_id, "content": [{"type": "text", "text": "x"}]}
    return InboundEvent(server, "general", EventKind.MESSAGE, message_id, payload, digest=substance_digest(payload))


def tune_out(**fields: object) -> SavedTuneOut:
    values: dict[str, object] = {"agent": "kai", "server_id": "b", "channel_id": "general", "cadence": 0.5, "backlog_cap": 3,
                                 "max_wakes": 4, "duration": 60.0, "started_at": 1000.0, "ends_at": 1060.0}
    return SavedTuneOut(**{**values, **fields})  # type: ignore[arg-type]


async def test_a_tune_out_round_trips_and_reads_back_the_wakes_it_holds(journal_place: JournalPlace) -> None:
    """A saved tune-out comes back as saved, each server's ``general`` its own row, with what it
    holds: the agent's unacked wakes from that one channel after what it handed over."""
    async with open_journal(journal_place) as journal:
        [before] = await journal.record_inbound([(on("b", "m-0"), [KAI])])  # sent before the tune-out
        journal.save_tune_out(tune_out(handed_through=before.seq))
        journal.save_tune_out(tune_out(server_id="a", max_wakes=None, duration=None, ends_at=None))
        recorded = await journal.record_inbound(
            [(on("b", "m-1"), [KAI, ANN]), (on("a", "m-1"), [KAI]), (on("b", "m-2"), [KAI]), (on("b", "m-3"), [KAI])]
        )
        b1, a1, b2, b3 = (r.seq for r in recorded)
        # A summary handed b1 over; the host acked b2 (held wakes are acked like any other).
        journal.save_tune_out_progress("kai", "b", "general", wakes=1, handed_through=b1, summary=None)
        journal.save_tune_out_summary("kai", "b", "general", "quiet, mostly")
        await journal.ack_deliveries(["kai"], [b2])
        await journal.flush()
    async with open_journal(journal_place) as journal:
        saved = {row.server_id: row for row in await journal.saved_tune_outs()}
        assert saved["b"] == tune_out(wakes=1, handed_through=b1, summary="quiet, mostly", held=(b3,))
        assert saved["a"] == tune_out(server_id="a", max_wakes=None, duration=None, ends_at=None, held=(a1,))
        journal.forget_tune_out("kai", "b", "general")
        await journal.flush()
    async with open_journal(journal_place) as journal:
        assert [row.server_id for row in await journal.saved_tune_outs()] == ["a"]


async def test_channel_decisions_survive_a_restart_one_per_agent_and_channel_pair(journal_place: JournalPlace) -> None:
    async with open_journal(journal_place) as journal:
        journal.record_channel_decision("kai", "a", "general", "open")
        journal.record_channel_decision("kai", "b", "general", "closed")  # same id, other server: its own row
        journal.record_channel_decision("mo", "a", "general", "closed")
        journal.record_channel_decision("kai", "a", "c2", "open")
        journal.record_decline("kai", "a", "c2")  # a decline replaces the open decision
        journal.record_decline("mo", "b", "general")
        journal.record_channel_decision("mo", "b", "general", "open")  # and an open replaces a decline
        await journal.flush()
    async with open_journal(journal_place) as journal:
        assert sorted(journal.channel_decisions()) == [
            ("kai", "a", "general", "open"),
            ("kai", "b", "general", "closed"),
            ("mo", "a", "general", "closed"),
            ("mo", "b", "general", "open"),
        ]
        assert journal.declines() == [("kai", "a", "c2")]


async def test_a_version_2_journal_is_migrated_to_the_current_version_keeping_what_it_held(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    async with open_journal(path) as journal:
        [owed] = await journal.record_inbound([(on("b", "m-1"), [KAI])])
        journal.raise_fork_generation("kai", "b", "dm-1", 2)
        journal.record_decline("kai", "a", "general")
        await journal.flush()
    # What version 2 was: everything but the tune_outs table.
    db = sqlite3.connect(str(path))
    db.execute("DROP TABLE tune_outs")
    db.execute("PRAGMA user_version = 2")
    db.commit()
    db.close()
    with capture_logs() as logs:
        journal = Journal(path)
    try:
        assert [e for e in logs if e["event"] == "journal.migrated"] == [
            {"event": "journal.migrated", "log_level": "info", "journal": str(path), "from_version": 2, "to_version": 4}
        ]
        assert journal.unacked_count("kai") == 1 and journal.last_seq() == owed.seq
        assert journal.fork_generations() == [("kai", "b", "dm-1", 2)]
        assert journal.declines() == [("kai", "a", "general")]
        db = sqlite3.connect(str(path))
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 4
        columns = [row[1] for row in db.execute("PRAGMA table_info(tune_outs)")]
        assert columns[:3] == ["agent", "server", "channel"]  # a pair of columns, never a joined key
        db.close()
    finally:
        journal.close()
    async with open_journal(path) as journal:
        journal.save_tune_out(tune_out())
        await journal.flush()
        assert [row.held for row in await journal.saved_tune_outs()] == [(owed.seq,)]


def test_a_second_journal_on_the_same_file_is_refused_naming_the_file_and_pid(journal_place: JournalPlace) -> None:
    journal = journal_place.open()
    try:
        with pytest.raises(JournalLocked) as refused:
            journal_place.open()
        import os

        refusal = str(refused.value)
        if journal_place.path is not None:
            assert str(journal_place.path) in refusal and f"pid {os.getpid()}" in refusal
        else:
            # The database's advisory lock: the DSN (without a password) and who holds it.
            assert journal.where in refusal and "backend pid" in refusal
    finally:
        journal.close()
    journal_place.open().close()  # released with the first


async def test_a_failed_commit_is_an_error_for_its_callers_not_silence(journal_place: JournalPlace) -> None:
    with capture_logs() as logs:
        async with open_journal(journal_place) as journal:
            journal._backend.writer().execute("DROP TABLE deliveries")  # the disk "fails" under the next commit
            with pytest.raises(Exception) as failed:
                await journal.record_inbound([(message("m-1"), [KAI])])
            assert "deliveries" in str(failed.value)
            assert journal.statistics().failing is not None
    assert [entry for entry in logs if entry["event"] == "journal.commit.failed"]


async def test_an_op_run_outside_a_savepoint_that_fails_fails_alone(journal_place: JournalPlace) -> None:
    """The hot ops run bare; should one meet a constraint, the batch runs again isolated."""
    import sqlite3 as _sqlite3
    from typing import ClassVar

    import attrs

    from mcpl_router.store.writer import _Op

    @attrs.define(eq=False)
    class _Breaks(_Op):
        isolated: ClassVar[bool] = False

        def apply(self, db: _sqlite3.Connection, journal: object) -> None:
            db.execute("INSERT INTO agents (name, spec) VALUES ('x', NULL)")  # NOT NULL

    async with open_journal(journal_place) as journal:
        before = await journal.submit_inbound([(message("m-1"), [KAI])])
        broken = await journal._submit(_Breaks())
        after = await journal.submit_inbound([(message("m-2"), [KAI])])
        assert [r.seq for r in await before()] == [1]
        with pytest.raises(JournalFailure):
            await broken.wait()
        assert [r.seq for r in await after()] == [2]
        assert journal.unacked_count("kai") == 2


async def test_one_commit_sees_its_own_events_and_never_gives_a_pruned_seq_again(journal_place: JournalPlace) -> None:
    """A commit's inbound events are written together: a re-send within it is a duplicate of
    the first, a new message under its id is new, and the newest seq, acked and pruned, is
    not given to the next message."""
    async with open_journal(journal_place, retention=0.05) as journal:
        first, again, reused, other = await journal.record_inbound(
            [(message("m-1"), [KAI]), (message("m-1"), [KAI]), (message("m-1", "other words"), [KAI]), (message("m-2"), [])]
        )
        assert (first.duplicate, again.duplicate, again.seq) == (False, True, first.seq)
        assert not reused.duplicate and reused.reused_id and reused.seq == first.seq + 1
        assert not other.duplicate and other.seq == reused.seq + 1
        assert journal.unacked_count("kai") == 2  # m-2 woke nobody
        await journal.ack_deliveries(["kai"], [first.seq, reused.seq])
        await trio.sleep(0.1)
        await journal._prune()
        assert journal.events() == []
        [later] = await journal.record_inbound([(message("m-3"), [KAI])])
        assert later.seq == other.seq + 1


async def test_an_acks_on_done_is_told_once_durable_nothing_to_ack_or_not_queued(journal_place: JournalPlace) -> None:
    """The outbox forgets an ack it remembers on this callback, so it comes in every case, once."""
    told: list[str] = []
    async with open_journal(journal_place) as journal:
        seq = (await (await journal.submit_inbound([(message("m-1"), [KAI])]))())[0].seq
        wait = await journal.submit_ack(["kai"], [seq], on_done=lambda failure: told.append(f"durable {failure}"))
        assert told == [] and await wait() == 1 and told == ["durable None"]
        await journal.submit_ack(["kai"], [], on_done=lambda failure: told.append(f"nothing {failure}"))
        assert told[-1] == "nothing None"
        with trio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(trio.Cancelled):
                await journal.submit_ack([], [seq], on_done=lambda failure: told.append(f"nothing, cancelled {failure}"))
        assert told[-1] == "nothing, cancelled None"
        with trio.CancelScope() as scope:
            scope.cancel()
            with pytest.raises(trio.Cancelled):
                await journal.submit_ack(["kai"], [seq], on_done=lambda failure: told.append(type(failure).__name__))
        assert told[-1] == "JournalFailure"
    with pytest.raises(JournalFailure):
        await journal.submit_ack(["kai"], [seq], on_done=lambda failure: told.append(f"closed {type(failure).__name__}"))
    assert told[-1] == "closed JournalFailure" and len(told) == 5


async def test_each_agents_latest_acked_wake_on_a_channel_is_read_for_its_default(journal_place: JournalPlace) -> None:
    """What a start sets each agent's default channel from: its newest acked delivery whose event
    has a channel; an unacked one, a push without a channel, another agent's, don't count."""
    kai, bo = Delivery("kai", "message", (), False), Delivery("bo", "message", (), False)

    def message(server: str, channel: str, message_id: str) -> InboundEvent:
        return InboundEvent(server, channel, EventKind.MESSAGE, message_id, {"messageId": message_id, "threadId": "t-1"})

    async with open_journal(journal_place) as journal:
        first, second, third = await journal.record_inbound(
            [(message("a", "general", "m-1"), [kai, bo]), (message("b", "general", "m-2"), [kai]), (message("a", "lounge", "m-3"), [kai])]
        )
        [push] = await journal.record_inbound([(InboundEvent("a", None, EventKind.PUSH, "e-1", {"eventId": "e-1"}), [kai])])
        await journal.ack_deliveries(["kai"], [first.seq, second.seq, push.seq])  # m-3 stays unacked
        await journal.ack_deliveries(["bo"], [first.seq])
        found = await journal.latest_acked_channels(["kai", "bo", "nobody"])
    assert {agent: (server, channel, payload["messageId"]) for agent, (server, channel, payload) in found.items()} == {  # type: ignore[index]
        "kai": ("b", "general", "m-2"),
        "bo": ("a", "general", "m-1"),
    }
