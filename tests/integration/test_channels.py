"""Channels are named with their server, end to end: real server processes, both orders.

Issue 3's registry-level acceptance through the daemon: a server can't have a message admitted
into another server's channel, can't register outside its patterns, a Notification-form
refusal is logged, a push belongs to the pushing server, and names resolve (or are refused)
the same whichever server registered first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog
import trio

from mcpl_router.daemon import Daemon
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import dialled_server, running_daemon, wait_channel, wait_ready

pytestmark = pytest.mark.integration

ORDERS = pytest.mark.parametrize("first", ["a", "b"], ids=["a-first", "b-first"])


def other(server_id: str) -> str:
    return "b" if server_id == "a" else "a"


@asynccontextmanager
async def servers(
    workdir: Path, ids: tuple[str, ...] = ("a", "b"), options: dict[str, dict[str, Any]] | None = None
) -> AsyncIterator[tuple[Daemon, dict[str, FixtureProcess]]]:
    """Daemon plus one strict TCP fixture per id, none registering anything yet."""
    options = options or {}
    async with AsyncExitStack() as stack:
        fixtures = {
            server_id: await stack.enter_async_context(
                FixtureProcess.start(transport="tcp", control_dir=workdir, server_name=server_id)
            )
            for server_id in ids
        }
        config = {sid: dialled_server(fx, **options.get(sid, {})) for sid, fx in fixtures.items()}
        daemon = await stack.enter_async_context(running_daemon(workdir, config))
        for server_id in ids:
            await wait_ready(daemon, server_id)
        yield daemon, fixtures


@ORDERS
async def test_a_shared_id_is_refused_as_ambiguous_and_qualified_names_pick_one(tmp_path: Path, first: str) -> None:
    with trio.fail_after(40):
        async with servers(tmp_path) as (daemon, fx):
            for server_id in (first, other(first)):
                answer = await fx[server_id].register([{"id": "general", "label": "general"}])
                assert answer["results"] == [{"id": "general", "accepted": True}]
            rows = {(row["serverId"], row["channelId"]): row for row in daemon.channels_list()}
            assert rows[("a", "general")]["shown"] == "a:general"
            assert rows[("b", "general")]["shown"] == "b:general"
            explained = daemon.explain("general")
            assert explained["resolved"] is None
            text = explained["refusal"]["text"]
            assert "more than one server" in text and "not found" not in text.lower()
            assert "a:general" in text and "b:general" in text
            assert daemon.explain("b:general")["resolved"] == {"serverId": "b", "channelId": "general"}
            assert daemon.explain("general", "a")["resolved"] == {"serverId": "a", "channelId": "general"}


@ORDERS
async def test_a_message_is_admitted_only_into_its_own_servers_channel(tmp_path: Path, first: str) -> None:
    second = other(first)
    message = {"channelId": "general", "messageId": "m-1", "content": [{"type": "text", "text": "hello"}]}
    with trio.fail_after(40):
        async with servers(tmp_path) as (daemon, fx):
            await fx[first].register(["general"])
            # The second server never registered "general": its message is refused, alone.
            answer = await fx[second].incoming([message, {**message, "channelId": "nowhere", "messageId": "m-2"}])
            results = answer["results"]
            assert [r["accepted"] for r in results] == [False, False]
            assert results[0]["code"] == -32023
            assert daemon.journal.last_seq() == 0
            # Once it registers its own "general", the same message is admitted there.
            await fx[second].register(["general"])
            answer = await fx[second].incoming([message])
            assert answer["results"][0]["accepted"] is True
            stored = daemon.journal.events()
            assert [(e.server_id, e.channel_id) for e in stored] == [(second, "general")]
            # The same message again is a duplicate: accepted, not stored twice.
            again = await fx[second].incoming([message])
            assert again["results"][0]["accepted"] is True
            assert len(daemon.journal.events()) == 1


@ORDERS
async def test_a_push_belongs_to_the_pushing_server(tmp_path: Path, first: str) -> None:
    second = other(first)
    with trio.fail_after(40):
        async with servers(tmp_path) as (daemon, fx):
            await fx[first].register(["general"])
            before = daemon.router.registry.get(ChannelRef(first, "general"))
            answer = await fx[second].push("ev-1", origin={"mcplChannelId": "general"}, payload={"content": [{"type": "text", "text": "hi"}]})
            assert answer["accepted"] is True
            lazy = daemon.router.registry.get(ChannelRef(second, "general"))
            assert lazy is not None and lazy.lazy
            assert daemon.router.registry.get(ChannelRef(first, "general")) is before
            [event] = daemon.journal.events()
            assert (event.server_id, event.channel_id, event.kind) == (second, "general", "push")


async def test_registration_outside_patterns_is_refused_and_notification_refusals_logged(tmp_path: Path) -> None:
    options = {"a": {"channelPatterns": ["acme:*"]}}
    with trio.fail_after(40):
        async with servers(tmp_path, ("a",), options) as (daemon, fx):
            answer = await fx["a"].register(["acme:general", "elsewhere"])
            results = {r["id"]: r for r in answer["results"]}
            assert results["acme:general"]["accepted"] is True
            assert results["elsewhere"]["accepted"] is False and "outside" in results["elsewhere"]["reason"]
            with structlog.testing.capture_logs() as logs:
                assert await fx["a"].register(["also-elsewhere"], form="notification") is None
                await wait_until(lambda: any(e["event"] == "channels.register.refused" for e in logs), timeout=10)
            refused = [e for e in logs if e["event"] == "channels.register.refused"]
            assert refused[0]["form"] == "notification" and refused[0]["channel"] == "also-elsewhere"
            assert not daemon.router.registry.is_registered(ChannelRef("a", "also-elsewhere"))


async def test_ids_that_would_join_to_one_key_stay_two_channels(tmp_path: Path) -> None:
    # Server a's "b:room" and server "a:b"'s "room" both read "a:b:room" joined with a colon.
    with trio.fail_after(40):
        async with servers(tmp_path, ("a", "a:b")) as (daemon, fx):
            await fx["a"].register(["b:room"])
            await fx["a:b"].register(["room"])
            registry = daemon.router.registry
            assert registry.is_registered(ChannelRef("a", "b:room"))
            assert registry.is_registered(ChannelRef("a:b", "room"))
            refs = daemon.router.names.channels_named("a:b:room")
            assert set(refs) == {ChannelRef("a", "b:room"), ChannelRef("a:b", "room")}
            assert daemon.explain("a:b:room")["resolved"] is None
            assert daemon.explain("room")["resolved"] == {"serverId": "a:b", "channelId": "room"}


@ORDERS
async def test_withdrawal_and_disconnect_remove_only_that_servers_channel(tmp_path: Path, first: str) -> None:
    second = other(first)
    with trio.fail_after(40):
        async with servers(tmp_path) as (daemon, fx):
            await fx[first].register(["general"])
            await fx[second].register(["general"])
            await fx[second].withdraw(["general"])
            await wait_until(lambda: not daemon.router.registry.is_registered(ChannelRef(second, "general")))
            assert daemon.explain("general")["resolved"] == {"serverId": first, "channelId": "general"}
            await fx[second].register(["general"])
            await wait_channel(daemon, second, "general")
            await fx[first].disconnect()
            await wait_until(lambda: not daemon.router.registry.is_registered(ChannelRef(first, "general")))
            assert daemon.explain("general")["resolved"] == {"serverId": second, "channelId": "general"}


async def test_a_malformed_descriptor_is_refused_alone(tmp_path: Path) -> None:
    with trio.fail_after(40):
        async with servers(tmp_path, ("a",)) as (daemon, fx):
            answer = await fx["a"].register([{"id": "ok"}, {"label": "no id"}, {"id": ""}])
            accepted = [r["accepted"] for r in answer["results"]]
            assert accepted == [True, False, False]
            assert daemon.router.registry.is_registered(ChannelRef("a", "ok"))
            # A batch that isn't a list at all is bad params, answered with the field's path.
            answer = await fx["a"].host_call("channels/register", {"channels": "not-a-list"})
            assert answer["error"]["code"] == -32602 and "$.channels" in answer["error"]["message"]


async def test_one_message_id_in_two_channels_is_two_messages(tmp_path: Path) -> None:
    # Message ids are often unique only per chat: the dedup key is (channel, messageId).
    with trio.fail_after(40):
        async with servers(tmp_path, ("a",)) as (daemon, fx):
            await fx["a"].register(["group:111", "group:222"])
            for channel in ("group:111", "group:222", "group:111"):
                answer = await fx["a"].incoming([{"channelId": channel, "messageId": "42", "text": "hi"}])
                assert answer["results"][0]["accepted"] is True
            stored = daemon.journal.events()
            assert [(e.server_id, e.channel_id) for e in stored] == [("a", "group:111"), ("a", "group:222")]


async def test_channels_list_comes_in_pages_that_follow_their_cursor_across_changes(tmp_path: Path) -> None:
    """Issue 15: no host must take the whole registry in one message."""
    from mcpl_router.client import RouterClient
    from mcpl_router.jsonrpc import RpcError

    from .conftest import servers_and_daemon

    with trio.fail_after(60):
        async with servers_and_daemon(tmp_path, ["a", "b"]) as (daemon, fx):
            await fx["a"].register([f"a{n}" for n in range(25)])
            await fx["b"].register([f"b{n}" for n in range(5)] + ["a3"])
            await wait_channel(daemon, "b", "a3")
            assert daemon.host_socket_path is not None
            async with RouterClient.connect_unix(daemon.host_socket_path) as host:
                first = await host.call("channels/list", {"limit": 10})
                assert len(first["channels"]) == 10 and first["nextCursor"]
                # A channel that came before the cursor goes away between pages: nothing is
                # skipped or repeated after the last row the host got.
                await fx["a"].withdraw(["a0"])
                await wait_until(lambda: not daemon.router.registry.is_registered(ChannelRef("a", "a0")), timeout=10)
                rows = list(first["channels"])
                page = first
                while page.get("nextCursor"):
                    page = await host.call("channels/list", {"cursor": page["nextCursor"], "limit": 10})
                    rows.extend(page["channels"])
                pairs = [(row["serverId"], row["channelId"]) for row in rows]
                assert pairs == [("a", f"a{n}") for n in range(25)] + [("b", f"b{n}") for n in range(5)] + [("b", "a3")]
                # Shown names are the same as the whole list's: the shared id is qualified.
                shown = {(row["serverId"], row["channelId"]): row["shown"] for row in rows}
                assert shown[("a", "a3")] == "a:a3" and shown[("b", "a3")] == "b:a3" and shown[("a", "a4")] == "a4"
                whole = {(r["serverId"], r["channelId"]): r["shown"] for r in daemon.channels_list()}
                assert {pair: shown[pair] for pair in whole} == whole
                with pytest.raises(RpcError):
                    await host.call("channels/list", {"cursor": "not-a-cursor"})


async def test_an_accepted_message_is_counted_and_logged_at_debug_not_info(tmp_path: Path) -> None:
    """No JSON line per message at the default level (issue 30): an accepted message's line is at
    debug, a re-send's (a duplicate) still at info."""
    with trio.fail_after(40):
        async with servers(tmp_path, ("a",)) as (daemon, fx):
            await fx["a"].register(["general"])
            with structlog.testing.capture_logs() as logs:
                message = {"channelId": "general", "messageId": "m-1", "text": "hi"}
                assert (await fx["a"].incoming([message]))["results"][0]["accepted"] is True
                assert (await fx["a"].incoming([message]))["results"][0]["accepted"] is True
                await wait_until(lambda: any(e["event"] == "channels.incoming.duplicate" for e in logs), timeout=10)
    [accepted] = [e for e in logs if e["event"] == "channels.incoming.accepted"]
    [duplicate] = [e for e in logs if e["event"] == "channels.incoming.duplicate"]
    assert (accepted["log_level"], duplicate["log_level"]) == ("debug", "info")


async def test_a_grant_narrowed_or_widened_by_a_reload_decides_the_next_message(tmp_path: Path) -> None:
    """The admission and the grant's policy are kept per channel while they stand (issue 30):
    a reload that revokes ``channels.incoming`` refuses the very next message, one that grants
    it again admits the next; each accepted message's conversation id is its own channel's, and
    no refused message is journaled."""
    from mcpl_router.jsonrpc import RpcError

    from .conftest import daemon_config

    with trio.fail_after(60):
        async with servers(tmp_path, ("a",)) as (daemon, fx):
            await fx["a"].register(["general", "random"])
            entry = dialled_server(fx["a"])

            async def send(n: int, channel: str = "general") -> dict[str, Any]:
                answer = await fx["a"].incoming([{"channelId": channel, "messageId": f"m-{n}", "text": "hi"}])
                result: dict[str, Any] = answer["results"][0]
                return result

            for n in range(5):
                assert (await send(n))["conversationId"] == '["a","general"]'
            assert (await send(5, "random"))["conversationId"] == '["a","random"]'
            narrowed = await daemon.reload(daemon_config(tmp_path, {"a": {**entry, "disabledCapabilities": ["channels.incoming"]}}))
            assert narrowed["outcome"] == "applied"
            with pytest.raises(RpcError) as refused:  # the link refuses it before it is admitted
                await send(6)
            assert refused.value.code == -32002
            widened = await daemon.reload(daemon_config(tmp_path, {"a": entry}))
            assert widened["outcome"] == "applied"
            await wait_until(lambda: daemon.links["a"].grant.allows("channels.incoming"), timeout=15)
            assert (await send(7))["accepted"] is True
            stored = [(e.channel_id, e.payload["messageId"]) for e in daemon.journal.events()]  # type: ignore[index]
            assert stored == [("general", f"m-{n}") for n in range(5)] + [("random", "m-5"), ("general", "m-7")]
