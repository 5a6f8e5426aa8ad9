"""Where each server's link belongs: a pure decision every node makes at each poll.

``cluster.links = "balanced"`` (docs/cluster.md): each node, from the same view of the
database (the live nodes, who holds which link), decides which free links to take and which
of its own to hand over. The leases make the decisions safe when two nodes' views differ for
a moment (only one can take a link); the rules make them converge:

- a server **pinned** to a live node belongs there: that node takes it once it is free, and any
  other holder hands it over (so a pinned node that comes back gets its link back);
- every other server (unpinned, or pinned to a node that is not live) is **balanced**: a node
  among the least loaded takes a free one while it holds fewer than its share, ``ceil(balanced
  / live nodes)``, and a node holding two more than the least loaded hands one over, a poll at a
  time (so the spread converges to differences of one, and a node that joins gets some);
- a link just taken is not moved for placement until it has been held a while (every move is a
  reconnect of its server); a link left free too long is taken by any live node;
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
    #: Which of ``release`` are for balance alone (the node may pause balancing when no node
    #: picks them up).
    balancing: tuple[str, ...] = ()


def plan_links(
    *,
    me: str,
    servers: Sequence[str],
    pin: Mapping[str, str],
    live: Collection[str],
    held_by: Mapping[str, str],
    draining: bool = False,
    settled: Collection[str] | None = None,
    long_free: Collection[str] = (),
    balance: bool = True,
) -> LinkPlan:
    """This node's moves, given the configured ``servers``, their pins, the ``live``
    nodes that take links (this one among them unless it drains) and who holds each link
    unexpired now (``held_by``: server → node; a free link is absent).

    ``settled``: the links this node has held long enough to move them for placement (None:
    all); a link just taken is not handed on at once (a pinned node flapping, a node joining in
    a rolling restart), since every move is a reconnect of that server. ``long_free``: links
    free for longer than a node should take to pick them up; taken by any live node whatever
    the rules say (nodes whose configs disagree on a pin must not leave a link unheld).
    ``balance``: False while this node holds off moving links for balance (one it moved was
    picked up by no node).
    """
    mine = sorted(server for server in servers if held_by.get(server) == me)
    if draining:
        return LinkPlan(release={server: f"node {me} is draining" for server in mine})
    movable = set(mine) if settled is None else set(settled)
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
        elif owner != me and held_by.get(server) == me and server in movable:
            release[server] = f"it is pinned to node {owner}, which is live"
    counts = {node: 0 for node in live_nodes}
    for server in balanced:
        holder = held_by.get(server)
        if holder in counts:
            counts[holder] += 1
    fewest = min(counts.values())
    mine_balanced = [server for server in mine if server in balanced]
    # Handed on while this node holds two more than the least loaded, one a poll (the last by
    # id): the spread converges to differences of one, and a node that joins gets its share.
    # Only while every balanced link is held: a move waits for the last one to be picked up.
    balancing: tuple[str, ...] = ()
    if balance and len(mine_balanced) >= fewest + 2 and all(server in held_by for server in balanced):
        candidates = [server for server in mine_balanced if server in movable]
        if candidates:
            release[candidates[-1]] = (f"node {me} holds {len(mine_balanced)} balanced links and another live node "
                                       f"{fewest}: one moves")
            balancing = (candidates[-1],)
    # Taken while under the share and among the least loaded (the node that just handed one
    # on does not take it back).
    share = math.ceil(len(balanced) / len(live_nodes)) if balanced else 0
    room = share - len(mine_balanced) if counts[me] == fewest else 0
    for server in balanced:
        if room <= 0:
            break
        if server not in held_by and server not in take:
            take.append(server)
            room -= 1
    for server in sorted(long_free):
        if server in servers and server not in held_by and server not in take:
            take.append(server)
    return LinkPlan(take=tuple(take), release=release, balancing=balancing)
