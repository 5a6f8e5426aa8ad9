"""The links' lease in the journal's database (store/leases.py), on a real PostgreSQL.

What a cluster's safety rests on: one holder at a time; a takeover only after expiry, raising
the epoch; a lost holder can neither renew nor commit a journal transaction; a commit under
way finishes before a takeover can; a release lets a standby in at once. And the local
deadline a holder checks before sending runs out before the database's expiry.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator

import pytest
import trio

from mcpl_router.store.records import EventKind
from mcpl_router.jsonrpc.fenced import FencedStream
from mcpl_router.store.journal import Delivery, InboundEvent, JournalFailure
from mcpl_router.store.leases import (
    LINKS,
    LeaseFence,
    LeaseLost,
    acquire,
    cluster_view,
    ensure_cluster_tables,
    forget_gone_nodes,
    heartbeat,
    release,
    renew,
)
from mcpl_router.store.postgres_backend import PgConnection, connect
from mcpl_router.testing import postgres
from mcpl_router.testing.journal import JournalPlace, open_journal

_databases = itertools.count(1)


@pytest.fixture
def dsn(postgres_server: postgres.Server) -> str:
    return postgres.fresh_database(postgres_server, f"leases_{next(_databases)}")


@pytest.fixture
def db(dsn: str) -> Iterator[PgConnection]:
    conn = connect(dsn, None)
    ensure_cluster_tables(conn)
    try:
        yield conn
    finally:
        conn.close()


def test_one_holder_a_takeover_only_after_expiry_and_it_raises_the_epoch(db: PgConnection) -> None:
    first, _ = acquire(db, LINKS, "a", 0.5)
    assert first is not None and (first.node, first.epoch) == ("a", 1)
    refused, _ = acquire(db, LINKS, "b", 0.5)
    assert refused is None  # a lives
    assert acquire(db, LINKS, "a", 0.5)[0] is None  # not even its holder takes it again while it lives
    assert renew(db, first, 0.5) is not None
    time.sleep(0.6)
    taken, _ = acquire(db, LINKS, "b", 5)
    assert taken is not None and (taken.node, taken.epoch) == ("b", 2)
    # The old holder's renewal finds another epoch: it has lost the lease.
    assert renew(db, first, 5) is None
    assert release(db, first) is False
    assert release(db, taken) is True
    again, _ = acquire(db, LINKS, "a", 5)  # released: taken at once, no wait for the lease
    assert again is not None and again.epoch == 3


def test_a_lost_holder_commits_nothing(dsn: str, db: PgConnection) -> None:
    term, valid_until = acquire(db, LINKS, "a", 1.0)
    assert term is not None
    fence = LeaseFence(term, valid_until)
    event = InboundEvent("s", "general", EventKind.MESSAGE, "m-1", {"messageId": "m-1"})
    kai = Delivery("kai", "message", (), False)

    async def main() -> None:
        async with open_journal(JournalPlace(dsn=dsn), fence=fence) as journal:
            [recorded] = await journal.record_inbound([(event, [kai])])
            assert not recorded.duplicate
            await trio.sleep(1.1)
            taken, _ = acquire(db, LINKS, "b", 5)
            assert taken is not None
            second = InboundEvent("s", "general", EventKind.MESSAGE, "m-2", {"messageId": "m-2"})
            with pytest.raises(JournalFailure, match="lease"):
                await journal.record_inbound([(second, [kai])])
            assert fence.refusal() is not None

    trio.run(main)
    assert db.execute("SELECT count(*) FROM inbound").fetchone()[0] == 1


def test_the_fence_is_checked_in_the_database_not_only_against_the_local_clock(db: PgConnection) -> None:
    term, valid_until = acquire(db, LINKS, "a", 1.0)
    assert term is not None
    # A fence that believes itself valid for an hour (a clock gone wrong): the row still refuses.
    fence = LeaseFence(term, time.monotonic() + 3600)
    db.execute("BEGIN")
    fence.check_in(db)
    db.execute("COMMIT")
    time.sleep(1.1)
    assert acquire(db, LINKS, "b", 5)[0] is not None
    db.execute("BEGIN")
    with pytest.raises(LeaseLost, match="gone from the database"):
        fence.check_in(db)
    db.execute("ROLLBACK")
    assert fence.loss is not None and fence.refusal() == fence.loss


def test_a_takeover_waits_for_a_fenced_commit_under_way(dsn: str, db: PgConnection) -> None:
    term, valid_until = acquire(db, LINKS, "a", 0.5)
    assert term is not None
    fence = LeaseFence(term, time.monotonic() + 3600)
    writer = connect(dsn, None)
    try:
        writer.execute("BEGIN")
        fence.check_in(writer)  # the share lock is held until this transaction ends
        time.sleep(0.6)  # expired meanwhile
        other = connect(dsn, None)
        try:
            other.execute("SET lock_timeout = '300ms'")
            import psycopg

            # The taking waits on the share lock: the commit under way finishes first.
            with pytest.raises(psycopg.errors.LockNotAvailable):
                acquire(other, LINKS, "b", 5)
            writer.execute("COMMIT")
            taken, _ = acquire(other, LINKS, "b", 5)
            assert taken is not None and taken.epoch == 2
        finally:
            other.close()
    finally:
        writer.close()


def test_the_local_deadline_ends_before_the_database_expiry_and_breaks_the_stream(db: PgConnection) -> None:
    started = time.monotonic()
    term, valid_until = acquire(db, LINKS, "a", 2.0)
    assert term is not None
    # 0.8 of the lease, counted from before the statement: earlier than the database's expiry.
    assert started + 1.5 < valid_until <= time.monotonic() + 1.6
    fence = LeaseFence(term, valid_until)
    assert fence.refusal() is None

    sent: list[bytes] = []

    class Inner:
        line_oriented = True

        async def send_message(self, data: bytes) -> None:
            sent.append(data)

        async def send_messages(self, messages: list[bytes], *, progress: object = None) -> None:
            sent.extend(messages)

        async def receive_message(self) -> bytes:
            raise trio.EndOfChannel

        async def aclose(self) -> None:
            pass

    stream = FencedStream(Inner(), fence.refusal)

    async def main() -> None:
        await stream.send_messages([b"one"])
        fence.valid_until = time.monotonic()  # as after a pause past the deadline
        with pytest.raises(trio.BrokenResourceError, match="ran out unrenewed"):
            await stream.send_messages([b"two"])

    trio.run(main)
    assert sent == [b"one"] and stream.refused == 1


def test_the_view_shows_nodes_and_the_holder(db: PgConnection) -> None:
    heartbeat(db, "a", "holding", {"pid": 1})
    heartbeat(db, "b", "standby", {"pid": 2})
    term, _ = acquire(db, LINKS, "a", 5)
    assert term is not None
    view = cluster_view(db)
    assert [(n["node"], n["state"], n["info"]) for n in view["nodes"]] == [("a", "holding", {"pid": 1}), ("b", "standby", {"pid": 2})]  # type: ignore[index]
    [lease] = view["leases"]  # type: ignore[misc]
    assert (lease["node"], lease["epoch"]) == ("a", 1) and 4 < lease["expiresIn"] <= 5


def test_nodes_started_together_on_a_fresh_database_all_make_the_tables(postgres_server: postgres.Server) -> None:
    """Two ``CREATE TABLE IF NOT EXISTS`` at once on a fresh database: without one at a time,
    the second fails on the catalog's unique index and its node exits at start (seen with
    deploy/cluster-local.py's two nodes)."""
    import threading

    for round_ in range(5):
        dsn = postgres.fresh_database(postgres_server, f"leases_together_{round_}")
        conns = [connect(dsn, None) for _ in range(6)]
        start = threading.Barrier(len(conns))
        failures: list[BaseException] = []

        def make(conn: PgConnection) -> None:
            start.wait()
            try:
                ensure_cluster_tables(conn)
            except Exception as exc:
                failures.append(exc)

        threads = [threading.Thread(target=make, args=(conn,)) for conn in conns]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=30)
        finally:
            for conn in conns:
                conn.close()
        assert failures == []
    reader = connect(dsn, None)
    try:
        assert cluster_view(reader) == {"nodes": [], "leases": []}
    finally:
        reader.close()


def test_a_node_unseen_for_a_day_is_forgotten(db: PgConnection) -> None:
    heartbeat(db, "old", "stopped", {})
    heartbeat(db, "live", "standby", {})
    db.execute("UPDATE cluster_nodes SET seen_at = clock_timestamp() - interval '25 hours' WHERE node = 'old'")
    assert forget_gone_nodes(db) == 1
    assert [n["node"] for n in cluster_view(db)["nodes"]] == ["live"]  # type: ignore[index]


def test_two_processes_given_one_node_name_are_told_apart(db: PgConnection) -> None:
    assert heartbeat(db, "a", "holding", {"pid": 1, "hostname": "h"}, within=5) is None
    assert heartbeat(db, "a", "holding", {"pid": 1, "hostname": "h"}, within=5) is None  # itself again
    # Another process beats as "a" while the first lives: it hears of the first.
    assert heartbeat(db, "a", "standby", {"pid": 2, "hostname": "h"}, within=5) == {"pid": 1, "hostname": "h"}
    # A node that stopped, or went quiet for longer than ``within``, is no clash: a restart.
    db.execute("UPDATE cluster_nodes SET state = 'stopped' WHERE node = 'a'")
    assert heartbeat(db, "a", "standby", {"pid": 3, "hostname": "h"}, within=5) is None
    db.execute("UPDATE cluster_nodes SET seen_at = clock_timestamp() - interval '10 seconds' WHERE node = 'a'")
    assert heartbeat(db, "a", "standby", {"pid": 4, "hostname": "h"}, within=5) is None


def test_each_servers_link_has_a_lease_of_its_own_apart_from_the_routers(db: PgConnection) -> None:
    from mcpl_router.store.link_leases import acquire_link, link_holder, links_view, router_holds

    router, _ = acquire(db, LINKS, "r", 5)
    a, _ = acquire_link(db, "a", "n1", 0.5)
    b, _ = acquire_link(db, "b", "n2", 5)
    assert a is not None and b is not None and (a.server, a.epoch, b.server, b.epoch) == ("a", 1, "b", 1)
    assert a.what == "server a's link" and router is not None and router.what == "the links"
    assert acquire_link(db, "a", "n2", 5)[0] is None  # held: no one else takes it
    heartbeat(db, "n1", "standby", {"relay": "127.0.0.1:7001"})
    holder_a, holder_b = link_holder(db, "a"), link_holder(db, "b")
    assert holder_a is not None and (holder_a.node, holder_a.epoch, holder_a.relay) == ("n1", 1, "127.0.0.1:7001")
    assert holder_a.seen_ago is not None and 0 <= holder_a.seen_ago < 1
    assert holder_b is not None and (holder_b.relay, holder_b.seen_ago) == (None, None)  # n2 never beat: no relay, unheard of
    assert link_holder(db, "c") is None
    # The router's lease is apart: a link's renewal and release touch their own row only.
    assert router_holds(db, "r", router.epoch) and not router_holds(db, "r", router.epoch + 1) and not router_holds(db, "n1", 1)
    time.sleep(0.6)
    assert renew(db, a, 5) is None and link_holder(db, "a") is None  # ran out: free
    taken, _ = acquire_link(db, "a", "n2", 5)
    assert taken is not None and (taken.node, taken.epoch) == ("n2", 2)
    assert release(db, b) is True and link_holder(db, "b") is None
    assert router_holds(db, "r", router.epoch)
    assert [(row["server"], row["node"], row["epoch"], float(str(row["expiresIn"])) > 0) for row in links_view(db)] == [
        ("a", "n2", 2, True), ("b", "n2", 1, False)]
