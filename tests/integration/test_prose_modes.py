"""Prose routing end to end, per mode: real fixture server processes, the daemon, a host.

Servers ``a`` and ``b`` both register ``general`` (``b`` also ``random``), in both registration
orders where order could matter. Every post, typing indicator and acknowledgement is read from
the fixture servers' own recordings; each test also asserts what did NOT reach a server.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.daemon import Daemon
from mcpl_router.routing import texts
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import wait_channel
from .test_turns import open_channel, servers_and_daemon, typing_ops

pytestmark = pytest.mark.integration

AGENT = "ann"
ORDERS = pytest.mark.parametrize("first", ["a", "b"])


@asynccontextmanager
async def scene(
    workdir: Path, mode: str, *, first: str = "a", spec: dict[str, Any] | None = None
) -> AsyncIterator[tuple[Daemon, dict[str, FixtureProcess], RouterClient]]:
    """Servers a and b sharing ``general`` (registered ``first`` first), a host owning ``ann``."""
    async with servers_and_daemon(workdir, ["a", "b"]) as (daemon, servers):
        daemon.turns.typing_interval = 0.2
        for name in (first, "b" if first == "a" else "a"):
            extra = [open_channel("random")] if name == "b" else []
            await servers[name].register([open_channel("general"), *extra])
            await wait_channel(daemon, name, "general")
        assert daemon.host_socket_path is not None
        async with RouterClient.connect_unix(daemon.host_socket_path) as client:
            await client.hello("test-host", [{"name": AGENT, "proseRouting": mode, **(spec or {})}])
            yield daemon, servers, client


async def message(servers: dict[str, FixtureProcess], client: RouterClient, server: str, channel: str = "general") -> int:
    await servers[server].incoming([{"channelId": channel, "text": "hi ann", "tags": ["chat:mention"]}])
    wake = await client.next_wake()
    assert wake.channel is not None and wake.channel.server_id == server
    return wake.seq


async def run_turn(
    client: RouterClient,
    rounds: Sequence[str],
    *,
    wakes: Sequence[int] = (),
    channel: Any = None,
    outcome: str = "completed",
    subagent: bool = False,
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    """Open a turn, write each round's text (all but the last routed by turn/round), close it."""
    params: dict[str, Any] = {"agent": AGENT, "wakes": list(wakes)}
    if channel is not None:
        params["channel"] = channel
    if subagent:
        params["subagent"] = True
    opened = await client.call("turn/open", params)
    turn_id = opened["turnId"]
    routed = []
    for index, text in enumerate(rounds, start=1):
        await client.call("turn/text", {"turnId": turn_id, "round": index, "delta": text})
        if index < len(rounds):
            routed.append(await client.call("turn/round", {"turnId": turn_id, "round": index}))
    closed = await client.call("turn/close", {"turnId": turn_id, "outcome": outcome})
    return opened, routed, closed


async def posts(server: FixtureProcess) -> list[tuple[str, str]]:
    return [(e["params"]["channelId"], e["params"]["content"][0]["text"]) for e in await server.recorded("channels/publish")]


def notices(routed: list[dict[str, Any]], closed: dict[str, Any]) -> list[str]:
    return [notice for result in [*routed, closed] for notice in result["notices"]]


async def tool(client: RouterClient, turn_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return await client.call("turn/tool", {"turnId": turn_id, "callId": f"c-{name}", "name": name, "arguments": arguments})


# ---------------------------------------------------------------------- locus


@ORDERS
async def test_locus_speech_goes_where_it_was_written_and_a_heartbeat_holds_a_durable_draft(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "locus", first=first) as (daemon, servers, client):
            seq = await message(servers, client, "b")
            opened, routed, closed = await run_turn(client, ["one", "two"], wakes=[seq])
            assert opened["shown"]["routing"] == texts.speech_lands_in("b:general")
            assert closed["receipt"]["text"] == "[delivered] plain speech → b:general"

            # A heartbeat: no conversation, so the words are held as a draft, posted nowhere.
            opened, _, closed = await run_turn(client, ["thinking of you"])
            assert opened["shown"]["routing"] == texts.SPEECH_NO_DESTINATION_HELD
            [draft] = closed["drafts"]
            assert draft["id"].startswith("d-") and draft["state"] == "held" and draft["reason"] == "no-destination"
            assert closed["receipt"]["text"].startswith("[delivered] nothing — 1 draft(s) held, not posted: " + draft["id"])
            # Durable: the journal holds it.
            assert daemon.journal.draft(draft["id"])["text"] == "thinking of you"

            # The drafts tool: list, read, resend (resolved as speech is), and no second resend.
            turn = await client.call("turn/open", {"agent": AGENT})
            listed = await tool(client, turn["turnId"], "drafts", action="list")
            assert listed["structuredContent"]["drafts"][0]["id"] == draft["id"]
            read = await tool(client, turn["turnId"], "drafts", action="read", id=draft["id"])
            assert read["structuredContent"]["text"] == "thinking of you"
            shared = await tool(client, turn["turnId"], "drafts", action="resend", id=draft["id"], channelId="general")
            assert shared["isError"] and shared["reason"] == "destination-refused" and "a:general" in shared["content"][0]["text"]
            sent = await tool(client, turn["turnId"], "drafts", action="resend", id=draft["id"], channelId="b:general")
            assert not sent["isError"] and sent["structuredContent"]["sent"][0]["outcome"] == "delivered"
            again = await tool(client, turn["turnId"], "drafts", action="resend", id=draft["id"], channelId="b:general")
            assert again["isError"] and again["reason"] == "draft-not-resendable"
            await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})

            assert await posts(servers["b"]) == [("general", "one"), ("general", "two"), ("general", "thinking of you")]
            assert await posts(servers["a"]) == []
            assert typing_ops(await servers["a"].recorded()) == []


async def test_locus_holds_competing_conversations_as_drafts_and_types_nowhere(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "locus") as (_daemon, servers, client):
            first = await message(servers, client, "a")
            second = await message(servers, client, "b")
            opened, _, closed = await run_turn(client, ["which one?"], wakes=[first, second])
            assert opened["shown"]["locus"] is None
            assert opened["shown"]["routing"] == texts.speech_held(["a:general", "b:general"])
            [draft] = closed["drafts"]
            assert draft["reason"] == "ambiguous"
            for name in ("a", "b"):
                assert await posts(servers[name]) == []
                assert typing_ops(await servers[name].recorded()) == []


async def test_send_silencing_holds_the_rounds_text_as_drafts(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "locus") as (_daemon, servers, client):
            seq = await message(servers, client, "b")
            opened = await client.call("turn/open", {"agent": AGENT, "wakes": [seq]})
            turn_id = opened["turnId"]
            await client.call("turn/text", {"turnId": turn_id, "round": 1, "delta": "I'll say it there"})
            published = await tool(client, turn_id, "channel_publish", channelId="random", content="explicit words")
            assert not published["isError"]
            await client.call("turn/round", {"turnId": turn_id, "round": 1})
            await client.call("turn/text", {"turnId": turn_id, "round": 2, "delta": "later words"})
            closed = await client.call("turn/close", {"turnId": turn_id, "outcome": "completed"})
            [draft] = closed["drafts"]
            assert (draft["reason"], draft["preview"]) == ("explicit-send", "I'll say it there")
            assert await posts(servers["b"]) == [("random", "explicit words"), ("general", "later words")]
            assert await posts(servers["a"]) == []


async def test_send_silencing_when_turn_round_names_the_rounds_tool_calls_first(tmp_path: Path) -> None:
    # DESIGN §4's order: turn/round ends the round *before* its tool calls run, naming them.
    with trio.fail_after(60):
        async with scene(tmp_path, "locus") as (_daemon, servers, client):
            seq = await message(servers, client, "b")
            opened = await client.call("turn/open", {"agent": AGENT, "wakes": [seq]})
            turn_id = opened["turnId"]
            await client.call("turn/text", {"turnId": turn_id, "round": 1, "delta": "I'll say it there"})
            publish_call = {"name": "channel_publish", "arguments": {"channelId": "random", "content": "explicit words"}}
            ended = await client.call("turn/round", {"turnId": turn_id, "round": 1, "toolCalls": [publish_call]})
            assert ended["deliveries"] == []
            published = await tool(client, turn_id, "channel_publish", channelId="random", content="explicit words")
            assert not published["isError"]
            await client.call("turn/text", {"turnId": turn_id, "round": 2, "delta": "later words"})
            await client.call("turn/round", {"turnId": turn_id, "round": 2, "toolCalls": [{"name": "think", "arguments": {}}]})
            closed = await client.call("turn/close", {"turnId": turn_id, "outcome": "completed"})
            [draft] = closed["drafts"]
            assert (draft["reason"], draft["preview"]) == ("explicit-send", "I'll say it there")
            assert await posts(servers["b"]) == [("random", "explicit words"), ("general", "later words")]
            assert await posts(servers["a"]) == []


# ---------------------------------------------------------------------- explicit


@ORDERS
async def test_explicit_targets_stick_type_on_the_trigger_and_bounce_with_one_token_candidates(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "explicit", first=first) as (daemon, servers, client):
            seq = await message(servers, client, "b")
            opened = await client.call("turn/open", {"agent": AGENT, "wakes": [seq]})
            turn_id = opened["turnId"]
            assert opened["shown"]["locus"] is None

            async def typing_on_b() -> bool:
                return ("general", "start") in typing_ops(await servers["b"].recorded())

            await wait_until(typing_on_b, timeout=10)
            # The turn's own channel's id means b's general; the first valid target sticks.
            await client.call("turn/text", {"turnId": turn_id, "round": 1, "delta": ">>general hello b\n>>a:general ! hello a"})
            await client.call("turn/round", {"turnId": turn_id, "round": 1})
            await client.call("turn/text", {"turnId": turn_id, "round": 2, "delta": "sticky words"})
            closed = await client.call("turn/close", {"turnId": turn_id, "outcome": "completed"})
            assert closed["receipt"]["text"] is None  # explicit mode has no receipt
            assert closed["again"] is True  # the " !"
            assert await posts(servers["b"]) == [("general", "hello b"), ("general", "sticky words")]
            assert await posts(servers["a"]) == [("general", "hello a")]
            assert typing_ops(await servers["a"].recorded()) == []

            # A heartbeat: no trigger, no typing; a shared id bounces with both candidates.
            _, _, closed = await run_turn(client, [">>general who hears this"])
            [bounce] = closed["notices"]
            [draft] = closed["drafts"]
            assert draft["reason"] == "bounced" and draft["id"] in bounce
            lines = bounce.splitlines()
            assert "- >>a:general" in lines and "- >>b:general" in lines
            assert f">>{first}:general {{{{unsent}}}}" in bounce
            assert closed["again"] is True

            # {{unsent}} sends the latest bounced draft; its state moves to delivered.
            _, _, closed = await run_turn(client, [">>b:general {{unsent}}"])
            assert closed["again"] is False
            assert daemon.journal.draft(draft["id"])["state"] == "delivered"
            assert (await posts(servers["b"]))[-1] == ("general", "who hears this")
            assert await posts(servers["a"]) == [("general", "hello a")]


async def test_explicit_bounce_wakes_are_capped_at_two_in_a_row(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "explicit") as (_daemon, servers, client):
            again = []
            for _ in range(3):
                _, _, closed = await run_turn(client, ["no target"])
                again.append(closed["again"])
                assert texts.BOUNCE_NO_TARGET not in closed["notices"][0]  # reads as words, not a code
            assert again == [True, True, False]
            # >>skip_reply {{unsent}} sets the latest bounce aside.
            _, _, closed = await run_turn(client, [">>skip_reply {{unsent}}"])
            assert closed["notices"] == []
            for name in ("a", "b"):
                assert await posts(servers[name]) == []


# ---------------------------------------------------------------------- hybrid


@ORDERS
async def test_hybrid_pin_beats_the_locus_skip_reply_quiets_and_a_failed_target_holds(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "hybrid", first=first) as (_daemon, servers, client):
            seq = await message(servers, client, "b")
            rounds = [
                "to the locus\n>>> a:general pinned",
                "follows the pin",
                ">>>skip_reply\nprivate now",
                ">>> nowhere lost words",
                "held words",
                ">>> general back home",
                "home again",
            ]
            _, routed, closed = await run_turn(client, rounds, wakes=[seq])
            assert await posts(servers["a"]) == [("general", "pinned"), ("general", "follows the pin")]
            assert await posts(servers["b"]) == [("general", "to the locus"), ("general", "back home"), ("general", "home again")]
            reasons = sorted(d["reason"] for d in closed["drafts"])
            assert reasons == ["bounced", "no-destination"]
            said = notices(routed, closed)
            assert texts.speech_lands_in("a:general") in said
            receipt = closed["receipt"]["text"]
            assert receipt.startswith("[delivered] plain speech → b:general · a:general — 2 draft(s) held")
            assert "1 segment(s) private" in receipt


async def test_hybrid_bounce_advice_resends_the_draft_and_skip_reply_unsent_sets_it_aside(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "hybrid") as (daemon, servers, client):
            seq = await message(servers, client, "b")
            _, routed, closed = await run_turn(client, [">>> nowhere hello there", ">>> b:general {{unsent}}"], wakes=[seq])
            [bounce] = [n for n in routed[0]["notices"] if "were not delivered" in n]
            # The advice is written in the mode's own grammar.
            assert ">>>b:general {{unsent}}" in bounce and ">>>skip_reply {{unsent}}" in bounce
            assert ">>skip_reply" not in bounce.replace(">>>skip_reply", "")
            # Following it posts the bounced words (never the placeholder); the draft IS what went.
            assert await posts(servers["b"]) == [("general", "hello there")]
            [draft] = daemon.turns.drafts.drafts_of(AGENT)
            assert (draft.state, draft.text) == ("delivered", "hello there")
            # >>>skip_reply {{unsent}} sets the latest bounce aside: dismissed, nothing posted.
            seq = await message(servers, client, "b")
            _, routed, closed = await run_turn(client, [">>> nowhere second words", ">>>skip_reply {{unsent}}"], wakes=[seq])
            states = {d.text: d.state for d in daemon.turns.drafts.drafts_of(AGENT)}
            assert states == {"hello there": "delivered", "second words": "dismissed"}
            # Text that follows a >>> pin is read as explicit mode reads it: it is the draft.
            seq = await message(servers, client, "b")
            await run_turn(client, [">>> nowhere third words", ">>> b:general\n{{unsent}}"], wakes=[seq])
            assert (await posts(servers["b"]))[-1] == ("general", "third words")
            assert [d.state for d in daemon.turns.drafts.drafts_of(AGENT)] == ["delivered", "dismissed", "delivered"]
            for name in ("a", "b"):
                assert all("unsent" not in text for _channel, text in await posts(servers[name]))
            assert await posts(servers["a"]) == []


# ---------------------------------------------------------------------- disabled


async def test_disabled_posts_nothing_prefixes_included_and_counts_suppressed(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "disabled") as (_daemon, servers, client):
            seq = await message(servers, client, "b")
            opened, _, closed = await run_turn(client, ["plain", ">>b:general prefixed", ">>> b:general pinned"], wakes=[seq])
            assert opened["shown"]["routing"] is None and opened["system"] == []
            assert closed["receipt"]["text"].startswith("[delivered] nothing — 3 plain-speech segment(s) suppressed")
            for name in ("a", "b"):
                assert await posts(servers[name]) == []
                assert typing_ops(await servers[name].recorded()) == []


# ---------------------------------------------------------------------- named (seed 002)


async def test_named_never_posts_plain_text_in_a_message_turn_a_heartbeat_or_a_self_wake(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "named") as (_daemon, servers, client):
            seq = await message(servers, client, "b")
            texts_written = ["plain", ">>b:general prefixed", ">>> b:general pinned"]
            opened, routed, closed = await run_turn(client, texts_written, wakes=[seq])
            # The system line, in the message turn, and the same in a heartbeat's and a self-wake's.
            assert opened["system"] == [texts.NAMED_LINE_PUBLISH]
            assert all(r["deliveries"] == [] and r["notices"] == [] for r in routed)
            assert closed["receipt"]["text"] == "[delivered] nothing — " + texts.note_named(3)
            assert "kept in your context, sent to no one" in closed["receipt"]["text"]
            heartbeat, _, _ = await run_turn(client, texts_written)
            self_wake, _, _ = await run_turn(client, texts_written, channel="b:general")
            assert heartbeat["system"] == self_wake["system"] == opened["system"]
            for name in ("a", "b"):
                assert await posts(servers[name]) == []
                assert typing_ops(await servers[name].recorded()) == []


async def test_named_system_line_wordings_tools_sleep_and_resend(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "named", spec={"allowedTools": ["drafts", "sleep", "skip_reply", "think", "prose_help"]}) as (
            _daemon, servers, client,
        ):
            opened = await client.call("turn/open", {"agent": AGENT})
            assert opened["system"] == [texts.NAMED_LINE_NO_PUBLISH]
            assert "channel_publish" not in opened["system"][0]
            described = {spec["name"]: spec for spec in opened["tools"]}
            assert "Nothing is announced" in described["sleep"]["description"]
            assert described["sleep"]["inputSchema"]["properties"] == {}
            assert "names where it goes" in described["skip_reply"]["description"]
            assert "same round" not in described["think"]["description"]
            slept = await tool(client, opened["turnId"], "sleep", announce="brb")
            assert slept["content"][0]["text"] == texts.SLEEP_NOT_ANNOUNCED
            await client.call("turn/text", {"turnId": opened["turnId"], "round": 1, "delta": "words"})
            await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
            subagent = await client.call("turn/open", {"agent": AGENT, "subagent": True})
            assert subagent["system"] == [texts.NAMED_LINE_SUBAGENT]
            # A resend with no destination is refused: nothing goes to a default channel.
            daemon_draft = _daemon.turns
            draft = daemon_draft.drafts.new(daemon_draft.run_of(subagent["turnId"]), "kept words", "no-destination")
            refused = await tool(client, subagent["turnId"], "drafts", action="resend", id=draft.draft_id)
            assert refused["isError"] and refused["reason"] == "no-destination"
            assert refused["content"][0]["text"] == texts.draft_no_destination(True)
            await client.call("turn/close", {"turnId": subagent["turnId"], "outcome": "completed"})
            for name in ("a", "b"):
                assert await posts(servers[name]) == []


@ORDERS
async def test_a_refusal_reacts_on_the_messages_own_server_except_for_named(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "locus", first=first) as (_daemon, servers, client):
            seq = await message(servers, client, "b")
            _, _, closed = await run_turn(client, ["unsaid"], wakes=[seq], outcome="refused")
            assert closed["deliveries"] == []

            async def acknowledged() -> list[dict[str, Any]]:
                return await servers["b"].recorded("channels/acknowledge")

            [ack] = await wait_until(acknowledged, timeout=10)
            assert ack["params"]["channelId"] == "general" and ack["params"]["value"] == "🚫"
            assert ack["kind"] == "request" and ack["params"]["intent"] == "refused"
            assert ack["params"]["messageId"]
            assert await servers["a"].recorded("channels/acknowledge") == []
            assert await posts(servers["b"]) == []
            phases = [e["params"]["phase"] for e in await servers["b"].recorded("inference/lifecycle")]
            assert phases == []  # this turn never started inference (no round was routed)


async def test_named_refusal_gets_no_reaction(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "named") as (_daemon, servers, client):
            seq = await message(servers, client, "b")
            await run_turn(client, ["unsaid"], wakes=[seq], outcome="refused")
            # A later notification on b's link: an acknowledge, had one been sent, precedes it.
            await client.call("channels/typing", {"channel": "b:general", "op": "stop"})

            async def typed() -> bool:
                return ("general", "stop") in typing_ops(await servers["b"].recorded())

            await wait_until(typed, timeout=10)
            for name in ("a", "b"):
                assert await servers[name].recorded("channels/acknowledge") == []


# ---------------------------------------------------------------------- outgoing streams


def stream_entries(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in entries if e["method"].startswith("channels/outgoing/")]


async def completed_stream(server: FixtureProcess) -> list[dict[str, Any]]:
    async def done() -> list[dict[str, Any]]:
        entries = stream_entries(await server.recorded())
        return entries if any(e["method"] == "channels/outgoing/complete" for e in entries) else []

    return await wait_until(done, timeout=10)


@ORDERS
async def test_streams_carry_only_decided_words_to_the_destinations_own_server(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "hybrid", first=first) as (_daemon, servers, client):
            seq = await message(servers, client, "b")
            rounds = ["to b", ">>> a:general to a", ">>>skip_reply\nprivate", ">>> nowhere bounced", "held", ">>> general b again"]
            opened, _, _ = await run_turn(client, rounds, wakes=[seq])
            inference = opened["inferenceId"]
            # Chunks and completes are notifications: wait until each server recorded its complete.
            a_stream = await completed_stream(servers["a"])
            b_stream = await completed_stream(servers["b"])
            chunks = sorted(
                [(e["params"]["index"], name, e["params"]["delta"]) for name, es in (("a", a_stream), ("b", b_stream))
                 for e in es if e["method"] == "channels/outgoing/chunk"]
            )
            assert chunks == [(0, "b", "to b"), (1, "a", "to a"), (2, "b", "\n\nb again")]
            completes = {
                name: [(e["params"]["channelId"], e["params"]["content"]) for e in es if e["method"] == "channels/outgoing/complete"]
                for name, es in (("a", a_stream), ("b", b_stream))
            }
            assert completes == {"a": [("general", "to a")], "b": [("general", "to b\n\nb again")]}
            assert {e["params"]["inferenceId"] for e in a_stream + b_stream} == {inference}


async def test_a_server_not_granted_streaming_gets_no_chunks_and_an_aborted_turn_completes(tmp_path: Path) -> None:
    options = {"a": {"disabledCapabilities": ["channels.streaming"]}}
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"], options) as (daemon, servers):
            for name in ("a", "b"):
                await servers[name].register([open_channel("general")])
                await wait_channel(daemon, name, "general")
            assert daemon.host_socket_path is not None
            async with RouterClient.connect_unix(daemon.host_socket_path) as client:
                await client.hello("test-host", [{"name": AGENT, "proseRouting": "explicit"}])
                opened = await client.call("turn/open", {"agent": AGENT})
                turn_id = opened["turnId"]
                await client.call("turn/text", {"turnId": turn_id, "round": 1, "delta": ">>a:general to a\n>>b:general to b"})
                await client.call("turn/round", {"turnId": turn_id, "round": 1})
                await client.call("turn/text", {"turnId": turn_id, "round": 2, "delta": "unfinished"})
                await client.call("turn/close", {"turnId": turn_id, "outcome": "aborted"})
            b_stream = await completed_stream(servers["b"])
            assert stream_entries(await servers["a"].recorded()) == []
            assert await posts(servers["a"]) == [("general", "to a")]
            assert [(e["method"], e["params"].get("index"), e["params"].get("delta", e["params"].get("content"))) for e in b_stream] == [
                ("channels/outgoing/chunk", 0, "to b"),
                ("channels/outgoing/complete", None, "to b"),
            ]


# ---------------------------------------------------------------------- closed-channel invitation


@pytest.mark.parametrize(
    "mode, spec, reply",
    [
        ("named", {}, 'call channel_publish with channelId "b:lounge".'),
        ("named", {"allowedTools": ["drafts"]}, texts.INVITATION_REPLY_SEND_TOOL),
        ("explicit", {}, "begin a line with >>b:lounge and write your reply after it."),
        ("hybrid", {}, "begin a line with >>> b:lounge and write your reply after it."),
        ("locus", {}, texts.invitation_reply_locus()),
    ],
)
async def test_a_closed_channel_invitation_offers_a_reply_that_reaches_that_channel_alone(
    tmp_path: Path, mode: str, spec: dict[str, Any], reply: str
) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, mode, spec=spec) as (daemon, servers, client):
            # Both servers have a closed "lounge": only b:lounge picks b's alone.
            for name in ("a", "b"):
                await servers[name].register([channel_descriptor_closed("lounge")])
                await wait_channel(daemon, name, "lounge")
            await servers["b"].incoming([{"channelId": "lounge", "text": "ann?", "tags": ["chat:mention"]}])
            notification = await client.next_notification("wake")
            invitation = notification.params["invitation"]
            assert invitation.startswith("[channels] Demo User addressed you in b:lounge, a channel you have not joined")
            assert f"1. Reply without joining: {reply}\n" in invitation
            assert '2. Join: channel_open with channelId "lounge" and serverId "b"' in invitation
            assert "3. Stay out: channel_decline" in invitation
            # An open channel's message carries none.
            await servers["b"].incoming([{"channelId": "general", "text": "ann!", "tags": ["chat:mention"]}])
            assert "invitation" not in (await client.next_notification("wake")).params


@ORDERS
async def test_the_invitation_is_per_agent_even_while_another_agent_keeps_the_channel_open(tmp_path: Path, first: str) -> None:
    """kai opens a:general, which opens its transport for every agent: kai's wakes there carry no
    invitation, mo's (who opened nothing) do, and kai is still invited to b:general, the other
    server's channel with the same id."""
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"]) as (daemon, servers):
            for name in (first, "b" if first == "a" else "a"):
                await servers[name].register([channel_descriptor_closed("general")])
                await wait_channel(daemon, name, "general")
            assert daemon.host_socket_path is not None
            async with RouterClient.connect_unix(daemon.host_socket_path) as client:
                await client.hello("test-host", ["kai", "mo"])
                turn = await client.call("turn/open", {"agent": "kai"})
                opened = await client.call("turn/tool", {"turnId": turn["turnId"], "callId": "c1", "name": "channel_open",
                                                         "arguments": {"channelId": "a:general", "setSpeechTarget": False}})
                assert opened["isError"] is False and opened["structuredContent"]["serverId"] == "a"
                await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
                entry = daemon.router.registry.get(ChannelRef("a", "general"))
                assert entry is not None and entry.open  # the shared transport: open for mo too

                async def wakes_from(server: str) -> dict[str, dict[str, Any]]:
                    await servers[server].incoming([{"channelId": "general", "text": "kai? mo?", "tags": ["chat:mention"]}])
                    woken = [dict((await client.next_notification("wake")).params) for _ in range(2)]
                    assert {w["channel"]["serverId"] for w in woken} == {server}
                    return {w["agent"]: w for w in woken}

                on_a = await wakes_from("a")
                assert "invitation" not in on_a["kai"]
                assert on_a["mo"]["invitation"].startswith("[channels] Demo User addressed you in a:general, a channel you have not joined")
                assert '2. Join: channel_open with channelId "general" and serverId "a"' in on_a["mo"]["invitation"]
                on_b = await wakes_from("b")
                for agent in ("kai", "mo"):
                    invitation = on_b[agent]["invitation"]
                    assert invitation.startswith("[channels] Demo User addressed you in b:general")
                    assert '2. Join: channel_open with channelId "general" and serverId "b"' in invitation


def channel_descriptor_closed(channel_id: str) -> dict[str, Any]:
    from mcpl_router.testing.descriptors import channel_descriptor

    return {**channel_descriptor(channel_id), "initiallyOpen": False}


# ---------------------------------------------------------------------- failed deliveries


async def test_a_failed_delivery_is_told_and_a_failed_pin_holds_later_words(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "hybrid") as (daemon, servers, client):
            await servers["a"].configure(publish={"delivered": False})
            seq = await message(servers, client, "b")
            _, routed, closed = await run_turn(client, [">>> a:general refused words", "held after the failure", ">>> b:general back"], wakes=[seq])
            said = notices(routed, closed)
            assert any(texts.bounce_why_not_delivered("a:general", texts.Reason.NOT_DELIVERED) in n for n in said)
            assert texts.SPEECH_HELD_UNTIL_TARGET in said
            assert sorted(d["reason"] for d in closed["drafts"]) == ["bounced", "no-destination"]
            assert [d["outcome"] for d in closed["deliveries"]] == ["failed", "delivered"]
            assert "not delivered to a:general" in closed["receipt"]["text"]
            assert await posts(servers["b"]) == [("general", "back")]

            # Locus mode: a failed delivery is told, naming the place and its server; nothing drafted.
            await servers["b"].configure(publish={"delivered": False})
            seq = await message(servers, client, "b")
            opened = await client.call("turn/open", {"agent": AGENT, "wakes": [seq]})
            await client.call("turn/text", {"turnId": opened["turnId"], "round": 1, "delta": "lost words"})
            closed = await client.call("turn/close", {"turnId": opened["turnId"], "outcome": "completed"})
            assert closed["notices"] == [texts.delivery_failed("b:general", "b", texts.Reason.NOT_DELIVERED)]
            assert closed["drafts"] == [] and daemon.turns.open_turns() == []


# ---------------------------------------------------------------------- speech tools


async def test_sleep_announces_in_the_pin_and_nowhere_for_a_call_outside_the_turn(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "hybrid") as (_daemon, servers, client):
            seq = await message(servers, client, "b")
            first = await client.call("turn/open", {"agent": AGENT, "wakes": [seq]})
            await client.call("turn/text", {"turnId": first["turnId"], "round": 1, "delta": ">>> a:general pinned"})
            await client.call("turn/round", {"turnId": first["turnId"], "round": 1})
            slept = await tool(client, first["turnId"], "sleep", announce="back soon")
            assert slept["content"][0]["text"] == texts.sleep_announced("a:general")
            # A new turn; a script of the first turn calls sleep: it announces nowhere.
            second = await client.call("turn/open", {"agent": AGENT, "wakes": [seq]})
            late = await client.call("turn/tool", {"turnId": second["turnId"], "callId": "c9", "name": "sleep",
                                                   "arguments": {"announce": "late"}, "callerTurnId": first["turnId"]})
            assert late["content"][0]["text"] == texts.SLEEP_NOT_ANNOUNCED
            await client.call("turn/close", {"turnId": second["turnId"], "outcome": "completed"})
            assert await posts(servers["a"]) == [("general", "pinned"), ("general", "back soon")]
            assert await posts(servers["b"]) == []


async def test_skip_reply_keeps_the_rest_private_and_prose_help_gives_the_grammar(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "explicit") as (_daemon, servers, client):
            seq = await message(servers, client, "b")
            opened = await client.call("turn/open", {"agent": AGENT, "wakes": [seq]})
            turn_id = opened["turnId"]
            helped = await tool(client, turn_id, "prose_help")
            grammar = helped["content"][0]["text"]
            assert ">>a:general" in grammar and "the turn has been in" in grammar and "{{unsent}}" in grammar
            await client.call("turn/text", {"turnId": turn_id, "round": 1, "delta": ">>general never sent"})
            skipped = await tool(client, turn_id, "skip_reply")
            assert skipped["structuredContent"] == {"endTurn": True}
            await client.call("turn/round", {"turnId": turn_id, "round": 1})
            await client.call("turn/text", {"turnId": turn_id, "round": 2, "delta": "nor this"})
            closed = await client.call("turn/close", {"turnId": turn_id, "outcome": "completed"})
            assert closed["receipt"]["private"] == 2 and closed["drafts"] == []
            for name in ("a", "b"):
                assert await posts(servers[name]) == []


async def test_an_unconfirmed_draft_needs_confirm_duplicate_and_dismiss_sets_aside(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "locus") as (daemon, servers, client):
            _, _, closed = await run_turn(client, ["first words", "second words"])
            first, second = (d["id"] for d in closed["drafts"])
            daemon.turns.publish_timeout = 0.3
            await servers["b"].configure(publish={"delayMs": 1500})
            turn = await client.call("turn/open", {"agent": AGENT})
            unknown = await tool(client, turn["turnId"], "drafts", action="resend", ids=[first, second], channelId="b:general")
            # The first went out and its outcome is unknown: the resend stops there.
            assert [s["outcome"] for s in unknown["structuredContent"]["sent"]] == ["unknown"]
            assert daemon.journal.draft(first)["state"] == "unconfirmed"
            assert daemon.journal.draft(second)["state"] == "held"
            await servers["b"].configure(publish={})
            refused = await tool(client, turn["turnId"], "drafts", action="resend", id=first, channelId="b:general")
            assert refused["isError"] and refused["reason"] == "confirm-duplicate-needed"
            daemon.turns.publish_timeout = 10
            confirmed = await tool(client, turn["turnId"], "drafts", action="resend", id=first, channelId="b:general",
                                   confirmDuplicate=True)
            assert confirmed["structuredContent"]["sent"][0]["outcome"] == "delivered"
            dismissed = await tool(client, turn["turnId"], "drafts", action="dismiss", id=second)
            assert not dismissed["isError"] and daemon.journal.draft(second)["state"] == "dismissed"
            gone = await tool(client, turn["turnId"], "drafts", action="resend", id=second, channelId="b:general")
            assert gone["reason"] == "draft-not-resendable"
            await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})

            async def both_arrived() -> bool:
                return len(await posts(servers["b"])) == 2

            await wait_until(both_arrived, timeout=10)
            assert await posts(servers["b"]) == [("general", "first words"), ("general", "first words")]
            assert await posts(servers["a"]) == []


# ---------------------------------------------------------------------- mid-turn hold


@ORDERS
async def test_an_addressed_message_from_another_conversation_holds_the_locus_mid_turn(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "locus", first=first) as (_daemon, servers, client):
            seq = await message(servers, client, "b")
            opened = await client.call("turn/open", {"agent": AGENT, "wakes": [seq]})
            turn_id = opened["turnId"]
            await client.call("turn/text", {"turnId": turn_id, "round": 1, "delta": "written before"})
            # Ambient chatter in the same conversation changes nothing.
            await servers["b"].incoming([{"channelId": "general", "text": "chatter"}])
            await client.call("turn/round", {"turnId": turn_id, "round": 1})
            await client.call("turn/text", {"turnId": turn_id, "round": 2, "delta": "still b"})
            # Someone on a's general addresses ann: later words are held.
            await message(servers, client, "a")
            routed = await client.call("turn/round", {"turnId": turn_id, "round": 2})
            assert routed["notices"] == [texts.speech_held(["b:general", "a:general"])]
            await client.call("turn/text", {"turnId": turn_id, "round": 3, "delta": "held now"})
            closed = await client.call("turn/close", {"turnId": turn_id, "outcome": "completed"})
            assert [(d["reason"], d["preview"]) for d in closed["drafts"]] == [("ambiguous", "held now")]
            assert await posts(servers["b"]) == [("general", "written before"), ("general", "still b")]
            assert await posts(servers["a"]) == []
            assert typing_ops(await servers["a"].recorded()) == []


@ORDERS
async def test_an_arrival_held_for_a_tune_out_does_not_hold_the_locus(tmp_path: Path, first: str) -> None:
    """a's general is tuned out: someone addressing ann there mid-turn is held for the summary,
    so it competes with nothing and the turn's words still go to b."""
    with trio.fail_after(60):
        async with scene(tmp_path, "locus", first=first) as (daemon, servers, client):
            seq = await message(servers, client, "b")
            opened = await client.call("turn/open", {"agent": AGENT, "wakes": [seq]})
            turn_id = opened["turnId"]
            tuned = await client.call("turn/tool", {"turnId": turn_id, "callId": "t", "name": "tune_out",
                                                    "arguments": {"channelId": "a:general", "cadence": 600}})
            assert tuned["isError"] is False
            await client.call("turn/text", {"turnId": turn_id, "round": 1, "delta": "to b"})
            await servers["a"].incoming([{"channelId": "general", "text": "hi ann", "tags": ["chat:mention"]}])
            await wait_until(lambda: len(daemon.tune_outs.table.get(AGENT, ChannelRef("a", "general")).held) == 1, timeout=10)
            routed = await client.call("turn/round", {"turnId": turn_id, "round": 1})
            assert routed["notices"] == []
            assert [d["outcome"] for d in routed["deliveries"]] == ["delivered"]
            await client.call("turn/close", {"turnId": turn_id, "outcome": "completed"})
            assert await posts(servers["b"]) == [("general", "to b")]
            assert await posts(servers["a"]) == []


async def test_a_draft_no_receipt_named_is_named_at_the_next_turn(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "locus") as (_daemon, servers, client):
            first = await client.call("turn/open", {"agent": AGENT})
            assert first["notices"] == []
            await client.call("turn/text", {"turnId": first["turnId"], "round": 1, "delta": "unheard"})
            await client.call("turn/round", {"turnId": first["turnId"], "round": 1})
            # Superseded: the first turn never closes, so no receipt named its draft.
            second = await client.call("turn/open", {"agent": AGENT})
            [notice] = second["notices"]
            assert notice.startswith("[routing] 1 draft(s) of yours were held and not yet mentioned: d-")
            await client.call("turn/close", {"turnId": second["turnId"], "outcome": "completed"})
            third = await client.call("turn/open", {"agent": AGENT})
            assert third["notices"] == []
            await client.call("turn/close", {"turnId": third["turnId"], "outcome": "completed"})
            for name in ("a", "b"):
                assert await posts(servers[name]) == []


async def test_a_channel_open_that_sets_the_speech_target_supersedes_the_pin(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "hybrid") as (_daemon, servers, client):
            seq = await message(servers, client, "b")
            opened = await client.call("turn/open", {"agent": AGENT, "wakes": [seq]})
            turn_id = opened["turnId"]
            await client.call("turn/text", {"turnId": turn_id, "round": 1, "delta": ">>> a:general pinned\n"})
            await client.call("turn/round", {"turnId": turn_id, "round": 1})
            await client.call("turn/text", {"turnId": turn_id, "round": 2, "delta": ">>>skip_reply\nquiet"})
            await client.call("turn/round", {"turnId": turn_id, "round": 2})
            moved = await tool(client, turn_id, "channel_open", channelId="random")
            assert not moved["isError"], moved
            await client.call("turn/text", {"turnId": turn_id, "round": 3, "delta": "in random"})
            await client.call("turn/close", {"turnId": turn_id, "outcome": "completed"})
            assert await posts(servers["a"]) == [("general", "pinned")]
            assert await posts(servers["b"]) == [("random", "in random")]


# ---------------------------------------------------------------------- review regressions


def stream_rows(entries: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    return [
        (e["method"].rsplit("/", 1)[1], e["params"]["channelId"], e["params"].get("delta") or e["params"].get("content"))
        for e in stream_entries(entries)
    ]


async def test_a_turn_whose_lease_expires_mid_round_posts_nothing_more_and_completes_every_stream(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "explicit") as (daemon, servers, client):
            daemon.turns.lease = 0.6
            await servers["a"].configure(publish={"delayMs": 1500})
            opened = await client.call("turn/open", {"agent": AGENT})
            turn_id = opened["turnId"]
            await client.call("turn/text", {"turnId": turn_id, "round": 1, "delta": ">>b:general one\n>>a:general two\n>>b:general three"})
            # The lease runs out while a's publish is in flight: that publish ends, nothing after it goes out.
            await client.call("turn/round", {"turnId": turn_id, "round": 1})
            await completed_stream(servers["b"])
            await wait_until(lambda: daemon.turns.open_turns() == [], timeout=10)

            async def a_posted() -> list[tuple[str, str]]:
                return await posts(servers["a"])

            assert await wait_until(a_posted, timeout=10) == [("general", "two")]
            assert await posts(servers["b"]) == [("general", "one")]
            # Every channel that got chunks got exactly one complete, carrying what it was sent.
            assert stream_rows(await servers["b"].recorded()) == [("chunk", "general", "one"), ("complete", "general", "one")]
            a_rows = stream_rows(await servers["a"].recorded())
            assert a_rows == [] or [kind for kind, _, _ in a_rows] == ["chunk", "complete"]
            # The words the ended turn never sent are kept as a draft.
            assert [d.text for d in daemon.turns.drafts.drafts_of(AGENT)] == ["three"]


async def test_words_whose_delivery_failed_are_never_streamed(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "explicit") as (_daemon, servers, client):
            await servers["a"].configure(publish={"delivered": False})
            _, routed, closed = await run_turn(client, [">>a:general bounced words\n>>b:general fine", "x"])
            assert [d["outcome"] for d in routed[0]["deliveries"]] == ["failed", "delivered"]
            assert [d["preview"] for d in closed["drafts"]][0] == "bounced words"
            assert stream_rows(await completed_stream(servers["b"])) == [("chunk", "general", "fine"), ("complete", "general", "fine")]
            await trio.sleep(0.3)
            assert stream_entries(await servers["a"].recorded()) == []


async def test_a_resend_naming_one_draft_twice_posts_it_once(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "locus") as (daemon, servers, client):
            _, _, closed = await run_turn(client, ["heartbeat words"])
            [draft] = closed["drafts"]
            turn = await client.call("turn/open", {"agent": AGENT})
            sent = await tool(client, turn["turnId"], "drafts", action="resend", ids=[draft["id"], draft["id"]], channelId="a:general")
            assert [s["outcome"] for s in sent["structuredContent"]["sent"]] == ["delivered"]
            await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
            assert await posts(servers["a"]) == [("general", "heartbeat words")]
            assert daemon.journal.draft(draft["id"])["state"] == "delivered"


async def test_a_resend_interrupted_mid_publish_leaves_the_draft_unconfirmed_not_sending(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "locus") as (daemon, servers, client):
            _, _, closed = await run_turn(client, ["heartbeat words"])
            [draft] = closed["drafts"]
            await servers["a"].configure(publish={"delayMs": 3000})
            turn = await client.call("turn/open", {"agent": AGENT})
            run = daemon.turns.run_of(turn["turnId"])
            held = daemon.turns.drafts.draft(AGENT, draft["id"])
            assert run is not None and held is not None
            # The send is cancelled while its publish is in flight (as when the daemon stops).
            with trio.move_on_after(0.5) as interrupted:
                await daemon.turns.speech.resend_draft(run, held, ChannelRef("a", "general"))
            assert interrupted.cancelled_caught
            await servers["a"].configure(publish={})
            row = daemon.journal.draft(draft["id"])
            assert row is not None and row["state"] == "unconfirmed"
            assert [(a["outcome"], a.get("reason")) for a in row["attempts"]] == [("unknown", texts.Reason.INTERRUPTED)]
            # Not "being sent" forever: a resend is refused only until the duplicate is confirmed.
            again = await tool(client, turn["turnId"], "drafts", action="resend", id=draft["id"], channelId="a:general")
            assert again["isError"] and again["reason"] == "confirm-duplicate-needed"
            await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})


async def test_a_bounced_unsent_envelope_holds_the_draft_text_once(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "explicit") as (daemon, servers, client):
            _, _, first = await run_turn(client, ["orphan words"])
            [orphan] = first["drafts"]
            _, _, second = await run_turn(client, [">>nowhere {{unsent}}"])
            # The same draft bounced again (its words exactly): no copy, no placeholder stored.
            assert [d["id"] for d in second["drafts"]] == [orphan["id"]]
            _, _, third = await run_turn(client, [">>nowhere again: {{unsent}}"])
            [replacement] = third["drafts"]
            rows = {d.draft_id: (d.state, d.text) for d in daemon.turns.drafts.drafts_of(AGENT)}
            assert rows == {orphan["id"]: ("dismissed", "orphan words"), replacement["id"]: ("held", "again: orphan words")}
            turn = await client.call("turn/open", {"agent": AGENT})
            await tool(client, turn["turnId"], "drafts", action="resend", ids=list(rows), channelId="b:general")
            await tool(client, turn["turnId"], "drafts", action="resend", id=replacement["id"], channelId="b:general")
            await client.call("turn/close", {"turnId": turn["turnId"], "outcome": "completed"})
            assert await posts(servers["b"]) == [("general", "again: orphan words")]


async def test_the_receipt_names_each_place_once_by_the_name_shown_at_close(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"]) as (daemon, servers):
            await servers["a"].register([open_channel("general")])
            await wait_channel(daemon, "a", "general")
            assert daemon.host_socket_path is not None
            async with RouterClient.connect_unix(daemon.host_socket_path) as client:
                await client.hello("test-host", [{"name": AGENT, "proseRouting": "locus"}])
                seq = await message(servers, client, "a")
                opened = await client.call("turn/open", {"agent": AGENT, "wakes": [seq]})
                turn_id = opened["turnId"]
                await client.call("turn/text", {"turnId": turn_id, "round": 1, "delta": "one"})
                await client.call("turn/round", {"turnId": turn_id, "round": 1})
                # b takes "general" too: the bare name no longer means a's channel alone.
                await servers["b"].register([open_channel("general")])
                await wait_channel(daemon, "b", "general")
                await client.call("turn/text", {"turnId": turn_id, "round": 2, "delta": "two"})
                closed = await client.call("turn/close", {"turnId": turn_id, "outcome": "completed"})
                assert closed["receipt"]["text"] == "[delivered] plain speech → a:general"
                assert await posts(servers["a"]) == [("general", "one"), ("general", "two")]
                assert await posts(servers["b"]) == []


async def test_a_failed_unsent_delivery_names_the_place_and_the_draft_still_held(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "explicit") as (daemon, servers, client):
            _, _, first = await run_turn(client, ["orphan words"])
            [orphan] = first["drafts"]
            await servers["a"].configure(publish={"delivered": False})
            _, routed, _ = await run_turn(client, [">>a:general {{unsent}}", "x"])
            assert [d["outcome"] for d in routed[0]["deliveries"]] == ["failed"]
            assert routed[0]["notices"] == [
                texts.unsent_delivery_failed("a:general", "a", texts.Reason.NOT_DELIVERED, orphan["id"])
            ]
            assert daemon.journal.draft(orphan["id"])["state"] == "held"
            assert await posts(servers["b"]) == []


@pytest.mark.parametrize("mode", ["locus", "explicit"])
async def test_typing_follows_a_channel_open_that_moves_speech_and_stays_on_the_trigger_in_explicit(tmp_path: Path, mode: str) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, mode) as (_daemon, servers, client):
            seq = await message(servers, client, "b")
            opened = await client.call("turn/open", {"agent": AGENT, "wakes": [seq]})
            turn_id = opened["turnId"]

            async def b_typing() -> bool:
                return bool(typing_ops(await servers["b"].recorded()))

            await wait_until(b_typing, timeout=10)
            await tool(client, turn_id, "channel_open", channelId="a:general")
            before = len(typing_ops(await servers["b"].recorded()))

            async def settled() -> bool:
                # locus: b got its stop and a its start; explicit: b refreshed its typing again.
                b_ops = typing_ops(await servers["b"].recorded())[before:]
                if mode == "locus":
                    return ("general", "stop") in b_ops and bool(typing_ops(await servers["a"].recorded()))
                return ("general", "start") in b_ops

            await wait_until(settled, timeout=10)
            # A few refresh intervals (0.2 s) more, so a typing that shouldn't be there would show.
            await trio.sleep(0.6)
            b_after = typing_ops(await servers["b"].recorded())[before:]
            a_ops = typing_ops(await servers["a"].recorded())
            if mode == "locus":
                # Speech moved to a:general: b's typing stops at once, a's starts (each on its own server).
                assert b_after == [("general", "stop")]
                assert a_ops and set(a_ops) == {("general", "start")}
            else:
                # Explicit: typing stays on the trigger, a gets none.
                assert b_after and set(b_after) == {("general", "start")}
                assert a_ops == []
            await client.call("turn/close", {"turnId": turn_id, "outcome": "completed"})
