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
