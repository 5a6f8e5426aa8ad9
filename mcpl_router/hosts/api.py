"""Host API methods (JSON-RPC 2.0): what a host, or the CLI, may ask the daemon.

One method table per host connection, composed from the areas that own the methods:
- queries (this module): ``status``, ``servers/list``, ``channels/list``, ``explain``,
  ``daemon/reload``;
- sessions, agents and wakes (:mod:`mcpl_router.hosts.sessions`): ``session/hello``,
  ``wake/ack``, …;
- turns, typing and context (:mod:`mcpl_router.hosts.turn_api`): ``turn/*``,
  ``channels/typing``, …;
- server-initiated inference (:mod:`mcpl_router.hosts.inference_api`): ``inference/chunk``.
Documented in ``docs/host-api.md``; every method here has an entry there.
"""

from __future__ import annotations

import base64
import binascii
from typing import TYPE_CHECKING, Final

import msgspec

from mcpl_router.hosts.inference_api import add_inference_methods
from mcpl_router.hosts.publish_api import add_publish_methods
from mcpl_router.hosts.session_api import add_session_methods
from mcpl_router.hosts.turn_api import add_turn_methods
from mcpl_router.jsonrpc import INVALID_PARAMS, Inbound, MethodTable, RpcError
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.router import Router

if TYPE_CHECKING:
    from mcpl_router.hosts.connection import HostConnection
    from mcpl_router.hosts.services import HostServices


class ExplainParams(msgspec.Struct, rename="camel"):
    name: str
    server_id: str | None = None


class NoParams(msgspec.Struct):
    pass


#: Rows in one ``channels/list`` page unless the host asks for another size (at most MAX).
CHANNEL_PAGE: Final = 1000
CHANNEL_PAGE_MAX: Final = 10_000


class ChannelsListParams(msgspec.Struct):
    cursor: str | None = None
    limit: int | None = None


def channels_page(router: Router, params: ChannelsListParams) -> dict[str, object]:
    """One page of ``channels/list``, in registration order, and the cursor of the next.

    The cursor holds the next position and the last row's ref: if channels came or went
    before it is used, the page starts right after that ref wherever it now stands.
    """
    limit = CHANNEL_PAGE if params.limit is None else params.limit
    if not 1 <= limit <= CHANNEL_PAGE_MAX:
        raise RpcError(INVALID_PARAMS, f"limit must be 1 to {CHANNEL_PAGE_MAX}; got {limit}.", {"field": "limit"})
    start = 0
    if params.cursor:
        try:
            position, server_id, channel_id = msgspec.json.decode(base64.urlsafe_b64decode(params.cursor.encode()))
            last = ChannelRef(str(server_id), str(channel_id))
            start = int(position)
        except (ValueError, TypeError, msgspec.DecodeError, binascii.Error):
            raise RpcError(INVALID_PARAMS, "cursor: not a cursor this daemon gave. Start again without one.", {"field": "cursor"}) from None
        found = router.registry.position_of(last, start - 1)
        if found is not None:
            start = found + 1
    rows = router.names.channel_page(start, limit)
    answer: dict[str, object] = {"channels": [row.to_dict() for row in rows]}
    if rows and start + len(rows) < len(router.registry):
        last_row = rows[-1]
        token = msgspec.json.encode([start + len(rows), last_row.server_id, last_row.channel_id])
        answer["nextCursor"] = base64.urlsafe_b64encode(token).decode()
    return answer


def add_query_methods(table: MethodTable, services: HostServices) -> None:
    async def status(_params: NoParams, _inbound: Inbound) -> object:
        return services.status()

    async def servers_list(_params: NoParams, _inbound: Inbound) -> object:
        return {"servers": services.servers_list()}

    async def channels_list(params: ChannelsListParams, _inbound: Inbound) -> object:
        return channels_page(services.router, params)

    async def explain(params: ExplainParams, _inbound: Inbound) -> object:
        return services.explain(params.name, params.server_id or None)

    async def reload(_params: NoParams, _inbound: Inbound) -> object:
        return await services.reload()

    table.add("status", status, NoParams)
    table.add("daemon/reload", reload, NoParams)
    table.add("servers/list", servers_list, NoParams)
    table.add("channels/list", channels_list, ChannelsListParams)
    table.add("explain", explain, ExplainParams)


def host_methods(services: HostServices, connection: HostConnection | None = None) -> MethodTable:
    """The method table for one host connection (queries only when there is no connection)."""
    table = MethodTable()
    add_query_methods(table, services)
    if connection is not None:
        add_session_methods(table, services.sessions, connection, services.inference.serving)
        add_turn_methods(table, services, connection)
        add_publish_methods(table, services, connection)
        add_inference_methods(table, services.inference, connection)
    return table
