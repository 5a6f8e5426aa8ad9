"""The per-message path's items (issue 30), timed in one process, no sockets.

    python bench/bench_decisions.py [--agents 1] [--messages 20000]

The decisions kept per channel: whom an event wakes (``Forks.deliveries_for`` over
``AgentDirectory.deliveries_for``, as the daemon wires them; agents declared as a host's hello
declares them, the default wake policy), a message's admission
(``ChannelRegistry.admit_incoming``) and each woken agent's wake rendered
(``SessionManager.wake_params``, its closed-channel invitation asked of the channel lifecycle as
the daemon wires them: none of the agents opened the channel, so each wake carries one). And the
smaller items beside them: the digest of what a message says (``substance_digest``), its answer
and its wakes counted for ``/metrics`` (``DaemonMetrics.inbound_answered``, ``wake_sent``) and
each wake asked of the tune-outs and wake gates (``WakeHolds.divert``, as the daemon wires them;
no agent tuned out or gated). For the inbound bench's messages: 4 servers' ``general``, tagged
``chat:mention``. Prints µs a message of the calling thread's CPU, the best of 5 passes. Runs on
any tree with these APIs, so two trees can be compared: ``PYTHONPATH=<tree> python
bench/bench_decisions.py``. Nothing is asserted beyond the agents woken.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import trio

from mcpl_router.store.records import EventKind
from mcpl_router.hosts.directory import AgentDirectory
from mcpl_router.hosts.diversion import WakeHolds
from mcpl_router.hosts.forks import Forks
from mcpl_router.hosts.gate import StillAdmitted, WakeGates
from mcpl_router.hosts.sessions import SessionManager
from mcpl_router.metrics import DaemonMetrics
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.wakes import REASON_MESSAGE, Wake
from mcpl_router.tools.channel_lifecycle import ChannelLifecycle
from mcpl_router.turns.invitations import Invitations
from mcpl_router.events import EventBus
from mcpl_router.host_notices import HostNotice
from mcpl_router.routing.agents import AgentSpec
from mcpl_router.routing.registry import RegistrationPolicy
from mcpl_router.mcpl.inbound import substance_digest
from mcpl_router.routing.router import Router
from mcpl_router.routing.tuneout import TuneOutTable
from mcpl_router.store.journal import InboundEvent, Journal

#: What each line times, in the order printed.
ITEMS = ("whom a message wakes", "its admission", "its wakes rendered", "its digest", "its answer and wakes counted",
         "its wakes diverted")


async def measure(agents: int, messages: int) -> dict[str, float]:
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

            async def settle(agent: str, seqs: list[int]) -> None:
                return None

            forks = Forks(registry=router.registry, journal=journal, policy_deliveries=directory.deliveries_for,
                          agent_of=directory.agent, owner_of=lambda name: None, notify_agent=notify)
            events = [
                InboundEvent(f"s{i % 4}", "general", EventKind.MESSAGE, f'["general","m-{i}"]',
                             {"channelId": "general", "messageId": f"m-{i}", "author": {"id": "user-1", "name": "Demo User"},
                              "content": [{"type": "text", "text": "x"}], "tags": ["chat:mention"],
                              "timestamp": "2026-01-01T00:00:00Z", "metadata": {"sentAt": 1.0}})
                for i in range(messages)
            ]
            bus = EventBus()
            lifecycle = ChannelLifecycle(router, {}, journal, fork_home=forks.home_of, events=bus)
            metrics = DaemonMetrics([])
            sessions = SessionManager(directory=directory, journal=journal, router=router, metrics=metrics,
                                      invitations=Invitations(router, lifecycle.has_open), servers_list=list, events=bus)
            gates = WakeGates(router=router, agent_of=directory.agent, admitted=StillAdmitted(router.registry, {}),
                              deliver=sessions.offer_batch, settle=settle, count=metrics.wake_gated, route_fence=forks, events=bus)
            holds = WakeHolds(TuneOutTable(), gates)
            refs = [ChannelRef(f"s{server}", "general") for server in range(4)]
            wakes = [
                [Wake(i, f"bench{n}", REASON_MESSAGE, refs[i % 4], event.payload, ("chat:mention", "chat:addressed"), True,
                      event.server_id) for n in range(agents)]
                for i, event in enumerate(events)
            ]
            answers = [{"results": [{"messageId": f"m-{i}", "accepted": True, "conversationId": '["s0","general"]'}]}
                       for i in range(messages)]

            def whom() -> None:
                for event in events:
                    forks.deliveries_for(event)

            def admission() -> None:
                for event in events:
                    router.registry.admit_incoming(event.server_id, str(event.channel_id), policy)

            def rendering() -> None:
                for per_event in wakes:
                    for wake in per_event:
                        sessions.wake_params(wake)

            def digest() -> None:
                for event in events:
                    substance_digest(event.payload)

            def counting() -> None:
                for event, answer, per_event in zip(events, answers, wakes, strict=True):
                    metrics.inbound_answered(event.server_id, "channels/incoming", answer)
                    for wake in per_event:
                        metrics.wake_sent(wake.agent)

            def diversion() -> None:
                for per_event in wakes:
                    for wake in per_event:
                        holds.divert(wake)

            best = dict.fromkeys(ITEMS, float("inf"))
            for _ in range(5):
                for item, run in zip(ITEMS, (whom, admission, rendering, digest, counting, diversion), strict=True):
                    start = time.thread_time()
                    run()
                    best[item] = min(best[item], (time.thread_time() - start) / messages * 1e6)
            assert "invitation" in sessions.wake_params(wakes[0][0])
            assert [d.agent for d in forks.deliveries_for(events[0])] == [f"bench{n}" for n in range(agents)]
            assert not any(holds.divert(wake) for wake in wakes[0])
            return best
        finally:
            journal.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=1)
    parser.add_argument("--messages", type=int, default=20_000)
    args = parser.parse_args()
    best = trio.run(measure, args.agents, args.messages)
    print(f"{args.agents} agent(s), µs a message: " + ", ".join(f"{item} {us:.2f}" for item, us in best.items()))


if __name__ == "__main__":
    main()
