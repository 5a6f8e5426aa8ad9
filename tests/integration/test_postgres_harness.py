"""The test PostgreSQL itself: a synchronous pair that loses nothing committed when the primary
is killed, and leaves no process behind. The journal's PostgreSQL tests stand on it."""

from __future__ import annotations

import pytest

from mcpl_router.testing import postgres

pytestmark = pytest.mark.integration


def test_a_killed_primary_loses_no_synchronous_commit_and_nothing_is_left_running() -> None:
    postgres.require()
    import psycopg

    with postgres.postgres_pair() as pair:
        with psycopg.connect(pair.primary.dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (n integer PRIMARY KEY)")
            for n in range(200):
                conn.execute("INSERT INTO t VALUES (%s)", (n,))
        pair.primary.kill()
        pair.promote()
        with psycopg.connect(pair.multi_host_dsn, autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM t").fetchone()
            assert row == (200,)
            conn.execute("INSERT INTO t VALUES (200)")  # the promoted standby takes writes
        root = pair.root
    assert not root.exists()
    assert postgres._processes_using(root / "primary") == []
    assert postgres._processes_using(root / "standby") == []
