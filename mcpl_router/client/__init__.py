"""A Python client for the daemon's host socket: what hosts, the CLI and the tests use.

    from mcpl_router.client import RouterClient, RpcError

    async with RouterClient.connect_default() as client:   # connect_unix(path), connect_websocket(url, token)
        await client.hello("my-host", ["kai"])
        async for wake in client.wakes():
            async with client.turn(wake.agent, wakes=[wake.seq]) as turn:
                await turn.text("On it.")
            print(turn.receipt.text)
            await client.ack([wake.seq])

The parts, one module each: the connection (:mod:`.connection`), its transports
(:mod:`.transport`), the typed results (:mod:`.results`), the turn helper (:mod:`.turn`), the
bounded notification buffer (:mod:`.buffer`, whose docstring is the buffering policy), parsed
wakes (:mod:`.wakes`), acks sharing a ``wake/ack`` (:mod:`.acks`), the daemon→host requests a
host serves (:mod:`.serving`) and :class:`FailoverClient`, given several nodes' addresses, which
moves to the next when its connection is lost (:mod:`.failover`). Documented
in ``docs/client.md``.
"""

from mcpl_router.client.buffer import BufferStatistics, Notification, NotificationBuffer
from mcpl_router.client.connection import ClientStatistics, RouterClient
from mcpl_router.client.failover import ConnectionLost, FailoverClient, FailoverStatistics, NoNodeReachable
from mcpl_router.client.results import *  # noqa: F403
from mcpl_router.client.results import __all__ as _results
from mcpl_router.client.serving import InferenceRequest, ModelInfoRequest
from mcpl_router.client.transport import client_ssl_context
from mcpl_router.client.turn import Outcome, Turn, TurnAlreadyClosed
from mcpl_router.client.wakes import WakeChannel, WakeNotice
from mcpl_router.jsonrpc import PeerClosed, RequestTimeout, RpcError

__all__ = [
    "BufferStatistics",
    "ClientStatistics",
    "ConnectionLost",
    "FailoverClient",
    "FailoverStatistics",
    "InferenceRequest",
    "ModelInfoRequest",
    "NoNodeReachable",
    "Notification",
    "NotificationBuffer",
    "Outcome",
    "PeerClosed",
    "RequestTimeout",
    "RouterClient",
    "RpcError",
    "Turn",
    "TurnAlreadyClosed",
    "WakeChannel",
    "WakeNotice",
    "client_ssl_context",
    *_results,
]
