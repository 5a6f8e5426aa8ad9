"""Host API methods (JSON-RPC 2.0): what a host, or the CLI, may ask the daemon.

One method table per host connection, composed from the areas that own the methods:
- queries (this module): ``status``, ``servers/list``, ``channels/list``, ``explain``,
  ``daemon/reload``;
- sessions, agents and wakes (:mod:`mcpl_router.hosts.sessions`): ``session/hello``,
  ``wake/ack``, …;
- turns, typing and context (:mod:`mcpl_router.hosts.turn_api`): ``turn/*``,
  ``channels/typing``, ….
Documented in ``docs/host-api.md``; every method here has an entry there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from mcpl_router.hosts.publish_api import add_publish_methods
from mcpl_router.hosts.sessions import add_session_methods
from mcpl_router.hosts.turn_api import add_turn_methods
from mcpl_router.jsonrpc import Inbound, MethodTable

if TYPE_CHECKING:
    from mcpl_router.daemon import Daemon
    from mcpl_router.hosts.connection import HostConnection


class ExplainParams(msgspec.Struct, rename="camel"):
    name: str
    server_id: str | None = None


class NoParams(msgspec.Struct):
    pass


def add_query_methods(table: MethodTable, daemon: Daemon) -> None:
    async def status(_params: NoParams, _inbound: Inbound) -> Any:
        return daemon.status()

    async def servers_list(_params: NoParams, _inbound: Inbound) -> Any:
        return {"servers": daemon.servers_list()}

    async def channels_list(_params: NoParams, _inbound: Inbound) -> Any:
        return {"channels": daemon.channels_list()}

    async def explain(params: ExplainParams, _inbound: Inbound) -> Any:
        return daemon.explain(params.name, params.server_id or None)

    async def reload(_params: NoParams, _inbound: Inbound) -> Any:
        return await daemon.reload()

    table.add("status", status, NoParams)
    table.add("daemon/reload", reload, NoParams)
    table.add("servers/list", servers_list, NoParams)
    table.add("channels/list", channels_list, NoParams)
    table.add("explain", explain, ExplainParams)


def host_methods(daemon: Daemon, connection: HostConnection | None = None) -> MethodTable:
    """The method table for one host connection (queries only when there is no connection)."""
    table = MethodTable()
    add_query_methods(table, daemon)
    if connection is not None:
        add_session_methods(table, daemon, connection)
        add_turn_methods(table, daemon, connection)
        add_publish_methods(table, daemon, connection)
    return table
