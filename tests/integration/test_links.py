"""The daemon's links to real MCPL server processes: every transport, every personality.

Issue 2's acceptance: grant computed and sent as a Request; a privileged method before the
policy → -32002; a legacy server accepted in ``auto``, refused in ``deny``; a server killed
mid-session reconnected with backoff and re-granted; malformed frames, a non-JSON stdout line
and an oversized message each leave the link up.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.daemon import Daemon
from mcpl_router.jsonrpc import RpcError
from mcpl_router.testing.control import FixtureControl, FixtureProcess, wait_until

from .conftest import control_of, dialled_server, running_daemon, stdio_server, wait_channel, wait_ready

pytestmark = pytest.mark.integration

TRANSPORTS = ["stdio", "tcp", "ws"]
PERSONALITIES = ["strict", "discord", "legacy", "notify-publish"]


@asynccontextmanager
async def one_server(
    workdir: Path, transport: str, personality: str = "strict", *, options: dict[str, Any] | None = None, **fixture_args: Any
) -> AsyncIterator[tuple[Daemon, FixtureControl]]:
    """The daemon with one server ``s`` on ``transport``; yields (daemon, the server's control)."""
    options = options or {}
    if transport == "stdio":
        control_file = workdir / "s.control.json"
        entry = stdio_server(control_file, personality, grace=1, **fixture_args)
        entry.update(options)
        async with running_daemon(workdir, {"s": entry}) as daemon, control_of(control_file) as control:
            yield daemon, control
        return
    token = "t0ken-never-logged" if transport == "ws" else None
    async with FixtureProcess.start(
        transport=transport, personality=personality, channels=["general"], control_dir=workdir, grace=1, token=token, **fixture_args
    ) as fixture:
        entry = dialled_server(fixture, **({"token": token} if token else {}))
        entry.update(options)
        async with running_daemon(workdir, {"s": entry}) as daemon:
            yield daemon, fixture


@pytest.mark.parametrize("personality", PERSONALITIES)
@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_handshake_grant_and_registration(tmp_path: Path, transport: str, personality: str) -> None:
    # The editor-like server registers before any policy: only legacy="allow" admits that.
    options = {"legacy": "allow"} if personality == "notify-publish" else {}
    with trio.fail_after(40):
        async with one_server(tmp_path, transport, personality, options=options) as (daemon, server):
            await wait_ready(daemon, "s")
            await wait_channel(daemon, "s", "general")
            link = daemon.links["s"]
            # The grant goes out as a Request, once, in this epoch; only a server that answers it
            # -32601 (heartbeat-like) is told again, as a Notification (which the server records
            # when it reads it: waited for, not assumed).
            expected = ["request", "notification"] if personality == "legacy" else ["request"]
            with trio.move_on_after(5):
                while len(await server.recorded("featureSets/update")) < len(expected):
                    await trio.sleep(0.05)
            updates = await server.recorded("featureSets/update")
            assert [u["kind"] for u in updates] == expected
            sent = updates[0]["params"]["effectiveCapabilities"]
            assert "channels.register" in sent and "channels.incoming" in sent
            # Server-initiated inference is not granted until a host can serve it.
            assert "inferenceRequest" not in sent and "modelInfo" not in sent
            methods = [entry["method"] for entry in await server.recorded()]
            assert methods[:3] == ["initialize", "notifications/initialized", "featureSets/update"]
            initialize = (await server.recorded("initialize"))[0]
            assert initialize["params"]["capabilities"]["experimental"]["mcpl"]["version"] == "0.5"
            expect_legacy = personality in ("discord", "legacy")
            assert link.legacy is expect_legacy
            assert link.grant.allows("channels.register")


@pytest.mark.parametrize("transport", ["stdio", "tcp"])
async def test_privileged_method_before_the_policy_is_refused(tmp_path: Path, transport: str) -> None:
    with trio.fail_after(30):
        async with one_server(tmp_path, transport, "strict", eager=True) as (daemon, server):
            await wait_ready(daemon, "s")
            answers = (await server.state())["eagerAnswers"]
            assert answers, "the eager server sent nothing before the policy"
            for answer in answers:
                assert answer["error"]["code"] == -32002, answer
                assert answer["error"]["data"]["capability"] in ("channels.register", "pushEvents")
            # What it registered after the policy is admitted.
            await wait_channel(daemon, "s", "general")


@pytest.mark.parametrize("personality", ["legacy", "discord", "editor"])
async def test_legacy_server_refused_in_deny_mode(tmp_path: Path, personality: str) -> None:
    with trio.fail_after(30):
        async with one_server(tmp_path, "tcp", personality, options={"legacy": "deny"}) as (daemon, _server):
            link = daemon.links["s"]
            await wait_until(lambda: link.state.value == "failed", timeout=15)
            assert "legacy" in (link.last_error or "")
            assert daemon.router.registry.channels_for("s") == []


async def test_pre_policy_registration_of_a_05_server_is_refused_by_default(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with one_server(tmp_path, "tcp", "notify-publish") as (daemon, server):
            await wait_ready(daemon, "s")
            answers = await wait_until(lambda: _auto_answers(server), timeout=10)
            assert answers[0]["error"]["code"] == -32002
            assert daemon.router.registry.channels_for("s") == []


async def _auto_answers(server: FixtureControl) -> list[dict[str, Any]] | None:
    return (await server.state()).get("autoAnswers") or None


async def test_legacy_allow_admits_pre_policy_registration_of_a_05_server(tmp_path: Path) -> None:
    # notify-publish (editor-like) registers before any policy: refused unless legacy="allow".
    with trio.fail_after(30):
        async with one_server(tmp_path, "tcp", "notify-publish", options={"legacy": "allow"}) as (daemon, server):
            await wait_ready(daemon, "s")
            await wait_channel(daemon, "s", "general")
            assert all("error" not in answer for answer in (await server.state()).get("autoAnswers", []))


async def test_stdio_server_killed_is_respawned_and_granted_again(tmp_path: Path) -> None:
    states: list[str] = []
    with trio.fail_after(40):
        control_file = tmp_path / "s.control.json"
        async with running_daemon(tmp_path, {"s": stdio_server(control_file)}) as daemon:
            daemon.observers.append(lambda event, f: states.append(f["state"]) if event == "server/state" else None)
            await wait_ready(daemon, "s")
            await wait_channel(daemon, "s", "general")
            async with control_of(control_file) as first:
                first_pid = first.pid
            os.kill(first_pid, signal.SIGKILL)
            await wait_ready(daemon, "s", epoch=2)
            await wait_channel(daemon, "s", "general")
            async with FixtureControl.connect(control_file, timeout=15, stale_pid=first_pid) as second:
                assert second.pid != first_pid
                updates = await second.recorded("featureSets/update")
                assert [u["kind"] for u in updates] == ["request"]
            assert states[:4] == ["ready", "retrying", "connecting", "ready"]
            # The first epoch ended because its server died: that is what the link reports.
            # The child's death, not the closed pipe it left, explains the reconnect.
            assert daemon.links["s"].last_error.startswith("the server was killed by SIGKILL")


async def test_tcp_disconnect_reconnects_with_a_fresh_grant(tmp_path: Path) -> None:
    with trio.fail_after(40):
        async with one_server(tmp_path, "tcp") as (daemon, server):
            await wait_ready(daemon, "s")
            await wait_channel(daemon, "s", "general")
            await server.disconnect()
            await wait_ready(daemon, "s", epoch=2)
            await wait_channel(daemon, "s", "general")
            updates = await server.recorded("featureSets/update")
            assert sorted(u["epoch"] for u in updates) == [1, 2]


@pytest.mark.parametrize("transport", ["stdio", "tcp"])
async def test_bad_frames_leave_the_link_up(tmp_path: Path, transport: str) -> None:
    with trio.fail_after(40):
        async with one_server(tmp_path, transport) as (daemon, server):
            await wait_ready(daemon, "s")
            await wait_channel(daemon, "s", "general")
            link = daemon.links["s"]
            await server.send_raw('{"jsonrpc": "2.0", "id": 99, "method": \n')  # not JSON: a log line, skipped
            await server.send_raw("gateway: heartbeat ack, latency 42ms\n")  # a log line on stdout
            await server.send_raw('{"jsonrpc": "2.0", "id": 98}\n')  # invalid request
            # Oversized: 5 MiB in one line (the limit is 4 MiB).
            await server.send_raw('{"jsonrpc":"2.0","method":"push/event","params":{"x":"', repeat=1, suffix="")
            await server.send_raw("a" * 65536, repeat=80, suffix='"}}\n')

            def counted() -> bool:
                stats = link.peer_statistics()
                return stats is not None and stats.oversized_messages == 1 and stats.malformed_messages == 1 and stats.skipped_lines >= 2

            await wait_until(counted, timeout=15)
            # Still the same connection, and it still works both ways.
            assert link.state.value == "ready" and link.epoch == 1
            answer = await server.register([{"id": "after-junk", "label": "after"}])
            assert answer["results"] == [{"id": "after-junk", "accepted": True}]


async def test_websocket_malformed_frame_is_answered_and_link_stays_up(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with one_server(tmp_path, "ws") as (daemon, server):
            await wait_ready(daemon, "s")
            link = daemon.links["s"]
            await server.send_raw('{"jsonrpc": "2.0", "id": 7, "method": ')
            await wait_until(lambda: (link.peer_statistics() or _zero).malformed_messages == 1, timeout=10)
            answer = await server.register([{"id": "still-up"}])
            assert answer["results"][0]["accepted"] is True
            assert link.epoch == 1


async def test_websocket_token_is_required_and_never_logged(tmp_path: Path) -> None:
    from structlog.testing import capture_logs

    with trio.fail_after(30), capture_logs() as logs:
        async with FixtureProcess.start(transport="ws", channels=["general"], control_dir=tmp_path, token="s3cret-value") as fixture:
            entry = dialled_server(fixture, token="wrong-token")
            async with running_daemon(tmp_path, {"s": entry}) as daemon:
                link = daemon.links["s"]
                await wait_until(lambda: link.state.value == "retrying", timeout=10)
                assert "refused" in (link.last_error or "")
    assert not any("s3cret-value" in repr(entry) or "wrong-token" in repr(entry) for entry in logs)


@pytest.mark.parametrize("form", ["request", "notification"])
async def test_inbound_admission_follows_the_grant(tmp_path: Path, form: str) -> None:
    options = {"disabledCapabilities": ["channels.incoming"]}
    with trio.fail_after(30):
        async with one_server(tmp_path, "tcp", options=options) as (daemon, server):
            await wait_ready(daemon, "s")
            await wait_channel(daemon, "s", "general")
            message = {"channelId": "general", "messageId": "m1", "content": [{"type": "text", "text": "hi"}]}
            if form == "request":
                with pytest.raises(RpcError) as refused:
                    await server.incoming([message], form=form)
                assert refused.value.code == -32002
                assert refused.value.data == {"capability": "channels.incoming"}
            else:
                assert await server.incoming([message], form=form) is None
                # A dropped notification is logged, never admitted. Inbound is dispatched in
                # order, so once a later request is answered the notification was handled.
                await server.register(["barrier"])
            assert daemon.journal.last_seq() == 0


async def test_manifest_change_revokes_removals_and_never_grants_additions(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with one_server(tmp_path, "tcp") as (daemon, server):
            await wait_ready(daemon, "s")
            link = daemon.links["s"]
            assert link.grant.allows("channels.typing")
            new_manifest = {
                "version": "0.5",
                "pushEvents": True,
                "modelInfo": True,  # an addition: must not be granted
                "channels": {"register": True, "publish": True, "incoming": True},
            }
            await server.manifest_changed(new_manifest)
            await wait_until(lambda: not link.grant.allows("channels.typing"), timeout=10)
            assert not link.grant.allows("modelInfo")
            assert link.grant.allows("channels.publish")
            updates = await wait_until(lambda: _two_updates(server), timeout=10)
            assert "channels.typing" not in updates[-1]["params"]["effectiveCapabilities"]


async def _two_updates(server: FixtureControl) -> list[dict[str, Any]] | None:
    updates = await server.recorded("featureSets/update")
    return updates if len(updates) >= 2 else None


class _Zero:
    malformed_messages = 0


_zero = _Zero()
