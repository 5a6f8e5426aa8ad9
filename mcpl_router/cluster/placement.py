"""Where each server's link belongs: a pure decision every node makes at each poll.

``cluster.links = "balanced"`` (docs/cluster.md): each node, from the same view of the
database (the live nodes, who holds which link), decides which free links to take and which
of its own to hand over. The leases make the decisions safe when two nodes' views differ for
a moment (only one can take a link); the rules make them converge:

- a server **pinned** to a live node belongs there: that node takes it once it is free, and any
  other holder hands it over (so a pinned node that comes back gets its link back);
- every other server (unpinned, or pinned to a node that is not live) is **balanced**: a node
  takes a free one while it holds fewer than its share, ``ceil(balanced / live nodes)``, and
  hands over what it holds beyond its share (so a node that joins gets some);
- a node that is draining holds nothing: it hands everything over at once.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import attrs

__all__ = ["LinkPlan", "plan_links"]


@attrs.frozen
class LinkPlan:
    """What this node does now: try to take ``take``; hand over ``release`` (server → why)."""

    take: tuple[str, ...] = ()
    release: Mapping[str, str] = attrs.field(factory=dict)


def plan_links(
    *,
    me: str,
    servers: Sequence[str],
    pin: Mapping[str, str],
    live: Collection[str],
    held_by: Mapping[str, str],
    draining: bool = False,
) -> LinkPlan:
    """This node's moves, given the configured ``servers``, their ``pin``\\ s, the ``live``
    nodes that take links (this one among them unless it drains) and who holds each link
    unexpired now (``held_by``: server → node; a free link is absent)."""
    mine = sorted(server for server in servers if held_by.get(server) == me)
    if draining:
        return LinkPlan(release={server: f"node {me} is draining" for server in mine})
    live_nodes = set(live) | {me}
    release: dict[str, str] = {}
    take: list[str] = []
    balanced = sorted(server for server in servers if pin.get(server) not in live_nodes)
    for server in sorted(servers):
        owner = pin.get(server)
        if owner not in live_nodes:
            continue
        if owner == me and server not in held_by:
            take.append(server)
        elif owner != me and held_by.get(server) == me:
            release[server] = f"it is pinned to node {owner}, which is live"
    share = math.ceil(len(balanced) / len(live_nodes)) if balanced else 0
    mine_balanced = [server for server in mine if server in balanced]
    for server in mine_balanced[share:]:
        release[server] = f"node {me} holds more than its share ({share}) of the balanced links"
    room = share - len(mine_balanced)
    for server in balanced:
        if room <= 0:
            break
        if server not in held_by:
            take.append(server)
            room -= 1
    return LinkPlan(take=tuple(take), release=release)
