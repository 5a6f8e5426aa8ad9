"""The daemon: one trio root nursery holding every server link, the host socket and the state.

Shutdown (SIGTERM/SIGINT, or :meth:`Daemon.request_shutdown`) drains within a grace deadline:
links stop (stdio children: stdin closed → grace → SIGTERM → SIGKILL), the journal is closed.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import trio

from mcpl_router import __version__
from mcpl_router.channel_tools import ChannelTools
from mcpl_router.config import RouterConfig
from mcpl_router.connector_tools import ConnectorTools
from mcpl_router.tune_out import TuneOuts
from mcpl_router.hosts.connection import HostConnection
from mcpl_router.jsonrpc import Inbound
from mcpl_router.logs import get_logger
from mcpl_router.mcpl.inbound import ServerInbound
from mcpl_router.mcpl.link import LinkState, ServerLink
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.router import Router
from mcpl_router.speech_tools import SpeechTools
from mcpl_router.store.journal import Delivery, InboundEvent, Journal
from mcpl_router.turn_runner import TurnManager

#: How long open turns may take to end (typing stopped, lifecycle terminals) at shutdown.
SHUTDOWN_GRACE = 5.0

Observer = Callable[[str, dict[str, Any]], None]


class Daemon:
    """Wires the parts together; the :class:`Router` is the state, the links are the shell.

    Args:
        config: the loaded configuration.
        observers: called with ``(event, fields)`` for state changes and channel changes (the
            demo prints them; hosts get them as notifications).
    """

    def __init__(self, config: RouterConfig, *, observers: list[Observer] | None = None) -> None:
        self.config = config
        self.router = Router()
        self.journal = Journal(config.journal.path, retention=config.journal.retention)
        self.inbound = ServerInbound(
            self.router.registry,
            self.journal,
            on_channels_changed=self._channels_changed,
            deliveries_for=lambda event: self.sessions.deliveries_for(event),
            on_accepted=self._accepted,
            on_tools_changed=lambda link: self.connector_tools.list_changed(link),
        )
        self.links: dict[str, ServerLink] = {
            server_id: ServerLink(server, self)
            for server_id, server in config.servers.items()
            if not server.disabled
        }
        self.observers: list[Observer] = list(observers or [])
        self._shutdown = trio.Event()
        self._log = get_logger()
        self.host_socket_path: str | None = None
        #: ``ws://host:port/path`` once the host WebSocket listens (the actual port).
        self.host_websocket_url: str | None = None
        self._host_token: str | None = None
        # Sessions own agents and wakes: the inbound handler asks them whom each new event wakes
        # before its commit (the deliveries commit with it), and they relay server and channel
        # changes to hosts.
        from mcpl_router.hosts.sessions import SessionManager

        self.sessions = SessionManager(self)
        self.host_connection_hooks = self
        self.observers.append(self.sessions.observe)
        self.turns = TurnManager(self)
        # The daemon's channel tools, and each agent's default channel (channel_publish).
        self.channel_tools = ChannelTools(self)
        self.turns.tool_providers.append(self.channel_tools)
        # The servers' own tools, offered under each server's prefix and forwarded to it.
        self.connector_tools = ConnectorTools(self)
        self.turns.tool_providers.append(self.connector_tools)
        # Tune-outs (each agent's tuned-out channels; sessions ask it before sending a wake)
        # and the subconscious agent's tools.
        self.tune_outs = TuneOuts(self)
        self.turns.tool_providers.append(self.tune_outs)
        self.turns.tool_providers.append(SpeechTools(self))

    # -- LinkDelegate ------------------------------------------------------------------------

    def link_state_changed(self, link: ServerLink, old: LinkState, new: LinkState) -> None:
        self._emit("server/state", {"serverId": link.server_id, "old": old.value, "state": new.value})
        if new is LinkState.READY:
            # Every epoch (a reconnect too) lists the server's tools again.
            self.connector_tools.link_ready(link)

    def link_epoch_ended(self, link: ServerLink) -> None:
        # The transport is gone and with it everything that server registered: a reconnect
        # registers again. Until then no name may resolve to its channels.
        removed = self.router.registry.remove_server(link.server_id)
        # Defaults on its channels keep their ref, not their message (issue 6 item 8).
        self.channel_tools.server_removed(link.server_id)
        if removed:
            self._channels_changed(link.server_id, [], removed)

    async def handle_server_message(self, link: ServerLink, inbound: Inbound) -> Any:
        return await self.inbound.handle(link, inbound)

    # -- host connections (the listener calls these) -------------------------------------------

    def opened(self, connection: HostConnection) -> None:
        self.sessions.opened(connection)

    def closed(self, connection: HostConnection) -> None:
        # The host is gone: its turns end now (typing stopped, lifecycle terminal sent),
        # not at their lease; then its agents are released after the session grace.
        self.turns.connection_closed(connection)
        self.sessions.closed(connection)

    # -- events ------------------------------------------------------------------------------

    def _channels_changed(self, server_id: str, added: list[ChannelRef], removed: list[ChannelRef]) -> None:
        if removed:
            # Only these refs' typing stops: another server's channel with the id keeps its own.
            self.turns.channels_removed(removed)
        self._emit(
            "channels/changed",
            {
                "serverId": server_id,
                "added": [ref.to_wire() for ref in added],
                "removed": [ref.to_wire() for ref in removed],
            },
        )

    def _accepted(self, seq: int, event: InboundEvent, deliveries: list[Delivery]) -> None:
        self.channel_tools.message_admitted(seq, event, [delivery.agent for delivery in deliveries])
        self.sessions.accepted(seq, event, deliveries)
        self._emit("inbound/accepted", {"seq": seq, "serverId": event.server_id, "channelId": event.channel_id, "kind": event.kind})

    def _emit(self, event: str, fields: dict[str, Any]) -> None:
        for observer in self.observers:
            try:
                observer(event, fields)
            except Exception:
                self._log.exception("daemon.observer.crashed", observed=event)

    # -- queries (host API, CLI, demo) ---------------------------------------------------------

    def status(self) -> dict[str, Any]:
        servers = [link.status().to_wire() for link in self.links.values()]
        return {
            "version": __version__,
            "servers": servers,
            "ready": sum(1 for s in servers if s["state"] == "ready"),
            "channels": len(self.router.registry.all_entries()),
            "lastSeq": self.journal.last_seq(),
            "agents": self.sessions.statistics(),
            "hosts": self.sessions.host_statistics(),
            "journal": self._journal_status(),
            "openTurns": len(self.turns.table.all()),
        }

    def _journal_status(self) -> dict[str, Any]:
        stats = self.journal.statistics()
        return {
            "lastSeq": stats.last_seq,
            "queuedWrites": stats.queued_writes,
            "commits": stats.commits,
            "lastBatch": stats.last_batch,
            "largestBatch": stats.largest_batch,
            "lastCommitMs": round(stats.last_commit_seconds * 1000, 3),
            "prunedEvents": stats.pruned_events,
            "prunedDrafts": stats.pruned_drafts,
            "failing": stats.failing,
        }

    def servers_list(self) -> list[dict[str, Any]]:
        return [link.status().to_wire() for link in self.links.values()]

    def channels_list(self) -> list[dict[str, Any]]:
        return [row.to_dict() for row in self.router.names.channel_list()]

    def explain(self, name: str, server_id: str | None = None) -> dict[str, Any]:
        return self.router.names.explain(name, server_id).to_dict()

    # -- lifecycle ---------------------------------------------------------------------------

    def request_shutdown(self) -> None:
        self._shutdown.set()

    async def run(self, *, task_status: trio.TaskStatus[Daemon] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until :meth:`request_shutdown`; then drain within :data:`SHUTDOWN_GRACE`."""
        from mcpl_router.hosts.listener import prepare_socket_path, serve_unix_socket
        from mcpl_router.hosts.websocket import prepare_websocket, serve_websocket

        self._log.info("daemon.starting", version=__version__, servers=list(self.links), config=self.config.source)
        websocket = self.config.host.websocket
        try:
            # Refusals (an unsafe socket directory, a non-loopback bind without a token) come
            # first and bare, before anything listens or dials.
            if self.config.host.unix_socket:
                prepare_socket_path(self.config.host.unix_socket)
            if websocket is not None:
                self._host_token = prepare_websocket(self, websocket)
            async with trio.open_nursery() as root:
                # The journal's writer first and last: cancelled with the root, it still commits
                # what was queued (acks, drafts) before the file is closed below.
                await root.start(self.journal.run)
                await root.start(self.sessions.run)
                await root.start(self.turns.run)
                await root.start(self.connector_tools.run)
                await root.start(self.tune_outs.run)
                async with trio.open_nursery() as serving:
                    if self.config.host.unix_socket:
                        self.host_socket_path = await serving.start(serve_unix_socket, self, self.config.host.unix_socket)
                    if websocket is not None and self._host_token is not None:
                        self.host_websocket_url = await serving.start(serve_websocket, self, websocket, self._host_token)
                    for link in self.links.values():
                        await serving.start(link.run)
                    task_status.started(self)
                    await self._shutdown.wait()
                    self._log.info("daemon.draining", open_turns=len(self.turns.table.all()))
                    # Open turns end while the links are still up: typing stops and every
                    # started inference gets its terminal, bounded so a stuck server can't
                    # hold shutdown.
                    with trio.move_on_after(SHUTDOWN_GRACE):
                        await self.turns.drain()
                    # Links close their transports in shielded cleanup bounded by their own
                    # graces (stdin close → SIGTERM → SIGKILL), so cancelling is the rest.
                    serving.cancel_scope.cancel()
                root.cancel_scope.cancel()
        finally:
            self.journal.close()
            self._log.info("daemon.stopped")


async def run_until_signalled(daemon: Daemon, *, task_status: trio.TaskStatus[Daemon] = trio.TASK_STATUS_IGNORED) -> None:
    """Run ``daemon``; SIGINT or SIGTERM starts a graceful shutdown (a second one too)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for signum in signals:
                    get_logger().info("daemon.signal", signal=signal.Signals(signum).name)
                    daemon.request_shutdown()

            nursery.start_soon(watch)
            await daemon.run(task_status=task_status)
            nursery.cancel_scope.cancel()
