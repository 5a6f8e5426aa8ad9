"""The fixture MCPL server, driven as a real subprocess over stdio, TCP and WebSocket.

The test plays the host (the daemon's part): it holds the link, answers the fixture's calls and
checks what the fixture records through its control channel. Every test runs under an absolute
``trio.fail_after`` and leaves no process behind (``FixtureProcess`` terminates and reaps it).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mcpl_router.mcpl.grants import DEFAULT_ENABLED_CAPABILITIES
import structlog
import trio
import trio_websocket

from mcpl_router.jsonrpc import Inbound, MessageStream, NdjsonStream, Peer, RequestTimeout, RpcError, WebSocketMessageStream
from mcpl_router.testing import FixtureProcess, FixtureStartError, fixture_command, wait_until
from mcpl_router.testing.fixture_server import grants_leaf

pytestmark = pytest.mark.integration

# Spawning a Python process takes a while on a loaded CI box; a hang still fails fast.
LIMIT = 30

# Every leaf the daemon grants by default: what a real host would send a fixture.
ALL_LEAVES = list(DEFAULT_ENABLED_CAPABILITIES)
_PRIVILEGED = {
    "channels/register": "channels.register",
    "channels/changed": "channels.register",
    "channels/incoming": "channels.incoming",
    "push/event": "pushEvents",
}


class Host:
    """The host's side of the link: answers the fixture's calls and remembers them in order."""

    def __init__(self, *, deny_privileged: bool = False) -> None:
        self.deny_privileged = deny_privileged
        self.received: list[tuple[str, Any, bool]] = []

    def methods(self) -> list[str]:
        return [method for method, _params, _notification in self.received]

    def params_of(self, method: str) -> list[Any]:
        return [params for name, params, _notification in self.received if name == method]

    async def handle(self, inbound: Inbound) -> Any:
        params = msgspec.json.decode(inbound.params) if inbound.params is not None else None
        self.received.append((inbound.method, params, inbound.is_notification))
        if inbound.method in _PRIVILEGED and self.deny_privileged:
            capability = _PRIVILEGED[inbound.method]
            raise RpcError(-32002, f"Capability denied: {capability}", {"capability": capability})
        if inbound.method == "channels/register":
            return {"results": [{"id": c["id"], "accepted": True} for c in params["channels"]]}
        if inbound.method == "channels/incoming":
            return {"results": [{"messageId": m["messageId"], "accepted": True} for m in params["messages"]]}
        if inbound.method == "push/event":
            return {"accepted": True}
        if inbound.method == "channels/changed":
            return {"results": []}
        raise RpcError(-32601, f"Method not found: {inbound.method}")


@asynccontextmanager
async def host_link(stream: MessageStream, host: Host) -> AsyncIterator[Peer]:
    """Run a host-side Peer on ``stream`` for the block; closed at the end."""
    async with trio.open_nursery() as nursery:
        peer = Peer(stream, host.handle, request_timeout=10, log_fields={"link": "test-host"})
        await nursery.start(peer.run)
        try:
            yield peer
        finally:
            await peer.aclose("test over")
            nursery.cancel_scope.cancel()


async def handshake(peer: Peer) -> dict[str, Any]:
    """initialize + notifications/initialized, as the daemon does; returns the manifest."""
    result = await peer.request(
        "initialize",
        {
            "protocolVersion": "2024-11-05",
            "capabilities": {"experimental": {"mcpl": {"version": "0.5", "pushEvents": True, "featureSets": True}}},
            "clientInfo": {"name": "test-host", "version": "0"},
        },
    )
    assert result["protocolVersion"] == "2024-11-05"
    await peer.notify("notifications/initialized")
    return result["capabilities"]["experimental"]["mcpl"]


async def open_tcp(fx: FixtureProcess) -> NdjsonStream:
    assert fx.listen_port is not None
    stream = await trio.open_tcp_stream("127.0.0.1", fx.listen_port)
    return NdjsonStream(stream, stream)


def assert_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_fixture_command_spells_every_kind_of_flag(tmp_path: Path) -> None:
    argv = fixture_command(
        "ws",
        "discord",
        ["discord:1:2=general", ("discord:1:3", "random")],
        tmp_path / "c.json",
        token="t",
        eager=True,
        grace=None,
        register_form="notification",
        dm={"discord:dm:9": "Ann"},
    )
    assert argv[1:3] == ["-m", "mcpl_router.testing.fixture_server"]
    assert argv[3:] == [
        "--transport", "ws", "--personality", "discord", "--control-file", str(tmp_path / "c.json"),
        "--channel", "discord:1:2=general", "--channel", "discord:1:3=random",
        "--token", "t", "--eager", "--register-form", "notification", "--dm", "discord:dm:9=Ann",
    ]  # fmt: skip


def test_grants_leaf_star_matches_one_segment_only() -> None:
    assert grants_leaf(["channels.*"], "channels.publish")
    assert not grants_leaf(["contextHooks.*"], "contextHooks.beforeInference.inject.system")
    assert not grants_leaf(["channels"], "channels.publish")


async def test_strict_over_stdio_sends_nothing_privileged_before_the_policy(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with FixtureProcess.start(
            transport="stdio", personality="strict", channels=["slack:C1=general"], control_dir=tmp_path
        ) as fx:
            host = Host()
            async with host_link(fx.host_stream(), host) as peer:
                manifest = await handshake(peer)
                assert manifest["version"] == "0.5"
                assert isinstance(manifest["featureSets"], dict)
                assert manifest["featureSets"]["slack.messaging"]["uses"]
                assert manifest["channels"]["publish"] is True

                async def initialized() -> bool:
                    return (await fx.state())["initialized"]

                await wait_until(initialized)
                assert await peer.request("ping") == {}
                assert host.received == []

                with pytest.raises(RpcError) as denied:
                    await peer.request("channels/publish", {"channelId": "slack:C1", "content": []})
                assert denied.value.code == -32002
                assert denied.value.data == {"capability": "channels.publish"}

                receipt = await peer.request("featureSets/update", {"effectiveCapabilities": ALL_LEAVES})
                assert receipt == {"accepted": True}
                await wait_until(lambda: host.params_of("channels/register"))
                (registered,) = host.params_of("channels/register")
                assert registered["channels"][0]["id"] == "slack:C1"
                assert registered["channels"][0]["label"] == "general"
                assert registered["channels"][0]["type"] == "text"

                published = await peer.request(
                    "channels/publish",
                    {"conversationId": "c1", "channelId": "slack:C1", "content": [{"type": "text", "text": "hi"}]},
                )
                assert published == {"delivered": True, "messageId": "m-1"}

                records = await fx.recorded()
                assert [r["method"] for r in records] == [
                    "initialize",
                    "notifications/initialized",
                    "ping",
                    "channels/publish",
                    "featureSets/update",
                    "channels/publish",
                ]
                assert [r["kind"] for r in records][:2] == ["request", "notification"]
                assert {r["epoch"] for r in records} == {1}
                assert records[3]["denied"] == "channels.publish"
                assert "denied" not in records[5]
                assert (await fx.recorded("channels/publish"))[-1]["params"]["content"][0]["text"] == "hi"

                state = await fx.state()
                assert state["grant"] == {"effectiveCapabilities": ALL_LEAVES}
                assert state["channels"] == ["slack:C1"]
                assert state["autoAnswers"][0]["result"] == {"results": [{"id": "slack:C1", "accepted": True}]}
        assert_gone(fx.pid)


async def test_strict_receipt_is_degraded_when_a_used_capability_is_missing(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with FixtureProcess.start(transport="tcp", personality="strict", control_dir=tmp_path) as fx:
            async with host_link(await open_tcp(fx), Host()) as peer:
                await handshake(peer)
                grant = [leaf for leaf in ALL_LEAVES if leaf != "channels.typing"]
                receipt = await peer.request(
                    "featureSets/update", {"effectiveCapabilities": grant, "enabled": ["slack.messaging"]}
                )
                assert receipt == {
                    "accepted": True,
                    "mode": "degraded",
                    "unavailableFeatures": [
                        {"featureSet": "slack.messaging", "missingCapabilities": ["channels.typing"], "effect": "degraded"}
                    ],
                }
                # A denied notification is recorded as such; the fixture does nothing with it.
                await peer.notify("channels/typing", {"channelId": "slack:C1", "op": "start"})
                typing = await wait_until(lambda: fx.recorded("channels/typing"))
                assert typing[0]["denied"] == "channels.typing"


async def test_eager_server_records_the_hosts_refusals(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with FixtureProcess.start(
            transport="tcp", personality="strict", channels=["slack:C1"], control_dir=tmp_path, eager=True
        ) as fx:
            host = Host(deny_privileged=True)
            async with host_link(await open_tcp(fx), host) as peer:
                await handshake(peer)

                async def eager_answers() -> list[dict[str, Any]]:
                    answers = (await fx.state())["eagerAnswers"]
                    return answers if len(answers) == 2 else []

                answers = await wait_until(eager_answers)
                assert [a["method"] for a in answers] == ["channels/register", "push/event"]
                assert [a["error"]["code"] for a in answers] == [-32002, -32002]
                assert answers[0]["error"]["data"] == {"capability": "channels.register"}
                assert host.methods() == ["channels/register", "push/event"]

                host.deny_privileged = False
                assert await peer.request("featureSets/update", {"effectiveCapabilities": ALL_LEAVES}) == {
                    "accepted": True
                }
                await wait_until(lambda: host.methods().count("channels/register") == 2)


async def test_legacy_refuses_the_policy_and_registers_anyway(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with FixtureProcess.start(
            transport="stdio",
            personality="legacy",
            channels=["heartbeat:main"],
            control_dir=tmp_path,
            push_on_start=True,
        ) as fx:
            host = Host()
            async with host_link(fx.host_stream(), host) as peer:
                manifest = await handshake(peer)
                assert manifest["version"] == "0.4"
                assert isinstance(manifest["featureSets"], list)
                assert manifest["featureSets"][0]["name"] == "heartbeat"

                # No policy sent: a legacy server registers and pushes regardless.
                await wait_until(lambda: host.methods() == ["channels/register", "push/event"])
                (event,) = host.params_of("push/event")
                assert event["featureSet"] == "heartbeat"
                assert event["origin"] == {"source": "heartbeat"}

                with pytest.raises(RpcError) as refused:
                    await peer.request("featureSets/update", {"effectiveCapabilities": ALL_LEAVES})
                assert refused.value.code == -32601
                assert (await fx.state())["grant"] is None


async def test_discord_prints_a_log_line_on_stdout_and_registers_after_the_policy(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with FixtureProcess.start(
            transport="stdio",
            personality="discord",
            channels=["discord:1:2=general"],
            control_dir=tmp_path,
            dm={"discord:dm:7": "Ann"},
            grace=60,
        ) as fx:
            host = Host()
            with structlog.testing.capture_logs() as logs:
                async with host_link(fx.host_stream(), host) as peer:
                    manifest = await handshake(peer)
                    assert manifest["version"] == "0.4"
                    assert manifest["channels"] is True
                    assert [fs["name"] for fs in manifest["featureSets"]] == ["discord.messaging", "discord.context"]

                    skipped = await wait_until(
                        lambda: [e for e in logs if e["event"] == "jsonrpc.line.skipped"]
                    )
                    assert skipped[0]["line"] == "[discord-mcpl] Client initialized (MCPL mode)"
                    assert host.received == []

                    receipt = await peer.request("featureSets/update", {"effectiveCapabilities": ALL_LEAVES})
                    assert receipt["accepted"] is True
                    registered = await wait_until(lambda: host.params_of("channels/register"))
                    assert [(c["id"], c["type"]) for c in registered[0]["channels"]] == [
                        ("discord:1:2", "text"),
                        ("discord:dm:7", "dm"),
                    ]


async def test_discord_registers_after_the_grace_without_a_policy(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with FixtureProcess.start(
            transport="tcp",
            personality="discord",
            channels=["discord:1:2"],
            control_dir=tmp_path,
            grace=0.2,
            register_form="notification",
        ) as fx:
            host = Host()
            async with host_link(await open_tcp(fx), host) as peer:
                await handshake(peer)
                await wait_until(lambda: host.methods() == ["channels/register"])
                assert host.received[0][2] is True  # sent as a notification
                assert (await fx.state())["autoAnswers"][0] == {
                    "epoch": 1,
                    "method": "channels/register",
                    "result": None,
                }


async def test_notify_publish_over_websocket_takes_publish_only_as_a_notification(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with FixtureProcess.start(
            transport="ws",
            personality="notify-publish",
            channels=["editor:chat=Editor"],
            control_dir=tmp_path,
            token="s3cret",
        ) as fx:
            assert fx.listen_url == f"ws://127.0.0.1:{fx.listen_port}/mcpl"
            assert fx.listen_port is not None
            assert await ws_handshake_status(fx.listen_port, "/mcpl", "Bearer wrong") == 401
            assert await ws_handshake_status(fx.listen_port, "/mcpl", None) == 401
            assert await ws_handshake_status(fx.listen_port, "/other", "Bearer s3cret") == 404

            host = Host()
            async with trio_websocket.open_websocket_url(
                fx.listen_url, extra_headers=[(b"Authorization", b"Bearer s3cret")]
            ) as ws:
                await wait_until(lambda: _connected(fx))
                # sendRaw: one text frame, verbatim.
                await fx.send_raw("{not json", suffix="\n")
                assert await ws.get_message() == "{not json\n"

                async with host_link(WebSocketMessageStream(ws), host) as peer:
                    manifest = await handshake(peer)
                    assert manifest["version"] == "0.5"
                    # Registers before any policy, like mcpl-editor.
                    await wait_until(lambda: host.methods() == ["channels/register"])

                    with pytest.raises(RpcError) as refused:
                        await peer.request("channels/publish", {"channelId": "editor:chat", "content": []})
                    assert refused.value.code == -32601

                    await peer.notify(
                        "channels/publish", {"channelId": "editor:chat", "content": [{"type": "text", "text": "yo"}]}
                    )
                    publishes = await wait_until(
                        lambda: _recorded_kinds(fx, "channels/publish", want=["request", "notification"])
                    )
                    assert publishes[1]["params"]["content"][0]["text"] == "yo"


async def ws_handshake_status(port: int, path: str, authorization: str | None) -> int:
    """The HTTP status of a WebSocket upgrade, sent by hand.

    By hand because trio-websocket's client leaks its socket when the handshake is rejected
    (a ResourceWarning, an error under this suite's ``filterwarnings``).
    """
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13",
    ]
    if authorization is not None:
        lines.append(f"Authorization: {authorization}")
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode())
        response = b""
        while b"\r\n" not in response:
            chunk = await stream.receive_some(4096)
            if not chunk:
                break
            response += chunk
    return int(response.split()[1])


async def _connected(fx: FixtureProcess) -> bool:
    return (await fx.state())["connected"]


async def _recorded_kinds(fx: FixtureProcess, method: str, *, want: list[str]) -> list[dict[str, Any]]:
    records = await fx.recorded(method)
    return records if [r["kind"] for r in records] == want else []


async def test_send_raw_bytes_arrive_verbatim_over_tcp(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with FixtureProcess.start(transport="tcp", control_dir=tmp_path) as fx:
            assert fx.listen_url == f"tcp://127.0.0.1:{fx.listen_port}"
            assert fx.listen_port is not None
            stream = await trio.open_tcp_stream("127.0.0.1", fx.listen_port)
            async with stream:
                await wait_until(lambda: _connected(fx))
                data = 'discord-mcpl: a log line\n\n{"jsonrpc":"2.0","method":'
                result = await fx.send_raw(data, repeat=2, suffix="!")
                expected = (data * 2 + "!").encode()
                assert result == {"bytes": len(expected)}
                received = b""
                while len(received) < len(expected):
                    received += await stream.receive_some(65536)
                assert received == expected


async def test_disconnect_then_reconnect_is_epoch_two_with_a_fresh_grant(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with FixtureProcess.start(transport="tcp", control_dir=tmp_path, channels=["slack:C1"]) as fx:
            with pytest.raises(RpcError) as no_host:
                await fx.register(["slack:C9"])
            assert (no_host.value.code, no_host.value.message) == (-32000, "no host connected")

            first = Host()
            async with host_link(await open_tcp(fx), first) as peer:
                await handshake(peer)
                await peer.request("featureSets/update", {"effectiveCapabilities": ALL_LEAVES})
                await wait_until(lambda: first.methods() == ["channels/register"])
                assert (await fx.disconnect()) == {"epoch": 1}
                await wait_until(lambda: peer.closed)

            second = Host()
            async with host_link(await open_tcp(fx), second) as peer:
                await handshake(peer)
                state = await fx.state()
                assert (state["epoch"], state["connected"], state["grant"], state["channels"]) == (2, True, None, [])
                await peer.request("featureSets/update", {"effectiveCapabilities": ["channels.register"]})
                await wait_until(lambda: second.methods() == ["channels/register"])
                epochs = [(r["epoch"], r["method"]) for r in await fx.recorded("initialize")]
                assert epochs == [(1, "initialize"), (2, "initialize")]
                assert len(await fx.recorded(epoch=2)) == 3


async def test_control_scripts_incoming_push_hooks_tools_and_host_calls(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with FixtureProcess.start(transport="tcp", control_dir=tmp_path) as fx:
            host = Host()
            async with host_link(await open_tcp(fx), host) as peer:
                manifest = await handshake(peer)
                await peer.request("featureSets/update", {"effectiveCapabilities": ALL_LEAVES})
                await wait_until(lambda: _initialized_with_grant(fx))

                assert await fx.register(["slack:C1"]) == {"results": [{"id": "slack:C1", "accepted": True}]}
                answer = await fx.incoming([{"channelId": "slack:C1", "text": "hello"}])
                assert answer["results"][0]["accepted"] is True
                (sent,) = host.params_of("channels/incoming")
                message = sent["messages"][0]
                assert message["content"] == [{"type": "text", "text": "hello"}]
                assert message["author"] == {"id": "user-1", "name": "Demo User"}
                assert message["timestamp"]

                assert await fx.push("ev-1", tags=["chat:ambient"]) == {"accepted": True}
                (event,) = host.params_of("push/event")
                assert (event["eventId"], event["featureSet"], event["tags"]) == ("ev-1", "slack.messaging", ["chat:ambient"])

                assert await fx.host_call("model/info", {}) == {
                    "error": {"code": -32601, "message": "Method not found: model/info"}
                }
                assert await fx.withdraw(["slack:C1"]) == {"results": []}
                assert (await fx.state())["channels"] == []

                injection = {"namespace": "slack", "position": "system", "content": "ctx", "metadata": {}}
                await fx.configure(before_inference={"injections": [injection]}, publish={"delivered": False})
                hooked = await peer.request("context/beforeInference", {"inferenceId": "i1", "userMessage": None})
                assert hooked == {"featureSet": "slack.context", "contextInjections": [injection]}

                tools = await peer.request("tools/list", {})
                assert [t["name"] for t in tools["tools"]] == ["send_message", "fetch_history"]
                called = await peer.request(
                    "tools/call", {"name": "send_message", "arguments": {"channelId": "slack:C1", "text": "via tool"}}
                )
                assert called["content"] == [{"type": "text", "text": "sent"}]
                via_tool = (await fx.recorded("channels/publish"))[-1]
                assert (via_tool["kind"], via_tool["via"]) == ("tool", "tools/call")

                assert await peer.request("mcpl/manifest", {}) == {"manifest": manifest}
                changed = {**manifest, "revision": "sha256:new", "pushEvents": False}
                assert await fx.manifest_changed(changed) == {"notified": True}
                await wait_until(lambda: "mcpl/manifestChanged" in host.methods())
                assert host.params_of("mcpl/manifestChanged") == [{"revision": "sha256:new"}]
                assert await peer.request("mcpl/manifest", {}) == {"manifest": changed}

                added = {"id": "slack:C2", "type": "text", "label": "random", "direction": "inbound"}
                assert await fx.change(added=[added], form="notification") is None
                assert (await fx.state())["channels"] == ["slack:C2"]
                with pytest.raises(RpcError) as unknown:
                    await peer.request("no/such/method", {})
                assert unknown.value.code == -32601


async def _initialized_with_grant(fx: FixtureProcess) -> bool:
    state = await fx.state()
    return state["initialized"] and state["grant"] is not None


async def test_stdio_fixture_exits_on_stdin_eof_and_on_exit_with_its_code(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with FixtureProcess.start(transport="stdio", control_dir=tmp_path) as fx:
            assert fx.listen_url is None
            assert fx.process.stdin is not None
            await fx.process.stdin.aclose()
            assert await fx.wait() == 0
            # A clean exit removes the control file, so nobody dials a dead fixture.
            assert not fx.control_file.exists()

        async with FixtureProcess.start(transport="stdio", control_dir=tmp_path) as fx:
            # A stdio server can't hang up and stay up: disconnect means exit.
            assert (await fx.disconnect())["exiting"] is True
            assert await fx.wait() == 0

        async with FixtureProcess.start(transport="tcp", control_dir=tmp_path) as fx:
            assert await fx.exit(3) == {"exiting": True, "code": 3}
            assert await fx.wait() == 3
        assert_gone(fx.pid)


async def test_a_fixture_that_cannot_start_is_reported_not_awaited(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        with pytest.raises(FixtureStartError, match="exited with code 2"):
            async with FixtureProcess.start(transport="tcp", control_dir=tmp_path, dm=["no-label"]):
                pass  # pragma: no cover


async def test_editor_speaks_04_names_and_stalls_when_its_register_is_refused(tmp_path: Path) -> None:
    # mcpl-editor's start (issue 11 item 5): register, wait for the answer, only then read on.
    with trio.fail_after(LIMIT):
        async with FixtureProcess.start(
            transport="tcp", personality="editor", channels=["editor:chat"], control_dir=tmp_path
        ) as fx:
            host = Host(deny_privileged=True)
            async with host_link(await open_tcp(fx), host) as peer:
                manifest = await handshake(peer)
                assert manifest["version"] == "0.5"
                assert manifest["channels"] == {"register": True, "publish": True, "observe": True}
                assert manifest["featureSets"]["editor.chat"]["uses"] == ["channels.publish", "channels.observe"]
                await wait_until(lambda: host.methods() == ["channels/register"])
                # Refused: its handling of the connection is over; the policy is never answered.
                with pytest.raises(RequestTimeout):
                    await peer.request("featureSets/update", {"effectiveCapabilities": ALL_LEAVES}, timeout=1)


async def test_editor_takes_the_policy_and_publishes_only_as_notifications(tmp_path: Path) -> None:
    with trio.fail_after(LIMIT):
        async with FixtureProcess.start(
            transport="tcp", personality="editor", channels=["editor:chat"], control_dir=tmp_path
        ) as fx:
            host = Host()
            async with host_link(await open_tcp(fx), host) as peer:
                await handshake(peer)
                await wait_until(lambda: host.methods() == ["channels/register"])
                for method in ("featureSets/update", "channels/publish", "channels/typing", "channels/acknowledge"):
                    with pytest.raises(RpcError) as refused:
                        await peer.request(method, {"channelId": "editor:chat", "content": [{"type": "text", "text": "x"}]})
                    assert refused.value.code == -32601, method
                await peer.notify("channels/publish", {"channelId": "editor:chat", "content": [{"type": "text", "text": "hi"}]})
                await peer.notify("featureSets/update", {"enabled": ["editor.chat"], "disabled": ["editor.observe"]})
                state = await wait_until(lambda: _with_chat(fx))
                assert [m["text"] for m in state["chatStore"]] == ["hi"]
                assert state["grant"] == {"enabled": ["editor.chat"], "disabled": ["editor.observe"]}


async def _with_chat(fx: FixtureProcess) -> dict[str, Any] | None:
    state = await fx.state()
    return state if state["chatStore"] and state["grant"] else None
