"""Speech: turns per second with 10 agents speaking at once, daemon vs a same-wire-work forwarder.

    python bench/bench_speech.py [--agents 10] [--turns 100] [--rounds 3]

One fixture server (a process, TCP). Through the **daemon**, each agent runs ``--turns`` turns one
after another, all agents at once: ``turn/open`` (from its wake: typing starts on the wake's
channel), ``turn/context`` (``context/beforeInference``, lifecycle ``started``), ``turn/text``,
``turn/close`` (the publish, the stream's chunk and complete, typing stop, lifecycle
``completed``). Through the **forwarder** (bench/forwarder.py) the same host calls, made by the
same client code, put the same messages on the server's wire with no routing decision, and are
answered with the daemon's own answers (captured from the daemon's first turn in this run): the
same wire work on both wires. A second reading, **one call**, does that server wire work in one
``speak`` host call per turn (the forwarder this figure was measured against before). Sides
interleaved and repeated; medians of the per-round ratios.

Each side also prints the CPU a turn of the three processes that do its work (the side itself,
the fixture server, this process as the host client) and how many cores they kept busy between
them (CPU read from ``/proc`` in clock ticks of 10 ms: over a round's 2,000 turns, 0.005 ms a
turn). A side's turns a second are those cores over that CPU, so the ratio splits into the two,
and the last line solves it for the daemon's own CPU a turn at the speech row's target: what a
turn of the daemon may cost for the row to be met on this machine, beside what it costs. Two
bounds: with the fixture server's and the host's CPU a turn as they are beside the daemon, and
as they are beside the forwarder (they spend less a turn beside a side that keeps up with more).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from harness import cpu_seconds, daemon_running, fixtures_running, forwarder_running, median

from mcpl_router.client import RouterClient
from mcpl_router.logs import configure_logging

#: The speech row's target (issue 30): daemon ÷ same-wire-work forwarder.
SPEECH_TARGET = 0.9


async def speak_turns(host: RouterClient, agent: str, wake: int, turns: int, capture: dict[str, Any] | None = None) -> None:
    """``turns`` whole turns of ``agent``, one after another, each opened from ``wake``; the
    first turn's answers go into ``capture`` when given."""
    for n in range(turns):
        opened = await host.call("turn/open", {"agent": agent, "wakes": [wake]})
        context = await host.call("turn/context", {"turnId": opened["turnId"]})
        await host.notify("turn/text", {"turnId": opened["turnId"], "round": 1, "delta": f"{agent} says {n}"})
        closed = await host.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
        if capture is not None and not capture:
            capture.update(open=opened, context=context, close=closed)


async def _timed(proc: trio.Process, server: trio.Process, agents: int, turns: int, speak: Any) -> dict[str, float]:
    """The turns' rate, and the CPU a turn of each of the three processes that do its work:
    the side under test (``proc``), the fixture server, and this process (the host client)."""
    cpu, server_cpu, host_cpu = cpu_seconds(proc.pid), cpu_seconds(server.pid), time.process_time()
    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for agent in range(agents):
            nursery.start_soon(speak, agent)
    elapsed = time.perf_counter() - start
    cpu = cpu_seconds(proc.pid) - cpu
    server_cpu = cpu_seconds(server.pid) - server_cpu
    host_cpu = time.process_time() - host_cpu
    done = agents * turns
    return {
        "turns_per_s": done / elapsed,
        "turns_per_cpu_s": done / cpu if cpu else float("nan"),
        "ms_own": 1000 * cpu / done,
        "ms_server": 1000 * server_cpu / done,
        "ms_host": 1000 * host_cpu / done,
        # CPU-seconds a second of the three together: how many of the machine's cores they kept busy.
        "cores_busy": (cpu + server_cpu + host_cpu) / elapsed,
    }


async def through_daemon(workdir: Path, agents: int, turns: int, tag: str, capture: dict[str, Any] | None = None) -> dict[str, float]:
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
        return await _timed(proc, fixture.process, agents, turns, lambda n: speak_turns(host, names[n], wakes[names[n]], turns, capture if n == 0 else None))


async def through_forwarder(workdir: Path, agents: int, turns: int, tag: str, answers: Path) -> dict[str, float]:
    """The same host calls as :func:`through_daemon`, through the same-wire-work forwarder."""
    async with fixtures_running(workdir, 1) as fixtures, forwarder_running(
        workdir, fixtures, tag=tag, mode="speech", answers=answers
    ) as (proc, socket), RouterClient.connect_unix(socket) as host:
        return await _timed(proc, fixtures[0].process, agents, turns, lambda n: speak_turns(host, f"agent{n}", 1, turns))


async def through_one_call(workdir: Path, agents: int, turns: int, tag: str) -> dict[str, float]:
    """The server wire work of a turn in one ``speak`` host call (the second reading)."""
    async with fixtures_running(workdir, 1) as fixtures, forwarder_running(workdir, fixtures, tag=tag, mode="speech") as (proc, socket), RouterClient.connect_unix(socket) as host:

        async def speak(agent: int) -> None:
            for n in range(turns):
                await host.call("speak", {"server": 0, "channel": "general", "text": f"agent{agent} says {n}"})

        return await _timed(proc, fixtures[0].process, agents, turns, speak)


async def speech(workdir: Path, agents: int, turns: int, rounds: int) -> dict[str, Any]:
    daemon: list[dict[str, float]] = []
    forwarder: list[dict[str, float]] = []
    one_call: list[dict[str, float]] = []
    answers = workdir / "turn-answers.json"
    for round_ in range(rounds):
        capture: dict[str, Any] = {}
        daemon.append(await through_daemon(workdir, agents, turns, f"sd{round_}", capture))
        if round_ == 0:
            answers.write_text(json.dumps(capture))
        forwarder.append(await through_forwarder(workdir, agents, turns, f"sf{round_}", answers))
        one_call.append(await through_one_call(workdir, agents, turns, f"so{round_}"))
        print(
            f"  speech round {round_ + 1}: daemon {daemon[-1]['turns_per_s']:,.0f} turns/s, forwarder {forwarder[-1]['turns_per_s']:,.0f},"
            f" one call {one_call[-1]['turns_per_s']:,.0f}",
            flush=True,
        )

    def medians(side: list[dict[str, float]]) -> dict[str, float]:
        return {k: median([r[k] for r in side]) for k in side[0]}

    return {
        "agents": agents,
        "daemon": medians(daemon),
        "forwarder": medians(forwarder),
        "one_call": medians(one_call),
        "vs_forwarder": median([d["turns_per_s"] / f["turns_per_s"] for d, f in zip(daemon, forwarder, strict=True)]),
        "vs_one_call": median([d["turns_per_s"] / f["turns_per_s"] for d, f in zip(daemon, one_call, strict=True)]),
        # The two factors of each round's daemon ÷ forwarder (own_budget): medians of the rounds.
        "busy_factor": median([d["cores_busy"] / f["cores_busy"] for d, f in zip(daemon, forwarder, strict=True)]),
        "cpu_factor": median([all_three(f) / all_three(d) for d, f in zip(daemon, forwarder, strict=True)]),
    }


def all_three(side: dict[str, float]) -> float:
    """The CPU a turn (ms) of the three processes that do a turn's work on one side."""
    return side["ms_own"] + side["ms_server"] + side["ms_host"]


def own_budget(figures: dict[str, Any], ratio: float, *, others_of: str = "daemon") -> float:
    """The daemon's own CPU a turn (ms) at which daemon ÷ forwarder would read ``ratio``.

    A side's turns a second are the cores its three processes keep busy over their CPU a turn
    together, so each round's daemon ÷ forwarder is (cores busy, daemon ÷ forwarder) × (CPU a
    turn of all three, forwarder ÷ daemon): an identity. With the forwarder's side and the cores
    as they were, the row would read ``ratio`` with the daemon's three processes at the row's
    value × their CPU a turn ÷ ``ratio`` (the medians of the rounds: the row is the median of
    the rounds' ratios). Less the fixture server's and the host client's CPU a turn, as they
    were beside ``others_of``: ``daemon`` holds them as they are; ``forwarder`` as they are
    beside a side that keeps up with more turns, which they spend less on (the other bound).
    """
    others = figures[others_of]
    return figures["vs_forwarder"] * all_three(figures["daemon"]) / ratio - others["ms_server"] - others["ms_host"]


def print_speech(figures: dict[str, Any], target: float = SPEECH_TARGET) -> None:
    print(f"\nSpeech: {figures['agents']} agents at once, whole turns (open, context, text, close)")
    print(f"{'':<12}{'turns/s':>10}{'turns/CPU-s':>13}   CPU ms a turn: {'own':>6}{'server':>8}{'host':>7}{'all 3':>7}   cores busy")
    for side in ("daemon", "forwarder", "one_call"):
        f = figures[side]
        print(
            f"{side:<12}{f['turns_per_s']:>10,.0f}{f['turns_per_cpu_s']:>13,.0f}   {'':<15}{f['ms_own']:>6.3f}{f['ms_server']:>8.3f}"
            f"{f['ms_host']:>7.3f}{all_three(f):>7.3f}   {f['cores_busy']:.2f}"
        )
    print(f"daemon ÷ forwarder (same host calls and server messages): {figures['vs_forwarder']:.3f}")
    print(f"daemon ÷ one call (the server's messages from one host call a turn): {figures['vs_one_call']:.3f}")
    daemon, forwarder = figures["daemon"], figures["forwarder"]
    print(
        f"  each round = (cores busy, daemon ÷ forwarder) × (CPU a turn of all three, forwarder ÷ daemon);"
        f" medians of the rounds: {figures['busy_factor']:.3f} and {figures['cpu_factor']:.3f}"
    )
    print(
        f"  {target} would need the daemon's own CPU a turn at {own_budget(figures, target):.3f} ms with the server's and host's"
        f" as beside it, {own_budget(figures, target, others_of='forwarder'):.3f} with theirs as beside the forwarder"
        f" (it is {daemon['ms_own']:.3f}; the forwarder's {forwarder['ms_own']:.3f})"
    )


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
