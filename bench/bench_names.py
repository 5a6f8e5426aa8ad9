"""Benchmark: name resolution, shown names and channel_list at 100, 10k and 100k channels.

Run: ``python3 bench/bench_names.py`` (``--quick`` for fewer repeats). Prints one table and the
100k/100 ratios. Lookups should stay flat (O(1) in the number of channels: the ratio near 1) and
the listing should grow linearly (its ratio near 1000, its per-row time flat). No assertions:
timings depend on the machine; the shape is what matters.

At 100k channels the registry outgrows the CPU's caches, so a lookup of a random name costs a
few cache misses more than at 100 (about x2 on a laptop-class CPU). The "100 hot" column does
the same lookups over 100 distinct names: it stays flat, which shows the growth is memory, not
work. The cyclic GC is kept out of timed regions, as timeit does.

The registry is built to collide the way real deployments do, and worse: nine servers, half of
each server's ids shared by all nine (``general17`` on every server), the other half its own,
and a server ``srv0:x`` whose ids meet ``srv0``'s ``x:…`` ids in one qualified name, so the
lookups pay for real candidate sets and refusals, not only for one-hit dict probes.
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mcpl_router.routing.names import ChannelNames  # noqa: E402
from mcpl_router.routing.registry import ChannelDescriptor, ChannelRegistry, RegistrationPolicy  # noqa: E402

SIZES = (100, 10_000, 100_000)
PLAIN_SERVERS = [f"srv{k}" for k in range(8)]
COLLIDING_SERVER = "srv0:x"  # srv0's "x:room5" and srv0:x's "room5" are both "srv0:x:room5"
LOOKUPS = 20_000


def build(size: int) -> ChannelNames:
    """A registry of ``size`` channels over nine servers with colliding ids."""
    registry = ChannelRegistry()
    policy = RegistrationPolicy.permissive()
    servers = [*PLAIN_SERVERS, COLLIDING_SERVER]
    for index, server in enumerate(servers):
        batch = []
        # Spread the remainder, so the registry holds exactly ``size`` channels.
        for i in range(size // len(servers) + (index < size % len(servers))):
            if server == COLLIDING_SERVER:
                channel_id = f"room{i}"
            elif server == "srv0" and i % 4 == 1:
                channel_id = f"x:room{i}"
            elif i % 2 == 0:
                channel_id = f"general{i}"  # on every plain server
            else:
                channel_id = f"{server}-ch{i}"
            kind = "dm" if i % 10 == 3 else "text"
            batch.append(ChannelDescriptor(id=channel_id, type=kind, label=f"Label{i % 50}"))
        results = registry.register(server, batch, policy)
        assert all(r.accepted for r in results)
    return ChannelNames(registry)


def _timed(run: Callable[[], object]) -> float:
    # As timeit does, keep the cyclic GC out of the timed region: with 100k live channels a
    # collection walks them all, and when one lands depends on allocation counts, not on the
    # code measured.
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        run()
        return time.perf_counter() - start
    finally:
        gc.enable()


def per_call_us(fn: Callable[[Any], object], args: Sequence[Any], repeats: int) -> float:
    """Best-of-``repeats`` mean time per call, in microseconds."""

    def run() -> None:
        for arg in args:
            fn(arg)

    return min(_timed(run) for _ in range(repeats)) / len(args) * 1e6


def total_ms(fn: Callable[[], object], repeats: int) -> float:
    """Best-of-``repeats`` time of one call, in milliseconds."""
    return min(_timed(fn) for _ in range(repeats)) * 1e3


def measure(size: int, repeats: int) -> dict[str, float]:
    names = build(size)
    registry = names.registry
    rng = random.Random(size)
    refs = [entry.ref for entry in registry.all_entries()]
    sample_refs = [rng.choice(refs) for _ in range(LOOKUPS)]
    # Names as agents give them: ids (often shared), qualified names, and some that name nothing.
    sample_names = []
    for ref in sample_refs:
        roll = rng.random()
        if roll < 0.45:
            sample_names.append(ref.channel_id)
        elif roll < 0.9:
            sample_names.append(ref.qualified_name)
        else:
            sample_names.append(f"missing-{rng.randrange(10**9)}")
    # The same lookups over only 100 distinct names: the work per lookup is the same, but the
    # memory touched stays in the CPU's caches. Where the cold column grows with the registry
    # and this one doesn't, the growth is cache misses, not the algorithm.
    hot_pool = rng.sample(sample_names, 100)
    hot_names = [rng.choice(hot_pool) for _ in range(LOOKUPS)]
    ambiguous = sum(1 for name in sample_names[:2000] if len(names.channels_named(name)) > 1)
    return {
        "channels": len(registry),
        "ambiguous_pct": ambiguous / 20,
        "channels_named_us": per_call_us(names.channels_named, sample_names, repeats),
        "hot_named_us": per_call_us(names.channels_named, hot_names, repeats),
        "channel_named_us": per_call_us(names.channel_named, sample_names, repeats),
        "name_shown_us": per_call_us(names.name_shown, sample_refs, repeats),
        "channel_list_ms": total_ms(names.channel_list, max(1, repeats - 2)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat per measurement")
    args = parser.parse_args()
    repeats = 1 if args.quick else 5

    rows = [measure(size, repeats) for size in SIZES]
    header = (
        f"{'channels':>9} | {'ambig. names':>12} | {'channels_named':>14} | {'same, 100 hot':>13} |"
        f" {'channel_named':>13} |"
        f" {'name_shown':>10} | {'channel_list':>12} | {'list per row':>12}"
    )
    units = (
        f"{'':>9} | {'% of lookups':>12} | {'µs/lookup':>14} | {'µs/lookup':>13} | {'µs/lookup':>13} |"
        f" {'µs/call':>10} | {'ms total':>12} | {'µs/row':>12}"
    )
    print(f"Python {sys.version.split()[0]}, {LOOKUPS} lookups per size, best of {repeats}")
    print(header)
    print(units)
    print("-" * len(header))
    for row in rows:
        print(
            f"{row['channels']:>9,} | {row['ambiguous_pct']:>11.0f}% | {row['channels_named_us']:>14.2f} |"
            f" {row['hot_named_us']:>13.2f} |"
            f" {row['channel_named_us']:>13.2f} | {row['name_shown_us']:>10.2f} |"
            f" {row['channel_list_ms']:>12.2f} | {row['channel_list_ms'] * 1e3 / row['channels']:>12.3f}"
        )
    small, large = rows[0], rows[-1]
    print("-" * len(header))

    def ratio(key: str) -> float:
        return large[key] / small[key]

    growth = large["channels"] / small["channels"]
    print(
        f"ratio {large['channels']:,}/{small['channels']:,} channels (x{growth:,.0f}): "
        f"channels_named x{ratio('channels_named_us'):.2f} (x{ratio('hot_named_us'):.2f} over 100 hot names), "
        f"channel_named x{ratio('channel_named_us'):.2f}, "
        f"name_shown x{ratio('name_shown_us'):.2f} (per lookup; O(1) is ~1); "
        f"channel_list x{ratio('channel_list_ms'):,.0f} total (linear is ~{growth:,.0f})"
    )


if __name__ == "__main__":
    main()
