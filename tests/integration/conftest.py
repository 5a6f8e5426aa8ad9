"""Integration harness: the daemon in this test's trio run, MCPL servers as real processes.

Every server here is the fixture program (``mcpl_router.testing.fixture_server``) in its own
process, on 127.0.0.1; the daemon talks real JSON-RPC to it over stdio pipes, TCP or WebSocket.
Assertions about what a server received are read from the server's own recordings.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.config import parse_config
from mcpl_router.daemon import Daemon
from mcpl_router.testing.control import FixtureControl, FixtureProcess, fixture_command, wait_until

FAST_RECONNECT = {"initialDelay": 0.05, "maxDelay": 0.5, "multiplier": 2, "jitter": 0.1}


@pytest.fixture
def short_tmp() -> Any:
    # Unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="mr-", dir="/tmp") as directory:
        yield Path(directory)


def stdio_server(control_file: Path, personality: str = "strict", channels: tuple[str, ...] = ("general",), **extra: Any) -> dict[str, Any]:
    argv = fixture_command("stdio", personality, channels, control_file, **extra)
    return {"command": argv[0], "args": argv[1:], "inheritEnv": True, "reconnect": FAST_RECONNECT}


def dialled_server(fixture: FixtureProcess, **options: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"url": fixture.listen_url, "reconnect": FAST_RECONNECT}
    entry.update(options)
    return entry


@asynccontextmanager
async def running_daemon(workdir: Path, servers: dict[str, dict[str, Any]], *, unix_socket: bool = False) -> AsyncIterator[Daemon]:
    data = {
        "mcplServers": servers,
        "host": {"unixSocket": str(workdir / "run" / "host.sock") if unix_socket else False, "websocket": {"enabled": False}},
        "journal": {"path": str(workdir / "journal.sqlite3")},
    }
    config = parse_config(data, source="<test>", base_dir=workdir)
    daemon = Daemon(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        try:
            yield daemon
        finally:
            daemon.request_shutdown()


async def wait_ready(daemon: Daemon, server_id: str, *, epoch: int = 1, timeout: float = 15) -> None:
    link = daemon.links[server_id]

    def ready() -> bool:
        return link.state.value == "ready" and link.epoch >= epoch

    await wait_until(ready, timeout=timeout)


async def wait_channel(daemon: Daemon, server_id: str, channel_id: str, *, timeout: float = 15) -> None:
    from mcpl_router.routing.refs import ChannelRef

    await wait_until(lambda: daemon.router.registry.is_registered(ChannelRef(server_id, channel_id)), timeout=timeout)


@asynccontextmanager
async def servers_and_daemon(
    workdir: Path, names: Sequence[str], options: Mapping[str, dict[str, Any]] | None = None
) -> AsyncIterator[tuple[Daemon, dict[str, FixtureProcess]]]:
    """Fixture processes (tcp, strict, registering nothing yet) and the daemon dialling each,
    with its host Unix socket; yields once every server is ready."""
    options = options or {}
    async with AsyncExitStack() as stack:
        fixtures: dict[str, FixtureProcess] = {}
        for name in names:
            fixtures[name] = await stack.enter_async_context(
                FixtureProcess.start(transport="tcp", personality="strict", control_dir=workdir, server_name=name)
            )
        config = {name: dialled_server(fixture, **options.get(name, {})) for name, fixture in fixtures.items()}
        daemon = await stack.enter_async_context(running_daemon(workdir, config, unix_socket=True))
        for name in names:
            await wait_ready(daemon, name)
        yield daemon, fixtures


@asynccontextmanager
async def control_of(control_file: Path) -> AsyncIterator[FixtureControl]:
    async with FixtureControl.connect(control_file, timeout=15) as control:
        yield control


@asynccontextmanager
async def host_session(daemon: Daemon, agent: Mapping[str, Any] | str = "ann") -> AsyncIterator[RouterClient]:
    """A host on the daemon's Unix socket that has claimed ``agent`` (a name or an AgentSpec)."""
    assert daemon.host_socket_path is not None
    async with RouterClient.connect_unix(daemon.host_socket_path) as client:
        await client.hello("test-host", [agent])
        yield client
