"""Scale: memory per registered channel, ``channels/list`` pages and resolution at 1k/10k/100k.

    python bench/bench_scale.py [--sizes 1000,10000,100000]

Each size runs in a fresh process (so its RSS is its own): the daemon's registry and resolver
(the state a daemon holds per channel) take N channels over 4 servers, registered as servers do
(batches of 500 descriptors); the RSS growth per channel is measured, then a full
``channels/list`` walk in pages of 1,000 (the host API's pages), one page, and resolution
(``channels_named``, ``name_shown``) of names that pick one channel, that are shared, and that
answer to none. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import ROOT, rss_kib

PAGE = 1000


def measure(size: int) -> dict[str, Any]:
    """In this process: register ``size`` channels and time what a host and an agent ask."""
    import os

    from mcpl_router.routing.refs import ChannelRef
    from mcpl_router.routing.registry import RegistrationPolicy
    from mcpl_router.routing.router import Router

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
    gc.collect()
    router = Router()
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
    print(f"{'channels':>10}{'B/channel':>11}{'page ms':>9}{'all pages ms':>14}{'unique µs':>11}{'shared µs':>11}{'none µs':>9}{'shown µs':>10}")
    for row in rows:
        print(
            f"{row['channels']:>10,}{row['rss_bytes_per_channel']:>11.0f}{row['list_page_ms']:>9.2f}{row['list_all_pages_ms']:>14.1f}"
            f"{row['resolve_unique_us']:>11.2f}{row['resolve_shared_us']:>11.2f}{row['resolve_none_us']:>9.2f}{row['name_shown_us']:>10.2f}"
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
