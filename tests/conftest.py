"""Shared test rules.

- Network tests bind 127.0.0.1 only, on port 0.
- Every I/O test carries an absolute ``trio.fail_after`` so a hang fails fast with logs.
- Anything that waits on time uses ``autojump_clock`` where no real process is involved.
"""

from __future__ import annotations

import structlog

from mcpl_router.logs import configure_logging

configure_logging("debug", json=True)
# capture_logs() swaps processors per test; keep the logger uncached so that works.
structlog.configure(cache_logger_on_first_use=False)


# -- the journal on both backends ----------------------------------------------------------------

import itertools  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from mcpl_router.testing import postgres  # noqa: E402
from mcpl_router.testing.journal import JournalPlace  # noqa: E402

JOURNAL_BACKENDS = ("sqlite", "postgres")
_databases = itertools.count(1)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[postgres.Server]:
    """One PostgreSQL for the whole run (each journal test gets a database of its own)."""
    postgres.require()
    with postgres.postgres_server() as server:
        yield server


@pytest.fixture(params=JOURNAL_BACKENDS)
def journal_place(request: pytest.FixtureRequest, tmp_path: Path) -> JournalPlace:
    """Where a journal contract test's journal is: a SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return JournalPlace(path=tmp_path / "journal.sqlite3")
    server: postgres.Server = request.getfixturevalue("postgres_server")
    return JournalPlace(dsn=postgres.fresh_database(server, f"journal_{next(_databases)}"))


# -- a Ctrl-C stops the run -----------------------------------------------------------------------


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A Ctrl-C during a trio test stops the whole run, as it does during any other test.

    Trio raises the KeyboardInterrupt inside the test's task, and each nursery it passes on its
    way out wraps it in an exception group, which pytest takes for one more failure: it would
    report the test failed and run the rest of the suite on (ten minutes and more, servers and all).
    A KeyboardInterrupt of its own stops the run, and pytest tears the fixtures down.
    """
    try:
        return (yield)
    except BaseExceptionGroup as group:
        if group.subgroup(KeyboardInterrupt) is not None:
            raise KeyboardInterrupt from group
        raise
