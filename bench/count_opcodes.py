"""The Python bytecodes the trio thread executes a message (or a turn): the daemon's and its floor's.

    python bench/count_opcodes.py [--side both|daemon|floor] [--servers 4] [--messages 400] [--top 40]
    python bench/count_opcodes.py --speech [--agents 10] [--turns 20] [--side ...] [--top 40]
    (either with --out FILE: each side's counts by function as JSON)

Inbound (the default): the same flood as ``bench_inbound.py``'s throughput (``--servers``
fixture servers, each ``--messages`` one-message ``channels/incoming`` requests, 128
outstanding; one host acking each wake as the shipped client does), through the daemon or
through the journal floor (``bench/forwarder.py --journal``). Speech: ``bench_speech.py``'s
turns (``--agents`` at once, ``--turns`` each: open, context, text, close), through the daemon
or through the same-wire-work forwarder (``bench/forwarder.py --mode speech``, given the
daemon's answers from its first turn). Each side runs under a launcher that traces its main
thread (the trio thread; the journal's worker thread is not traced) with ``sys.settrace``
opcode events from just before the flood or the turns to just after, toggled by ``SIGUSR1``,
and counts the bytecodes each function executed.

Why count bytecodes: the timings of one flood move by a third from run to run on this machine,
so an item of a few microseconds can't be seen end to end, and cProfile's per-call overhead
ranks a cheap call like a dear one. The count of bytecodes moves by a percent or two between
runs (with how the commits batch) and goes down by exactly what a change took off the path. It
leaves out the work done in C (JSON, sockets, the journal's SQL), which the daemon and the floor
share: ``docs/performance.md`` relates the two counts to the trio thread's CPU a message.
Tracing makes the process some fifty times slower, hence the small default flood. Nothing is
asserted.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

import trio
from harness import ROOT, daemon_running, fixtures_running, forwarder_running, wait_until

import bench_inbound
import bench_speech
from mcpl_router.client import RouterClient

#: Counts every bytecode of the main thread between two SIGUSR1s; writes them out at the second.
TRACER = r"""
import collections, json, os, signal, sys
counts = collections.Counter()
def tracer(frame, event, arg):
    frame.f_trace_opcodes = True
    if event == "opcode":
        code = frame.f_code
        counts[(code.co_filename, code.co_firstlineno, code.co_name)] += 1
    return tracer
def toggle(signum, frame):
    if sys.gettrace() is None:
        sys.settrace(tracer)
        while frame is not None:  # the frames already running are traced from here too
            frame.f_trace, frame.f_trace_opcodes, frame = tracer, True, frame.f_back
    else:
        sys.settrace(None)
        with open(os.environ["MCPL_ROUTER_BENCH_OPCODES"], "w") as out:
            json.dump([[list(key), n] for key, n in counts.items()], out)
signal.signal(signal.SIGUSR1, toggle)
"""

DAEMON_MAIN = """
from mcpl_router.cli import main
sys.argv = ["mcpl-router", *sys.argv[1:]]
sys.exit(main())
"""

#: The forwarder (the journal floor, or the speech forwarder) under the tracer.
FLOOR = TRACER + f"""
import runpy
runpy.run_path({str(ROOT / "bench" / "forwarder.py")!r}, run_name="__main__")
"""


async def counted(workdir: Path, side: str, servers: int, messages: int) -> collections.Counter[tuple[str, int, str]]:
    out = workdir / f"{side}.opcodes.json"
    os.environ["MCPL_ROUTER_BENCH_OPCODES"] = str(out)
    async with fixtures_running(workdir, servers) as fixtures:
        if side == "daemon":
            config = {f"s{n}": {"url": f.listen_url} for n, f in enumerate(fixtures)}
            running = daemon_running(workdir, config, tag="opcodes", launcher=TRACER + DAEMON_MAIN)
        else:
            running = forwarder_running(workdir, fixtures, tag="opcodes", journal=True, launcher=FLOOR)
        async with running as (proc, socket):
            proc.send_signal(signal.SIGUSR1)
            await bench_inbound._drive(socket, proc.pid, fixtures, messages, f"opcodes-{side}")
            proc.send_signal(signal.SIGUSR1)
            await wait_until(lambda: _written(out), timeout=60, interval=0.1)
    return collections.Counter({(path, line, name): n for (path, line, name), n in json.loads(out.read_text())})


async def counted_speech(workdir: Path, side: str, agents: int, turns: int) -> collections.Counter[tuple[str, int, str]]:
    out = workdir / f"{side}.speech.opcodes.json"
    answers = workdir / "turn-answers.json"
    os.environ["MCPL_ROUTER_BENCH_OPCODES"] = str(out)
    names = [f"agent{n}" for n in range(agents)]
    async with fixtures_running(workdir, 1) as [fixture]:
        if side == "daemon":
            running = daemon_running(workdir, {"s0": {"url": fixture.listen_url}}, tag="opcodes-speech",
                                     launcher=TRACER + DAEMON_MAIN)
        else:
            running = forwarder_running(workdir, [fixture], tag="opcodes-speech", mode="speech", answers=answers, launcher=FLOOR)
        async with running as (proc, socket), RouterClient.connect_unix(socket) as host:
            wakes = {} if side == "daemon" else dict.fromkeys(names, 1)  # the forwarder's turns need no wake
            if side == "daemon":
                await host.hello("bench", names)
                await fixture.incoming([{"channelId": "general", "text": "speak, all of you", "tags": ["chat:mention"]}])
                while len(wakes) < agents:
                    wake = await host.next_wake()
                    wakes[wake.agent] = wake.seq
            capture: dict[str, object] = {}
            proc.send_signal(signal.SIGUSR1)
            async with trio.open_nursery() as nursery:
                for n, name in enumerate(names):
                    nursery.start_soon(bench_speech.speak_turns, host, name, wakes[name], turns, capture if n == 0 else None)
            proc.send_signal(signal.SIGUSR1)
            if side == "daemon":
                answers.write_text(json.dumps(capture))
            await wait_until(lambda: _written(out), timeout=60, interval=0.1)
    return collections.Counter({(path, line, name): n for (path, line, name), n in json.loads(out.read_text())})


async def _written(path: Path) -> bool:
    await trio.sleep(0)
    try:
        json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return True


def where(path: str) -> str:
    """A function's module, short: ``hosts/sessions.py``, ``trio``, ``attrs-made ChannelRef``."""
    if path.startswith("<attrs generated"):
        return "attrs-made " + path.rstrip(">").split(".")[-1]
    parts = Path(path).parts
    if "mcpl_router" in parts:
        return "/".join(parts[parts.index("mcpl_router") + 1 :])
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1]
    return Path(path).name


def _in_package(path: str) -> bool:
    return "mcpl_router" in Path(path).parts


def report(side: str, counts: collections.Counter[tuple[str, int, str]], total: int, top: int, unit: str) -> None:
    print(f"\n{side}: {sum(counts.values()) / total:,.0f} bytecodes a {unit}")
    modules: collections.Counter[str] = collections.Counter()
    for (path, _, _), n in counts.items():
        modules[where(path).split("/")[0] if "/" in where(path) else where(path)] += n
    print("  by part: " + ", ".join(f"{name} {n / total:.0f}" for name, n in modules.most_common(12)))
    # What the daemon runs of its own: its package outside the JSON-RPC layer the forwarder
    # shares. Steady where the total is not: trio's share moves with how the tasks interleave.
    own = sum(n for (path, _, _), n in counts.items() if _in_package(path) and not where(path).startswith("jsonrpc/"))
    print(f"  mcpl_router outside jsonrpc/: {own / total:,.0f}")
    for (path, line, name), n in counts.most_common(top):
        print(f"  {n / total:7.1f}  {name} {where(path)}:{line}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=("both", "daemon", "floor"), default="both")
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--messages", type=int, default=400)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--speech", action="store_true", help="count turns (bench_speech.py's) instead of inbound messages")
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None,
                        help="also write each side's counts by function, a message or a turn, as JSON (for comparing two trees)")
    args = parser.parse_args()
    saved: dict[str, dict[str, float]] = {}
    sides = ("daemon", "floor") if args.side == "both" else (args.side,)
    if args.speech and sides == ("floor",):
        parser.error("--speech --side floor needs the daemon's answers: run --side both")
    with tempfile.TemporaryDirectory(prefix="mr-opcodes-", dir="/tmp") as tmp:
        for side in sides:
            if args.speech:
                counts = trio.run(counted_speech, Path(tmp), side, args.agents, args.turns)
                total = args.agents * args.turns
                report(side if side == "daemon" else "forwarder", counts, total, args.top, "turn")
            else:
                counts = trio.run(counted, Path(tmp), side, args.servers, args.messages)
                total = args.servers * args.messages
                report(side, counts, total, args.top, "message")
            saved[side] = {f"{name} {where(path)}:{line}": n / total for (path, line, name), n in counts.items()}
    if args.out is not None:
        args.out.write_text(json.dumps(saved, indent=1, sort_keys=True))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
