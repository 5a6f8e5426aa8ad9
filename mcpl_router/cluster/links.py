"""A node's share of the links (``cluster.links = "balanced"``): leases taken, renewed, handed over.

Every node of a balanced cluster, router or standby, runs a :class:`LinkHoldings`:

- each poll it reads who holds which link and which nodes are live, asks the placement
  (cluster/placement.py) what to do, hands over what belongs elsewhere and tries to take the
  free links that belong here;
- it renews the leases it holds every :data:`RENEW_SHARE` of the lease; one that fails to
  renew, or whose local deadline passes, is lost at once: its relay ends, nothing more is
  written to that server from here;
- its :class:`~mcpl_router.cluster.relay.Relay` serves the router those links;
- on a drain it hands every link over (released, not left to expire).

The router's side is :meth:`LinkHoldings.transport_for`: the transport its links open, through
the relay of whichever node holds each server's link (this node's own relay too).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, Final

import trio

from mcpl_router.cluster.database import NodeDatabase
from mcpl_router.cluster.placement import plan_links
from mcpl_router.cluster.relay import HeldLink, Relay, dial_relay
from mcpl_router.config import RouterConfig, ServerConfig
from mcpl_router.logs import get_logger
from mcpl_router.mcpl.transports import OpenTransport, TransportError
from mcpl_router.store.leases import LeaseFence, LeaseTerm, relay_token, release, renew
from mcpl_router.store.link_leases import LinkHolder, acquire_link, link_holder, links_view, router_holds

if TYPE_CHECKING:
    from mcpl_router.store.backend import Connection

__all__ = ["LinkHoldings"]

#: Shares of the lease, as the router's lease uses them (cluster/node.py).
POLL_SHARE: Final = 0.1
RENEW_SHARE: Final = 0.2
#: A node unheard of for this share of the lease is not given links (three heartbeats missed):
#: its own leases run out soon after, and the others must not wait on its share for long.
LIVE_SHARE: Final = 0.6
#: A link held for less than this many leases is not moved for placement (every move is a
#: reconnect of its server): a pinned node flapping, or nodes restarted one after another.
SETTLE_LEASES: Final = 1
#: A link seen free for this many leases is taken by any live node, whatever the placement
#: says (nodes whose configs disagree must not leave a server unheld).
LONG_FREE_LEASES: Final = 2
#: A holder whose dials of a server failed this many times in a row, over at least this many
#: leases, hands the link on (if another node is live), and does not take it back for the
#: last many leases.
UNREACHABLE_DIALS: Final = 3
UNREACHABLE_LEASES: Final = 2
AVOID_LEASES: Final = 12
#: How long a hand-over waits for the server's answers to the router's requests under way (at
#: most this, and at most this share of the lease: the lease is renewed meanwhile).
HAND_OVER_GRACE: Final = 2.0
HAND_OVER_GRACE_SHARE: Final = 0.4
#: How long the router's link waits for some node to hold a free link before its attempt
#: fails (and is tried again with the link's backoff).
HOLDER_WAIT_LEASES: Final = 2


class LinkHoldings:
    def __init__(self, node: str, config: RouterConfig, *, leases: NodeDatabase, lookups: NodeDatabase) -> None:
        assert config.cluster is not None
        self.node = node
        self.config = config
        self.ttl = config.cluster.lease_ttl
        # Lease statements on one connection, lookups (and the placement's clean-up) on another:
        # a slow lookup never delays a renewal.
        self._leases = leases
        self._lookups = lookups
        #: server id → the link this node holds (its lease, its relay).
        self.held: dict[str, HeldLink] = {}
        self.relay = Relay(node, config, self.held, self._router_holds)
        self.draining = False
        self.counts = {"linksTaken": 0, "linksLost": 0, "linksHandedOver": 0, "linksUnreachable": 0}
        self._log = get_logger(component="links")
        self._nudge = trio.Event()
        #: Links this node handed on because it could not reach their server: not taken back
        #: before this time (trio time).
        self._avoid: dict[str, float] = {}
        #: Links this node handed on for balance, and when; balancing is held off until the
        #: pause's end once one of them was picked up by no node (a live node not taking links).
        self._balanced_away: dict[str, float] = {}
        self._balance_paused_until = 0.0
        #: Since when (trio time) each configured link was seen free by this node's polls.
        self._free_since: dict[str, float] = {}
        #: The router's side: server id → (the link epoch its relay answered for, the transport).
        self._dialled: dict[str, tuple[int, OpenTransport]] = {}

    # -- running ---------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                # Only a node reads the cluster's relay token (from the journal's database).
                self.relay.token = str(await self._lookups.run(relay_token))
                address = await nursery.start(self.relay.serve)
                task_status.started(address)
                nursery.start_soon(self._renewals)
                await self._placements()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await self._hand_over_all("node stopped", graceful=False)

    def leaving(self) -> None:
        """The node was asked to stop: no new relay is served (a new router dials the links'
        next holders, not this node's), while the relays under way carry its router's drain."""
        self.relay.refusing = f"node {self.node} is leaving the cluster"

    async def drain(self) -> None:
        """Hand every link over now (a node leaving): another takes each at its next poll."""
        self.draining = True
        self._nudge.set()
        await self._hand_over_all(f"node {self.node} is draining")

    def reconfigure(self, config: RouterConfig) -> None:
        """A reload: the servers placed and relayed are the file's now (the cluster section
        is unchanged: the node checked)."""
        self.config = config
        self.relay.config = config
        self._nudge.set()

    async def _placements(self) -> None:
        poll = min(1.0, self.ttl * POLL_SHARE)
        said: str | None = None
        while True:
            try:
                held_by, live = await self._lookups.run(
                    partial(_placement_view, live_within=self.ttl * LIVE_SHARE, servers=list(self.config.servers))
                )
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"
                if error != said:
                    said = error
                    self._log.warning("cluster.links.unreadable", error=error)
            else:
                said = None
                now = trio.current_time()
                for server in [server for server in self._free_since if server not in self.config.servers]:
                    del self._free_since[server]  # removed by a reload
                for server in self.config.servers:
                    if server in held_by:
                        self._free_since.pop(server, None)
                    else:
                        self._free_since.setdefault(server, now)
                long_free = [server for server, since in self._free_since.items() if now - since >= self.ttl * LONG_FREE_LEASES]
                self._check_balance(long_free, now)
                plan = plan_links(
                    me=self.node, servers=tuple(self.config.servers), pin=self.config.cluster.pin if self.config.cluster else {},
                    live=live, held_by=held_by, draining=self.draining,
                    settled=[server for server, held in self.held.items() if now - held.taken_at >= self.ttl * SETTLE_LEASES],
                    long_free=long_free, balance=now >= self._balance_paused_until,
                )
                for server in plan.balancing:
                    self._balanced_away[server] = now
                for server, why in plan.release.items():
                    await self._hand_over(server, why)
                await self._hand_on_unreachable(live, now)
                for server in [server for server in self.held if server not in self.config.servers]:
                    await self._hand_over(server, "it is no longer in the config")
                for server in plan.take:
                    if self._avoid.get(server, 0.0) <= now:
                        await self._take(server)
            with trio.move_on_after(poll):
                await self._nudge.wait()
            self._nudge = trio.Event()

    def _check_balance(self, long_free: list[str], now: float) -> None:
        for server in long_free:
            moved_at = self._balanced_away.pop(server, None)
            if moved_at is not None and now - moved_at < self.ttl * AVOID_LEASES:
                self._balance_paused_until = now + self.ttl * AVOID_LEASES
                self._log.warning("cluster.links.balance_paused", server=server, pause=self.ttl * AVOID_LEASES,
                                  reason="a link this node handed on for balance was picked up by no node (a live node that takes no links?)")

    async def _hand_on_unreachable(self, live: set[str], now: float) -> None:
        """A link whose server this node's dials have failed to reach for a while, while
        another node is live, is handed on to let that node try (and not taken back here for
        a while): a holder cut off from its server must not keep the link for good."""
        if not live - {self.node}:
            return
        for server, held in list(self.held.items()):
            since = held.unreachable_since
            if since is None or held.unreachable < UNREACHABLE_DIALS or now - since < self.ttl * UNREACHABLE_LEASES:
                continue
            self._avoid[server] = now + self.ttl * AVOID_LEASES
            self.counts["linksUnreachable"] += 1
            await self._hand_over(server, f"node {self.node} can't reach server {server} ({held.unreachable} dials failed in "
                                          f"{now - since:.0f}s, the last: {held.unreachable_error}): another node tries")

    async def _take(self, server: str) -> None:
        try:
            term, valid_until = await self._leases.run(partial(_try_acquire_link, server=server, node=self.node, ttl=self.ttl))
        except Exception as exc:
            self._log.warning("cluster.link.take_failed", server=server, error=f"{type(exc).__name__}: {exc}")
            return
        if term is None:
            return
        self.held[server] = HeldLink(LeaseFence(term, valid_until))
        self.counts["linksTaken"] += 1
        self._log.info("cluster.link.taken", server=server, epoch=term.epoch)

    async def _hand_over(self, server: str, why: str) -> None:
        await self._hand_over_all(why, [server])

    async def _hand_over_all(self, why: str, servers: list[str] | None = None, *, graceful: bool = True) -> None:
        """Hand ``servers`` (all held: None) over. Gracefully: their relays send the server no
        new request (the router's is answered "not sent") and the answers to those under way
        are waited for, a bounded while, before the lease is let go; then nothing more is
        written to the server from here and another node takes the link."""
        handing = {server: self.held[server] for server in sorted(self.held if servers is None else servers) if server in self.held}
        for held in handing.values():
            held.closing = why
        with trio.move_on_after(min(HAND_OVER_GRACE, self.ttl * HAND_OVER_GRACE_SHARE) if graceful else 0):
            while any(held.pending and held.relay_scope is not None for held in handing.values()):
                await trio.sleep(0.02)
        for server, held in handing.items():
            if self.held.get(server) is not held:
                continue  # lost meanwhile: said where it was lost
            del self.held[server]
            held.fence.lost(f"handed over: {why}")  # nothing more is written to it from here
            held.end_relay()
            self.counts["linksHandedOver"] += 1
            try:
                released = await self._leases.run(partial(release, term=held.fence.term))
            except Exception as exc:
                self._log.warning("cluster.link.release_failed", server=server, error=f"{type(exc).__name__}: {exc}",
                                  effect=f"another node takes it when its lease runs out ({self.ttl:g}s)")
                continue
            self._log.info("cluster.link.handed_over", server=server, epoch=held.fence.term.epoch, reason=why, released=released,
                           unanswered=len(held.pending))

    async def _renewals(self) -> None:
        every = self.ttl * RENEW_SHARE
        next_renewal = trio.current_time() + every
        while True:
            for server, held in list(self.held.items()):
                refusal = held.fence.refusal()
                if refusal is not None:
                    self._lose(server, held, refusal)
            if trio.current_time() >= next_renewal:
                next_renewal = trio.current_time() + every
                for server, held in list(self.held.items()):
                    if self.held.get(server) is not held:
                        continue  # handed over while an earlier renewal was under way: released, not lost
                    try:
                        valid_until = await self._leases.run(partial(renew, term=held.fence.term, ttl=self.ttl))
                    except Exception as exc:
                        self._log.warning("cluster.link.renew_failed", server=server, error=f"{type(exc).__name__}: {exc}")
                        continue
                    if self.held.get(server) is not held:
                        continue  # handed over meanwhile: its release is what the database has
                    if valid_until is None:
                        self._lose(server, held, f"node {self.node}'s lease on server {server}'s link (epoch {held.fence.term.epoch}) "
                                                 "expired or was taken by another node")
                    else:
                        held.fence.renewed(valid_until)
            await trio.sleep(min(0.1, every))

    def _lose(self, server: str, held: HeldLink, why: str) -> None:
        if self.held.get(server) is held:
            del self.held[server]
        held.fence.lost(why)
        held.end_relay()
        self.counts["linksLost"] += 1
        self._log.error("cluster.link.lost", server=server, epoch=held.fence.term.epoch, reason=why,
                        effect="its relay ends now: nothing more is sent to the server from this node")

    async def _router_holds(self, node: str, epoch: int) -> bool:
        return bool(await self._lookups.run(partial(router_holds, node=node, epoch=epoch)))

    # -- the router's side -------------------------------------------------------------------------

    def transport_for(self, router: LeaseTerm) -> Callable[[ServerConfig, trio.Nursery], Awaitable[OpenTransport]]:
        """What the router's links open for ``router``'s term: the relay of the node holding
        each server's link, waited for while the link is free (a holder died, a hand-over)."""

        async def open_link(server: ServerConfig, nursery: trio.Nursery) -> OpenTransport:
            deadline = trio.current_time() + self.ttl * HOLDER_WAIT_LEASES
            poll = min(0.5, self.ttl * POLL_SHARE)
            why = "no node holds it"
            while True:
                try:
                    holder = await self._lookups.run(partial(link_holder, server=server.id))
                except Exception as exc:
                    # The database can't say who holds the link: a connection failure like
                    # any other to the link (retried with its backoff), not a crash of it.
                    raise TransportError(f"who holds server {server.id}'s link can't be read: {type(exc).__name__}: {exc}") from None
                if holder is not None and holder.node == self.node and server.id not in self.held:
                    holder = None  # the row is this node's, but it is handing it over
                elif holder is not None and holder.node != self.node and (holder.seen_ago is None or holder.seen_ago > self.ttl * LIVE_SHARE):
                    # Its holder is unheard of (dead, or stopped: a dial would wait out its
                    # timeouts): its lease runs out soon, and a live node takes the link.
                    why = f"node {holder.node} holds it but was last heard of {holder.seen_ago or 0:.1f}s ago"
                    holder = None
                if holder is not None:
                    try:
                        dialled = await self._dial_while_held(holder, server, router, poll)
                    except TransportError as exc:
                        if exc.status is not None:
                            raise  # the server refused the holder's dial: the link decides (its token's place)
                        # A holder just killed keeps its row until the lease runs out: waited
                        # for here, at the poll, not with the link's growing backoff.
                        why = str(exc)
                    else:
                        if dialled is not None:
                            transport, link_epoch = dialled
                            # The epoch the relay answered for: the one links_seen compares.
                            self._dialled[server.id] = (link_epoch, transport)
                            return transport
                        why = f"node {holder.node}'s relay did not answer before the link moved on"
                        self._log.info("cluster.link.dial_abandoned", server=server.id, holder=holder.node, epoch=holder.epoch,
                                       reason="the database shows the link taken by another node, or run out",
                                       effect="the link's holder now is dialled at once")
                        continue
                if trio.current_time() >= deadline:
                    raise TransportError(f"server {server.id}'s link can't be reached through any node for "
                                         f"{math.ceil(self.ttl * HOLDER_WAIT_LEASES)}s: {why}")
                await trio.sleep(poll)

        return open_link

    async def _dial_while_held(self, holder: LinkHolder, server: ServerConfig, router: LeaseTerm, poll: float) -> tuple[OpenTransport, int] | None:
        """:func:`dial_relay`, given up (None) once the database shows the link under another
        epoch or run out. A holder stopped (SIGSTOP, a paused VM) accepts the connection in its
        kernel and never answers: the dial would wait out the answer's timeout (15 s) long
        after another node took the link. (:meth:`links_seen` does the same for a relay
        already dialled.)"""
        dialling = trio.CancelScope()
        transport: tuple[OpenTransport, int] | None = None
        failure: TransportError | None = None

        async def watch() -> None:
            while True:
                await trio.sleep(poll)
                try:
                    now = await self._lookups.run(partial(link_holder, server=server.id))
                except Exception:
                    continue  # the database can't say now: the dial goes on, with its own timeout
                if now is None or (now.node, now.epoch) != (holder.node, holder.epoch):
                    dialling.cancel()
                    return

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            with dialling:
                try:
                    transport = await dial_relay(holder, server, router=router.node, router_epoch=router.epoch, token=self.relay.token)
                except TransportError as exc:
                    failure = exc  # raised as itself, not in the nursery's group
            nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure
        return transport

    async def links_seen(self, links: list[dict[str, object]]) -> None:
        """The router's side of a hand-over it was not told of: the database shows a server's
        link under a newer epoch than the relay this router reaches it through (its holder
        paused, or cut off), or run out: that relay is closed, and the link reconnects to
        whoever holds it now. A stale view shows an older epoch, never a newer one."""
        shown = {str(row["server"]): (int(str(row["epoch"])), float(str(row["expiresIn"])) > 0) for row in links}
        for server, (epoch, transport) in list(self._dialled.items()):
            now = shown.get(server)
            if now is None:
                continue
            if now[0] > epoch or (now[0] == epoch and not now[1]):
                if self._dialled.get(server, (0, None))[1] is transport:
                    del self._dialled[server]
                self._log.info("cluster.link.relay_superseded", server=server, epoch=epoch, now=now[0],
                               effect="the relay is closed; the link reconnects through the holder now")
                if transport.socket is not None:
                    await trio.aclose_forcefully(transport.socket)

    def status(self) -> dict[str, object]:
        return {
            "relay": self.relay.address,
            "held": {server: {"epoch": held.fence.term.epoch, "since": held.fence.term.since,
                              "router": None if held.router is None else {"node": held.router[0], "epoch": held.router[1]}}
                     for server, held in sorted(self.held.items())},
            "relayCounts": {"served": self.relay.counts.served, "refused": self.relay.counts.refused,
                            "oversized": self.relay.counts.oversized, "backpressured": self.relay.counts.backpressured,
                            "fromServer": self.relay.counts.fromServer,
                            "toServer": self.relay.counts.toServer},
            **self.counts,
        }


def _placement_view(db: Connection, *, live_within: float, servers: list[str]) -> tuple[dict[str, str], set[str]]:
    """(server → the node holding its link unexpired, the nodes live enough to be given links);
    the rows of servers no longer configured, and not held, are deleted on the way (a server
    removed from the file leaves status and ``journal check`` once its holder let it go)."""
    db.execute("DELETE FROM cluster_links WHERE NOT (server = ANY(?)) AND expires_at < clock_timestamp()", (servers,))
    held_by = {str(row["server"]): str(row["node"]) for row in links_view(db) if float(str(row["expiresIn"])) > 0}
    live = {
        str(node)
        for node, in db.execute(
            "SELECT node FROM cluster_nodes WHERE state NOT IN ('draining', 'stopped')"
            " AND seen_at > clock_timestamp() - make_interval(secs => ?)",
            (live_within,),
        ).fetchall()
    }
    return held_by, live


def _try_acquire_link(db: Connection, *, server: str, node: str, ttl: float) -> tuple[LeaseTerm | None, float]:
    """Take ``server``'s link if it is free; a lock held by a commit under way is not a fault
    (the next poll tries again)."""
    import psycopg

    try:
        return acquire_link(db, server, node, ttl)
    except psycopg.errors.LockNotAvailable:
        return None, 0.0
