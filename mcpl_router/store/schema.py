"""The journal's statements, and its SQLite file's schema, migration and lock.

The statements are written once, in SQL both backends understand, with ``?`` placeholders;
the few that differ are each backend's :class:`~mcpl_router.store.backend.Dialect` (the
SQLite texts are here, PostgreSQL's in :mod:`~mcpl_router.store.postgres_backend`). Every
statement run per message, per ack or per turn is in :data:`HOT_STATEMENTS`, and
``tests/unit/test_journal.py`` asserts that each is an indexed search, on both backends.
"""

from __future__ import annotations

import errno
import fcntl
import io
import os
import sqlite3
import time
from pathlib import Path
from typing import Final

from mcpl_router.logs import Logger
from mcpl_router.store.backend import Connection


class JournalRefused(Exception):
    """The journal can't be trusted or used as it is; ``str()`` is one line: the file, what is
    wrong, what to do (``mcpl-router run`` says it and exits 2)."""

    def __init__(self, path: Path | str, problem: str, fix: str) -> None:
        self.path = str(path)
        self.problem = problem
        self.fix = fix
        super().__init__(f"journal {path}: {problem} {fix}")


class JournalLocked(Exception):
    """Another daemon holds this journal; the message names the file and its pid."""


#: 1: digests, deliveries by (seq, agent), settled drafts; 2: fork generations; 3: tune-outs;
#: 4: channel decisions (open, closed).
SCHEMA_VERSION: Final = 4

SCHEMA = """
CREATE TABLE IF NOT EXISTS inbound (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    server TEXT NOT NULL,
    channel TEXT,
    kind TEXT NOT NULL,
    dedup TEXT NOT NULL,
    -- What the message said (a digest): a re-send is the same id with the same digest.
    digest BLOB,
    payload BLOB NOT NULL,
    received_at REAL NOT NULL,
    acked INTEGER NOT NULL DEFAULT 0
);
-- Few indexes on purpose: each costs a B-tree insert per message. Pruning walks the primary
-- key (seq follows received_at), so it needs none of its own.
CREATE INDEX IF NOT EXISTS inbound_dedup ON inbound (server, kind, dedup, seq);
-- One row per agent an inbound event woke; written in the event's own transaction, so a wake
-- is durable before the server hears "accepted". Re-sent to the agent's owner until acked.
-- Keyed by (seq, agent) without a rowid: one B-tree serves the row, its acks and its pruning.
CREATE TABLE IF NOT EXISTS deliveries (
    seq INTEGER NOT NULL REFERENCES inbound (seq),
    agent TEXT NOT NULL,
    reason TEXT NOT NULL,
    tags BLOB NOT NULL,
    addressed INTEGER NOT NULL,
    acked INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (seq, agent)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS deliveries_unacked ON deliveries (agent, acked, seq);
-- Agents hosts declared, so wakes for them are kept while their host is away (and across
-- restarts). Config agents are not stored: the config declares them at every start.
CREATE TABLE IF NOT EXISTS agents (
    name TEXT PRIMARY KEY,
    spec BLOB NOT NULL
);
-- channel_decline: an agent chose to stay out of a channel (server + id: a channel is a pair).
CREATE TABLE IF NOT EXISTS declines (
    agent TEXT NOT NULL,
    server TEXT NOT NULL,
    channel TEXT NOT NULL,
    declined_at REAL NOT NULL,
    PRIMARY KEY (agent, server, channel)
);
-- channel_open / channel_close (and a connector send that opened a channel): an agent's last
-- decision for a channel, so the daemon can hold the server to it after either side restarts
-- (a server that keeps no subscriptions registers the channel closed again). A decline is the
-- declines table's; an agent has one decision per channel, in one table or the other.
CREATE TABLE IF NOT EXISTS channel_decisions (
    agent TEXT NOT NULL,
    server TEXT NOT NULL,
    channel TEXT NOT NULL,
    state TEXT NOT NULL,
    decided_at REAL NOT NULL,
    PRIMARY KEY (agent, server, channel)
) WITHOUT ROWID;
-- Drafts: plain speech held instead of posted (mcpl_router.routing.drafts), one row each,
-- rewritten whole on every change (an attempt is saved before its publish goes out).
-- settled_at: when it was delivered or dismissed (NULL while it is live), for pruning.
CREATE TABLE IF NOT EXISTS drafts (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    created_at REAL NOT NULL,
    row BLOB NOT NULL,
    settled_at REAL
);
CREATE INDEX IF NOT EXISTS drafts_by_agent ON drafts (agent, created_at);
CREATE INDEX IF NOT EXISTS drafts_settled ON drafts (settled_at);
-- Conversation forks (routing/forks.py): the highest generation each binding key (an agent and
-- a channel, server + id) has used, so a fork name is never proposed twice, across restarts.
-- Only ever raised (SQL_RAISE_FORK_GENERATION), never lowered.
CREATE TABLE IF NOT EXISTS fork_generations (
    agent TEXT NOT NULL,
    server TEXT NOT NULL,
    channel TEXT NOT NULL,
    generation INTEGER NOT NULL,
    PRIMARY KEY (agent, server, channel)
) WITHOUT ROWID;
-- Tune-outs (routing/tuneout.py), so a restart resumes them: one row per agent and channel
-- (server + id), made or replaced at tune_out, deleted when it is cancelled or ends. The
-- settings as given; started_at and ends_at are wall-clock (ends_at NULL: no duration).
-- wakes: summary wakes sent so far (maxWakes counts on). handed_through: the newest seq no
-- longer held (the journal's last seq at entry, then each summary's newest); the agent's
-- unacked deliveries from the channel after it are what the tune-out holds at a restart.
-- summary: a delivered summary not handed over yet.
CREATE TABLE IF NOT EXISTS tune_outs (
    agent TEXT NOT NULL,
    server TEXT NOT NULL,
    channel TEXT NOT NULL,
    cadence REAL NOT NULL,
    backlog_cap INTEGER NOT NULL,
    max_wakes INTEGER,
    duration REAL,
    started_at REAL NOT NULL,
    ends_at REAL,
    wakes INTEGER NOT NULL DEFAULT 0,
    handed_through INTEGER NOT NULL DEFAULT 0,
    summary TEXT,
    PRIMARY KEY (agent, server, channel)
) WITHOUT ROWID;
"""


# The statements run once per message or per ack: each must be an indexed search.
SQL_FIND_DUPLICATE: Final = "SELECT seq, digest FROM inbound WHERE server = ? AND kind = ? AND dedup = ? ORDER BY seq DESC LIMIT 1"
#: The latest row under each of many dedup keys (a JSON array) of one server and kind: a commit's
#: duplicate check in one statement (each key an index search; ``digest`` is the latest row's).
SQL_FIND_DUPLICATES: Final = (
    "SELECT dedup, MAX(seq), digest FROM inbound WHERE server = ? AND kind = ? AND dedup IN (SELECT value FROM json_each(?))"
    " GROUP BY dedup"
)
#: The highest seq ever given (pruning may have deleted it; AUTOINCREMENT never gives it again):
#: a commit numbers its events after it. Once per commit; sqlite_sequence has a row per table.
SQL_LAST_SEQ_GIVEN: Final = (
    "SELECT MAX(COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'inbound'), 0), COALESCE((SELECT MAX(seq) FROM inbound), 0))"
)
SQL_INSERT_EVENT_AT: Final = (
    "INSERT INTO inbound (seq, server, channel, kind, dedup, digest, payload, received_at, acked) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
SQL_INSERT_DELIVERY: Final = (
    "INSERT INTO deliveries (agent, seq, reason, tags, addressed) VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
#: An ack of many seqs (a JSON array) in one statement: each seq is an index lookup.
SQL_ACK_DELIVERIES: Final = (
    "UPDATE deliveries SET acked = 1 WHERE agent = ? AND acked = 0 AND seq IN (SELECT value FROM json_each(?))"
)
SQL_ACK_EVENTS: Final = (
    "UPDATE inbound SET acked = 1 WHERE seq IN (SELECT value FROM json_each(?)) AND acked = 0"
    " AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.seq = inbound.seq AND d.acked = 0)"
)
SQL_UNACKED_DELIVERIES: Final = (
    "SELECT d.agent, d.reason, d.tags, d.addressed, i.seq, i.server, i.channel, i.kind, i.payload, i.received_at"
    " FROM deliveries d JOIN inbound i ON i.seq = d.seq"
    " WHERE d.agent = ? AND d.acked = 0 AND d.seq > ? ORDER BY d.seq LIMIT ?"
)
#: A row a failed commit left, recorded by a later one (store/writer.py ``_renumber``): its
#: event and deliveries move to the seq that commit gives it, unless a delivery of it was acked.
SQL_ANY_DELIVERY_ACKED: Final = "SELECT 1 FROM deliveries WHERE seq = ? AND acked = 1 LIMIT 1"
SQL_RENUMBER_EVENT: Final = "UPDATE inbound SET seq = ?, received_at = ? WHERE seq = ?"
SQL_RENUMBER_DELIVERIES: Final = "UPDATE deliveries SET seq = ? WHERE seq = ?"
SQL_DELIVERY: Final = "SELECT reason, tags, addressed FROM deliveries WHERE agent = ? AND seq = ?"
SQL_EVENT: Final = "SELECT seq, server, channel, kind, payload, received_at FROM inbound WHERE seq = ?"
#: An agent's latest acked wakes, newest first (its default channel at a start is the first of
#: them on a channel: docs/host-api.md). Read with SQL_EVENT each, until one has a channel.
SQL_LATEST_ACKED: Final = "SELECT seq FROM deliveries WHERE agent = ? AND acked = 1 ORDER BY seq DESC LIMIT ?"
SQL_SAVE_DRAFT: Final = (
    "INSERT INTO drafts (id, agent, created_at, row, settled_at) VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT (id) DO UPDATE SET row = excluded.row, settled_at = excluded.settled_at"
)
SQL_PRUNABLE_EVENTS: Final = "SELECT seq FROM inbound WHERE seq <= ? AND acked = 1 ORDER BY seq LIMIT ?"
SQL_FIRST_FROM: Final = "SELECT seq, received_at FROM inbound WHERE seq >= ? ORDER BY seq LIMIT 1"
SQL_PRUNE_DELIVERIES: Final = "DELETE FROM deliveries WHERE seq = ?"
SQL_PRUNE_EVENT: Final = "DELETE FROM inbound WHERE seq = ?"
SQL_PRUNE_DRAFTS: Final = "DELETE FROM drafts WHERE settled_at IS NOT NULL AND settled_at < ?"
#: A fork's spawn: the binding key's counter raised to its generation (a lower one changes nothing),
#: then the row made if it had none.
SQL_RAISE_FORK_GENERATION: Final = (
    "UPDATE fork_generations SET generation = ? WHERE agent = ? AND server = ? AND channel = ? AND generation < ?"
)
SQL_ADD_FORK_GENERATION: Final = (
    "INSERT INTO fork_generations (agent, server, channel, generation) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING"
)
#: A fork whose spawn failed: what it is owed (its first seq and how many), handed to its trunk;
#: a row the trunk has already (never, in practice: a fork's delivery replaced the trunk's) is
#: acked for the fork instead, so nothing stays owed to an agent that does not exist.
SQL_OWED_RANGE: Final = "SELECT MIN(seq), COUNT(*) FROM deliveries WHERE agent = ? AND acked = 0"
#: (to, from, to): a row the trunk already has for that seq is left to SQL_ACK_ALL_OF.
SQL_HAND_OVER: Final = (
    "UPDATE deliveries SET agent = ? WHERE agent = ? AND acked = 0"
    " AND NOT EXISTS (SELECT 1 FROM deliveries mine WHERE mine.seq = deliveries.seq AND mine.agent = ?)"
)
SQL_ACK_ALL_OF: Final = "UPDATE deliveries SET acked = 1 WHERE agent = ? AND acked = 0"
#: tune_out (entering again replaces the row: new settings and start, what it holds kept).
SQL_SAVE_TUNE_OUT: Final = (
    "INSERT INTO tune_outs (agent, server, channel, cadence, backlog_cap, max_wakes, duration, started_at, ends_at,"
    " wakes, handed_through, summary) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (agent, server, channel) DO UPDATE SET cadence = excluded.cadence, backlog_cap = excluded.backlog_cap,"
    " max_wakes = excluded.max_wakes, duration = excluded.duration, started_at = excluded.started_at,"
    " ends_at = excluded.ends_at, wakes = excluded.wakes, handed_through = excluded.handed_through,"
    " summary = excluded.summary"
)
#: A summary wake went out: what it handed over is no longer held.
SQL_TUNE_OUT_PROGRESS: Final = (
    "UPDATE tune_outs SET wakes = ?, handed_through = ?, summary = ? WHERE agent = ? AND server = ? AND channel = ?"
)
#: deliver_summary: kept for the next summary wake.
SQL_TUNE_OUT_SUMMARY: Final = "UPDATE tune_outs SET summary = ? WHERE agent = ? AND server = ? AND channel = ?"
SQL_FORGET_TUNE_OUT: Final = "DELETE FROM tune_outs WHERE agent = ? AND server = ? AND channel = ?"
#: At start-up, per saved tune-out: the wakes it holds (the agent's unacked deliveries from its
#: channel after what it last handed over), oldest first. Walks the agent's unacked deliveries
#: by index, each event by its primary key.
SQL_TUNE_OUT_HELD: Final = (
    "SELECT d.seq FROM deliveries d JOIN inbound i ON i.seq = d.seq"
    " WHERE d.agent = ? AND d.acked = 0 AND d.seq > ? AND i.server = ? AND i.channel = ? ORDER BY d.seq"
)

#: Every statement above that runs per message, per ack or per turn, and the tune-outs' (per call,
#: per summary, per saved tune-out at start-up), for the query-plan test.
HOT_STATEMENTS: Final = {
    "find duplicate": (SQL_FIND_DUPLICATE, ("s", "message", "k")),
    "find duplicates": (SQL_FIND_DUPLICATES, ("s", "message", '["k", "l"]')),
    "ack deliveries": (SQL_ACK_DELIVERIES, ("kai", "[1, 2]")),
    "ack events": (SQL_ACK_EVENTS, ("[1, 2]",)),
    "unacked deliveries": (SQL_UNACKED_DELIVERIES, ("kai", 0, 100)),
    "one delivery": (SQL_DELIVERY, ("kai", 1)),
    "any delivery acked": (SQL_ANY_DELIVERY_ACKED, (1,)),
    "renumber event": (SQL_RENUMBER_EVENT, (9, 0.0, 1)),
    "renumber deliveries": (SQL_RENUMBER_DELIVERIES, (9, 1)),
    "one event": (SQL_EVENT, (1,)),
    "prunable events": (SQL_PRUNABLE_EVENTS, (100, 10)),
    "prune cutoff probe": (SQL_FIRST_FROM, (1,)),
    "prune deliveries": (SQL_PRUNE_DELIVERIES, (1,)),
    "prune event": (SQL_PRUNE_EVENT, (1,)),
    "prune drafts": (SQL_PRUNE_DRAFTS, (0.0,)),
    "raise fork generation": (SQL_RAISE_FORK_GENERATION, (2, "kai", "b", "general", 2)),
    "owed range": (SQL_OWED_RANGE, ("kai-a-dm-1",)),
    "latest acked": (SQL_LATEST_ACKED, ("kai", 64)),
    "hand over": (SQL_HAND_OVER, ("kai", "kai-a-dm-1", "kai")),
    "ack all of": (SQL_ACK_ALL_OF, ("kai-a-dm-1",)),
    "tune-out progress": (SQL_TUNE_OUT_PROGRESS, (1, 10, None, "kai", "b", "general")),
    "tune-out summary": (SQL_TUNE_OUT_SUMMARY, ("text", "kai", "b", "general")),
    "forget tune-out": (SQL_FORGET_TUNE_OUT, ("kai", "b", "general")),
    "tune-out held": (SQL_TUNE_OUT_HELD, ("kai", 0, "b", "general")),
}



def is_current(db: sqlite3.Connection) -> bool:
    """Whether the file is at :data:`SCHEMA_VERSION` (a migration would write nothing)."""
    return int(db.execute("PRAGMA user_version").fetchone()[0]) == SCHEMA_VERSION


def migrate(db: sqlite3.Connection, log: Logger) -> None:
    """Bring the file to :data:`SCHEMA_VERSION`, one version at a time.

    Version 0 journals are rebuilt in place; versions 1 and 2 lack only whole tables (fork
    generations came with 2, tune-outs with 3, channel decisions with 4), which the schema
    script makes. A new file
    (version 0, no tables) is no migration.
    """
    version = int(db.execute("PRAGMA user_version").fetchone()[0])
    if version == SCHEMA_VERSION:
        # Nothing to write: a start on a full disk can still read and deliver the backlog.
        return
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if version < 1 and "inbound" in tables:
        # Version 0 made (server, kind, dedup) unique and kept no digest: rebuild inbound
        # without the constraint, and give drafts their settled time.
        # Legacy rename: otherwise SQLite rewrites deliveries' REFERENCES inbound to the old
        # table's new name, which is dropped below.
        db.execute("PRAGMA legacy_alter_table = ON")
        db.execute("BEGIN IMMEDIATE")
        db.execute("ALTER TABLE inbound RENAME TO inbound_v0")
        # Statement by statement: executescript would commit the transaction halfway.
        db.execute("DROP INDEX IF EXISTS inbound_dedup")
        db.execute("DROP INDEX IF EXISTS inbound_prunable")
        for statement in statements(SCHEMA):
            if "drafts_settled" not in statement and "deliveries" not in statement:
                db.execute(statement)
        db.execute(
            "INSERT INTO inbound (seq, server, channel, kind, dedup, digest, payload, received_at, acked)"
            " SELECT seq, server, channel, kind, dedup, NULL, payload, received_at, acked FROM inbound_v0"
        )
        db.execute("DROP TABLE inbound_v0")
        # Deliveries move to (seq, agent) without a rowid.
        db.execute("ALTER TABLE deliveries RENAME TO deliveries_v0")
        db.execute("DROP INDEX IF EXISTS deliveries_unacked")
        db.execute("DROP INDEX IF EXISTS deliveries_by_seq")
        for statement in statements(SCHEMA):
            if "deliveries" in statement and statement.startswith("CREATE"):
                db.execute(statement)
        db.execute(
            "INSERT INTO deliveries (seq, agent, reason, tags, addressed, acked)"
            " SELECT seq, agent, reason, tags, addressed, acked FROM deliveries_v0"
        )
        db.execute("DROP TABLE deliveries_v0")
        columns = {row[1] for row in db.execute("PRAGMA table_info(drafts)")}
        if "settled_at" not in columns:
            db.execute("ALTER TABLE drafts ADD COLUMN settled_at REAL")
            # Drafts already delivered or dismissed are settled as of now: pruned after retention.
            db.execute(
                "UPDATE drafts SET settled_at = ? WHERE json_extract(CAST(row AS TEXT), '$.state') IN ('delivered', 'dismissed')",
                (time.time(),),
            )
        db.execute("COMMIT")
        db.execute("PRAGMA legacy_alter_table = OFF")
        log.info("journal.migrated", from_version=version, to_version=SCHEMA_VERSION)
    elif 0 < version < SCHEMA_VERSION:
        # 1 → 2: fork_generations is new; 2 → 3: tune_outs; 3 → 4: channel_decisions. Each is
        # a whole table the script below makes (IF NOT EXISTS), so any of them is one step.
        log.info("journal.migrated", from_version=version, to_version=SCHEMA_VERSION)
    db.executescript(SCHEMA)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def last_seq_before(db: Connection, cutoff: float) -> int:
    """The newest seq received before ``cutoff`` (0 if none), in O(log n) primary-key probes.

    Seqs are assigned in commit order and ``received_at`` at commit, so it grows with seq.
    """
    first = db.execute(SQL_FIRST_FROM, (0,)).fetchone()
    if first is None or first[1] >= cutoff:
        return 0
    low = int(first[0])  # received before the cutoff
    high = int(db.execute("SELECT MAX(seq) FROM inbound").fetchone()[0])
    while low < high:
        middle = (low + high + 1) // 2
        seq, received_at = db.execute(SQL_FIRST_FROM, (middle,)).fetchone()
        if received_at < cutoff:
            low = int(seq)
        else:
            high = middle - 1
    return low


def statements(script: str) -> list[str]:
    """The SQL statements of ``script``, one by one (comments may hold semicolons)."""
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        if line.lstrip().startswith("--"):
            continue
        buffer += line
        if sqlite3.complete_statement(buffer):
            statements.append(buffer.strip())
            buffer = ""
    return statements


def lock(path: Path) -> io.TextIOWrapper:
    """Take ``<path>.lock`` (flock) and write our pid in it, or raise :class:`JournalLocked`."""
    lock_path = Path(f"{path}.lock")
    handle = open(lock_path, "a+", encoding="utf-8")  # noqa: SIM115 - held open while we run
    try:
        os.chmod(lock_path, 0o600)
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        if exc.errno in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
            raise JournalLocked(
                f"the journal {path} is in use by another daemon (pid {holder}); stop that daemon, "
                "or give this one its own journal.path"
            ) from None
        raise
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"{os.getpid()}\n")
        handle.flush()
    except OSError:
        pass  # the pid is for a person reading the file; the lock is the flock (a full disk)
    return handle
