"""Host API: ``inference/chunk``, a streamed piece of a forwarded ``inference/request``.

The daemon's own requests to a host (``inference/request``, ``model/info``) and what becomes of
a chunk are :mod:`mcpl_router.inference`'s; documented in ``docs/host-api.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mcpl_router.inference import ChunkParams
from mcpl_router.jsonrpc import Inbound, MethodTable

if TYPE_CHECKING:
    from mcpl_router.hosts.connection import HostConnection
    from mcpl_router.inference import InferenceBroker

__all__ = ["add_inference_methods"]


def add_inference_methods(table: MethodTable, broker: InferenceBroker, connection: HostConnection) -> None:
    """Register ``inference/chunk`` for one connection."""

    async def chunk(params: ChunkParams, _inbound: Inbound) -> object:
        await broker.chunk(connection, params)
        return {}  # a notification gets no answer; a host that sent it as a request gets this

    table.add("inference/chunk", chunk, ChunkParams)
