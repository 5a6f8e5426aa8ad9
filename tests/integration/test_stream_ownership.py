"""A stream takes only its destination ref: a channel id passing to another server mid-stream
never moves the rest of the stream (issue 5 item 10; seed 000's outgoing-stream defect)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from mcpl_router.routing.refs import ChannelRef
from mcpl_router.testing.control import wait_until

from .test_prose_modes import ORDERS, completed_stream, message, posts, scene, stream_entries

pytestmark = pytest.mark.integration


@ORDERS
async def test_the_rest_of_a_stream_never_moves_to_the_server_left_with_the_id(tmp_path: Path, first: str) -> None:
    with trio.fail_after(60):
        async with scene(tmp_path, "locus", first=first) as (daemon, servers, client):
            seq = await message(servers, client, "b")
            a_before = len(await servers["a"].recorded())
            opened = await client.call("turn/open", {"agent": "ann", "wakes": [seq]})
            turn_id = opened["turnId"]
            await client.call("turn/text", {"turnId": turn_id, "round": 1, "delta": "first words"})
            await client.call("turn/round", {"turnId": turn_id, "round": 1})
            # b withdraws its general: a is now the only server with that id.
            await servers["b"].withdraw(["general"])
            await wait_until(lambda: not daemon.router.registry.is_registered(ChannelRef("b", "general")))
            await client.call("turn/text", {"turnId": turn_id, "round": 2, "delta": "second words"})
            await client.call("turn/round", {"turnId": turn_id, "round": 2})
            await client.call("turn/close", {"turnId": turn_id, "outcome": "completed"})
            b_stream = await completed_stream(servers["b"])
            chunks = [e["params"]["delta"] for e in b_stream if e["method"] == "channels/outgoing/chunk"]
            assert chunks == ["first words"]
            assert await posts(servers["b"]) == [("general", "first words")]
            # Nothing of the turn's words reached a: no chunk, no complete, no publish.
            a_after = (await servers["a"].recorded())[a_before:]
            assert stream_entries(a_after) == []
            assert [e for e in a_after if e["method"] == "channels/publish"] == []
