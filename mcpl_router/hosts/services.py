"""What the host API reaches: each part it calls, handed over by the daemon that wires them.

The host socket's handlers never see the daemon. They get this bundle, built once by the
daemon, so what a host method may touch is read here: the registry and names, the links a
host publish goes through, the sessions and turns, and the daemon-wide questions (status,
explain, reload) as plain callables.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Protocol

import attrs

if TYPE_CHECKING:
    from mcpl_router.hosts.admission import HostAdmission
    from mcpl_router.hosts.connection import HostConnection
    from mcpl_router.hosts.sessions import SessionManager
    from mcpl_router.inference import InferenceBroker
    from mcpl_router.mcpl.session import ServerSession
    from mcpl_router.routing.router import Router
    from mcpl_router.tools import ToolTable
    from mcpl_router.turns import TurnManager, TypingIndicators

__all__ = ["ConnectionHooks", "HostServices"]


class ConnectionHooks(Protocol):
    """Told when a host connection opens and closes (the daemon, for sessions and turns)."""

    def opened(self, connection: HostConnection) -> None: ...

    def closed(self, connection: HostConnection) -> None: ...


@attrs.frozen
class HostServices:
    """The parts the host API uses.

    Attributes:
        router: the registry and the one resolver (``channels/list``, ``channels/publish``).
        servers: each server's session by id (a host publish goes through its channel's own server).
        sessions: agents, ownership, wakes (``session/hello``, ``wake/ack``).
        turns: ``turn/*``.
        typing: ``channels/typing`` (hosts' own typing, with its lease).
        tools: the name table ``turn/tool`` dispatches through.
        hooks: told of each connection's open and close.
        status: the ``status`` answer.
        servers_list: the ``servers/list`` rows.
        explain: ``explain``'s answer for a name (and an optional server id).
        reload: ``daemon/reload``.
        stall_timeout: ``host.stallTimeout``: a connection taking nothing this long is closed.
        inference: servers' inference requests (hello's ``serves``, ``inference/chunk``).
        admission: the listeners' bounds (connections, buffered bytes, deadlines) and counters.
    """

    router: Router
    servers: Mapping[str, ServerSession]
    sessions: SessionManager
    turns: TurnManager
    typing: TypingIndicators
    tools: ToolTable
    hooks: ConnectionHooks
    status: Callable[[], dict[str, object]]
    servers_list: Callable[[], list[dict[str, object]]]
    explain: Callable[[str, str | None], dict[str, object]]
    reload: Callable[[], Awaitable[dict[str, object]]]
    stall_timeout: float
    inference: InferenceBroker
    admission: HostAdmission
