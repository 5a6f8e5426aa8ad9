"""Test support: the fixture MCPL server (a real program) and the helpers that drive it.

The program is :mod:`mcpl_router.testing.fixture_server` (run it with ``python -m``); this
package re-exports only the test-side API from :mod:`mcpl_router.testing.control`. The server
module is deliberately not imported here, so ``python -m`` finds it unimported.
"""

from mcpl_router.testing.control import (
    FIXTURE_MODULE,
    FixtureControl,
    FixtureProcess,
    FixtureStartError,
    channel_descriptor,
    fixture_command,
    wait_until,
)

__all__ = [
    "FIXTURE_MODULE",
    "FixtureControl",
    "FixtureProcess",
    "FixtureStartError",
    "channel_descriptor",
    "fixture_command",
    "wait_until",
]
