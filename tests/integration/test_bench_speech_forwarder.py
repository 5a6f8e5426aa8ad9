"""The bench's same-wire-work forwarder (``bench/forwarder.py --mode speech``) does a daemon turn's wire work.

The speech row (docs/performance.md) divides the daemon's turns a second by this forwarder's, on
the claim that both put the same messages on the server's wire for the same host calls. A
forwarder that sent less (a publish without the turn's words, a message left out) would make the
row look further off than it is; one that sent more, nearer. Real processes, through the bench's
own launchers: a fixture server records what each side sends it for one turn of the bench's host
calls (``bench_speech.speak_turns``), the forwarder answering with the daemon's captured answers.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import bench_speech  # noqa: E402
from harness import daemon_running, fixtures_running, forwarder_running  # noqa: E402

from mcpl_router.client import RouterClient  # noqa: E402
from mcpl_router.testing.control import FixtureProcess, wait_until  # noqa: E402

pytestmark = pytest.mark.integration

#: The text fields that carry the turn's words, by method.
WORDS = {
    "channels/publish": lambda p: p["content"][0]["text"],
    "channels/outgoing/chunk": lambda p: p["delta"],
    "channels/outgoing/complete": lambda p: p["content"],
}


async def one_turn_recorded(fixture: FixtureProcess, speak: Any) -> list[dict[str, Any]]:
    """What ``fixture`` was sent during ``speak()`` (one whole turn), once the turn's last
    message (its lifecycle terminal) is in."""
    before = len(await fixture.recorded())
    await speak()

    async def terminal_in() -> bool:
        sent = (await fixture.recorded())[before:]
        return any(m["method"] == "inference/lifecycle" and m["params"].get("phase") == "completed" for m in sent)

    await wait_until(terminal_in, timeout=10)
    return (await fixture.recorded())[before:]


async def test_the_speech_forwarder_sends_the_server_a_daemon_turns_messages_with_its_words(short_tmp: Path) -> None:
    # Bounded as a whole: a side that never answers fails the test instead of holding the suite.
    with trio.fail_after(120):
        daemon_sent, forwarder_sent = await both_sides_one_turn(short_tmp)

    def shape(sent: list[dict[str, Any]]) -> list[tuple[str, str, list[str]]]:
        return [(m["kind"], m["method"], sorted(m["params"])) for m in sent]

    assert [m["method"] for m in daemon_sent] == [
        "channels/typing", "inference/lifecycle", "context/beforeInference", "channels/publish",
        "channels/outgoing/chunk", "channels/typing", "channels/outgoing/complete", "inference/lifecycle",
    ]
    # The same messages, in the same order, with the same parameter names (the ids in them differ).
    assert shape(forwarder_sent) == shape(daemon_sent)
    for daemon_message, forwarder_message in zip(daemon_sent, forwarder_sent, strict=True):
        words = WORDS.get(daemon_message["method"])
        if words is not None:
            assert words(forwarder_message["params"]) == words(daemon_message["params"]) == "agent0 says 0"


async def both_sides_one_turn(short_tmp: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What a server was sent for one bench turn through the daemon, then through the forwarder
    answering with the daemon's answers."""
    capture: dict[str, Any] = {}
    async with fixtures_running(short_tmp, 1) as [fixture], daemon_running(
        short_tmp, {"s0": {"url": fixture.listen_url}}, tag="daemon"
    ) as (_proc, socket), RouterClient.connect_unix(socket) as host:
        await host.hello("bench", ["agent0"])
        await fixture.incoming([{"channelId": "general", "text": "speak", "tags": ["chat:mention"]}])
        wake = await host.next_wake()
        daemon_sent = await one_turn_recorded(fixture, lambda: bench_speech.speak_turns(host, "agent0", wake.seq, 1, capture))
    answers = short_tmp / "answers.json"
    answers.write_text(json.dumps(capture))
    async with fixtures_running(short_tmp, 1) as fixtures, forwarder_running(
        short_tmp, fixtures, tag="forwarder", mode="speech", answers=answers
    ) as (_proc, socket), RouterClient.connect_unix(socket) as host:
        forwarder_sent = await one_turn_recorded(fixtures[0], lambda: bench_speech.speak_turns(host, "agent0", 1, 1))
    return daemon_sent, forwarder_sent
