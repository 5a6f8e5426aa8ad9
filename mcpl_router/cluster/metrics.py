"""A node's series on ``/metrics``: whether it holds the links, the lease's epoch, every node's
last heartbeat, and what happened to its terms.

Read when scraped from the node (never counted on a hot path). While the node holds the links
they are registered into its term's daemon registry, so one page has both; while it is a
standby, the page is these and the process series alone.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, GCCollector, Info, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder

from mcpl_router import __version__
from mcpl_router.metrics import without_created

__all__ = ["NodeMetrics"]


class _NodeView(Protocol):
    def status(self) -> dict[str, object]: ...


class NodeMetrics:
    """The node's collector, and ``/metrics`` for its health listener (:class:`~mcpl_router.health.MetricsPage`)."""

    def __init__(self, node: _NodeView) -> None:
        self._node = node
        self._standby = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self._standby)
        PlatformCollector(registry=self._standby)
        GCCollector(registry=self._standby)
        Info("mcpl_router_build", "The daemon's version and the Python that runs it.", registry=self._standby).info(
            {"version": __version__, "python": platform.python_version()}
        )
        self._standby.register(self)
        self._term: CollectorRegistry | None = None

    def attach(self, registry: CollectorRegistry) -> None:
        """A term began: its daemon's registry shows the node's series too (a fresh registry
        each term, so each is registered once)."""
        registry.register(self)
        self._term = registry

    def detach(self) -> None:
        self._term = None

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        encode, content_type = choose_encoder(accept or "")
        return encode(without_created(self._term or self._standby)), content_type

    def describe(self) -> list[Metric]:
        # Nothing to describe ahead: registering must not read the node before it is made.
        return []

    def collect(self) -> Iterator[Metric]:
        status = self._node.status()
        node = str(status["node"])
        lease = status.get("lease")
        holding = GaugeMetricFamily("mcpl_router_cluster_holding", "1 while this node holds the links' lease (serves hosts and servers).", labels=["node"])
        holding.add_metric([node], 1.0 if status.get("state") == "holding" else 0.0)
        yield holding
        holder = status.get("holder")
        epoch = GaugeMetricFamily("mcpl_router_cluster_lease_epoch", "The links' lease's epoch as this node last saw it (raised by every takeover).")
        if isinstance(holder, dict):
            epoch.add_metric([], float(holder.get("epoch", 0)))
        elif isinstance(lease, dict):
            epoch.add_metric([], float(lease.get("epoch", 0)))
        yield epoch
        seen = GaugeMetricFamily("mcpl_router_cluster_node_seen_seconds", "Seconds since each node's last heartbeat, by the database's clock.", labels=["node", "state"])
        nodes = status.get("nodes")
        for row in nodes if isinstance(nodes, list) else []:
            seen.add_metric([str(row.get("node")), str(row.get("state"))], float(row.get("seenAgo", 0)))
        yield seen
        links = GaugeMetricFamily("mcpl_router_cluster_link_holder", "1 for the node holding each server's link unexpired, as this node last saw it (links = \"balanced\").",
                                  labels=["server", "node"])
        rows = status.get("links")
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, dict) and float(row.get("expiresIn", 0)) > 0:
                links.add_metric([str(row.get("server")), str(row.get("node"))], 1.0)
        yield links
        holdings = status.get("linkHoldings")
        if isinstance(holdings, dict):
            for key, name, text in (
                ("linksTaken", "mcpl_router_cluster_links_taken", "Server links this node took (a lease per link)."),
                ("linksLost", "mcpl_router_cluster_links_lost", "Server links whose lease this node lost (expired unrenewed or taken)."),
                ("linksHandedOver", "mcpl_router_cluster_links_handed_over", "Server links this node released to another (placement, drain)."),
                ("linksUnreachable", "mcpl_router_cluster_links_unreachable", "Server links this node handed on because it could not reach their server."),
            ):
                counter = CounterMetricFamily(name, text, labels=["node"])
                counter.add_metric([node], float(str(holdings.get(key, 0))))
                yield counter
            relayed = CounterMetricFamily("mcpl_router_cluster_relay_messages", "Messages this node's relay carried, by direction.", labels=["node", "direction"])
            relays = CounterMetricFamily("mcpl_router_cluster_relays", "Relays this node served or refused; messages too large; batches that waited for the router's stream (backpressure).", labels=["node", "outcome"])
            counts = holdings.get("relayCounts")
            counts = counts if isinstance(counts, dict) else {}
            for direction in ("fromServer", "toServer"):
                relayed.add_metric([node, direction], float(counts.get(direction, 0)))
            for outcome in ("served", "refused", "oversized", "backpressured"):
                relays.add_metric([node, outcome], float(counts.get(outcome, 0)))
            yield relayed
            yield relays
        proxied = status.get("proxied")
        proxied = proxied if isinstance(proxied, dict) else {}
        forwarding = GaugeMetricFamily("mcpl_router_cluster_proxied_connections", "Host connections this standby forwards to the holder now.", labels=["node"])
        forwarding.add_metric([node], float(proxied.get("open", 0)))
        yield forwarding
        forwarded = CounterMetricFamily("mcpl_router_cluster_proxied_connections_forwarded", "Host connections this node forwarded to the holder while a standby.", labels=["node"])
        forwarded.add_metric([node], float(proxied.get("total", 0)))
        yield forwarded
        refused = CounterMetricFamily("mcpl_router_cluster_proxy_refused", "Host connections this standby refused (no holder, the holder unreachable, too many), by reason.", labels=["node", "reason"])
        for reason, count in sorted((proxied.get("refused") or {}).items()):
            refused.add_metric([node, str(reason)], float(count))
        yield refused
        for key, name, text in (
            ("terms", "mcpl_router_cluster_terms", "Terms this node held the links (each began with a takeover of the lease)."),
            ("leasesLost", "mcpl_router_cluster_leases_lost", "Terms that ended because the lease was lost (expired unrenewed or taken)."),
            ("renewFailures", "mcpl_router_cluster_renew_failures", "Lease renewals that failed (the database unreachable)."),
            ("refusedTerms", "mcpl_router_cluster_refused_terms", "Terms that could not start (the journal refused); the lease was given up."),
            ("nameClashes", "mcpl_router_cluster_name_clashes", "Other processes found heartbeating under this node's name (a configuration mistake)."),
        ):
            counter = CounterMetricFamily(name, text, labels=["node"])
            counter.add_metric([node], float(str(status.get(key, 0))))
            yield counter
