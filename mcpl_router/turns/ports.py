"""What the turns need of the floors above them, each as the few methods they call.

Turns sit below the tools, the host API and the application (docs/architecture.md, Floors):
the sessions that say who owns an agent, the name table that lists an
agent's tools, and the metrics are handed in at construction and reached only through these
protocols, so nothing here imports ``hosts/``, ``tools/`` or ``metrics.py``. (A host's connection, as a
turn holds it, is :class:`~mcpl_router.turns.run.HostLink`.)
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from mcpl_router.host_notices import HostNotice
    from mcpl_router.routing.agents import AgentSpec
    from mcpl_router.routing.wakes import Wake
    from mcpl_router.turns.run import TurnRun

__all__ = ["ContextMetrics", "Owners", "ToolListing"]


class Owners(Protocol):
    """Who owns each agent, and the wakes and notifications that reach its host."""

    def require_owner(self, connection: Any, name: str) -> AgentSpec: ...

    def wake(self, seq: int, agent: str) -> Awaitable[Wake | None]: ...

    def notify_agent(self, name: str, notice: HostNotice) -> Awaitable[bool]: ...


class ToolListing(Protocol):
    """The name table as a turn reads it: the tools an agent is offered, and which are sends."""

    def offered(self, agent: AgentSpec, run: TurnRun) -> list[dict[str, object]]: ...

    def is_send(self, name: str, arguments: Mapping[str, object]) -> bool: ...


class ContextMetrics(Protocol):
    """Where a ``beforeInference`` fan-out's outcomes and latencies are counted."""

    def context_answered(self, outcomes: Mapping[str, str], elapsed: Mapping[str, float]) -> None: ...
