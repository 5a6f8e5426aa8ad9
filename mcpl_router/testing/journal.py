"""A journal with its writer running, for tests that use the journal without a daemon."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from mcpl_router.store.journal import Journal


@asynccontextmanager
async def open_journal(path: Path, **options: Any) -> AsyncIterator[Journal]:
    """Open ``path``, run its writer for the block, then stop it (what was queued is written) and close."""
    journal = Journal(path, **options)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(journal.run)
            yield journal
            nursery.cancel_scope.cancel()
    finally:
        journal.close()
