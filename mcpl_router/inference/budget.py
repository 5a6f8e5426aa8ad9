"""How much inference each server is spending: requests in flight, and asks in the last minute.

Pure bookkeeping, read and changed only from trio tasks (no await inside a check-and-take), so
two requests of one server can't both take the last slot.
"""

from __future__ import annotations

from collections import deque

import attrs

__all__ = ["RATE_WINDOW", "InferenceBudget"]

#: The window ``perMinute`` counts over, in seconds.
RATE_WINDOW = 60.0


@attrs.define
class _ServerBudget:
    in_flight: int = 0
    #: When each admitted request of the last window started, oldest first (at most perMinute).
    started: deque[float] = attrs.field(factory=deque)


class InferenceBudget:
    """Per server: requests in flight, and starts within :data:`RATE_WINDOW`."""

    def __init__(self) -> None:
        self._servers: dict[str, _ServerBudget] = {}

    def in_flight(self, server_id: str) -> int:
        budget = self._servers.get(server_id)
        return 0 if budget is None else budget.in_flight

    def retry_after(self, server_id: str, per_minute: int, now: float) -> float | None:
        """None when another request may start now; else the seconds until one may."""
        budget = self._servers.get(server_id)
        if budget is None:
            return None
        while budget.started and budget.started[0] <= now - RATE_WINDOW:
            budget.started.popleft()
        if len(budget.started) < per_minute:
            return None
        return max(0.0, budget.started[len(budget.started) - per_minute] + RATE_WINDOW - now)

    def start(self, server_id: str, per_minute: int, now: float) -> None:
        """Take a slot (after :meth:`in_flight` and :meth:`retry_after` said yes)."""
        budget = self._servers.setdefault(server_id, _ServerBudget())
        budget.in_flight += 1
        budget.started.append(now)
        while len(budget.started) > per_minute:  # bounded by the policy's own limit
            budget.started.popleft()

    def finish(self, server_id: str) -> None:
        budget = self._servers.get(server_id)
        if budget is not None and budget.in_flight > 0:
            budget.in_flight -= 1
