"""Operations (issue 12): health and metrics over HTTP, reload, failures explained in status,
the shutdown notice. Real daemons, real fixture servers, real sockets on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from mcpl_router.query import http_get as _http_get
from mcpl_router.client import RouterClient
from mcpl_router.config import parse_config
from mcpl_router.daemon import Daemon
from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import FAST_RECONNECT, control_of, stdio_server, wait_channel, wait_ready

pytestmark = pytest.mark.integration


def _config(workdir: Path, servers: dict[str, Any], **sections: Any) -> Any:
    data = {
        "mcplServers": servers,
        "host": {"unixSocket": str(workdir / "run" / "host.sock"), "websocket": {"enabled": False}},
        "journal": {"path": str(workdir / "journal.sqlite3")},
        **sections,
    }
    return parse_config(data, source="<test>", base_dir=workdir)


async def _get(url: str) -> tuple[int, str]:
    status, body = await _http_get(url, 10)
    return status, body.decode()


def _samples(text: str) -> dict[str, list[Any]]:
    families: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        families.setdefault(family.name, []).extend(family.samples)
    return families


async def test_health_readiness_and_metrics_over_http(short_tmp: Path) -> None:
    """/healthz 200; /readyz 503 naming a required server while it is down, 200 once it is
    up; /metrics parses and has per-server series."""
    with trio.socket.socket() as probe:  # a free port for server a (it must come back on it)
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = _config(
        short_tmp,
        {
            "a": {"url": f"tcp://127.0.0.1:{port}", "required": True, "reconnect": FAST_RECONNECT},
            "b": {"url": "tcp://127.0.0.1:9", "reconnect": FAST_RECONNECT},
        },
        health={"enabled": True, "port": 0},
    )
    daemon = Daemon(config)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            try:
                url = daemon.health_url
                assert url is not None and not url.endswith(":0")
                assert await _get(url + "/healthz") == (200, "ok\n")

                async def answers(expected: int) -> bool:
                    return (await _get(url + "/readyz"))[0] == expected

                # The required server isn't there: not ready, and the body says which and why.
                status, body = await _get(url + "/readyz")
                assert status == 503, body
                assert "server a (required) is" in body and "server b" not in body
                async with FixtureProcess.start(
                    transport="tcp", channels=["general"], control_dir=short_tmp, server_name="a", port=port
                ) as fixture:
                    await wait_ready(daemon, "a", timeout=20)
                    await wait_channel(daemon, "a", "general")
                    # One message admitted, one for a channel a never registered (-32023).
                    await fixture.incoming([{"channelId": "general", "text": "hi"}, {"channelId": "nope", "text": "hi"}])
                    # It is up; b never connects but isn't required: ready.
                    await wait_until(lambda: answers(200), timeout=10)
                    assert await _get(url + "/readyz") == (200, "ready\n")
                    status, text = await _get(url + "/metrics")
                assert status == 200
                samples = _samples(text)
                up = {s.labels["server"]: s.value for s in samples["mcpl_router_server_up"]}
                assert up == {"a": 1.0, "b": 0.0}
                channels = {s.labels["server"]: s.value for s in samples["mcpl_router_server_channels"]}
                assert channels == {"a": 1.0, "b": 0.0}
                registered = [
                    s for s in samples["mcpl_router_channel_registrations"]
                    if s.name.endswith("_total") and s.labels == {"server": "a", "outcome": "accepted", "reason": ""}
                ]
                assert [s.value for s in registered] == [1.0]
                connects = {s.labels["server"]: s.value for s in samples["mcpl_router_server_connects"]}
                assert connects["b"] >= 1
                assert [s.value for s in samples["mcpl_router_ready"]] == [1.0]
                inbound = {(s.labels["outcome"], s.labels["code"]): s.value for s in samples["mcpl_router_inbound_messages"]
                           if s.name.endswith("_total") and s.labels["server"] == "a"}
                assert inbound == {("accepted", ""): 1.0, ("refused", "-32023"): 1.0}
                assert any(s.labels == {"queue": "server-inbound", "owner": "a"} for s in samples["mcpl_router_queue_depth"])
                # Gone again: 503 once more.
                await wait_until(lambda: answers(503), timeout=15)
                assert (await _get(url + "/nope"))[0] == 404
            finally:
                daemon.request_shutdown()


async def test_a_server_that_exits_is_explained_in_status(short_tmp: Path, tmp_path: Path) -> None:
    """Its exit code and last stderr line, not "PeerClosed"; every server failed → not ready."""
    script = tmp_path / "boom.py"
    script.write_text("import sys\nprint('starting', file=sys.stderr)\nprint('boom: missing API key', file=sys.stderr)\nsys.exit(3)\n")
    config = _config(
        short_tmp,
        {"boom": {"command": sys_executable(), "args": [str(script)], "reconnect": {**FAST_RECONNECT, "maxAttempts": 2}}},
    )
    daemon = Daemon(config)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            try:
                await wait_until(lambda: daemon.links["boom"].state.value == "failed", timeout=20)
                [server] = daemon.status()["servers"]
                assert server["exitCode"] == 3
                assert server["stderr"][-1] == "boom: missing API key"
                assert "exited with code 3: boom: missing API key" in server["lastError"]
                readiness = daemon.status()["readiness"]
                assert not readiness["ready"] and "no server is ready (0/1)" in readiness["problems"][0]
            finally:
                daemon.request_shutdown()


async def test_refused_registrations_are_not_ready_without_saying_so(short_tmp: Path) -> None:
    """A server whose every channel is refused (channelPatterns) is not counted as serving."""
    control = short_tmp / "c.json"
    server = stdio_server(control, channels=("general",))
    server["channelPatterns"] = ["discord:*"]
    server["required"] = True
    daemon = Daemon(_config(short_tmp, {"s": server}))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            try:
                await wait_ready(daemon, "s")
                await wait_until(lambda: daemon.servers.registration_refusals.get("s"), timeout=10)
                [row] = daemon.status()["servers"]
                assert row["state"] == "ready" and not row["serving"]
                assert row["registrationsRefused"] == 1 and "every channel registration was refused" in row["problem"]
                problems = daemon.readiness().problems
                assert problems and problems[0].startswith("server s (required) is ready but every channel registration was refused")
            finally:
                daemon.request_shutdown()


async def test_hosts_hear_of_a_shutdown_before_the_drain(short_tmp: Path) -> None:
    daemon = Daemon(_config(short_tmp, {}))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            async with RouterClient.connect_unix(str(short_tmp / "run" / "host.sock")) as client:
                await client.hello("h", agents=[{"name": "kai"}])
                daemon.request_shutdown("signal SIGTERM")
                notice = await client.next_notification("daemon/shutdown")
    assert notice.params == {"grace": 5.0, "reason": "signal SIGTERM"}


async def test_reload_in_process_narrows_a_grant_and_refuses_a_bad_config(short_tmp: Path) -> None:
    """A policy-only change is re-granted on the live link (no reconnect); a broken file is refused."""
    control = short_tmp / "c.json"
    server = stdio_server(control, channels=("general",))
    config_file = short_tmp / "router.json"

    def write(servers: dict[str, Any]) -> None:
        config_file.write_text(
            json.dumps(
                {
                    "mcplServers": servers,
                    "host": {"unixSocket": str(short_tmp / "run" / "host.sock"), "websocket": False},
                    "journal": {"path": str(short_tmp / "journal.sqlite3")},
                }
            )
        )

    write({"s": server})
    from mcpl_router.config import load_config

    daemon = Daemon(load_config(config_file))
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            try:
                await wait_ready(daemon, "s")
                link = daemon.links["s"]
                assert link.grant.allows("channels.typing")
                write({"s": {**server, "disabledCapabilities": ["channels.typing"]}})
                result = await daemon.reload()
                assert result["outcome"] == "applied" and result["regranted"] == ["s"]
                assert daemon.links["s"] is link and link.epoch == 1  # the same connection
                assert not link.grant.allows("channels.typing") and link.grant.allows("channels.publish")
                # Widening back waits for the server's receipt, then applies; an agent is added.
                # The server holds its answer, so a widening applied before it would show.
                async with control_of(control) as fixture:
                    await fixture.configure(policy_delay_ms=1500)
                    sent = len(await fixture.recorded("featureSets/update"))
                    write_agents = {"s": server}
                    write(write_agents)
                    data = json.loads(config_file.read_text())
                    data["agents"] = {"kai": {"proseRouting": "named"}}
                    config_file.write_text(json.dumps(data))
                    async with trio.open_nursery() as reloading:
                        widening: list[dict[str, Any]] = []

                        async def widen() -> None:
                            widening.append(await daemon.reload())

                        reloading.start_soon(widen)

                        async def received() -> bool:
                            return len(await fixture.recorded("featureSets/update")) > sent

                        await wait_until(received, timeout=10, interval=0.05)
                        assert not link.grant.allows("channels.typing")  # sent, not yet answered
                    widened = widening[0]
                    await fixture.configure(policy_delay_ms=0)
                assert widened["regranted"] == ["s"] and widened["agentsAdded"] == ["kai"]
                await wait_until(lambda: link.grant.allows("channels.typing"), timeout=10)
                assert link.epoch == 1
                assert daemon.sessions.agent("kai").prose_routing == "named"
                config_file.write_text("{ not json")
                refused = await daemon.reload()
                assert refused["outcome"] == "refused" and "not valid JSON" in refused["errors"][0]
                assert daemon.status()["lastReload"]["outcome"] == "refused"
                assert daemon.links["s"] is link and link.state.value == "ready"
            finally:
                daemon.request_shutdown()


def sys_executable() -> str:
    import sys

    return sys.executable


async def test_the_health_listener_answers_bad_requests_and_stays_bounded(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mcpl_router import health

    monkeypatch.setattr(health, "MAX_CONNECTIONS", 1)
    daemon = Daemon(_config(short_tmp, {}, health={"enabled": True, "port": 0}))
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(daemon.run)
            try:
                host, port = daemon.health_url.removeprefix("http://").split(":")
                garbage = await trio.open_tcp_stream(host, int(port))
                await garbage.send_all(b"NOT HTTP\r\n\r\n")
                answer = await garbage.receive_some(1000)
                assert answer.startswith(b"HTTP/1.1 400")
                await garbage.aclose()
                # Every slot held by a connection that sends nothing: the health check still gets
                # its answer, and the idle one is closed to make room (idle sockets can't starve
                # the container's check).
                holder = await trio.open_tcp_stream(host, int(port))
                assert await _get(daemon.health_url + "/healthz") == (200, "ok\n")
                with trio.fail_after(5):
                    # Closed unanswered: to make room, or at the request deadline at the latest.
                    assert await holder.receive_some(100) == b""
                await holder.aclose()
                await wait_until(lambda: _healthz_ok(daemon.health_url), timeout=10)
                # A scrape that crashes is one 500, not a dead listener.
                def broken(accept: str | None) -> tuple[bytes, str]:
                    raise RuntimeError("bug")

                monkeypatch.setattr(daemon.metrics, "exposition", broken)
                assert (await _get(daemon.health_url + "/metrics"))[0] == 500
                assert (await _get(daemon.health_url + "/healthz"))[0] == 200
                post = await trio.open_tcp_stream(host, int(port))
                await post.send_all(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
                assert (await post.receive_some(1000)).startswith(b"HTTP/1.1 405")
                await post.aclose()
            finally:
                daemon.request_shutdown()


async def _healthz_ok(url: str) -> bool:
    return (await _get(url + "/healthz"))[0] == 200
