"""Nodes: several daemons on one PostgreSQL journal, one holding the links under a lease
(docs/cluster.md)."""

from mcpl_router.cluster.node import ClusterNode

__all__ = ["ClusterNode"]
