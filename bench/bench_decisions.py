"""The per-message decisions kept per channel (issue 30), timed in one process, no sockets.

    python bench/bench_decisions.py [--agents 1] [--messages 20000]

Whom an event wakes (``Forks.deliveries_for`` over ``AgentDirectory.deliveries_for``, as the
daemon wires them; agents declared as a host's hello declares them, the default wake policy)
and a message's admission (``ChannelRegistry.admit_incoming``), for the inbound bench's
messages: 4 servers' ``general``, tagged ``chat:mention``. Prints µs a message of the calling
thread's CPU, the best of 5 passes. Runs on any tree with these APIs, so two trees can be
compared: ``PYTHONPATH=<tree> python bench/bench_decisions.py``. Nothing is asserted beyond
the agents woken.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import trio

from mcpl_router.hosts.directory import AgentDirectory
from mcpl_router.hosts.forks import Forks
from mcpl_router.host_notices import HostNotice
from mcpl_router.routing.agents import AgentSpec
from mcpl_router.routing.registry import RegistrationPolicy
from mcpl_router.routing.router import Router
from mcpl_router.store.journal import InboundEvent, Journal


async def measure(agents: int, messages: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="mr-decisions-") as tmp:
        journal = Journal(Path(tmp) / "journal.sqlite3")
        try:
            router = Router()
            policy = RegistrationPolicy.permissive()
            for server in range(4):
                router.registry.register(f"s{server}", [{"id": "general"}], policy)
            directory = AgentDirectory(agents={}, journal=journal, router=router)
            for n in range(agents):
                directory.specs[f"bench{n}"] = AgentSpec(name=f"bench{n}")  # as a hello declares them

            async def notify(agent: str, notice: HostNotice) -> bool:
                return True

            forks = Forks(registry=router.registry, journal=journal, policy_deliveries=directory.deliveries_for,
                          agent_of=directory.agent, owner_of=lambda name: None, notify_agent=notify)
            events = [
                InboundEvent(f"s{i % 4}", "general", "message", f'["general","m-{i}"]',
                             {"channelId": "general", "messageId": f"m-{i}", "author": {"id": "user-1", "name": "Demo User"},
                              "content": [{"type": "text", "text": "x"}], "tags": ["chat:mention"],
                              "timestamp": "2026-01-01T00:00:00Z", "metadata": {"sentAt": 1.0}})
                for i in range(messages)
            ]
            woken = admitted = float("inf")
            for _ in range(5):
                start = time.thread_time()
                for event in events:
                    forks.deliveries_for(event)
                woken = min(woken, (time.thread_time() - start) / messages * 1e6)
                start = time.thread_time()
                for event in events:
                    router.registry.admit_incoming(event.server_id, str(event.channel_id), policy)
                admitted = min(admitted, (time.thread_time() - start) / messages * 1e6)
            assert [d.agent for d in forks.deliveries_for(events[0])] == [f"bench{n}" for n in range(agents)]
            return woken, admitted
        finally:
            journal.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=1)
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args()
    woken, admitted = trio.run(measure, args.agents, args.messages)
    print(f"{args.agents} agent(s): whom a message wakes {woken:.2f} µs, its admission {admitted:.2f} µs")


if __name__ == "__main__":
    main()
