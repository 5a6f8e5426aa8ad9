"""Scale: memory per registered channel, ``channels/list`` pages, resolution and ``servers/list`` at 1k/10k/100k.

    python bench/bench_scale.py [--sizes 1000,10000,100000]

Each size runs in a fresh process (so its RSS is its own): the daemon's registry and resolver
(the state a daemon holds per channel) take N channels over 4 servers, registered as servers do
(batches of 500 descriptors); the RSS growth per channel is measured, then a full
``channels/list`` walk in pages of 1,000 (the host API's pages), one page, and resolution
(``channels_named``, ``name_shown``) of names that pick one channel, that are shared, and that
answer to none; and ``servers/list`` (the daemon's own :class:`ServersView` over 4 configured
links) at N and over the same servers with one channel, both held in the same process and
timed in alternating rounds: its cost at N ÷ at 1 channel (issue 30's target: ≤ 1.5). Nothing is
asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import ROOT, rss_kib

PAGE = 1000
#: ``servers/list`` answers timed at each point (the median is kept).
LIST_CALLS = 200
#: Alternating rounds of ``servers/list`` at one channel and at the most (LIST_CALLS ÷ 4 calls each).
LIST_ROUNDS = 8


class _NoDelegate:
    """The links are never run: nothing of theirs reaches a delegate."""

    def link_state_changed(self, link: Any, old: Any, new: Any) -> None: ...

    def link_epoch_ended(self, link: Any) -> None: ...

    async def handle_server_message(self, link: Any, inbound: Any) -> object:
        raise AssertionError("never called")


def servers_list_us(view: Any, calls: int = LIST_CALLS) -> float:
    """The median µs of one ``servers/list`` answer."""
    timings = []
    for _ in range(calls):
        started = time.perf_counter()
        view.servers_list()
        timings.append(time.perf_counter() - started)
    return statistics.median(timings) * 1e6


def servers_list_compared(small: Any, large: Any, rounds: int = LIST_ROUNDS) -> tuple[float, float, float]:
    """``servers/list`` of two views timed in alternation: (µs of ``small``, µs of ``large``,
    the median of the rounds' large ÷ small).

    Both live in this process at once, so the machine's load, which moves within seconds on a
    shared machine, falls on both sides of each round alike (timed at two moments, minutes of
    registering apart, the ratio read the load's change as well: 0.59 to 1.55 for the same code).
    """
    small_us, large_us, ratios = [], [], []
    for round_number in range(rounds):
        pair = (small, large) if round_number % 2 == 0 else (large, small)
        timed = {id(view): servers_list_us(view, LIST_CALLS // 4) for view in pair}
        small_us.append(timed[id(small)])
        large_us.append(timed[id(large)])
        ratios.append(timed[id(large)] / timed[id(small)])
    return statistics.median(small_us), statistics.median(large_us), statistics.median(ratios)


def measure(size: int) -> dict[str, Any]:
    """In this process: register ``size`` channels and time what a host and an agent ask."""
    import os

    import tempfile

    from mcpl_router.config import parse_config
    from mcpl_router.events import EventBus
    from mcpl_router.mcpl.link import ServerLink
    from mcpl_router.mcpl.liveness import Liveness
    from mcpl_router.routing.refs import ChannelRef
    from mcpl_router.routing.registry import RegistrationPolicy
    from mcpl_router.routing.router import Router
    from mcpl_router.servers_view import ServersView

    policy = RegistrationPolicy.permissive()
    # Descriptors as servers send them, built before the baseline (they are the wire's, not ours).
    batches = []
    for server in range(4):
        descriptors = [
            {"id": f"guild-{n % 97}:channel-{n}", "type": "channel", "label": f"channel {n}", "direction": "bidirectional"}
            for n in range(server, size, 4)
        ]
        # Every 50th id is shared with the next server: collisions, as real ids have.
        batches.append((f"server{server}", descriptors))
    for server, descriptors in batches:
        if server != "server0":
            descriptors.extend({"id": d["id"], "type": "channel", "label": d["label"]} for d in batches[0][1][: max(1, size // 200)])
    router = Router()
    # servers/list as the daemon answers it: its ServersView over 4 links (never connected).
    config = parse_config(
        {"mcplServers": {server: {"command": "server"} for server, _ in batches}, "host": {"unixSocket": False}},
        source="<bench>",
        base_dir=Path(tempfile.gettempdir()),
    )
    links = {server_id: ServerLink(server, _NoDelegate()) for server_id, server in config.servers.items()}
    view = ServersView(router=router, links=links, liveness=Liveness(), events=EventBus())
    # The same servers with one channel, kept beside the large registry to be timed with it.
    one_channel = Router()
    one_channel.registry.register(batches[0][0], batches[0][1][:1], policy)
    view_at_one = ServersView(router=one_channel, links=links, liveness=Liveness(), events=EventBus())
    gc.collect()
    before = rss_kib(os.getpid())
    started = time.perf_counter()
    for server, descriptors in batches:
        for start in range(0, len(descriptors), 500):
            router.registry.register(server, descriptors[start : start + 500], policy)
    register_seconds = time.perf_counter() - started
    del batches
    gc.collect()
    after = rss_kib(os.getpid())
    registered = len(router.registry)
    names = router.names

    started = time.perf_counter()
    page = names.channel_page(0, PAGE)
    one_page = time.perf_counter() - started
    started = time.perf_counter()
    walked = 0
    position = 0
    while position < registered:
        walked += len(names.channel_page(position, PAGE))
        position += PAGE
    full_walk = time.perf_counter() - started
    assert walked == registered and page

    unique = [f"guild-{n % 97}:channel-{n}" for n in range(size // 200 + 1, size, max(1, size // 1000))][:1000]
    shared = ["guild-0:channel-0"] * 100
    nowhere = [f"nowhere-{n}" for n in range(100)]
    timings = {}
    for label, batch in (("unique", unique), ("shared", shared), ("none", nowhere)):
        started = time.perf_counter()
        for name in batch:
            names.channels_named(name)
        timings[label] = (time.perf_counter() - started) / len(batch) * 1e6
    refs = [ChannelRef("server1", name) for name in unique[:500]]
    started = time.perf_counter()
    for ref in refs:
        names.name_shown(ref)
    shown_us = (time.perf_counter() - started) / len(refs) * 1e6
    list_at_one, list_at_n, list_ratio = servers_list_compared(view_at_one, view)
    return {
        "channels": registered,
        "rss_bytes_per_channel": (after - before) * 1024 / registered,
        "register_us_per_channel": register_seconds / registered * 1e6,
        "list_page_ms": one_page * 1e3,
        "list_all_pages_ms": full_walk * 1e3,
        "resolve_unique_us": timings["unique"],
        "resolve_shared_us": timings["shared"],
        "resolve_none_us": timings["none"],
        "name_shown_us": shown_us,
        "servers_list_us": list_at_n,
        "servers_list_at_one_us": list_at_one,
        "servers_list_ratio": list_ratio,
    }


def scale(sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    for size in sizes:
        out = subprocess.run(
            [sys.executable, __file__, "--one", str(size)], capture_output=True, text=True, check=True, cwd=ROOT
        ).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(f"  scale {size:,}: {rows[-1]['rss_bytes_per_channel']:.0f} B/channel", flush=True)
    return rows


def print_scale(rows: list[dict[str, Any]]) -> None:
    print("\nScale: the registry and resolver, per registered channel (4 servers, some ids shared)")
    print(
        f"{'channels':>10}{'B/channel':>11}{'page ms':>9}{'all pages ms':>14}{'unique µs':>11}{'shared µs':>11}{'none µs':>9}{'shown µs':>10}"
        f"{'servers/list µs':>17}{'÷ at 1':>8}"
    )
    for row in rows:
        print(
            f"{row['channels']:>10,}{row['rss_bytes_per_channel']:>11.0f}{row['list_page_ms']:>9.2f}{row['list_all_pages_ms']:>14.1f}"
            f"{row['resolve_unique_us']:>11.2f}{row['resolve_shared_us']:>11.2f}{row['resolve_none_us']:>9.2f}{row['name_shown_us']:>10.2f}"
            f"{row['servers_list_us']:>17.1f}{row['servers_list_ratio']:>8.2f}"
        )
    if rows:
        largest = max(rows, key=lambda row: row["channels"])
        print(
            f"servers/list at {largest['channels']:,} channels ÷ at 1 channel (same process, 4 servers, timed in alternation): "
            f"{largest['servers_list_ratio']:.2f} (target ≤ 1.5)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    if args.one:
        print(json.dumps(measure(args.one)))
    else:
        print_scale(scale([int(s) for s in args.sizes.split(",")]))
