"""The golden-file probe: the same scripted steps for an agent in each prose-routing mode.

Each mode's run records every post and stream chunk the fixture servers received (from their
own recordings), every notice, receipt, system line and speech-tool description the agent was
given, into ``tests/golden/<mode>.txt``; the test compares byte for byte. The four existing
modes' files are separate from named's, so a change made for named that moves what a
disabled, locus, hybrid or explicit agent meets fails here.

Regenerate after an intended change with::

    MCPL_ROUTER_REGEN_GOLDEN=1 python3 -m pytest tests/integration/test_golden_probe.py

and review the diff of ``tests/golden/`` like code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.tools.speech_tools import SPEECH_TOOLS
from mcpl_router.testing.control import FixtureProcess, wait_until

from .test_prose_modes import AGENT, message, scene, tool

pytestmark = pytest.mark.integration

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
REGENERATE = os.environ.get("MCPL_ROUTER_REGEN_GOLDEN") == "1"
_DRAFT_ID = re.compile(r"\bd-[a-z0-9]{5}\b")
_RECORDED = ("channels/publish", "channels/outgoing/chunk", "channels/outgoing/complete", "channels/acknowledge")


def _stable(text: Any) -> str:
    """One line of the record: draft ids (random) masked, newlines shown as ⏎."""
    return _DRAFT_ID.sub("d-*****", str(text)).replace("\n", "⏎")


class Probe:
    def __init__(self, servers: dict[str, FixtureProcess]) -> None:
        self.servers = servers
        self.lines: list[str] = []
        self.seen = {name: 0 for name in servers}

    def add(self, label: str, value: Any) -> None:
        self.lines.append(f"{label}: {_stable(value)}")

    async def barrier(self, client: RouterClient) -> None:
        """Wait until every notification sent so far reached each server: a typing stop sent
        now arrives after them on the same link."""
        for name in sorted(self.servers):
            server = self.servers[name]
            before = len(await server.recorded("channels/typing"))
            await client.call("channels/typing", {"channel": f"{name}:general", "op": "stop"})

            async def arrived() -> bool:
                return len(await server.recorded("channels/typing")) > before  # noqa: B023

            await wait_until(arrived, timeout=10)

    async def server_traffic(self, client: RouterClient) -> None:
        await self.barrier(client)
        for name in sorted(self.servers):
            entries = [e for e in await self.servers[name].recorded() if e["seq"] > self.seen[name]]
            if entries:
                self.seen[name] = entries[-1]["seq"]
            for entry in entries:
                if entry["method"] not in _RECORDED:
                    continue
                params = dict(entry["params"])
                params.pop("inferenceId", None)
                params.pop("messageId", None)
                self.add(f"  {name} {entry['method']}", sorted(params.items()))

    async def turn(self, client: RouterClient, label: str, rounds: list[str], *, wakes: list[int] | None = None,
                   calls: dict[int, tuple[str, dict[str, Any]]] | None = None) -> None:
        self.lines.append(f"## {label}")
        opened = await client.call("turn/open", {"agent": AGENT, "wakes": wakes or []})
        turn_id = opened["turnId"]
        self.add("system", opened["system"])
        self.add("routing", opened["shown"]["routing"])
        for index, text in enumerate(rounds, start=1):
            await client.call("turn/text", {"turnId": turn_id, "round": index, "delta": text})
            if calls and index in calls:
                name, arguments = calls[index]
                result = await tool(client, turn_id, name, **arguments)
                # Whether it was refused, and what it posted (below, from the servers): the
                # channel tools' own wording is theirs and is tested with them.
                self.add(f"round {index} {name} refused", result["isError"])
            if index < len(rounds):
                routed = await client.call("turn/round", {"turnId": turn_id, "round": index})
                for notice in routed["notices"]:
                    self.add(f"round {index} notice", notice)
        closed = await client.call("turn/close", {"turnId": turn_id, "outcome": "completed"})
        for notice in closed["notices"]:
            self.add("close notice", notice)
        self.add("receipt", closed["receipt"]["text"])
        self.add("drafts", [(d["state"], d["reason"], d["preview"]) for d in closed["drafts"]])
        self.add("again", closed["again"])
        await self.server_traffic(client)


async def probe(workdir: Path, mode: str) -> str:
    async with scene(workdir, mode, first="a") as (_daemon, servers, client):
        record = Probe(servers)
        record.lines.append(f"# prose routing: {mode}")
        opened = await client.call("turn/open", {"agent": AGENT})
        for spec in opened["tools"]:
            if spec["name"] in SPEECH_TOOLS:
                record.add(f"tool {spec['name']}", spec["description"])
                record.add(f"tool {spec['name']} schema", sorted(spec["inputSchema"]["properties"]))
        await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "aborted"})
        await record.server_traffic(client)

        seq = await message(servers, client, "b")
        await record.turn(client, "a message on b:general", [
            "A plain reply.",
            ">>general An explicit reply.\n>>a:general To the other general.",
            ">>> a:general A pinned reply.",
            "After the pin.",
        ], wakes=[seq])
        await record.turn(client, "a heartbeat", ["Heartbeat words.", ">>general Shared target."],
                          calls={1: ("channel_publish", {"content": "Heartbeat publish."})})
        await record.turn(client, "a resend of the bounce", [">>b:general {{unsent}}", "Sticky after resend."])
        seq = await message(servers, client, "a")
        await record.turn(client, "a message on a:general with an explicit send", ["Said before the send."],
                          wakes=[seq], calls={1: ("channel_publish", {"channelId": "a:general", "content": "Sent."})})
        return "\n".join(record.lines) + "\n"


@pytest.mark.parametrize("mode", ["disabled", "locus", "hybrid", "explicit", "named"])
async def test_golden_probe(tmp_path: Path, mode: str) -> None:
    with trio.fail_after(60):
        output = await probe(tmp_path, mode)
    golden = GOLDEN / f"{mode}.txt"
    if REGENERATE:
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(output, encoding="utf-8")
    assert golden.exists(), f"{golden} is missing: regenerate with MCPL_ROUTER_REGEN_GOLDEN=1"
    assert output == golden.read_text(encoding="utf-8")
