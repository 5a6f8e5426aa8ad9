"""What the lease's fence costs a commit: the journal on PostgreSQL with and without it.

    python bench/bench_fence.py [--commits 500] [--rounds 3]

One PostgreSQL on loopback (as the tests start it). Each round, for each side in turn, a new
database: ``--commits`` inbound events recorded one at a time (each awaited: one commit's
latency), then 20 batches of 256 (a flood's group commits). The fenced side holds the links'
lease (store/leases.py) and checks it first in every transaction, as a cluster's holder does.
Prints p50/p99 of a single commit and the batches' events/s, medians over rounds.
"""

from __future__ import annotations

import argparse
import time
from statistics import median

import trio

from mcpl_router.store.records import EventKind
from mcpl_router.store.journal import Delivery, InboundEvent
from mcpl_router.store.leases import LINKS, LeaseFence, acquire, ensure_cluster_tables
from mcpl_router.store.postgres_backend import connect
from mcpl_router.testing import postgres
from mcpl_router.testing.journal import JournalPlace, open_journal

KAI = Delivery("kai", "message", (), False)


def _event(n: int) -> InboundEvent:
    return InboundEvent("s", "general", EventKind.MESSAGE, f"m-{n}", {"messageId": f"m-{n}", "text": "x" * 100})


async def _side(dsn: str, fence: LeaseFence | None, commits: int) -> tuple[float, float, float]:
    singles: list[float] = []
    async with open_journal(JournalPlace(dsn=dsn), fence=fence) as journal:
        for n in range(commits):
            started = time.perf_counter()
            await journal.record_inbound([(_event(n), [KAI])])
            singles.append(time.perf_counter() - started)
        started = time.perf_counter()
        for batch in range(20):
            await journal.record_inbound([(_event(100_000 + batch * 256 + i), [KAI]) for i in range(256)])
        rate = 20 * 256 / (time.perf_counter() - started)
    singles.sort()
    return singles[len(singles) // 2] * 1000, singles[int(len(singles) * 0.99)] * 1000, rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    postgres.require()
    figures: dict[str, list[tuple[float, float, float]]] = {"unfenced": [], "fenced": []}
    with postgres.postgres_server() as server:
        for round_ in range(args.rounds):
            for side in ("unfenced", "fenced"):
                dsn = postgres.fresh_database(server, f"fence_{side}_{round_}")
                fence = None
                if side == "fenced":
                    db = connect(dsn, None)
                    ensure_cluster_tables(db)
                    term, valid_until = acquire(db, LINKS, "bench", 300.0)
                    db.close()
                    assert term is not None
                    fence = LeaseFence(term, valid_until)
                figures[side].append(trio.run(_side, dsn, fence, args.commits))
    print(f"\nthe fence's cost ({args.rounds} rounds, medians): one commit p50 / p99 ms, batches of 256 events/s")
    for side, rows in figures.items():
        print(f"  {side:<9} {median(r[0] for r in rows):6.2f} / {median(r[1] for r in rows):6.2f} ms   {median(r[2] for r in rows):8.0f} events/s")


if __name__ == "__main__":
    main()
