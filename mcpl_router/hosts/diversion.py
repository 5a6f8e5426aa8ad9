"""What holds some wakes back instead of sending them: the tune-outs and the wake gates.

The sessions ask one :class:`WakeDiversion` (given to ``SessionManager`` at construction) for every
new wake and every wake read back from the journal; :class:`~mcpl_router.hosts.gate.Diversions`
chains several.
"""

from __future__ import annotations

from typing import Final, Protocol

from mcpl_router.routing.wakes import Wake

__all__ = ["NO_DIVERSION", "WakeDiversion"]


class WakeDiversion(Protocol):
    """What holds some wakes back instead of sending them (the tune-outs)."""

    def divert(self, wake: Wake) -> bool:
        """Whether a new wake is held (then it is not sent)."""
        ...

    def holds(self, wake: Wake) -> bool:
        """Whether a wake read back from the journal is held (not to be sent)."""
        ...


class _NoDiversion:
    def divert(self, wake: Wake) -> bool:
        return False

    def holds(self, wake: Wake) -> bool:
        return False


NO_DIVERSION: Final = _NoDiversion()
