"""Host API: ``session/hello`` and ``wake/ack``, decoded and handed to the :class:`SessionManager`.

Documented in ``docs/host-api.md``; what a session does is :mod:`mcpl_router.hosts.sessions`'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mcpl_router.hosts.agents import AckParams, HelloParams
from mcpl_router.jsonrpc import Inbound, MethodTable

if TYPE_CHECKING:
    from mcpl_router.hosts.connection import HostConnection
    from mcpl_router.hosts.sessions import SessionManager

__all__ = ["add_session_methods"]


def add_session_methods(table: MethodTable, manager: SessionManager, connection: HostConnection) -> None:
    """Register ``session/hello`` and ``wake/ack`` for one connection."""

    async def hello(params: HelloParams, _inbound: Inbound) -> Any:
        return manager.hello(connection, params)

    async def ack(params: AckParams, _inbound: Inbound) -> Any:
        return await manager.ack(connection, params)

    table.add("session/hello", hello, HelloParams)
    table.add("wake/ack", ack, AckParams)
