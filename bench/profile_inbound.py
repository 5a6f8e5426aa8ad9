"""Where the daemon's trio thread spends an inbound message: one inbound flood under cProfile.

    python bench/profile_inbound.py [--servers 4] [--messages 3000] [--top 30] [--out FILE]

The same flood as ``bench_inbound.py``'s throughput (``--servers`` fixture servers, each
``--messages`` one-message ``channels/incoming`` requests, 128 outstanding; one host acking
each wake as the shipped client does). The daemon runs under a launcher that profiles its main thread (the trio thread;
trio's worker threads, where the journal commits, are not profiled) from just before the
flood to just after the last wake, toggled by ``SIGUSR1``. Prints the functions with the most
own time and the most cumulative time, in µs a message. cProfile's own overhead inflates
call-heavy functions: the figures rank the costs; the unprofiled trio µs a message (printed
beside, from ``bench_inbound.py``'s measure) is the real total. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import pstats
import signal
import sys
import tempfile
from pathlib import Path

import trio
from harness import daemon_running, fixtures_running

import bench_inbound

#: The daemon's main, its trio thread profiled between two SIGUSR1s (stats written at the second).
LAUNCHER = """
import cProfile, os, signal, sys
from mcpl_router.cli import main
profile = cProfile.Profile()
state = {"on": False}
def toggle(signum, frame):
    if not state["on"]:
        state["on"] = True
        profile.enable()
    else:
        profile.disable()
        profile.dump_stats(os.environ["MCPL_ROUTER_BENCH_PROFILE"])
signal.signal(signal.SIGUSR1, toggle)
sys.argv = ["mcpl-router", *sys.argv[1:]]
sys.exit(main())
"""


async def profiled(workdir: Path, servers: int, messages: int, out: Path) -> float:
    os.environ["MCPL_ROUTER_BENCH_PROFILE"] = str(out)
    async with fixtures_running(workdir, servers) as fixtures:
        servers_config = {f"s{n}": {"url": f.listen_url} for n, f in enumerate(fixtures)}
        async with daemon_running(workdir, servers_config, tag="profile", launcher=LAUNCHER) as (proc, socket):
            proc.send_signal(signal.SIGUSR1)
            measured = await bench_inbound._drive(socket, proc.pid, fixtures, messages, "profile")
            proc.send_signal(signal.SIGUSR1)
            await trio.sleep(1)
    return float(measured["main_thread_us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mr-profile-", dir="/tmp") as tmp:
        out = args.out or Path(tmp) / "daemon.prof"
        trio_us = trio.run(profiled, Path(tmp), args.servers, args.messages, out)
        total = args.servers * args.messages
        stats = pstats.Stats(str(out))
        rows = stats.stats  # type: ignore[attr-defined]
        profiled_us = sum(tt for _, _, tt, _, _ in rows.values()) / total * 1e6
        print(f"{total:,} messages; the trio thread under the profiler {trio_us:.0f} µs a message (CPU), "
              f"{profiled_us:.0f} µs of profiled own time a message")
        for key, title in ((2, "own time"), (3, "cumulative")):
            print(f"\nby {title} (µs a message; calls a message):")
            ranked = sorted(rows.items(), key=lambda item: item[1][key], reverse=True)[: args.top]
            for (path, line, name), (_, calls, tt, ct, _) in ranked:
                where = f"{Path(path).name}:{line}" if path != "~" else ""
                print(f"  {tt / total * 1e6:7.2f} {ct / total * 1e6:8.2f} {calls / total:7.2f}  {name} {where}")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
