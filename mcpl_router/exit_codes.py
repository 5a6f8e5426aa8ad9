"""What every ``mcpl-router`` command exits with (docs/operations.md), and how a command says
it can't act: shared by the command table (``cli.py``) and the commands that ask a running
daemon (``query.py``)."""

from __future__ import annotations

import sys

__all__ = [
    "EXIT_CODES_TEXT",
    "EXIT_CONFIG",
    "EXIT_OK",
    "EXIT_REFUSED",
    "EXIT_UNREACHABLE",
    "UsageError",
    "fail",
]

EXIT_OK = 0
#: The daemon could not be reached (no socket, nothing listening, refused connection).
EXIT_UNREACHABLE = 1
#: Bad usage or an invalid config: nothing was done (``run``: the daemon did not start).
EXIT_CONFIG = 2
#: The daemon answered no: not ready (``health``), a name that picks no channel
#: (``explain``), a reload it refused (``reload``).
EXIT_REFUSED = 3

EXIT_CODES_TEXT = (
    "exit codes: 0 ok; 1 daemon unreachable; 2 bad config or usage; 3 the daemon answered no "
    "(not ready, name refused, reload refused)"
)


class UsageError(Exception):
    """The command line can't be acted on; the message says what to give."""


def fail(message: str, code: int) -> int:
    """Say ``message`` on stderr, as every command does; ``code`` back, to exit with."""
    print(f"mcpl-router: {message}", file=sys.stderr)
    return code
