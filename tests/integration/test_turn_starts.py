"""Turns that keep going (issue 13, item 3): a turn's further starts through ``turn/continue``.

Servers ``a`` and ``b`` both register ``general`` and ``lounge`` (in both orders). A turn opens
on a message in ``a:general``; a message on ``b:lounge`` arrives while it runs and the host
continues the turn on it: the turn re-pins on ``b`` (its speech, typing and ``wasIn``), and a
later ``lounge`` from that turn means ``b``'s, never ``a``'s. A start with no wakes (a budget
restart) moves nothing, and neither start supersedes the turn.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.jsonrpc import RpcError
from mcpl_router.testing.control import FixtureProcess, wait_until
from mcpl_router.testing.descriptors import channel_descriptor

from .conftest import servers_and_daemon, wait_channel

pytestmark = pytest.mark.integration

AGENT = "ann"


def open_channels(*ids: str) -> list[dict[str, Any]]:
    return [{**channel_descriptor(channel_id), "initiallyOpen": True} for channel_id in ids]


async def publishes(server: FixtureProcess) -> list[tuple[str, str]]:
    return [(e["params"]["channelId"], e["params"]["content"][0]["text"]) for e in await server.recorded("channels/publish")]


async def typing_ops(server: FixtureProcess) -> list[tuple[str, str]]:
    return [(e["params"]["channelId"], e["params"]["op"]) for e in await server.recorded("channels/typing")]


async def hello_and_wake(client: RouterClient, mode: str, server: FixtureProcess, channel_id: str) -> Any:
    """Claim the agent in ``mode``; a mention in ``server``'s ``channel_id``; its wake."""
    await client.hello("test-host", [{"name": AGENT, "proseRouting": mode}])
    await server.incoming([{"channelId": channel_id, "text": "hi ann", "tags": ["chat:mention"]}])
    return await client.next_wake()


async def registered_both(daemon: Any, servers: dict[str, FixtureProcess], first: str) -> None:
    for name in (first, "b" if first == "a" else "a"):
        await servers[name].register(open_channels("general", "lounge"))
        for channel_id in ("general", "lounge"):
            await wait_channel(daemon, name, channel_id)


@pytest.mark.parametrize("mode", ["locus", "explicit"])
@pytest.mark.parametrize("first", ["a", "b"])
async def test_a_mid_turn_message_on_b_lounge_re_pins_the_turn_on_b(tmp_path: Path, first: str, mode: str) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"]) as (daemon, servers):
            daemon.turns.typing_interval = 30  # one start per place: the test reads where it went
            await registered_both(daemon, servers, first)
            assert daemon.host_socket_path is not None
            async with RouterClient.connect_unix(daemon.host_socket_path) as client:
                first_wake = await hello_and_wake(client, mode, servers["a"], "general")
                async with client.turn(AGENT, wakes=[first_wake.seq]) as turn:
                    assert turn.channel is not None and turn.channel.shown == "a:general"
                    await wait_until(lambda: _has(servers["a"], ("general", "start")), timeout=10)

                    await servers["b"].incoming([{"channelId": "lounge", "text": "ann, over here", "tags": ["chat:mention"]}])
                    second_wake = await client.next_wake()
                    assert second_wake.channel is not None and second_wake.channel.shown == "b:lounge"
                    continued = await turn.continue_on([second_wake.seq])
                    assert continued.turn_id == turn.turn_id and continued.start == 2
                    assert continued.channel is not None and (continued.channel.server_id, continued.channel.channel_id) == ("b", "lounge")
                    assert [(ref.server_id, ref.channel_id) for ref in continued.was_in] == [("a", "general"), ("b", "lounge")]
                    if mode == "locus":
                        assert continued.shown.locus == "b:lounge"
                        assert continued.notices and "b:lounge" in continued.notices[0]
                    # Typing moved with the start: stopped on a's general, started on b's lounge.
                    await wait_until(lambda: _has(servers["b"], ("lounge", "start")), timeout=10)
                    assert await typing_ops(servers["a"]) == [("general", "start"), ("general", "stop")]

                    # Speech goes to b's lounge; a later "lounge" from the turn means b's, though
                    # a registers lounge too.
                    await turn.text(">>lounge in explicit words" if mode == "explicit" else "plain words")
                    await turn.end_round()
                    sent = await turn.tool("channel_publish", {"channelId": "lounge", "text": "by name"})
                    assert not sent.is_error, sent.text
                assert turn.receipt is not None
                expected = "in explicit words" if mode == "explicit" else "plain words"
                assert await publishes(servers["b"]) == [("lounge", expected), ("lounge", "by name")]
                assert await publishes(servers["a"]) == []
                assert daemon.turns.open_turns() == []


async def _has(server: FixtureProcess, op: tuple[str, str]) -> bool:
    return op in await typing_ops(server)


async def test_a_budget_restart_moves_nothing_and_a_continuation_is_not_a_new_turn(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"]) as (daemon, servers):
            daemon.turns.typing_interval = 30
            await registered_both(daemon, servers, "a")
            assert daemon.host_socket_path is not None
            async with RouterClient.connect_unix(daemon.host_socket_path) as client:
                wake = await hello_and_wake(client, "explicit", servers["b"], "general")
                async with client.turn(AGENT, wakes=[wake.seq]) as turn:
                    await wait_until(lambda: _has(servers["b"], ("general", "start")), timeout=10)
                    await turn.text(">>general first")  # the turn's own general: b's
                    await turn.end_round()
                    restarted = await turn.continue_on([])
                    assert restarted.start == 2 and restarted.notices == []
                    assert restarted.channel is not None and restarted.channel.shown == "b:general"
                    assert [(ref.server_id, ref.channel_id) for ref in restarted.was_in] == [("b", "general")]
                    # The pin from before the restart holds: the same logical turn.
                    await turn.text("second")
                    await turn.end_round()
                    with pytest.raises(RpcError) as unknown:
                        await turn.continue_on([999_999])
                    assert unknown.value.code == -32051 and "not continued" in unknown.value.message
                    assert [t.turn_id for t in daemon.turns.open_turns()] == [turn.turn_id]
                assert await publishes(servers["b"]) == [("general", "first"), ("general", "second")]
                assert await publishes(servers["a"]) == []
                # Typing never moved: one start on b's general, stopped at the close.
                assert await typing_ops(servers["b"]) == [("general", "start"), ("general", "stop")]
                assert await typing_ops(servers["a"]) == []


async def test_a_continuation_keeps_a_deliberate_locus_but_joins_the_turn_to_its_channel(tmp_path: Path) -> None:
    """A channel_open that set the speech target is deliberate: a continuation moves the
    trigger and wasIn, not where plain speech lands."""
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"]) as (daemon, servers):
            await registered_both(daemon, servers, "b")
            assert daemon.host_socket_path is not None
            async with RouterClient.connect_unix(daemon.host_socket_path) as client:
                wake = await hello_and_wake(client, "locus", servers["a"], "general")
                async with client.turn(AGENT, wakes=[wake.seq]) as turn:
                    opened = await turn.tool("channel_open", {"channelId": "general", "serverId": "b"})
                    assert not opened.is_error, opened.text
                    await servers["b"].incoming([{"channelId": "lounge", "text": "ann?", "tags": ["chat:mention"]}])
                    later = await client.next_wake()
                    continued = await turn.continue_on([later.seq])
                    assert continued.notices == [] and continued.shown.locus == "b:general"
                    assert [ref.shown for ref in continued.was_in] == ["a:general", "b:general", "b:lounge"]
                    await turn.text("still here")
                    await turn.end_round()
                assert await publishes(servers["b"]) == [("general", "still here")]
                assert await publishes(servers["a"]) == []


@asynccontextmanager
async def hybrid_agent_woken_in_a_lounge(tmp_path: Path) -> AsyncIterator[tuple[dict[str, FixtureProcess], RouterClient, Any]]:
    """Both servers register ``general`` and ``lounge``; the agent, in hybrid mode, is woken by
    a mention in ``a:lounge``. Yields the servers, the host client and the wake."""
    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"]) as (daemon, servers):
            await registered_both(daemon, servers, "a")
            assert daemon.host_socket_path is not None
            async with RouterClient.connect_unix(daemon.host_socket_path) as client:
                yield servers, client, await hello_and_wake(client, "hybrid", servers["a"], "lounge")


async def aim_at_no_channel(turn: Any) -> None:
    """A round whose ``>>>`` resolves to nothing: later plain words are held (hybrid)."""
    await turn.text(">>> b:nowhere\naimed at no channel")
    await turn.end_round()


async def continue_on_a_mention_in_a_general(servers: dict[str, FixtureProcess], client: RouterClient, turn: Any) -> Any:
    await servers["a"].incoming([{"channelId": "general", "text": "ann?", "tags": ["chat:mention"]}])
    later = await client.next_wake()
    return await turn.continue_on([later.seq])


async def test_a_continuation_does_not_lift_the_hold_a_failed_target_left(tmp_path: Path) -> None:
    """Hybrid: a ``>>>`` that names no channel holds later plain words until a new valid
    target. A message the turn is continued on is not one: the words stay drafts, not posts in
    that message's channel (a case the misrouting property's long run found)."""
    async with hybrid_agent_woken_in_a_lounge(tmp_path) as (servers, client, wake):
        async with client.turn(AGENT, wakes=[wake.seq]) as turn:
            await aim_at_no_channel(turn)
            continued = await continue_on_a_mention_in_a_general(servers, client, turn)
            # Nothing says plain speech now lands in a:general: it doesn't.
            assert not any("a:general" in notice for notice in continued.notices), continued.notices
            await turn.text("later plain words")
            await turn.end_round()
        assert turn.closed is not None
        assert await publishes(servers["a"]) == []
        assert await publishes(servers["b"]) == []
        previews = [draft.preview for draft in turn.closed.drafts]
        assert any("later plain words" in preview for preview in previews), previews


async def test_a_channel_open_of_the_channel_the_turn_is_in_lifts_a_failed_targets_hold(tmp_path: Path) -> None:
    """A ``channel_open`` that sets the speech target supersedes a failed ``>>>``, even when it
    names the channel the turn already speaks in (told apart by the open itself, not by a
    locus that moved)."""
    async with hybrid_agent_woken_in_a_lounge(tmp_path) as (servers, client, wake):
        async with client.turn(AGENT, wakes=[wake.seq]) as turn:
            await aim_at_no_channel(turn)
            opened = await turn.tool("channel_open", {"channelId": "lounge", "serverId": "a"})
            assert not opened.is_error, opened.text
            await turn.text("words after the open")
            await turn.end_round()
        assert await publishes(servers["a"]) == [("lounge", "words after the open")]
        assert await publishes(servers["b"]) == []


async def test_a_continuation_keeps_an_open_of_the_channel_the_turn_was_in(tmp_path: Path) -> None:
    """A ``channel_open`` of the turn's own channel is deliberate although the locus didn't
    move: a continuation on another channel's message before the next words leaves speech
    where the open put it (and a failed ``>>>`` before the open no longer holds it)."""
    async with hybrid_agent_woken_in_a_lounge(tmp_path) as (servers, client, wake):
        async with client.turn(AGENT, wakes=[wake.seq]) as turn:
            await aim_at_no_channel(turn)
            opened = await turn.tool("channel_open", {"channelId": "lounge", "serverId": "a"})
            assert not opened.is_error, opened.text
            continued = await continue_on_a_mention_in_a_general(servers, client, turn)
            assert continued.shown.locus == "a:lounge" and continued.notices == []
            await turn.text("still in the lounge")
            await turn.end_round()
        assert await publishes(servers["a"]) == [("lounge", "still in the lounge")]
        assert await publishes(servers["b"]) == []


async def test_a_pin_written_before_a_continuation_still_sticks(tmp_path: Path) -> None:
    """Hybrid: a round's ``>>>`` pin counts though the turn was continued (its locus moved)
    between the words and their routing: only a ``channel_open`` supersedes it."""
    async with hybrid_agent_woken_in_a_lounge(tmp_path) as (servers, client, wake):
        async with client.turn(AGENT, wakes=[wake.seq]) as turn:
            await turn.text(">>> b:general\nto b")
            await continue_on_a_mention_in_a_general(servers, client, turn)  # before the pin's round is routed
            await turn.end_round()
            await turn.text("along the pin")
            await turn.end_round()
        assert await publishes(servers["b"]) == [("general", "to b"), ("general", "along the pin")]
        assert await publishes(servers["a"]) == []
