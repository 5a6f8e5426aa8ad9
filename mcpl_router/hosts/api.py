"""Host API methods (JSON-RPC 2.0): what a host, or the CLI, may ask the daemon.

Documented in ``docs/host-api.md``; every method here has an entry there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from mcpl_router.jsonrpc import Inbound, MethodTable

if TYPE_CHECKING:
    from mcpl_router.daemon import Daemon


class ExplainParams(msgspec.Struct, rename="camel"):
    name: str
    server_id: str | None = None


class NoParams(msgspec.Struct):
    pass


def host_methods(daemon: Daemon) -> MethodTable:
    table = MethodTable()

    async def status(_params: NoParams, _inbound: Inbound) -> Any:
        return daemon.status()

    async def servers_list(_params: NoParams, _inbound: Inbound) -> Any:
        return {"servers": daemon.servers_list()}

    async def channels_list(_params: NoParams, _inbound: Inbound) -> Any:
        return {"channels": daemon.channels_list()}

    async def explain(params: ExplainParams, _inbound: Inbound) -> Any:
        return daemon.explain(params.name, params.server_id or None)

    table.add("status", status, NoParams)
    table.add("servers/list", servers_list, NoParams)
    table.add("channels/list", channels_list, NoParams)
    table.add("explain", explain, ExplainParams)
    return table
