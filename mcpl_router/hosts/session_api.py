"""Host API: ``session/hello`` and ``wake/ack``, decoded and handed to the :class:`SessionManager`.

Documented in ``docs/host-api.md``; what a session does is :mod:`mcpl_router.hosts.sessions`'.
Hello's ``serves`` (the agents whose model this connection serves) is checked before anything
is claimed and recorded after, in :class:`~mcpl_router.inference.Serving`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mcpl_router.hosts.agents import AckParams, HelloParams
from mcpl_router.jsonrpc import Inbound, MethodTable

if TYPE_CHECKING:
    from mcpl_router.hosts.connection import HostConnection
    from mcpl_router.hosts.sessions import SessionManager
    from mcpl_router.inference import Serving

__all__ = ["add_session_methods"]


def add_session_methods(table: MethodTable, manager: SessionManager, connection: HostConnection, serving: Serving) -> None:
    """Register ``session/hello`` and ``wake/ack`` for one connection."""

    async def hello(params: HelloParams, _inbound: Inbound) -> object:
        declared = params.serves.by_kind() if params.serves is not None else {}
        if declared:
            owned = connection.session.agents if connection.session is not None else set()
            serving.check(declared, {agent.name for agent in params.agents} | owned)
        answer = manager.hello(connection, params)
        answer["serves"] = serving.declare(connection, declared)
        return answer

    async def ack(params: AckParams, _inbound: Inbound) -> object:
        return await manager.ack(connection, params)

    table.add("session/hello", hello, HelloParams)
    table.add("wake/ack", ack, AckParams)
