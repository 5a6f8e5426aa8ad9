"""The operator's commands against a real daemon process: no secrets needed, one line per
failure, SIGHUP reloads without a restart (issue 12)."""

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
from mcpl_router.testing.control import FixtureProcess, fixture_command, wait_until

pytestmark = pytest.mark.integration

CLI = [sys.executable, "-m", "mcpl_router"]
FAST_RECONNECT = {"initialDelay": 0.05, "maxDelay": 0.5, "multiplier": 2, "jitter": 0.1}


def _env_without(*names: str) -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key not in names}


def _write(path: Path, servers: dict[str, Any], workdir: Path, **sections: Any) -> None:
    path.write_text(
        json.dumps(
            {
                "mcplServers": servers,
                "host": {"unixSocket": str(workdir / "run" / "host.sock"), "websocket": False},
                "journal": {"path": str(workdir / "journal.sqlite3")},
                **sections,
            }
        )
    )


@asynccontextmanager
async def daemon_process(config: Path, env: dict[str, str] | None = None) -> AsyncIterator[trio.Process]:
    process = await trio.lowlevel.open_process([*CLI, "run", "--config", str(config)], stderr=subprocess.DEVNULL, env=env)
    try:
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            with trio.move_on_after(15):
                await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()


async def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return await trio.run_process([*CLI, *args], capture_stdout=True, capture_stderr=True, check=False, env=env)


async def test_query_commands_need_none_of_the_daemons_secrets(short_tmp: Path, tmp_path: Path) -> None:
    """status, channels, explain and health with the config's ${VAR}s unset: answers, no traceback."""
    config = tmp_path / "router.json"
    control = tmp_path / "s.json"
    argv = fixture_command("stdio", "strict", ["general"], control)
    _write(
        config,
        {
            "s": {"command": argv[0], "args": argv[1:], "inheritEnv": True, "env": {"API_KEY": "${DISCORD_TOKEN}"}, "reconnect": FAST_RECONNECT},
            "w": {"url": "ws://127.0.0.1:9/mcpl", "token": "${EDITOR_TOKEN}", "disabled": True},
        },
        short_tmp,
    )
    daemon_env = {**os.environ, "DISCORD_TOKEN": "discord-secret", "EDITOR_TOKEN": "editor-secret"}
    bare = _env_without("DISCORD_TOKEN", "EDITOR_TOKEN")
    with trio.fail_after(60):
        async with daemon_process(config, daemon_env):

            async def ready() -> bool:
                result = await _cli("health", "--config", str(config), env=bare)
                return result.returncode == 0

            await wait_until(ready, timeout=30, interval=0.2)
            results = {
                "status": await _cli("status", "--config", str(config), env=bare),
                "channels": await _cli("channels", "--config", str(config), env=bare),
                "explain": await _cli("explain", "general", "--config", str(config), env=bare),
                "health": await _cli("health", "--config", str(config), env=bare),
            }
            for name, result in results.items():
                assert result.returncode == 0, (name, result.stderr)
                assert b"Traceback" not in result.stderr and b"secret" not in result.stdout
            assert b"s " in results["status"].stdout and b"ready" in results["status"].stdout
            assert b"general" in results["channels"].stdout
            assert results["explain"].stdout.startswith(b'"general" picks channel general on server s')
            assert results["health"].stdout.strip() == b"ready: 1/1 servers ready"

            refused = await _cli("explain", "nope", "--config", str(config), env=bare)
            assert refused.returncode == 3 and refused.stdout.startswith(b'"nope" picks no single channel')
            as_json = await _cli("explain", "nope", "--json", "--config", str(config), env=bare)
            assert as_json.returncode == 3 and json.loads(as_json.stdout)["refusal"]["kind"] == "unknown"
    # The daemon is gone: one line, exit 1.
    gone = await _cli("status", "--config", str(config), env=bare)
    assert gone.returncode == 1 and gone.stderr.decode().count("\n") == 1 and "cannot reach the daemon" in gone.stderr.decode()


async def test_health_fails_when_no_server_is_ready(short_tmp: Path, tmp_path: Path) -> None:
    config = tmp_path / "router.json"
    _write(config, {"x": {"url": "tcp://127.0.0.1:9", "reconnect": FAST_RECONNECT}}, short_tmp)
    with trio.fail_after(40):
        async with daemon_process(config):

            async def answering() -> subprocess.CompletedProcess[bytes] | None:
                result = await _cli("health", "--config", str(config))
                return result if result.returncode != 1 else None

            result = await wait_until(answering, timeout=30, interval=0.2)
    assert result.returncode == 3
    assert result.stdout.decode().startswith("not ready: no server is ready (0/1): x is ")


@pytest.mark.parametrize("key", ["host.websocket.port", "health.port"])
async def test_a_port_in_use_is_one_line_naming_the_key(short_tmp: Path, tmp_path: Path, key: str) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        config = tmp_path / "router.json"
        sections: dict[str, Any] = {"health": {"port": port}} if key == "health.port" else {}
        _write(config, {}, short_tmp, **sections)
        if key == "host.websocket.port":
            data = json.loads(config.read_text())
            data["host"]["websocket"] = {"port": port}
            config.write_text(json.dumps(data))
        with trio.fail_after(30):
            result = await _cli("run", "--config", str(config))
    stderr = result.stderr.decode()
    assert result.returncode == 2
    assert "Traceback" not in stderr and "ExceptionGroup" not in stderr
    naming = [line for line in stderr.splitlines() if key in line]
    assert naming == [f"mcpl-router: not started: {config}: {key}: 127.0.0.1:{port} is already in use. "
                      "Stop whatever listens there (another mcpl-router?), or choose another port (0 lets the OS pick)."]


async def test_sighup_reloads_servers_without_a_restart(short_tmp: Path, tmp_path: Path) -> None:
    """One server removed, one added: the removed one's channels are gone, the added one is
    ready, the daemon is the same process and the host connection stays up."""
    config = tmp_path / "router.json"
    async with FixtureProcess.start(transport="tcp", channels=["alpha"], control_dir=tmp_path, server_name="a") as a, \
            FixtureProcess.start(transport="tcp", channels=["gamma"], control_dir=tmp_path, server_name="c") as c:
        _write(config, {"a": {"url": a.listen_url, "reconnect": FAST_RECONNECT}}, short_tmp)
        with trio.fail_after(60):
            async with daemon_process(config) as daemon:
                socket_path = str(short_tmp / "run" / "host.sock")
                await wait_until(lambda: Path(socket_path).exists(), timeout=20)
                async with RouterClient.connect_unix(socket_path) as client:
                    await client.hello("ops", agents=["kai"])

                    async def channel_ids() -> set[tuple[str, str]]:
                        answer = await client.call("channels/list")
                        return {(row["serverId"], row["channelId"]) for row in answer["channels"]}

                    await wait_until(lambda: _has(channel_ids, ("a", "alpha")), timeout=20)
                    _write(config, {"c": {"url": c.listen_url, "reconnect": FAST_RECONNECT}}, short_tmp)
                    daemon.send_signal(signal.SIGHUP)

                    async def reloaded() -> Any:
                        status = await client.call("status")
                        servers = {row["serverId"]: row for row in status["servers"]}
                        return status if servers.keys() == {"c"} and servers["c"]["state"] == "ready" else None

                    status = await wait_until(reloaded, timeout=20)
                    assert status["lastReload"]["outcome"] == "applied"
                    assert status["lastReload"]["added"] == ["c"] and status["lastReload"]["removed"] == ["a"]
                    await wait_until(lambda: _has(channel_ids, ("c", "gamma")), timeout=20)
                    assert ("a", "alpha") not in await channel_ids()
                    # Told as it happened, on the connection that stayed up.
                    change = await client.next_notification("channels/changed")
                    while change.params["serverId"] != "a" or not change.params["removed"]:
                        change = await client.next_notification("channels/changed")
                    assert change.params["removed"] == [{"serverId": "a", "channelId": "alpha"}]

                    # `mcpl-router reload`: the same, asked over the socket; a broken file is refused.
                    same = await _cli("reload", "--socket", socket_path)
                    assert same.returncode == 0 and same.stdout.strip() == b"applied: nothing changed"
                    config.write_text("{ broken")
                    refused = await _cli("reload", "--socket", socket_path)
                    assert refused.returncode == 3 and b"refused, the old config keeps running" in refused.stdout
                    assert (await client.call("status"))["servers"][0]["state"] == "ready"
                assert daemon.returncode is None  # never restarted


async def _has(channel_ids: Any, pair: tuple[str, str]) -> bool:
    return pair in await channel_ids()


async def test_queries_over_the_websocket_with_a_token_file(short_tmp: Path, tmp_path: Path) -> None:
    """--url ws://… with --token-file: no Unix socket needed; a wrong token is one line."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "router.json"
    token_file = short_tmp / "host-token"
    config.write_text(
        json.dumps(
            {
                "host": {"unixSocket": False, "websocket": {"port": port}, "tokenFile": str(token_file)},
                "journal": {"path": str(short_tmp / "journal.sqlite3")},
            }
        )
    )
    url = f"ws://127.0.0.1:{port}/"
    with trio.fail_after(40):
        async with daemon_process(config):

            async def answered() -> subprocess.CompletedProcess[bytes] | None:
                result = await _cli("status", "--url", url, "--token-file", str(token_file))
                return result if result.returncode == 0 else None

            result = await wait_until(answered, timeout=30, interval=0.2)
            assert result.stdout.startswith(b"mcpl-router ") and b"0/0 servers ready" in result.stdout
            # --config finds the token file itself.
            with_config = await _cli("channels", "--url", url, "--config", str(config))
            assert with_config.returncode == 0, with_config.stderr
            wrong = tmp_path / "wrong-token"
            wrong.write_text("nope\n")
            refused = await _cli("status", "--url", url, "--token-file", str(wrong))
            assert refused.returncode == 2 and b"refused the token (401)" in refused.stderr  # a config problem (docs/operations.md)
            assert refused.stderr.decode().count("\n") == 1
            # No socket configured: said in one line, with what to do instead.
            no_socket = await _cli("status", "--config", str(config))
            assert no_socket.returncode == 2 and b"host.unixSocket is false" in no_socket.stderr
