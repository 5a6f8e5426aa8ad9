"""One node of a cluster: a standby until it holds the links' lease, then a daemon's term.

Several ``mcpl-router run`` processes with the same config file (``[cluster] node`` differing)
share one PostgreSQL journal. Each is a :class:`ClusterNode`:

- **standby**: it heartbeats its row in ``cluster_nodes`` and tries to take the lease
  (store/leases.py) every :data:`POLL_SHARE` of it; it serves ``/healthz``, ``/readyz`` (503:
  "standby: node a holds the links") and ``/metrics``. It listens on its host addresses and
  forwards each host connection to the holder's (cluster/host_proxy.py), so hosts may connect
  to any node; its listeners are closed before its own daemon binds them.
- **holding**: it took the lease. A :class:`~mcpl_router.daemon.Daemon` is built for this term
  from the journal, as at any start (the journal is the truth: wakes not acked are sent again
  to the hosts that reconnect here), with the lease's fence on every journal transaction and
  every write to a server. The lease is renewed every :data:`RENEW_SHARE` of it.
- **the lease lost** (a renewal finds another epoch, or none succeeded before the local
  deadline): the term is cancelled at once (no journal write, no byte to a server after it),
  its hosts disconnected; the node is a standby again.
- **SIGTERM** while holding: the daemon drains as ever (hosts hear ``daemon/shutdown``), the
  journal's last commit is made, and the lease is released and announced: a standby takes the
  links within its poll, not the lease's length.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from functools import partial
from typing import Final

import attrs
import structlog
import trio

from mcpl_router import __version__
from mcpl_router.cluster.database import NodeDatabase
from mcpl_router.cluster.host_proxy import HostProxy, holder_in_view
from mcpl_router.cluster.links import LinkHoldings
from mcpl_router.cluster.metrics import NodeMetrics
from mcpl_router.config import ConfigError, RouterConfig, load_config
from mcpl_router.daemon import Daemon
from mcpl_router.health import Readiness, serve_health
from mcpl_router.logs import get_logger
from mcpl_router.store.backend import Connection
from mcpl_router.store.journal import Journal, read_password
from mcpl_router.store.leases import (
    LINKS,
    LeaseFence,
    LeaseTerm,
    acquire,
    cluster_view,
    ensure_cluster_tables,
    forget_gone_nodes,
    heartbeat,
    leave,
    release,
    renew,
)
from mcpl_router.store.link_leases import links_view
from mcpl_router.store.schema import JournalLocked, JournalRefused

__all__ = ["ClusterNode"]

#: A standby tries to take the lease this often, as a share of the lease (at most every second).
POLL_SHARE: Final = 0.1
#: The holder renews this often, as a share of the lease: four renewals may fail before the
#: local deadline (0.8 of the lease) stops it.
RENEW_SHARE: Final = 0.2
#: A node whose heartbeat is older than this many leases is shown as gone (a holder that beat
#: no more for a lease has lost it anyway).
GONE_AFTER_LEASES: Final = 1
#: How long after a term that could not start (the journal refused) the node tries again.
RETRY_AFTER_REFUSAL: Final = 5.0


class ClusterNode:
    """Runs as a :class:`~mcpl_router.daemon.Daemon` runs (``run``, ``request_shutdown``,
    ``request_reload``): supervision and the CLI start either."""

    def __init__(self, config: RouterConfig) -> None:
        assert config.cluster is not None and config.journal.dsn is not None, "a node is configured by [cluster]"
        self.config = config
        self.name = config.cluster.node
        self.ttl = config.cluster.lease_ttl
        self.shutdown_requested = trio.Event()
        #: ``starting``, ``standby``, ``holding``, ``draining``, ``stopped``.
        self.state = "starting"
        #: The daemon of the term under way (None while standby).
        self.daemon: Daemon | None = None
        self.fence: LeaseFence | None = None
        #: ``http://host:port`` of the node's health listener once it listens.
        self.health_url: str | None = None
        self.metrics = NodeMetrics(self)
        #: The cluster as the database showed it at the last heartbeat (nodes, leases).
        self.view: dict[str, object] = {"nodes": [], "leases": []}
        self.counts = {"terms": 0, "leasesLost": 0, "renewFailures": 0, "heartbeatFailures": 0, "refusedTerms": 0, "nameClashes": 0}
        self._clash_said: object = None
        #: Live nodes whose placement (servers, pins) differs from this node's, at the last beat.
        self.placement_differs: list[str] = []
        #: Why a standby could not try for the lease just now (the database unreachable), if so.
        self.problem: str | None = None
        self._shutdown_reason: str | None = None
        self._reload_pending = False
        self._term_scope: trio.CancelScope | None = None
        #: While a standby: host connections forwarded to the holder its last heartbeat saw.
        self.host_proxy = HostProxy(self.name, lambda: holder_in_view(self.view, this_node=self.name), recheck=min(1.0, self.ttl * POLL_SHARE))
        password = read_password(config.journal)
        self._leases = NodeDatabase(config.journal.dsn, password, f"node {self.name} lease")
        self._info = NodeDatabase(config.journal.dsn, password, f"node {self.name} heartbeat")
        #: What the lease a term runs under is, as sentences say it: with the links spread, their
        #: own leases hold them, and this one is the router's (hosts, routing, the journal).
        self.lease_what = "the links" if config.cluster.links == "router" else "the router's lease"
        #: ``cluster.links = "balanced"``: this node's share of the links and its relay.
        self.links: LinkHoldings | None = None
        self._link_databases: tuple[NodeDatabase, ...] = ()
        if config.cluster.links == "balanced":
            self._link_databases = (
                NodeDatabase(config.journal.dsn, password, f"node {self.name} links"),
                NodeDatabase(config.journal.dsn, password, f"node {self.name} lookups"),
            )
            self.links = LinkHoldings(self.name, config, leases=self._link_databases[0], lookups=self._link_databases[1])
        self._log = get_logger()

    # -- what supervision calls ----------------------------------------------------------------

    def request_shutdown(self, reason: str = "requested") -> None:
        self._shutdown_reason = self._shutdown_reason or reason
        self.shutdown_requested.set()
        if self.links is not None:
            self.links.leaving()
        if self.daemon is not None:
            self.state = "draining"
            self.daemon.request_shutdown(reason)

    def request_reload(self) -> None:
        if self.links is not None:
            self._reload_links()
        if self.daemon is not None:
            self.daemon.request_reload()
        else:
            # No term to apply it to: the next term starts from the file as it is then.
            self._reload_pending = True
            self._log.info("cluster.reload.deferred", reason="standby: the config file is read again when this node takes the links")

    def _reload_links(self) -> None:
        """The servers whose links this node may hold and relay, from the file as it is now:
        a server added is placed, one removed is handed over (every node is reloaded, as the
        file is the same everywhere)."""
        assert self.links is not None
        try:
            fresh = load_config(self.config.source)
        except ConfigError as exc:
            self._log.error("config.reload.refused", errors=str(exc).splitlines(), hint="the links stay placed by the config read before")
            return
        # The pins may change on a reload; the rest of [cluster] and the journal need a restart.
        if (_without_pins(fresh), fresh.journal) != (_without_pins(self.config), self.config.journal):
            self._log.warning("cluster.reload.restart_needed", sections=["cluster", "journal"])
            return
        self.links.reconfigure(fresh)

    async def run(self, *, task_status: trio.TaskStatus[ClusterNode] = trio.TASK_STATUS_IGNORED) -> None:
        # Every line of this node's tasks (and its daemons') says which node wrote it.
        structlog.contextvars.bind_contextvars(node=self.name)
        self._log.info("cluster.node.starting", version=__version__, lease_ttl=self.ttl, journal=self.config.journal.described)
        try:
            async with trio.open_nursery() as nursery:
                if self.config.health.enabled:
                    self.health_url = await nursery.start(
                        partial(
                            serve_health, self.config.health, config_source=self.config.source, ready=self.readiness,
                            metrics=self.metrics, status=self.status_page, page_token=None,
                        )
                    )
                task_status.started(self)
                # The database may not be up yet (the node started first): waited for, said once.
                if await self._until_reachable():
                    if self.links is not None:
                        await nursery.start(self.links.run)  # its relay's address is in the first beat
                    await self._beat()
                    nursery.start_soon(self._heartbeats)
                    await self._serve_terms()
                    if self.links is not None:
                        # After the router's drain (if this node was the router): its turns
                        # ended over these links. Said first, so no node counts this one live
                        # (a pinned link is taken at once); then each is handed over now.
                        self.state = "draining"
                        await self._beat()
                        await self.links.drain()
                nursery.cancel_scope.cancel()  # the health listener and the heartbeats
        finally:
            self.state = "stopped"
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                try:
                    await self._info.run(partial(leave, node=self.name))
                except Exception as exc:  # the database may be what failed: the row ages out
                    self._log.warning("cluster.node.leave_failed", error=f"{type(exc).__name__}: {exc}")
            self._leases.close()
            self._info.close()
            for database in self._link_databases:
                database.close()
            self._log.info("cluster.node.stopped", reason=self._shutdown_reason)

    async def _until_reachable(self) -> bool:
        """Make the cluster's tables, trying again every second until the database answers;
        False when shutdown came first."""
        said: str | None = None
        while not self.shutdown_requested.is_set():
            try:
                await self._info.run(ensure_cluster_tables)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}".strip()
                if error != said:
                    said = error
                    self._log.warning("cluster.database.unreachable", error=error, retry_every=1.0)
                self.problem = f"the journal's database can't be reached: {error}"
                with trio.move_on_after(1.0):
                    await self.shutdown_requested.wait()
                continue
            if said is not None:
                self._log.info("cluster.database.reachable")
            self.problem = None
            return True
        return False

    # -- standby and terms ---------------------------------------------------------------------

    async def _serve_terms(self) -> None:
        while not self.shutdown_requested.is_set():
            taken = await self.host_proxy.serve_during(self.config.host, self._wait_for_lease)
            if taken is None:
                return
            refused = self.counts["refusedTerms"]
            await self._hold(*taken)
            if self.counts["refusedTerms"] > refused:
                # The journal refused this node (said in the log): another node may do better.
                with trio.move_on_after(RETRY_AFTER_REFUSAL):
                    await self.shutdown_requested.wait()

    async def _wait_for_lease(self) -> tuple[LeaseTerm, float] | None:
        self.state = "standby"
        poll = min(1.0, self.ttl * POLL_SHARE)
        said_standby = False
        said_unreachable: str | None = None
        while not self.shutdown_requested.is_set():
            try:
                term, valid_until = await self._leases.run(partial(_try_acquire, node=self.name, ttl=self.ttl))
            except Exception as exc:
                # Said when it starts or changes, not at every poll.
                error = f"{type(exc).__name__}: {exc}".strip()
                if error != said_unreachable:
                    said_unreachable = error
                    self._log.warning("cluster.lease.unreachable", error=error)
                self.problem = f"the lease can't be read: {error}"
                term, valid_until = None, 0.0
            else:
                if said_unreachable is not None:
                    said_unreachable = None
                    self._log.info("cluster.lease.reachable")
                self.problem = None
            if term is not None:
                return term, valid_until
            if not said_standby:
                said_standby = True
                self._log.info("cluster.node.standby", holder=self._holder())
            with trio.move_on_after(poll):
                await self.shutdown_requested.wait()
        return None

    async def _hold(self, term: LeaseTerm, valid_until: float) -> None:
        fence = self.fence = LeaseFence(term, valid_until)
        self.counts["terms"] += 1
        self._log.info("cluster.lease.taken", epoch=term.epoch, since=term.since)
        try:
            async with trio.open_nursery() as nursery:
                self._term_scope = nursery.cancel_scope
                nursery.start_soon(self._renewals, fence, nursery.cancel_scope)
                daemon = await self._new_daemon(fence)
                if daemon is None:
                    nursery.cancel_scope.cancel()
                    return
                self.daemon = daemon
                self.metrics.attach(daemon.metrics.registry)
                self.state = "holding"
                nursery.start_soon(self._beat)  # status shows the new holder now, not at the next beat
                if self.shutdown_requested.is_set():
                    daemon.request_shutdown(self._shutdown_reason or "requested")
                await daemon.run()
                nursery.cancel_scope.cancel()
        finally:
            self.daemon = None
            self.metrics.detach()
            self._term_scope = None
            self.fence = None
            if fence.loss is None:
                # The term ended by choice (shutdown, or a daemon that could not start): the
                # journal is closed, so the lease is given up now and a standby takes it.
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    await self._release(fence.term)
            elif not self.shutdown_requested.is_set():
                self._log.info("cluster.node.standby_again", reason=fence.loss)

    async def _new_daemon(self, fence: LeaseFence) -> Daemon | None:
        config = self.config
        if self._reload_pending:
            self._reload_pending = False
            try:
                fresh = load_config(config.source)
            except ConfigError as exc:
                self._log.error("config.reload.refused", errors=str(exc).splitlines(), hint="this term runs the config read at start")
            else:
                if (_without_pins(fresh), fresh.journal, fresh.health) != (_without_pins(config), config.journal, config.health):
                    self._log.warning("cluster.reload.restart_needed", sections=["cluster", "journal", "health"])
                else:
                    self.config = config = fresh
        try:
            # Opened (connected, its schema checked, its state read) in a worker thread: the
            # node's renewals, heartbeats and relays run on on the trio thread meanwhile.
            journal = await _open_journal(config, fence)
            return Daemon(config, fence=fence, node=self, journal=journal,
                          link_transport=None if self.links is None else self.links.transport_for(fence.term))
        except (JournalRefused, JournalLocked) as exc:
            self.counts["refusedTerms"] += 1
            self._log.error("cluster.term.refused", error=str(exc), retry_in=RETRY_AFTER_REFUSAL)
            return None

    async def _renewals(self, fence: LeaseFence, term_scope: trio.CancelScope) -> None:
        """Renew every :data:`RENEW_SHARE` of the lease; the term ends when the lease is lost
        or its local deadline passes unrenewed (checked often: a stopped process resumed
        notices at once, before anything else of its term runs long)."""
        every = self.ttl * RENEW_SHARE
        next_renewal = trio.current_time() + every
        while True:
            refusal = fence.refusal()
            if refusal is not None:
                self._lost(fence, refusal, term_scope)
                return
            if trio.current_time() >= next_renewal:
                next_renewal = trio.current_time() + every
                try:
                    valid_until = await self._leases.run(partial(renew, term=fence.term, ttl=self.ttl))
                except Exception as exc:
                    self.counts["renewFailures"] += 1
                    self._log.warning("cluster.lease.renew_failed", epoch=fence.term.epoch, error=f"{type(exc).__name__}: {exc}")
                    continue
                if valid_until is None:
                    fence.lost(f"node {self.name}'s lease on {self.lease_what} (epoch {fence.term.epoch}) expired or was taken by another node")
                    continue
                fence.renewed(valid_until)
            await trio.sleep(min(0.1, every))

    def _lost(self, fence: LeaseFence, why: str, term_scope: trio.CancelScope) -> None:
        fence.lost(why)
        self.counts["leasesLost"] += 1
        self._log.error("cluster.lease.lost", epoch=fence.term.epoch, reason=why, effect="this node's term ends now: no journal write, no send")
        term_scope.cancel()

    async def _release(self, term: LeaseTerm) -> None:
        try:
            released = await self._leases.run(partial(release, term=term))
        except Exception as exc:
            self._log.warning("cluster.lease.release_failed", epoch=term.epoch, error=f"{type(exc).__name__}: {exc}",
                              effect=f"another node takes the links when the lease runs out ({self.ttl:g}s)")
            return
        self._log.info("cluster.lease.released", epoch=term.epoch, released=released)

    # -- heartbeat and what status shows ------------------------------------------------------

    async def _heartbeats(self) -> None:
        while True:
            await trio.sleep(self.ttl * RENEW_SHARE)
            await self._beat()

    async def _beat(self) -> None:
        info = self._info_fields()
        try:
            self.view, other = await self._info.run(
                partial(_beat_and_view, node=self.name, state=self.state, info=info, within=self.ttl)
            )
        except Exception as exc:
            self.counts["heartbeatFailures"] += 1
            self._log.warning("cluster.heartbeat.failed", error=f"{type(exc).__name__}: {exc}")
            return
        if self.links is not None:
            router = self._holder()
            if router is not None:
                self.links.relay.router_seen(int(str(router.get("epoch"))), float(str(router.get("expiresIn", 0))) > 0)
            links = self.view.get("links")
            await self.links.links_seen(links if isinstance(links, list) else [])
            self._compare_placement()
        if other is not None and other.get("pid") != self._clash_said:
            # Said once per other process: each overwrites the other's row at every beat.
            self._clash_said = other.get("pid")
            self.counts["nameClashes"] += 1
            self._log.error("cluster.node.name_clash", other_pid=other.get("pid"), other_hostname=other.get("hostname"),
                            fix=f"another process runs as node {self.name}: give each node its own cluster.node")

    def _compare_placement(self) -> None:
        """Nodes placing links from different files (one reloaded, another not) disagree on
        pins and servers: said once for each set of such nodes (the links are still held: a
        link free too long is taken by any node)."""
        assert self.links is not None
        mine = _placement_digest(self.links.config)
        nodes = self.view.get("nodes")
        differ = sorted(
            str(row.get("node")) for row in (nodes if isinstance(nodes, list) else [])
            if isinstance(row, dict) and row.get("node") != self.name and row.get("state") != "stopped"
            and float(str(row.get("seenAgo", 0))) < self.ttl and isinstance(row.get("info"), dict)
            and row["info"].get("placement") not in (None, mine)
        )
        if differ and differ != self.placement_differs:
            self._log.warning("cluster.config.differs", nodes=differ,
                              fix="the nodes place links from different [cluster] pins or servers: give every node the same file and reload each")
        self.placement_differs = differ

    def _info_fields(self) -> dict[str, object]:
        host = self.config.host
        return {
            "pid": os.getpid(),
            "hostname": socket.gethostname(),
            "version": __version__,
            "hostSocket": None if host.unix_socket is None else str(host.unix_socket),
            "health": self.health_url,
            "websocket": None if self.daemon is None else self.daemon.host_websocket_url,
            "relay": None if self.links is None else self.links.relay.address,
            "placement": None if self.links is None else _placement_digest(self.links.config),
        }

    def _holder(self) -> dict[str, object] | None:
        leases = self.view.get("leases")
        for lease in leases if isinstance(leases, list) else []:
            if isinstance(lease, dict) and lease.get("scope") == LINKS:
                return lease
        return None

    def status(self) -> dict[str, object]:
        """``status``'s ``cluster``: this node, the holder, every node and when it was seen."""
        fence = self.fence
        nodes = self.view.get("nodes")
        gone_after = self.ttl * GONE_AFTER_LEASES
        return {
            "node": self.name,
            "state": self.state,
            "leaseTtl": self.ttl,
            "lease": None if fence is None else {
                "epoch": fence.term.epoch,
                "since": fence.term.since,
                "validForSeconds": round(max(0.0, fence.valid_until - time.monotonic()), 3),
            },
            "holder": self._holder(),
            "proxied": self.host_proxy.statistics(),
            "nodes": [
                {**node, "live": float(node.get("seenAgo", gone_after)) < gone_after and node.get("state") != "stopped"}
                for node in (nodes if isinstance(nodes, list) else []) if isinstance(node, dict)
            ],
            "links": self.view.get("links", []),
            "linkHoldings": None if self.links is None else self.links.status(),
            "placement": None if self.config.cluster is None else self.config.cluster.described_links,
            "placementDiffers": self.placement_differs,
            **self.counts,
        }

    def readiness(self) -> Readiness:
        daemon = self.daemon
        if daemon is not None and self.state == "holding":
            return daemon.readiness()
        if self.problem is not None:
            return Readiness((f"standby: {self.problem}",))
        holder = self._holder()
        if holder is None or float(str(holder.get("expiresIn", 0))) <= 0:
            them = "them" if self.lease_what == "the links" else "it"
            return Readiness((f"standby: node {self.name} does not hold {self.lease_what}, and no node holds {them} now",))
        return Readiness((f"standby: node {holder.get('node')} holds {self.lease_what} (epoch {holder.get('epoch')}); host connections here are forwarded to it",))

    def status_page(self, *, channels_page: int | None = None, channels_filter: str = "") -> dict[str, object]:
        daemon = self.daemon
        if daemon is not None:
            return daemon.status(channels_page=channels_page, channels_filter=channels_filter)
        readiness = self.readiness()
        return {"version": __version__, "ready": readiness.ready, "problems": list(readiness.problems), "cluster": self.status()}


async def _open_journal(config: RouterConfig, fence: LeaseFence) -> Journal:
    """The term's journal, opened in a worker thread; closed again if the term ends (the lease
    lost) before the daemon has it, rather than left with its connection open."""
    opened: list[Journal] = []

    def open_it() -> None:
        opened.append(Journal.from_config(config.journal, fence=fence))

    try:
        await trio.to_thread.run_sync(open_it)
    except trio.Cancelled:
        for journal in opened:
            journal.close()
        raise
    return opened[0]


def _placement_digest(config: RouterConfig) -> str:
    """What placement decides from (the servers, the pins, the mode), in 12 hex digits."""
    cluster = config.cluster
    placed = {"servers": sorted(config.servers), "pin": dict(sorted((cluster.pin if cluster else {}).items())),
              "links": cluster.links if cluster else None}
    return hashlib.sha256(json.dumps(placed, sort_keys=True).encode()).hexdigest()[:12]


def _without_pins(config: RouterConfig) -> object:
    return None if config.cluster is None else attrs.evolve(config.cluster, pin={})


def _try_acquire(db: Connection, *, node: str, ttl: float) -> tuple[LeaseTerm | None, float]:
    """Take the links' lease if it is free or expired. A read first, without a lock: a standby's
    poll never makes the holder's fenced commits wait on its row lock."""
    import psycopg

    row = db.execute("SELECT expires_at > clock_timestamp() FROM cluster_leases WHERE scope = ?", (LINKS,)).fetchone()
    if row is not None and row[0]:
        return None, 0.0
    try:
        return acquire(db, LINKS, node, ttl)
    except psycopg.errors.LockNotAvailable:
        # A commit of the last holder still holds the row (a holder stopped mid-commit, until
        # the server ends its transaction): not a fault, the next poll tries again.
        return None, 0.0


def _beat_and_view(db: Connection, *, node: str, state: str, info: dict[str, object], within: float) -> tuple[dict[str, object], dict[str, object] | None]:
    other = heartbeat(db, node, state, info, within=within)
    forget_gone_nodes(db)
    return {**cluster_view(db), "links": links_view(db)}, other
