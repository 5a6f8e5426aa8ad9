"""Readiness that notices a hung server (issue 25 item 3), through a daemon process and fixture
servers on 127.0.0.1: a required server stopped with SIGSTOP makes ``/readyz`` answer 503 naming
it within the ping interval plus its deadline, and 200 again after SIGCONT; a server answering
ping -32601 (as the real servers do) is answering; one that never answers ping raises no alarm.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.query import http_get
from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import FAST_RECONNECT, DaemonProcess, daemon_process, wait_daemon_ready, write_config

pytestmark = pytest.mark.integration

PING = {"interval": 0.3, "timeout": 0.5}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _config(workdir: Path, servers: dict[str, Any], port: int) -> Path:
    config = write_config(workdir, None, servers=servers)
    data = json.loads(config.read_text())
    data["health"] = {"enabled": True, "bind": "127.0.0.1", "port": port}
    config.write_text(json.dumps(data))
    return config


async def _liveness(socket_path: str) -> dict[str, dict[str, Any]]:
    async with RouterClient.connect_unix(socket_path, timeout=5) as probe:
        servers = await probe.servers_list()
    return {row.server_id: row.liveness for row in servers.servers}


async def _readyz(port: int) -> tuple[int, str]:
    status, body = await http_get(f"http://127.0.0.1:{port}/readyz", 5)
    return status, body.decode()


@asynccontextmanager
async def _pinged(workdir: Path, *, personality: str = "strict", servers: int = 1, **fixture_options: Any) -> AsyncIterator[tuple[FixtureProcess, DaemonProcess, str, int]]:
    """A fixture server ``s`` (required, pinged every 0.3 s) and a daemon process with its
    health listener; yields the fixture, the daemon, its host socket and its health port."""
    port = _free_port()
    async with FixtureProcess.start(transport="tcp", personality=personality, channels=["general"], control_dir=workdir, **fixture_options) as fixture:
        server = {"url": fixture.listen_url, "reconnect": FAST_RECONNECT, "required": True, "ping": PING, "legacy": "allow"}
        config = _config(workdir, {"s": server}, port)
        socket_path = str(workdir / "run" / "host.sock")
        async with daemon_process(config, workdir / "daemon.log") as daemon:
            await daemon.start()
            await wait_daemon_ready(socket_path, servers=servers)
            yield fixture, daemon, socket_path, port


async def _answered(socket_path: str, times: int) -> None:
    async def enough() -> bool:
        return (await _liveness(socket_path))["s"].get("answered", 0) >= times

    await wait_until(enough, timeout=20)


async def test_a_stopped_required_server_makes_readyz_503_and_recovers_after_sigcont(short_tmp: Path) -> None:
    with trio.fail_after(90):
        async with _pinged(short_tmp, unknown_method=["ping"]) as (fixture, daemon, socket_path, port):
            # -32601 is an answer: the server is answering.
            await _answered(socket_path, 1)
            assert (await _liveness(socket_path))["s"]["state"] == "answering"
            assert (await _readyz(port))[0] == 200

            os.kill(fixture.pid, signal.SIGSTOP)
            try:
                async def not_ready() -> bool:
                    return (await _readyz(port))[0] == 503

                # The interval plus the deadline, with room for a loaded machine.
                await wait_until(not_ready, timeout=10, interval=0.1)
                status, body = await _readyz(port)
                assert status == 503
                assert "server s (required) is connected but not answering: no answer to ping within 0.5 s" in body, body
                assert "stderr" not in body and "exited" not in body
                assert (await _liveness(socket_path))["s"]["state"] == "unresponsive"
                health = await trio.run_process(
                    [sys.executable, "-m", "mcpl_router", "health", "--config", str(daemon.config)],
                    capture_stdout=True, capture_stderr=True, check=False,
                )
                assert health.returncode == 3, health.stdout + health.stderr
                status_text = await trio.run_process(
                    [sys.executable, "-m", "mcpl_router", "status", "--socket", socket_path], capture_stdout=True, check=False
                )
                assert b"unresponsive" in status_text.stdout
            finally:
                os.kill(fixture.pid, signal.SIGCONT)

            async def ready_again() -> bool:
                return (await _readyz(port))[0] == 200

            await wait_until(ready_again, timeout=10, interval=0.1)
            assert (await _liveness(socket_path))["s"]["state"] == "answering"
            async with RouterClient.connect_unix(socket_path, timeout=5) as probe:
                assert [row.serving for row in (await probe.servers_list()).servers] == [True]
    log = (short_tmp / "daemon.log").read_text()
    assert '"event":"link.ping.unresponsive"' in log and '"event":"link.ping.answering_again"' in log


async def test_a_server_that_never_answers_ping_is_unknown_not_unresponsive(short_tmp: Path) -> None:
    with trio.fail_after(60):
        async with _pinged(short_tmp, never_answer=["ping"]) as (_fixture, _daemon, socket_path, port):

            async def judged() -> bool:
                return (await _liveness(socket_path))["s"].get("missed", 0) >= 2

            await wait_until(judged, timeout=20)
            assert (await _liveness(socket_path))["s"]["state"] == "unknown"
            # No false alarm: it answers everything else.
            assert await _readyz(port) == (200, "ready\n")
    log = (short_tmp / "daemon.log").read_text()
    assert log.count('"event":"link.ping.never_answered"') == 1


def test_ping_is_read_from_the_config_with_its_defaults(tmp_path: Path) -> None:
    from mcpl_router.config import parse_config

    def ping_of(value: Any) -> Any:
        server: dict[str, Any] = {"url": "tcp://127.0.0.1:9"}
        if value is not None:
            server["ping"] = value
        config = parse_config({"mcplServers": {"s": server}}, source="<t>", base_dir=tmp_path, environ={"HOME": str(tmp_path)})
        return config.servers["s"].ping

    assert ping_of(None).to_wire() == {"enabled": True, "interval": 30.0, "timeout": 10.0}
    assert ping_of(False).enabled is False
    assert ping_of({"interval": 5, "timeout": 2}).to_wire() == {"enabled": True, "interval": 5.0, "timeout": 2.0}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"mcplServers": {"s": {"url": "tcp://127.0.0.1:9", "ping": {"interval": 0}}}}))
    checked = subprocess.run([sys.executable, "-m", "mcpl_router", "check-config", str(bad)], capture_output=True, text=True, check=False)
    assert checked.returncode == 2 and "ping.interval" in checked.stdout + checked.stderr


@pytest.mark.parametrize("personality", ["discord", "legacy", "editor"])
async def test_the_real_servers_answer_to_ping_counts_as_alive(short_tmp: Path, personality: str) -> None:
    """discord-mcpl, heartbeat-mcpl and mcpl-editor answer ping -32601 (no handler), as the
    fixture personalities that play them do: answering, not unresponsive and not unknown."""
    with trio.fail_after(60):
        async with _pinged(short_tmp, personality=personality, servers=0) as (fixture, _daemon, socket_path, _port):
            await _answered(socket_path, 2)
            assert (await _liveness(socket_path))["s"]["state"] == "answering"
            pings = await fixture.recorded("ping")
    assert pings and all(entry["kind"] == "request" for entry in pings)
