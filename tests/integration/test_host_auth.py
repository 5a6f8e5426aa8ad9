"""The host listener refuses what it must: a wrong or missing WebSocket token, a non-loopback
bind without a token, and a Unix socket directory others can reach — each with a clear error,
and never a token in a log line."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio_websocket
from structlog.testing import capture_logs

from mcpl_router.client import RouterClient
from mcpl_router.config import RouterConfig, WebSocketListenConfig, parse_config
from mcpl_router.daemon import Daemon
from mcpl_router.hosts.auth import HostAuthError
from mcpl_router.hosts.listener import SocketSetupError

from .conftest import daemon_running

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-host-token-never-logged"


def config_for(workdir: Path, host: dict[str, Any]) -> RouterConfig:
    data = {"mcplServers": {}, "host": host, "journal": {"path": str(workdir / "state" / "journal.sqlite3")}}
    return parse_config(data, source="<test>", base_dir=workdir)


async def test_wrong_and_missing_token_are_refused_and_never_logged(short_tmp: Path) -> None:
    config = config_for(short_tmp, {"unixSocket": False, "websocket": {"port": 0}, "token": TOKEN})
    with trio.fail_after(20), capture_logs() as logs:
        async with daemon_running(config) as daemon:
            url = daemon.host_websocket_url
            assert url is not None and url.startswith("ws://127.0.0.1:")
            for offered in ("wrong-token", None):
                with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
                    async with RouterClient.connect_websocket(url, offered, timeout=5):
                        pass  # pragma: no cover - the handshake fails first
                assert rejected.value.status_code == 401
                assert b"Bearer" in (rejected.value.body or b"")
            async with RouterClient.connect_websocket(url, TOKEN, timeout=5) as client:
                status = await client.call("status")
                assert status["version"]
                hello = await client.hello("ws-host", ["kai"])
                assert hello.agents[0].name == "kai"
    refusals = [entry for entry in logs if entry["event"] == "host.websocket.rejected"]
    assert len(refusals) == 2 and all(entry["status"] == 401 for entry in refusals)
    text = repr(logs)
    assert TOKEN not in text and "wrong-token" not in text


async def test_token_generated_into_a_private_file(short_tmp: Path) -> None:
    token_file = short_tmp / "secrets" / "host-token"
    config = config_for(short_tmp, {"unixSocket": False, "websocket": {"port": 0}, "tokenFile": str(token_file)})
    with trio.fail_after(20), capture_logs() as logs:
        async with daemon_running(config) as daemon:
            assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
            assert stat.S_IMODE(token_file.parent.stat().st_mode) == 0o700
            token = token_file.read_text().strip()
            assert len(token) >= 40
            assert daemon.host_websocket_url is not None
            async with RouterClient.connect_websocket(daemon.host_websocket_url, token, timeout=5) as client:
                await client.call("status")
        # The next start reads the same token back.
        async with daemon_running(config):
            assert token_file.read_text().strip() == token
    assert token not in repr(logs)


def test_non_loopback_bind_without_token_refuses_to_start(short_tmp: Path) -> None:
    path = short_tmp / "router.json"
    path.write_text(
        json.dumps(
            {
                "mcplServers": {},
                "host": {"unixSocket": False, "websocket": {"bind": "0.0.0.0", "port": 0}, "allowNonLoopback": True},
                "journal": {"path": str(short_tmp / "journal.sqlite3")},
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "mcpl_router", "run", "--config", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert "0.0.0.0" in done.stderr and "not a loopback address" in done.stderr
    assert "token" in done.stderr
    # It never got as far as listening or opening its journal.
    assert not (short_tmp / "journal.sqlite3").exists()


async def test_non_loopback_bind_without_token_refused_by_the_daemon_itself(short_tmp: Path) -> None:
    # A config built in code skips the file checks: the listener still refuses, before binding.
    loaded = config_for(short_tmp, {"unixSocket": False, "websocket": {"port": 0}, "token": TOKEN})
    host = attrs.evolve(
        loaded.host, websocket=WebSocketListenConfig(bind="0.0.0.0"), token=None, token_file=None, allow_non_loopback=True
    )
    daemon = Daemon(attrs.evolve(loaded, host=host))
    with trio.fail_after(10), pytest.raises(HostAuthError, match="not a loopback address"):
        await daemon.run()
    assert daemon.host_websocket_url is None


async def test_socket_directory_others_can_reach_is_refused(short_tmp: Path) -> None:
    directory = short_tmp / "run"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    config = config_for(short_tmp, {"unixSocket": str(directory / "host.sock"), "websocket": False})
    daemon = Daemon(config)
    with trio.fail_after(10), pytest.raises(SocketSetupError, match=f"chmod 700 {directory}"):
        await daemon.run()
    assert not (directory / "host.sock").exists()
    assert daemon.host_socket_path is None


async def test_token_file_readable_by_others_is_refused(short_tmp: Path) -> None:
    token_file = short_tmp / "host-token"
    token_file.write_text(TOKEN)
    os.chmod(token_file, 0o644)
    config = config_for(short_tmp, {"unixSocket": False, "websocket": {"port": 0}, "tokenFile": str(token_file)})
    with trio.fail_after(10), capture_logs() as logs, pytest.raises(HostAuthError, match="chmod 600"):
        await Daemon(config).run()
    assert TOKEN not in repr(logs)


async def test_the_socket_file_exists_only_once_it_accepts(short_tmp: Path) -> None:
    """A host that waits for the file and connects at once is never refused: the socket is
    bound and listening under a private name, then linked into place. A second daemon on the
    same path is refused while the first one runs."""
    path = short_tmp / "run" / "host.sock"
    config = config_for(short_tmp, {"unixSocket": str(path), "websocket": False})
    daemon = Daemon(config)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(daemon.run)
            while not path.exists():
                await trio.sleep(0)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                probe.connect(str(path))  # raises ConnectionRefusedError if the file came first
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert [entry.name for entry in path.parent.iterdir()] == ["host.sock"]  # no private name left
            with pytest.raises(SocketSetupError, match="another daemon is listening"):
                await Daemon(config_for(short_tmp / "second", {"unixSocket": str(path), "websocket": False})).run()
            daemon.request_shutdown()
    assert not path.exists()


async def test_a_socket_path_too_long_to_stage_is_bound_in_place(short_tmp: Path) -> None:
    """A path near the limit has no room for the private name: bound where it is, and served."""
    directory = short_tmp / "run"
    name = "s" * (107 - len(os.fsencode(str(directory))) - 1)
    path = directory / name
    assert len(os.fsencode(str(path))) == 107
    async with daemon_running(config_for(short_tmp, {"unixSocket": str(path), "websocket": False})) as daemon:
        assert daemon.host_socket_path == str(path)
        async with RouterClient.connect_unix(str(path)) as client:
            assert (await client.call("status"))["version"]
        assert [entry.name for entry in directory.iterdir()] == [name]
    assert not path.exists()
