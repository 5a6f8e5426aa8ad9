"""One durable commit on this disk, alone, with nothing else running: what a wake waits for, at least.

    python bench/bench_commit.py [--rate 1000] [--seconds 4]

The daemon answers ``accepted`` and sends a wake only once the commit holding the message is on
disk (docs/reliability.md), so no wake can come sooner than a commit. This measures that commit
alone, in one thread of one process: on the connection a journal opens (the daemon's schema and
pragmas: WAL, ``synchronous=FULL``), ``BEGIN IMMEDIATE``, the journal's two insert statements
(one event, its delivery) and ``COMMIT``, paced open loop at ``--rate`` commits a second and
timed end to end. It skips the writer's batching and thread hand-offs, so it is a lower bound;
then the same with ``synchronous=OFF`` (no fsync), so the disk's share shows. What a commit
costs here is latency the daemon adds, at least, over a forwarder that keeps nothing, on any
design that keeps the delivery promise.

Prints p50/p90/p99 and returns them (``bench/run.py`` collects them). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import percentile

from mcpl_router.store.journal import Journal
from mcpl_router.store.schema import SQL_INSERT_DELIVERY, SQL_INSERT_EVENT_AT


def commits(path: Path, *, rate: float, seconds: float, synchronous: str) -> dict[str, float]:
    journal = Journal(path)
    try:
        db = journal._backend.writer()  # the writer's own connection, as the daemon opens it; no writer runs
        db.execute(f"PRAGMA synchronous={synchronous}")
        payload = b'{"channelId":"general","messageId":"m","content":[{"type":"text","text":"' + b"x" * 200 + b'"}]}'
        times: list[float] = []
        interval = 1.0 / rate
        next_at = time.perf_counter()
        for n in range(int(rate * seconds)):
            started = time.perf_counter()
            db.execute("BEGIN IMMEDIATE")
            db.execute(SQL_INSERT_EVENT_AT, (n + 1, "s", "general", "message", f"general\x00m-{n}", b"digest", payload, time.time(), 0))
            db.execute(SQL_INSERT_DELIVERY, ("bench", n + 1, "message", b"[]", 1))
            db.execute("COMMIT")
            times.append((time.perf_counter() - started) * 1000)
            next_at += interval
            pause = next_at - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            else:
                next_at = time.perf_counter()  # late: open loop from now, no catching up in a burst
    finally:
        journal.close()
    return {"commits": len(times), "p50_ms": percentile(times, 0.5), "p90_ms": percentile(times, 0.9), "p99_ms": percentile(times, 0.99)}


def commit_floor(rate: float = 1000, seconds: float = 4.0) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mr-commit-", dir="/tmp") as tmp:
        durable = commits(Path(tmp) / "durable.sqlite3", rate=rate, seconds=seconds, synchronous="FULL")
        unsynced = commits(Path(tmp) / "unsynced.sqlite3", rate=rate, seconds=seconds, synchronous="OFF")
    return {"rate": rate, "durable": durable, "no_fsync": unsynced}


def print_commit_floor(floor: dict[str, Any]) -> None:
    print(f"\nOne commit alone (an event and its delivery), {floor['rate']:,.0f} a second, nothing else running (ms)")
    print(f"{'':<24}{'p50':>8}{'p90':>8}{'p99':>8}")
    for name, key in (("synchronous=FULL", "durable"), ("synchronous=OFF", "no_fsync")):
        row = floor[key]
        print(f"{name:<24}{row['p50_ms']:>8.2f}{row['p90_ms']:>8.2f}{row['p99_ms']:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=1000)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    print_commit_floor(commit_floor(args.rate, args.seconds))


if __name__ == "__main__":
    main()
