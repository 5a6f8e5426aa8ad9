"""Speech: turns per second with 10 agents speaking at once, daemon vs a same-wire-work forwarder.

    python bench/bench_speech.py [--agents 10] [--turns 100] [--rounds 3]

One fixture server (a process, TCP). Through the **daemon**, each agent runs ``--turns`` turns one
after another, all agents at once: ``turn/open`` (from its wake: typing starts on the wake's
channel), ``turn/context`` (``context/beforeInference``, lifecycle ``started``), ``turn/text``,
``turn/close`` (the publish, typing stop, lifecycle ``completed``). Through the **forwarder**
(bench/forwarder.py), each ``speak`` call does that same work on the server's wire with no
routing decision. Sides interleaved and repeated; medians of the per-round ratios.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from harness import cpu_seconds, daemon_running, fixtures_running, forwarder_running, median

from mcpl_router.client import RouterClient
from mcpl_router.logs import configure_logging


async def through_daemon(workdir: Path, agents: int, turns: int, tag: str) -> dict[str, float]:
    names = [f"agent{n}" for n in range(agents)]
    async with fixtures_running(workdir, 1) as [fixture], daemon_running(
        workdir, {"s0": {"url": fixture.listen_url}}, tag=tag
    ) as (proc, socket), RouterClient.connect_unix(socket) as host:
        await host.hello("bench", names)
        await fixture.incoming([{"channelId": "general", "text": "speak, all of you", "tags": ["chat:mention"]}])
        wakes: dict[str, int] = {}
        while len(wakes) < agents:
            wake = await host.next_wake()
            wakes[wake.agent] = wake.seq

        async def speak(agent: str) -> None:
            for n in range(turns):
                opened = await host.call("turn/open", {"agent": agent, "wakes": [wakes[agent]]})
                await host.call("turn/context", {"turnId": opened["turnId"]})
                await host.notify("turn/text", {"turnId": opened["turnId"], "round": 1, "delta": f"{agent} says {n}"})
                await host.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})

        cpu = cpu_seconds(proc.pid)
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for agent in names:
                nursery.start_soon(speak, agent)
        elapsed = time.perf_counter() - start
        cpu = cpu_seconds(proc.pid) - cpu
    return {"turns_per_s": agents * turns / elapsed, "turns_per_cpu_s": agents * turns / cpu if cpu else float("nan")}


async def through_forwarder(workdir: Path, agents: int, turns: int, tag: str) -> dict[str, float]:
    async with fixtures_running(workdir, 1) as fixtures, forwarder_running(workdir, fixtures, tag=tag, mode="speech") as (proc, socket), RouterClient.connect_unix(socket) as host:

        async def speak(agent: int) -> None:
            for n in range(turns):
                await host.call("speak", {"server": 0, "channel": "general", "text": f"agent{agent} says {n}"})

        cpu = cpu_seconds(proc.pid)
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for agent in range(agents):
                nursery.start_soon(speak, agent)
        elapsed = time.perf_counter() - start
        cpu = cpu_seconds(proc.pid) - cpu
    return {"turns_per_s": agents * turns / elapsed, "turns_per_cpu_s": agents * turns / cpu if cpu else float("nan")}


async def speech(workdir: Path, agents: int, turns: int, rounds: int) -> dict[str, Any]:
    daemon: list[dict[str, float]] = []
    forwarder: list[dict[str, float]] = []
    for round_ in range(rounds):
        forwarder.append(await through_forwarder(workdir, agents, turns, f"sf{round_}"))
        daemon.append(await through_daemon(workdir, agents, turns, f"sd{round_}"))
        print(f"  speech round {round_ + 1}: daemon {daemon[-1]['turns_per_s']:,.0f} turns/s, forwarder {forwarder[-1]['turns_per_s']:,.0f}", flush=True)
    return {
        "agents": agents,
        "daemon": {k: median([r[k] for r in daemon]) for k in daemon[0]},
        "forwarder": {k: median([r[k] for r in forwarder]) for k in forwarder[0]},
        "vs_forwarder": median([d["turns_per_s"] / f["turns_per_s"] for d, f in zip(daemon, forwarder, strict=True)]),
    }


def print_speech(figures: dict[str, Any]) -> None:
    print(f"\nSpeech: {figures['agents']} agents at once, whole turns (open, context, text, close)")
    print(f"{'':<12}{'turns/s':>10}{'turns/CPU-s':>13}")
    for side in ("daemon", "forwarder"):
        print(f"{side:<12}{figures[side]['turns_per_s']:>10,.0f}{figures[side]['turns_per_cpu_s']:>13,.0f}")
    print(f"daemon ÷ forwarder: {figures['vs_forwarder']:.3f}")


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="mr-bench-", dir="/tmp") as tmp:
        print_speech(await speech(Path(tmp), args.agents, args.turns, args.rounds))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    configure_logging("error", json=True)
    trio.run(main, parser.parse_args())
