"""The daemon: one trio root nursery holding every server link, the host socket and the state.

Shutdown (SIGTERM/SIGINT, or :meth:`Daemon.request_shutdown`) drains within a grace deadline:
hosts are sent ``daemon/shutdown``, open turns end, links stop (stdio children: stdin closed →
grace → SIGTERM → SIGKILL), the journal is closed. SIGHUP (or :meth:`Daemon.reload`) re-reads
the config file and applies what can change live (docs/operations.md).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Protocol

import attrs
import msgspec
import trio

from mcpl_router import __version__
from mcpl_router.host_notices import ChannelsChangedNotice, ServerStateNotice, ShutdownNotice
from mcpl_router.config import ConfigError, RouterConfig, ServerConfig, load_config
from mcpl_router.errors import bind_failure, listen_refusal
from mcpl_router.events import (
    ChannelsChanged,
    EventBus,
    HostClosed,
    HostOpened,
    InboundAccepted,
    ServerRegranted,
    ServerStateChanged,
    ServerWithdrawn,
)
from mcpl_router.health import Readiness
from mcpl_router.hosts.admission import HostAdmission
from mcpl_router.hosts.connection import HostConnection
from mcpl_router.hosts.directory import AgentDirectory
from mcpl_router.hosts.forks import Forks
from mcpl_router.hosts.diversion import WakeHolds
from mcpl_router.hosts.gate import JournalSettle, StillAdmitted, WakeGates
from mcpl_router.hosts.services import HostServices
from mcpl_router.hosts.sessions import SessionManager
from mcpl_router.inference import InferenceBroker
from mcpl_router.jsonrpc import Inbound
from mcpl_router.logs import get_logger
from mcpl_router.mcpl.inbound import ServerInbound
from mcpl_router.mcpl.link import LinkState, ServerLink, policy_for
from mcpl_router.mcpl.liveness import Liveness
from mcpl_router.mcpl.session import LinkSessions
from mcpl_router.mcpl.transports import OpenTransport
from mcpl_router.metrics import DaemonMetrics, ScrapedParts, StateScrape
from mcpl_router.read_model import ReadModel
from mcpl_router.reload_plan import plan_reload
from mcpl_router.routing.router import Router
from mcpl_router.servers_view import ServersView
from mcpl_router.store.journal import Journal
from mcpl_router.store.leases import LeaseFence
from mcpl_router.tools import ToolTable
from mcpl_router.tools.channel_lifecycle import ChannelLifecycle
from mcpl_router.tools.channel_tools import ChannelTools
from mcpl_router.tools.connector_tools import ConnectorTools
from mcpl_router.tools.speech_tools import SpeechTools
from mcpl_router.tools.tune_out import TuneOuts
from mcpl_router.turns import Invitations, TurnManager, TurnTimings
from mcpl_router.turns.parts import TurnParts

#: How long open turns may take to end (typing stopped, lifecycle terminals) at shutdown.
SHUTDOWN_GRACE = 5.0
#: How long the ``daemon/shutdown`` notice may take to reach each host before draining starts.
SHUTDOWN_NOTICE_TIMEOUT = 1.0

#: The longest a reload's answer waits for the servers to answer their new policies. The
#: narrowing is host-side before any is sent; a slower server's receipt still arrives (within
#: its ``requestTimeout``) and the answer names it in ``policyPending``.
RELOAD_ANSWER_WAIT = 2.0

Observer = Callable[[str, Mapping[str, object]], None]


class ClusterStatus(Protocol):
    """The cluster node a daemon's term runs in (mcpl_router/cluster/), as status reads it."""

    def status(self) -> dict[str, object]: ...


class Daemon:
    """Wires the parts together; the :class:`Router` is the state, the links are the shell.

    Args:
        config: the loaded configuration.
        observers: called with ``(event, fields)`` for state changes and channel changes (the
            demo prints them; hosts get them as notifications).
        fence: a cluster node's lease on the links (mcpl_router/cluster/): every journal
            transaction and every write to a server checks it; None for a single daemon.
        node: the cluster node running this daemon's term: its ``status()`` is status's
            ``cluster``, and it serves the health listener (this daemon then doesn't).
        link_transport: what each link opens instead of its own connection to the server (a
            balanced cluster's router reaches servers through their holders' relays).
        journal: the journal ``config`` names, already opened (a cluster node opens it in a
            worker thread); None: opened here.
    """

    def __init__(
        self, config: RouterConfig, *, observers: list[Observer] | None = None, fence: LeaseFence | None = None,
        node: ClusterStatus | None = None,
        link_transport: Callable[[ServerConfig, trio.Nursery], Awaitable[OpenTransport]] | None = None,
        journal: Journal | None = None,
    ) -> None:
        self.config = config
        self.router = Router()
        self.journal = Journal.from_config(config.journal, fence=fence) if journal is None else journal
        #: Asked before each write to a server (None: a single daemon sends freely).
        self._outbound_fence = None if fence is None else fence.refusal
        self._node = node
        self._link_transport = link_transport
        #: The one dispatcher of the parts' events (mcpl_router/events.py).
        self.events = EventBus()
        self.metrics = DaemonMetrics(config.agents, events=self.events)
        #: Open host connections (the metrics read their peers' queues; the shutdown notice).
        self.host_connections: set[HostConnection] = set()
        #: True from the moment shutdown starts: ``/readyz`` answers 503.
        self.draining = False
        #: What the latest reload did (``status`` shows it).
        self.last_reload: dict[str, object] | None = None
        self._link_scopes: dict[str, tuple[trio.CancelScope, trio.Event]] = {}
        self._reload_requests, self._reload_receive = trio.open_memory_channel[None](1)
        self._shutdown_reason: str | None = None
        #: ``http://host:port`` once the health listener listens (the actual port).
        self.health_url: str | None = None
        self._serving: trio.Nursery | None = None
        self._reload_lock = trio.Lock()
        enabled = {server_id: server for server_id, server in config.servers.items() if not server.disabled}
        self.links: dict[str, ServerLink] = {server_id: self._new_link(server) for server_id, server in enabled.items()}
        #: Whether each ready server still answers (ping; mcpl/liveness.py).
        self.liveness = Liveness()
        #: What host connections may cost together (hosts/admission.py).
        self.admission = HostAdmission(config.host)
        # How many routing decisions status keeps, and how much of their words it shows.
        self.router.names.decisions.configure(keep=config.health.decisions, preview=config.health.status_preview)
        #: Told ``(event, fields)`` of state and channel changes and accepted events (the demo).
        self.observers: list[Observer] = list(observers or [])
        self.shutdown_requested = trio.Event()
        self._log = get_logger()
        self.host_socket_path: str | None = None
        #: ``ws://host:port/path`` once the host WebSocket listens (the actual port).
        self.host_websocket_url: str | None = None
        self._host_token: str | None = None
        self._wire_parts()

    def _wire_parts(self) -> None:
        """Build the parts in floor order, each given at construction what it uses; none of
        them holds the daemon, and none is tied to another after it is built. What a part must
        hear of another's doing it hears as an event (mcpl_router/events.py), subscribed as it
        is built; docs/architecture.md lists who publishes and who listens."""
        events = self.events
        router, links, journal, metrics = self.router, self.links, self.journal, self.metrics
        # What the turns, tools and hosts send a server through: each link's session, by server id.
        servers = LinkSessions(links)
        timings = TurnTimings()
        # Who the agents are and who owns each: read by the parts below the sessions.
        self.agents = AgentDirectory(agents=self.config.agents, journal=journal, router=router)
        # Conversation forks: a forking agent's message goes to its conversation's fork (docs/forks.md).
        # ``agent_of`` is the specs' own lookup (asked of every wake): the directory's ``agent``
        # without a layer of its own.
        self.forks = Forks(registry=router.registry, journal=journal, policy_deliveries=self.agents.deliveries_for,
                           agent_of=self.agents.specs.get, owner_of=self.agents.owner_of, notify_agent=self.agents.notify_agent,
                           hand_over=self.agents.hand_over_wakes, events=events)
        # Each agent's channel decisions, journaled; every registration is checked against them
        # (a server that keeps no subscriptions registers a channel closed again after a restart).
        # A tuned-out channel is held open as an agent's open one is (the tune-outs are made
        # below; the decisions ask them at each registration).
        # The forks' book answers each fork's home itself (asked of every wake: no layer between).
        self.channel_decisions = ChannelLifecycle(router, servers, journal, fork_home=self.forks.book.home_of,
                                                  kept_open=lambda: self.tune_outs.kept_open(), events=events)
        # Tune-outs (each agent's tuned-out channels; sessions ask them before sending a wake).
        # Saved in the journal and resumed by its run() before hosts or servers connect.
        self.tune_outs = TuneOuts(router, servers, timings, notify_agent=self.agents.notify_agent, journal=journal)
        # Wake gates: each agent's rules delay or batch its admitted wakes (never admit one).
        self.gates = WakeGates(router=router, agent_of=self.agents.specs.get, admitted=StillAdmitted(router.registry, servers),
                               deliver=self.agents.offer_batch, settle=JournalSettle(journal), count=metrics.wake_gated,
                               route_fence=self.forks, events=events)
        self.servers = ServersView(router=router, links=links, liveness=self.liveness, events=events)
        # Sessions own hello, acks and wake delivery: the inbound handler asks whom each new
        # event wakes before its commit (the deliveries commit with it); the tune-outs, then
        # the gates, are asked of every wake. Invitations are decided by each agent's decisions.
        self.sessions = SessionManager(
            directory=self.agents,
            journal=journal,
            router=router,
            metrics=metrics,
            invitations=Invitations(router, self.channel_decisions.has_open),
            servers_list=self.servers.servers_list,
            diversion=WakeHolds(self.tune_outs.table, self.gates),
            events=events,
        )
        # What turns speak and type with: the tools below reach it, the turn manager is given it.
        turn_parts = TurnParts.build(router=router, servers=servers, journal=journal, notify_agent=self.agents.notify_agent,
                                     timings=timings, tuned_out=self.tune_outs.tuned_out)
        # The daemon's channel tools, and each agent's default channel (channel_publish).
        self.channel_tools = ChannelTools(
            router, servers, self.channel_decisions, turn_parts.stop_typing_in, timings, self.tune_outs,
            fork_home=self.forks.book.home_of, may_take=self.forks.may_take_route, events=events)
        # The servers' own tools, offered under each server's prefix and forwarded to it.
        self.connector_tools = ConnectorTools(links, router, events, self.channel_decisions)
        # The one name table: what each offered tool name means, for listing and dispatch.
        # Listed in this order; a name means one tool whatever the order.
        self.tools = ToolTable([self.channel_tools, self.connector_tools, self.tune_outs,
                                SpeechTools(speech=turn_parts.speech, drafts=turn_parts.drafts)],
                               on_clash=metrics.tool_name_clash, events=events)
        self.turns = TurnManager(
            router=router,
            servers=servers,
            journal=journal,
            sessions=self.sessions,
            tools=self.tools,
            parts=turn_parts,
            metrics=metrics,
            is_draining=lambda: self.draining,
            notices_for=self.channel_decisions.notices_for,
            route_fence=self.forks,
            events=events,
        )
        self.inference = InferenceBroker(owner_of=self.agents.owner_of, metrics=metrics, events=events)
        self.inbound = ServerInbound(
            router.registry, journal,
            events=events,
            deliveries_for=self.forks.deliveries_for,
            on_tools_changed=self.connector_tools.list_changed,
            inference=self.inference,
            counted=metrics.inbound_answered,
        )
        self.read_model = ReadModel(
            router=router, links=links, servers=self.servers, sessions=self.sessions, tune_outs=self.tune_outs, turns=self.turns,
            journal=journal, host_connections=self.host_connections, admission=self.admission, liveness=self.liveness,
            channel_decisions=self.channel_decisions, draining=lambda: self.draining, last_reload=lambda: self.last_reload,
        )
        self.host_services = HostServices(
            router=router,
            servers=servers,
            sessions=self.sessions,
            turns=self.turns,
            typing=self.turns.typing,
            tools=self.tools,
            hooks=self,
            status=self.status,
            servers_list=self.servers_list,
            explain=self.explain,
            reload=self.reload,
            stall_timeout=self.config.host.stall_timeout,
            inference=self.inference,
            admission=self.admission,
        )
        StateScrape(
            ScrapedParts(
                router=router,
                links=links,
                host_connections=self.host_connections,
                sessions=self.sessions,
                journal=journal,
                turns=self.turns,
                readiness=self.readiness,
                channel_decisions=self.channel_decisions,
                liveness=self.liveness,
                admission=self.admission,
            ),
            metrics,
        )
        # The daemon's own observers (the demo prints what happens; hosts hear the same
        # through the sessions): last, so they hear of a change after the parts acted on it.
        events.subscribe(ServerStateChanged, self._observe_state)
        events.subscribe(ChannelsChanged, self._observe_channels)
        events.subscribe(InboundAccepted, self._observe_accepted)

    def _new_link(self, server: ServerConfig) -> ServerLink:
        if self._link_transport is not None:
            return ServerLink(server, self, open_transport_fn=self._link_transport, outbound_fence=self._outbound_fence)
        return ServerLink(server, self, outbound_fence=self._outbound_fence)

    # -- LinkDelegate: a link's news, published --------------------------------------------

    def link_state_changed(self, link: ServerLink, old: LinkState, new: LinkState) -> None:
        # A new connection (its refusals forgotten), or ready: every epoch (a reconnect too)
        # lists the server's tools again and holds it to the agents' channel decisions.
        self.events.publish(ServerStateChanged(link.server_id, old.value, new.value))

    def link_epoch_ended(self, link: ServerLink) -> None:
        # The transport is gone and with it everything that server registered: a reconnect
        # registers again. Until then no name may resolve to its channels.
        self.events.publish(ServerWithdrawn(link.server_id))

    @property
    def handle_server_message(self) -> Callable[[ServerLink, Inbound], Awaitable[object]]:
        """What a server says goes straight to the one that handles it (which counts its
        answers): no layer of the daemon's own between the link and the handler."""
        return self.inbound.handle

    # -- host connections (the listener calls these) -------------------------------------------

    def opened(self, connection: HostConnection) -> None:
        self.host_connections.add(connection)
        self.events.publish(HostOpened(connection))

    def closed(self, connection: HostConnection) -> None:
        self.host_connections.discard(connection)
        # Its turns end now (typing stopped, lifecycle terminal sent), not at their lease; its
        # agents are released after the session grace; the inference it served is forgotten.
        self.events.publish(HostClosed(connection))

    # -- observers -----------------------------------------------------------------------------

    def _observe_state(self, event: ServerStateChanged) -> None:
        if self.observers:
            self._emit(ServerStateNotice.METHOD, msgspec.to_builtins(ServerStateNotice(event.server_id, event.old, event.new)))

    def _observe_channels(self, event: ChannelsChanged) -> None:
        if self.observers:
            notice = ChannelsChangedNotice.of(event.server_id, event.added, event.removed)
            self._emit(notice.METHOD, msgspec.to_builtins(notice))

    def _observe_accepted(self, accepted: InboundAccepted) -> None:
        if not self.observers:
            return  # once per message: no fields built for nobody
        event = accepted.event
        self._emit("inbound/accepted", {"seq": accepted.seq, "serverId": event.server_id, "channelId": event.channel_id, "kind": event.kind})

    def _emit(self, event: str, fields: Mapping[str, object]) -> None:
        for observer in self.observers:
            try:
                observer(event, fields)
            except Exception:
                self._log.exception("daemon.observer.crashed", observed=event)

    # -- queries (host API, CLI, demo): the read model's -------------------------------------

    def status(self, *, channels_page: int | None = None, channels_filter: str = "") -> dict[str, object]:
        status = self.read_model.status(channels_page=channels_page, channels_filter=channels_filter)
        if self._node is not None:
            status["cluster"] = self._node.status()
        return status

    def servers_list(self) -> list[dict[str, object]]:
        return self.read_model.servers_list()

    def readiness(self) -> Readiness:
        return self.read_model.readiness()

    def channels_list(self) -> list[dict[str, object]]:
        return self.read_model.channels_list()

    def explain(self, name: str, server_id: str | None = None) -> dict[str, object]:
        return self.read_model.explain(name, server_id)

    # -- lifecycle ---------------------------------------------------------------------------

    def request_shutdown(self, reason: str = "requested") -> None:
        self._shutdown_reason = self._shutdown_reason or reason
        self.shutdown_requested.set()

    def request_reload(self) -> None:
        """Reload the config file soon (SIGHUP); requests made while one waits are one reload."""
        try:
            self._reload_requests.send_nowait(None)
        except trio.WouldBlock:
            pass  # one is already pending: it will read the file as it is then

    async def run(self, *, task_status: trio.TaskStatus[Daemon] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until :meth:`request_shutdown`; then drain within :data:`SHUTDOWN_GRACE`.

        Raises:
            StartupRefusal: a listener can't bind (the key and the fix in one line).
        """
        from mcpl_router.health import serve_health
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
                self._host_token = prepare_websocket(self.config.host, websocket)
            async with trio.open_nursery() as root:
                # The journal's writer first and last: cancelled with the root, it still commits
                # what was queued (acks, drafts) before the file is closed below.
                await root.start(self.journal.run)
                await root.start(self.sessions.run)
                await root.start(self.turns.run)
                await root.start(self.connector_tools.run)
                await root.start(self.tune_outs.run)
                await root.start(self.gates.run)
                await root.start(self.forks.run)
                await root.start(self.channel_decisions.run)
                # Each agent's default channel as it was (before hosts connect): a restart or
                # a cluster's takeover does not forget where a bare channel_publish goes.
                await self.channel_tools.restore_defaults(self.journal, self.agents.specs)
                async with trio.open_nursery() as serving:
                    self._serving = serving
                    if self.config.host.unix_socket:
                        self.host_socket_path = await serving.start(serve_unix_socket, self.host_services, self.config.host.unix_socket)
                    if websocket is not None and self._host_token is not None:
                        try:
                            self.host_websocket_url = await serving.start(serve_websocket, self.host_services, websocket, self._host_token)
                        except BaseException as exc:
                            failure = bind_failure(exc)
                            if failure is None:
                                raise
                            raise listen_refusal(self.config.source, "host.websocket.port", websocket.bind, websocket.port, failure) from None
                    if self.config.health.enabled and self._node is None:
                        self.health_url = await serving.start(
                            partial(
                                serve_health,
                                self.config.health,
                                config_source=self.config.source,
                                ready=self.readiness,
                                metrics=self.metrics,
                                status=self.status,
                                page_token=self._host_token,
                            )
                        )
                    for link in self.links.values():
                        await serving.start(self._run_link, link)
                    serving.start_soon(self._serve_reloads)
                    task_status.started(self)
                    await self.shutdown_requested.wait()
                    self.draining = True
                    self._log.info("daemon.draining", open_turns=len(self.turns.table.all()), reason=self._shutdown_reason)
                    # Hosts hear it first, so they stop opening turns and know the grace.
                    await self._notify_shutdown()
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
            self._serving = None
            self.journal.close()
            self._log.info("daemon.stopped")

    async def _notify_shutdown(self) -> None:
        notice = ShutdownNotice(SHUTDOWN_GRACE, self._shutdown_reason)
        async with trio.open_nursery() as nursery:
            for connection in list(self.host_connections):
                if connection.session is None:
                    continue  # only hosts that said hello get notifications

                async def tell(connection: HostConnection = connection) -> None:
                    with trio.move_on_after(SHUTDOWN_NOTICE_TIMEOUT):
                        await connection.notify(notice.METHOD, notice)

                nursery.start_soon(tell)

    async def _run_link(self, link: ServerLink, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """One link in its own cancel scope, so a reload can stop it alone."""
        scope = trio.CancelScope()
        done = trio.Event()
        self._link_scopes[link.server_id] = (scope, done)
        try:
            with scope:
                async with trio.open_nursery() as nursery:
                    # Pings while it is ready (mcpl/liveness.py): a stopped server shows.
                    nursery.start_soon(self.liveness.watch, link)
                    await link.run(task_status=task_status)
                    # Given up (failed): nothing left to ping.
                    nursery.cancel_scope.cancel()
        finally:
            done.set()
            if self._link_scopes.get(link.server_id, (None, None))[1] is done:
                del self._link_scopes[link.server_id]

    async def _stop_link(self, server_id: str) -> None:
        """Disconnect one server: its transport closed, its channels gone, its typing stopped."""
        entry = self._link_scopes.get(server_id)
        if entry is not None:
            scope, done = entry
            scope.cancel()
            await done.wait()
        self.links.pop(server_id, None)
        self.servers.new_connection(server_id)
        self.liveness.forget(server_id)

    async def _serve_reloads(self) -> None:
        async for _ in self._reload_receive:
            await self.reload()

    def _withdraw_if_register_revoked(self, link: ServerLink) -> None:
        """A reload took ``channels.register`` away: the server's channels go now, as at a link
        loss (hosts hear ``channels/changed``, typing on them stops), not at its next reconnect."""
        if link.grant.allows("channels.register"):
            return
        self.events.publish(ServerWithdrawn(link.server_id, why="channels.register revoked by reload"))

    async def reload(self, new_config: RouterConfig | None = None) -> dict[str, object]:
        """Re-read the config file (or take ``new_config``) and apply what can change live.

        Servers added are connected, removed ones disconnected (their channels withdrawn, their
        typing stopped), changed ones re-granted in place when only their grant policy changed,
        else reconnected; a server whose link has failed is reconnected, changed or not. Every
        narrowing applies at once, host-side, before any server is sent anything (revoking
        ``channels.register`` withdraws the server's channels); the servers are then sent their
        new grants concurrently, and what a grant adds applies on that server's receipt. The
        answer waits for those receipts :data:`RELOAD_ANSWER_WAIT` at most and names the servers
        still to answer in ``policyPending``. Agents added or changed take effect for new turns.
        ``host``, ``journal``, ``health`` and ``logging`` need a restart: reported, not applied.
        An invalid file is refused and nothing changes; so is any reload while shutting down.

        Returns:
            what was done (also kept as :attr:`last_reload` for ``status``).
        """
        if self.draining:
            # Shutting down: a new link or grant now would only be torn down again.
            return self._reloaded({"outcome": "refused", "errors": ["the daemon is shutting down: reload ignored"]})
        async with self._reload_lock:
            if new_config is None:
                try:
                    new_config = load_config(self.config.source)
                except ConfigError as exc:
                    return self._reloaded({"outcome": "refused", "errors": str(exc).splitlines()})
            revive = {server_id for server_id, link in self.links.items() if link.state in (LinkState.FAILED, LinkState.CLOSED)}
            plan = plan_reload(self.config, new_config, revive=revive)
            try:
                fresh = {server.id: self._new_link(server) for server in plan.to_start(new_config)}
                # Checked before any is applied, so a bad one refuses the reload whole.
                for server_id in plan.regranted:
                    policy_for(new_config.servers[server_id]).validate()
            except Exception as exc:  # a policy the link refuses (config validation should catch it)
                return self._reloaded({"outcome": "refused", "errors": [f"{self.config.source}: {exc}"]})
            # Every narrowing first, host-side and without awaiting anything, so no server's
            # round trip delays another's withdrawal: grants, then agents.
            to_tell: list[ServerLink] = []
            for server_id in plan.regranted:
                link = self.links[server_id]
                if link.regrant_host_side(new_config.servers[server_id]):
                    to_tell.append(link)
                self._withdraw_if_register_revoked(link)
            for server_id in plan.updated:
                # The link keeps what it learned (e.g. where its token goes): only config changes.
                self.links[server_id].config = new_config.servers[server_id]
            agents_added, agents_changed = self.sessions.configure_agents(new_config.agents)
            self.forks.agents_changed()
            for server_id in (*plan.removed, *plan.reconnected):
                await self._stop_link(server_id)
            assert self._serving is not None
            # The servers are sent their new grants concurrently, each bounded by its own
            # requestTimeout, in the background: the answer waits RELOAD_ANSWER_WAIT at most.
            pending: set[str] = set()
            all_told = trio.Event()

            async def tell(link: ServerLink) -> None:
                try:
                    await link.send_policy()
                    self.events.publish(ServerRegranted(link.server_id))
                except Exception:
                    # A bug in telling one server must not take the daemon down: its narrowing
                    # is already in force; log it whole.
                    self._log.exception("config.reload.policy_crashed", server=link.server_id)
                finally:
                    pending.discard(link.server_id)
                    if not pending:
                        all_told.set()

            for link in to_tell:
                pending.add(link.server_id)
                self._serving.start_soon(tell, link)
            if not pending:
                all_told.set()
            for server_id, link in fresh.items():
                self.links[server_id] = link
                await self._serving.start(self._run_link, link)
            order = [server.id for server in new_config.enabled_servers()]
            ordered = {server_id: self.links[server_id] for server_id in order if server_id in self.links}
            # In place: the tool providers hold this very dict.
            self.links.clear()
            self.links.update(ordered)
            self.connector_tools.servers_changed()
            # What can't change live stays as it was, so status keeps telling the truth.
            self.config = attrs.evolve(
                new_config, source=self.config.source, host=self.config.host, journal=self.config.journal,
                health=self.config.health, logging=self.config.logging, cluster=self.config.cluster,
            )
            with trio.move_on_after(RELOAD_ANSWER_WAIT):
                await all_told.wait()
            return self._reloaded(
                {
                    "outcome": "applied",
                    "added": list(plan.added),
                    "removed": list(plan.removed),
                    "reconnected": list(plan.reconnected),
                    "regranted": list(plan.regranted),
                    "updated": list(plan.updated),
                    "policyPending": sorted(pending),
                    "agentsAdded": agents_added,
                    "agentsChanged": agents_changed,
                    "restartNeeded": list(plan.restart_needed),
                }
            )

    def _reloaded(self, result: dict[str, object]) -> dict[str, object]:
        result = {**result, "at": time.time(), "config": self.config.source}
        self.last_reload = result
        self.metrics.reloads.labels(result["outcome"]).inc()
        if result["outcome"] == "refused":
            self._log.error("config.reload.refused", errors=result["errors"], hint="the running config is unchanged")
        else:
            fields = {key: value for key, value in result.items() if key not in ("outcome", "at") and value}
            self._log.info("config.reloaded", **fields)
        return result
