"""Where links belong in a balanced cluster (mcpl_router/cluster/placement.py).

The decision is pure; the leases make it safe (one taker per free link). These tests play
rounds of every node deciding from the same view, a link going to the first node that asks,
and check where it settles, from any starting holding.
"""

from __future__ import annotations

from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from mcpl_router.cluster.placement import plan_links

SERVERS = ("a", "b", "c", "d", "e")
NODES = ("n1", "n2", "n3")


def settle(
    live: tuple[str, ...], pin: Mapping[str, str], held_by: dict[str, str], order: list[int], rounds: int = 16, draining: frozenset[str] = frozenset()
) -> dict[str, str]:
    """Rounds of every node planning from the view as it is, in ``order`` (who asks first)."""
    held = dict(held_by)
    for round_ in range(rounds):
        turn = [live[(i + order[round_ % len(order)]) % len(live)] for i in range(len(live))]
        for node in turn:
            plan = plan_links(me=node, servers=SERVERS, pin=pin, live=[n for n in live if n not in draining],
                              held_by=held, draining=node in draining)
            for server in plan.release:
                assert held.get(server) == node, "a node hands over only what it holds"
                del held[server]
            for server in plan.take:
                held.setdefault(server, node)  # the lease: the first to ask gets it
    return held


placements = st.fixed_dictionaries({}, optional={server: st.sampled_from(NODES + ("gone",)) for server in SERVERS})


@settings(max_examples=300, deadline=None)
@given(
    live=st.lists(st.sampled_from(NODES), min_size=1, max_size=3, unique=True).map(tuple),
    pin=st.fixed_dictionaries({}, optional={server: st.sampled_from(NODES) for server in SERVERS}),
    held_by=placements,
    order=st.lists(st.integers(0, 2), min_size=1, max_size=4),
)
def test_links_settle_on_their_pins_and_evenly_over_the_live_nodes(
    live: tuple[str, ...], pin: dict[str, str], held_by: dict[str, str], order: list[int]
) -> None:
    # A holder that is not live holds a lease that runs out: the view shows the link free.
    start = {server: node for server, node in held_by.items() if node in live}
    held = settle(live, pin, start, order)
    # Every link is held, and by a live node.
    assert set(held) == set(SERVERS) and set(held.values()) <= set(live), held
    # A link pinned to a live node is there.
    for server, node in pin.items():
        if node in live:
            assert held[server] == node, (server, held)
    # The rest are spread evenly: no node holds more than its share.
    balanced = [server for server in SERVERS if pin.get(server) not in live]
    counts = {node: sum(1 for server in balanced if held[server] == node) for node in live}
    share = -(-len(balanced) // len(live))
    assert max(counts.values()) <= share and max(counts.values()) - min(counts.values()) <= 1, counts
    # And it stays put: another round moves nothing.
    assert settle(live, pin, held, order, rounds=2) == held


def test_a_draining_node_hands_over_everything_and_takes_nothing() -> None:
    held = {"a": "n1", "b": "n1", "c": "n2"}
    plan = plan_links(me="n1", servers=SERVERS, pin={"a": "n1"}, live=["n1", "n2"], held_by=held, draining=True)
    assert plan.take == () and set(plan.release) == {"a", "b"}
    settled = settle(("n1", "n2"), {"a": "n1"}, held, [0], draining=frozenset({"n1"}))
    assert set(settled.values()) == {"n2"} and set(settled) == set(SERVERS)


def test_a_pinned_node_that_comes_back_gets_its_link_back() -> None:
    # n1 was gone: its pinned link went to n2. Live again, n2 hands it over and n1 takes it.
    plan = plan_links(me="n2", servers=("a",), pin={"a": "n1"}, live=["n1", "n2"], held_by={"a": "n2"})
    assert plan.release == {"a": "it is pinned to node n1, which is live"}
    assert plan_links(me="n1", servers=("a",), pin={"a": "n1"}, live=["n1", "n2"], held_by={}).take == ("a",)
    # While n1 is not live, n2 keeps it.
    assert plan_links(me="n2", servers=("a",), pin={"a": "n1"}, live=["n2"], held_by={"a": "n2"}).release == {}


def test_a_node_that_joins_is_handed_links_one_a_poll_until_the_spread_is_even() -> None:
    plan = plan_links(me="n1", servers=("a", "b", "c", "d"), pin={}, live=["n1", "n2"], held_by=dict.fromkeys("abcd", "n1"))
    assert plan.release.keys() == {"d"} and "holds 4 balanced links and another live node 0" in plan.release["d"]
    # Two nodes at two and a third joining with none: one link moves to it (not 2/2/0 for ever).
    held = {"a": "n1", "b": "n1", "c": "n2", "d": "n2", "e": "n1"}
    settled = settle(("n1", "n2", "n3"), {}, held, [0, 1, 2])
    assert sorted(list(settled.values()).count(node) for node in ("n1", "n2", "n3")) == [1, 2, 2], settled
    # The node that handed one on does not take it back: the least loaded does.
    assert plan_links(me="n1", servers="abcd", pin={}, live=["n1", "n2", "n3"], held_by={"a": "n1", "c": "n2", "d": "n2"}).take == ()
    assert plan_links(me="n3", servers="abcd", pin={}, live=["n1", "n2", "n3"], held_by={"a": "n1", "c": "n2", "d": "n2"}).take == ("b",)


def test_a_link_just_taken_is_not_moved_for_placement() -> None:
    # n1 came back: its pinned link stays with n2 until n2 has held it long enough; then moves.
    early = plan_links(me="n2", servers=("a",), pin={"a": "n1"}, live=["n1", "n2"], held_by={"a": "n2"}, settled=())
    assert early.release == {}
    assert plan_links(me="n2", servers=("a",), pin={"a": "n1"}, live=["n1", "n2"], held_by={"a": "n2"}, settled=("a",)).release
    # The same for balance; a drain moves everything at once all the same.
    assert plan_links(me="n1", servers="abcd", pin={}, live=["n1", "n2"], held_by=dict.fromkeys("abcd", "n1"), settled=()).release == {}
    assert len(plan_links(me="n1", servers="ab", pin={}, live=["n1"], held_by=dict.fromkeys("ab", "n1"), settled=(), draining=True).release) == 2


def test_a_link_free_too_long_is_taken_whatever_the_pins_say() -> None:
    # n2 believes a is pinned to n1 (live); n1's config says otherwise: no one would take it.
    assert plan_links(me="n2", servers=("a",), pin={"a": "n1"}, live=["n1", "n2"], held_by={}).take == ()
    assert plan_links(me="n2", servers=("a",), pin={"a": "n1"}, live=["n1", "n2"], held_by={}, long_free=("a",)).take == ("a",)
    # Only a configured server, and only while free.
    assert plan_links(me="n2", servers=("a",), pin={}, live=["n2"], held_by={"a": "n1"}, long_free=("a", "z")).take == ()


def test_no_link_is_moved_for_balance_while_a_balanced_link_is_free() -> None:
    held = {"a": "n1", "b": "n1", "c": "n1"}
    assert plan_links(me="n1", servers="abcd", pin={}, live=["n1", "n2"], held_by=held).release == {}
    assert plan_links(me="n1", servers="abc", pin={}, live=["n1", "n2"], held_by=held).balancing == ("c",)
    assert plan_links(me="n1", servers="abc", pin={}, live=["n1", "n2"], held_by=held, balance=False).release == {}
