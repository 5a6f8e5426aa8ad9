"""What a reload does to grants and links, with real fixture processes on 127.0.0.1:

- a narrowing that lands while a server's handshake waits for its policy answer holds for the
  whole connection;
- every server's narrowing is applied host-side before any server is waited on, and the reload's
  answer does not wait for a slow server past its bound;
- a reload revives a failed link;
- a server that takes the policy only as a Notification is told its new grant;
- no turn opens and no reload applies while the daemon drains;
- revoking ``channels.register`` withdraws the server's channels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.daemon import RELOAD_ANSWER_WAIT
from mcpl_router.jsonrpc import RpcError
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import FAST_RECONNECT, daemon_running, dialled_server, daemon_config, wait_channel, wait_ready

pytestmark = pytest.mark.integration

#: How long a slow fixture holds each featureSets/update Request before answering it.
SLOW_POLICY_MS = 3000


async def _policies(fixture: FixtureProcess) -> list[list[str]]:
    """The effective capabilities of every featureSets/update the fixture received, in order."""
    return [entry["params"]["effectiveCapabilities"] for entry in await fixture.recorded("featureSets/update")]


# -------------------------------------------------------------- a narrowing during the handshake


async def test_a_narrowing_during_the_handshake_holds_for_the_whole_connection(short_tmp: Path) -> None:
    with trio.fail_after(60):
        async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp) as fixture:
            await fixture.configure(policy_delay_ms=SLOW_POLICY_MS)
            entry = dialled_server(fixture)
            async with daemon_running(daemon_config(short_tmp, {"s": entry})) as daemon:
                link = daemon.links["s"]
                # The server holds the policy answer: the reload lands inside the handshake.
                await wait_until(_recorded_policy(fixture), timeout=15, interval=0.05)
                assert link.state.value == "connecting"
                result = await daemon.reload(daemon_config(short_tmp, {"s": {**entry, "disabledCapabilities": ["channels.publish"]}}))
                assert result["outcome"] == "applied" and result["regranted"] == ["s"]
                assert not link.grant.allows("channels.publish")  # host-side at once
                await wait_ready(daemon, "s", timeout=20)
                # The first answer (to the wider policy) did not bring channels.publish back...
                assert not link.grant.allows("channels.publish")
                assert link.grant.allows("channels.register") and link.epoch == 1
                await wait_channel(daemon, "s", "general")
                # ...and the server was told the narrower grant in this same connection.
                policies = await wait_until(_policy_count(fixture, 2), timeout=15, interval=0.1)
                assert "channels.publish" in policies[0] and "channels.publish" not in policies[-1]
                assert not link.grant.allows("channels.publish")


def _recorded_policy(fixture: FixtureProcess) -> Any:
    async def check() -> bool:
        return bool(await fixture.recorded("featureSets/update"))

    return check


def _policy_count(fixture: FixtureProcess, count: int) -> Any:
    async def check() -> list[list[str]] | None:
        policies = await _policies(fixture)
        return policies if len(policies) >= count else None

    return check


# ------------------------------------------------- every server narrowed before any is waited on


async def test_a_reload_narrows_every_server_before_waiting_on_any(short_tmp: Path) -> None:
    with trio.fail_after(90):
        async with (
            FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp, server_name="a") as a,
            FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp, server_name="b") as b,
        ):
            entries = {"a": dialled_server(a), "b": dialled_server(b)}
            async with daemon_running(daemon_config(short_tmp, entries)) as daemon:
                await wait_ready(daemon, "a", timeout=20)
                await wait_ready(daemon, "b", timeout=20)
                for fixture in (a, b):
                    await fixture.configure(policy_delay_ms=SLOW_POLICY_MS)
                narrowed = {sid: {**entry, "disabledCapabilities": ["channels.publish"]} for sid, entry in entries.items()}
                done = trio.Event()
                results: list[dict[str, Any]] = []

                async def reload() -> None:
                    results.append(await daemon.reload(daemon_config(short_tmp, narrowed)))
                    done.set()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(reload)
                    # Both narrowings are host-side before either server's (3 s) answer.
                    with trio.fail_after(1.0):
                        await wait_until(
                            lambda: not any(daemon.links[sid].grant.allows("channels.publish") for sid in ("a", "b")),
                            timeout=1.0, interval=0.02,
                        )
                    # The answer does not wait for the slow servers past its bound, and says so.
                    with trio.fail_after(RELOAD_ANSWER_WAIT + 1.5):
                        await done.wait()
                result = results[0]
                assert result["outcome"] == "applied" and sorted(result["regranted"]) == ["a", "b"]
                assert sorted(result["policyPending"]) == ["a", "b"]
                # The policies were sent at once, concurrently: both servers got theirs.
                for fixture in (a, b):
                    policies = await _policies(fixture)
                    assert "channels.publish" not in policies[-1]
                # Widening back: applied only once each server answers.
                results.clear()
                done = trio.Event()
                narrowed = entries
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(reload)
                    await done.wait()
                    await wait_until(lambda: all(daemon.links[sid].grant.allows("channels.publish") for sid in ("a", "b")), timeout=15)


# ------------------------------------------------------------------------- a failed link revived


async def test_a_reload_revives_a_failed_server(short_tmp: Path) -> None:
    with trio.socket.socket() as probe:
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    entry = {"url": f"tcp://127.0.0.1:{port}", "reconnect": {**FAST_RECONNECT, "maxAttempts": 1}}
    with trio.fail_after(60):
        async with daemon_running(daemon_config(short_tmp, {"s": entry})) as daemon:
            await wait_until(lambda: daemon.links["s"].state.value == "failed", timeout=15)
            async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp, port=port):
                # A grant-only change to a failed server reconnects it (nothing to re-grant).
                result = await daemon.reload(daemon_config(short_tmp, {"s": {**entry, "disabledCapabilities": ["channels.typing"]}}))
                assert result["reconnected"] == ["s"] and result["regranted"] == []
                await wait_until(lambda: daemon.links["s"].state.value == "ready", timeout=15)
                assert not daemon.links["s"].grant.allows("channels.typing")
            await wait_until(lambda: daemon.links["s"].state.value == "failed", timeout=15)
            async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp, port=port):
                # A reload with no change at all (SIGHUP: "try again") restarts it too.
                result = await daemon.reload(daemon.config)
                assert result["reconnected"] == ["s"]
                await wait_until(lambda: daemon.links["s"].state.value == "ready", timeout=15)


# --------------------------------------------------------------------- notification-only servers


async def test_a_notification_only_server_is_told_its_new_grant(short_tmp: Path) -> None:
    with trio.fail_after(60):
        async with FixtureProcess.start(transport="ws", personality="editor", channels=["editor:chat"], control_dir=short_tmp, grace=1) as fixture:
            entry = dialled_server(fixture)
            async with daemon_running(daemon_config(short_tmp, {"s": entry})) as daemon:
                await wait_ready(daemon, "s")
                await wait_channel(daemon, "s", "editor:chat")
                link = daemon.links["s"]
                assert link.legacy and link.grant.legacy  # one answer to "is it legacy"
                before = await fixture.recorded("featureSets/update")
                result = await daemon.reload(daemon_config(short_tmp, {"s": {**entry, "disabledFeatureSets": ["editor.chat"]}}))
                assert result["regranted"] == ["s"] and link.epoch == 1
                assert "editor.chat" not in link.grant.enabled_feature_sets and link.grant.legacy

                async def told() -> list[dict[str, Any]] | None:
                    after = await fixture.recorded("featureSets/update")
                    return after if len(after) > len(before) else None

                after = await wait_until(told, timeout=10, interval=0.1)
                assert after[-1]["kind"] == "notification" and "editor.chat" in after[-1]["params"]["disabled"]
                assert (await fixture.state())["grant"]["disabled"] == after[-1]["params"]["disabled"]


async def test_a_notification_only_server_is_told_a_manifest_changes_narrowing_too(short_tmp: Path) -> None:
    """The manifest-change path tells it the way the reload path does (one "legacy" answer)."""
    with trio.fail_after(60):
        async with FixtureProcess.start(transport="ws", personality="editor", channels=["editor:chat"], control_dir=short_tmp, grace=1) as fixture:
            async with daemon_running(daemon_config(short_tmp, {"s": dialled_server(fixture)})) as daemon:
                await wait_ready(daemon, "s")
                await wait_channel(daemon, "s", "editor:chat")
                link = daemon.links["s"]
                assert link.manifest is not None and link.grant.allows("channels.publish")
                before = await fixture.recorded("featureSets/update")
                # mcpl-editor's manifest without channels.publish (and without its feature sets).
                narrowed = {"version": "0.5", "pushEvents": True, "stateUpdate": True, "channels": {"register": True, "observe": True}}
                await fixture.manifest_changed(narrowed)
                await wait_until(lambda: not link.grant.allows("channels.publish"), timeout=10)

                async def told() -> list[dict[str, Any]] | None:
                    after = await fixture.recorded("featureSets/update")
                    return after if len(after) > len(before) else None

                after = await wait_until(told, timeout=10, interval=0.1)
                assert after[-1]["kind"] == "notification"
                assert "channels.publish" not in after[-1]["params"]["effectiveCapabilities"]


async def test_a_legacy_servers_grant_and_link_agree_after_the_policy_answer(short_tmp: Path) -> None:
    """discord (0.4) answers featureSets/update: its grant must stay legacy, as the link is."""
    with trio.fail_after(60):
        async with FixtureProcess.start(transport="tcp", personality="discord", channels=["general"], control_dir=short_tmp, grace=0) as fixture:
            entry = dialled_server(fixture, legacy="allow")
            async with daemon_running(daemon_config(short_tmp, {"s": entry})) as daemon:
                await wait_ready(daemon, "s")
                link = daemon.links["s"]
                await wait_until(lambda: link.receipt is not None, timeout=10)
                assert link.legacy and link.grant.legacy
                before = len(await fixture.recorded("featureSets/update"))
                await daemon.reload(daemon_config(short_tmp, {"s": {**entry, "disabledCapabilities": ["channels.typing"]}}))
                assert not link.grant.allows("channels.typing") and link.grant.legacy
                # It takes the policy as a Request, so it is sent one.
                recorded = await wait_until(_policy_count(fixture, before + 1), timeout=10, interval=0.1)
                assert "channels.typing" not in recorded[-1]


# -------------------------------------------------------------------------------------- draining


async def test_no_turn_opens_and_no_reload_applies_while_draining(short_tmp: Path) -> None:
    with trio.fail_after(60):
        async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp) as fixture:
            entry = dialled_server(fixture)
            async with daemon_running(daemon_config(short_tmp, {"s": entry}, unix_socket=True)) as daemon:
                await wait_ready(daemon, "s")
                await wait_channel(daemon, "s", "general")
                assert daemon.host_socket_path is not None
                async with RouterClient.connect_unix(daemon.host_socket_path) as client:
                    await client.hello("test-host", ["ann"])
                    # As between the shutdown starting and the links stopping.
                    daemon.draining = True
                    with pytest.raises(RpcError) as refused:
                        await client.call("turn/open", {"agent": "ann", "channel": "general"})
                    assert refused.value.code == -32053 and "shutting down" in refused.value.message
                    assert daemon.turns.open_turns() == []
                    typing = [e for e in await fixture.recorded() if e["method"] == "channels/typing"]
                    assert typing == []
                    result = await daemon.reload(daemon_config(short_tmp, {"s": {**entry, "disabledCapabilities": ["channels.typing"]}}))
                    assert result["outcome"] == "refused" and "shutting down" in result["errors"][0]
                    assert daemon.links["s"].grant.allows("channels.typing")
                    daemon.draining = False


# ---------------------------------------------------------------------------- a revoked register


async def test_revoking_channels_register_withdraws_the_servers_channels(short_tmp: Path) -> None:
    with trio.fail_after(60):
        async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp) as fixture:
            entry = dialled_server(fixture)
            async with daemon_running(daemon_config(short_tmp, {"s": entry})) as daemon:
                changes: list[dict[str, Any]] = []
                daemon.observers.append(lambda event, fields: changes.append(fields) if event == "channels/changed" else None)
                await wait_ready(daemon, "s")
                await wait_channel(daemon, "s", "general")
                result = await daemon.reload(daemon_config(short_tmp, {"s": {**entry, "disabledCapabilities": ["channels.register"]}}))
                assert result["regranted"] == ["s"] and daemon.links["s"].epoch == 1
                assert not daemon.router.registry.is_registered(ChannelRef("s", "general"))
                assert daemon.router.registry.channels_for("s") == [] or not daemon.router.registry.channels_for("s")
                assert changes and changes[-1]["serverId"] == "s"
                assert [ref["channelId"] for ref in changes[-1]["removed"]] == ["general"]
