"""Integration harness: the daemon in this test's trio run, MCPL servers as real processes.

Every server here is the fixture program (``mcpl_router.testing.fixture_server``) in its own
process, on 127.0.0.1; the daemon talks real JSON-RPC to it over stdio pipes, TCP or WebSocket.
Assertions about what a server received are read from the server's own recordings.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Collection, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.config import RouterConfig, parse_config
from mcpl_router.daemon import Daemon
from mcpl_router.testing.control import FixtureControl, FixtureProcess, fixture_command, wait_until
from mcpl_router.testing.descriptors import channel_descriptor
from mcpl_router.testing.journal import JournalPlace

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


#: ``MCPL_ROUTER_TEST_JOURNAL=postgres``: every daemon these tests start keeps its journal on
#: PostgreSQL (a database of its own on one server for the run), to try every scenario from
#: outside on that backend. The tests of a file's own faults (damage, removal, a full disk) are
#: SQLite's and fail there by design. Off by default: the suite runs each backend's contract.
EVERY_DAEMON_ON_POSTGRES = os.environ.get("MCPL_ROUTER_TEST_JOURNAL") == "postgres"
_run_postgres: list[Any] = []


@pytest.fixture(autouse=True, scope="session")
def _postgres_for_every_daemon() -> Iterator[None]:
    if not EVERY_DAEMON_ON_POSTGRES:
        yield
        return
    from mcpl_router.testing import postgres

    postgres.require()
    with postgres.postgres_server() as server:
        _run_postgres.append(server)
        yield


def journal_section(workdir: Path, place: JournalPlace | None = None) -> dict[str, Any]:
    """The ``[journal]`` of a test's config: a SQLite file in ``workdir``, or ``place``'s (or,
    under :data:`EVERY_DAEMON_ON_POSTGRES`, a new PostgreSQL database)."""
    if place is None and _run_postgres:
        from mcpl_router.testing import postgres

        # One database per test directory: a daemon started again there finds its journal.
        dsn = _every_database.get(workdir)
        if dsn is None:
            dsn = _every_database[workdir] = postgres.fresh_database(_run_postgres[0], f"every_{len(_every_database) + 1}")
        place = JournalPlace(dsn=dsn)
    if place is None or place.dsn is None:
        return {"path": str(place.path if place is not None and place.path is not None else workdir / "journal.sqlite3")}
    return {"backend": "postgres", "dsn": place.dsn, "path": str(workdir / "journal.sqlite3")}


_every_database: dict[Path, str] = {}


def daemon_config(
    workdir: Path,
    servers: dict[str, dict[str, Any]],
    *,
    unix_socket: bool = False,
    host: dict[str, Any] | None = None,
    journal: JournalPlace | None = None,
) -> RouterConfig:
    """A daemon config for an in-process daemon: ``servers``, the journal in ``workdir`` (or at
    ``journal``), the host Unix socket in ``workdir/run`` when ``unix_socket``, no WebSocket
    unless ``host`` says so."""
    data = {
        "mcplServers": servers,
        "host": {
            "unixSocket": str(workdir / "run" / "host.sock") if unix_socket else False,
            "websocket": {"enabled": False},
            **(host or {}),
        },
        "journal": journal_section(workdir, journal),
    }
    return parse_config(data, source="<test>", base_dir=workdir)


@asynccontextmanager
async def daemon_running(config: RouterConfig) -> AsyncIterator[Daemon]:
    """``config``'s daemon in this test's trio run, started and, at the end, shut down."""
    daemon = Daemon(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(daemon.run)
        try:
            yield daemon
        finally:
            daemon.request_shutdown()


@asynccontextmanager
async def running_daemon(
    workdir: Path,
    servers: dict[str, dict[str, Any]],
    *,
    unix_socket: bool = False,
    host: dict[str, Any] | None = None,
    journal: JournalPlace | None = None,
) -> AsyncIterator[Daemon]:
    async with daemon_running(daemon_config(workdir, servers, unix_socket=unix_socket, host=host, journal=journal)) as daemon:
        yield daemon


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


# -- the daemon as a real process (kill -9, a second daemon, raw bytes on its sockets) ------------

ROOT = Path(__file__).resolve().parents[2]


def write_config(
    workdir: Path,
    fixture_url: str | None,
    *,
    servers: dict[str, dict[str, Any]] | None = None,
    host: dict[str, Any] | None = None,
    journal: JournalPlace | None = None,
) -> Path:
    """A config file for a daemon process: server ``s`` at ``fixture_url`` (or ``servers``),
    the host Unix socket in ``workdir/run``, the journal in ``workdir`` (or at ``journal``),
    debug JSON logs."""
    if servers is None:
        servers = {} if fixture_url is None else {"s": {"url": fixture_url, "reconnect": FAST_RECONNECT}}
    config = {
        "mcplServers": servers,
        "host": {"unixSocket": str(workdir / "run" / "host.sock"), "websocket": {"enabled": False}, **(host or {})},
        "journal": journal_section(workdir, journal),
        "logging": {"level": "debug", "format": "json"},
    }
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "router.json"
    path.write_text(json.dumps(config))
    return path


class DaemonProcess:
    """``mcpl-router run`` as a subprocess; its stderr goes to ``log`` (appended across runs).

    ``cwd`` is where it runs (the repository unless given), ``env`` its environment (ours).
    """

    def __init__(self, config: Path, log: Path, *, cwd: Path = ROOT, env: Mapping[str, str] | None = None) -> None:
        self.config = config
        self.log = log
        self.cwd = cwd
        self.env = None if env is None else dict(env)
        self.process: trio.Process | None = None

    async def start(self) -> None:
        with self.log.open("ab") as log:
            self.process = await trio.lowlevel.open_process(
                [sys.executable, "-m", "mcpl_router", "run", "--config", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
                cwd=self.cwd,
                env=self.env,
            )

    def kill9(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)

    async def wait(self) -> int:
        assert self.process is not None
        return await self.process.wait()

    async def stop(self) -> None:
        process = self.process
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(10):
            await process.wait()
        if process.poll() is None:
            process.kill()
            await process.wait()


@asynccontextmanager
async def daemon_process(config: Path, log: Path, **options: Any) -> AsyncIterator[DaemonProcess]:
    daemon = DaemonProcess(config, log, **options)
    try:
        yield daemon
    finally:
        with trio.CancelScope(shield=True):
            await daemon.stop()


async def daemon_serving(
    socket: str,
    *,
    servers: int = 1,
    channels: Collection[tuple[str | None, str]] = ((None, "general"),),
    timeout: float = 5,
    node: str | None = None,
) -> bool:
    """Whether a daemon answers hosts on ``socket`` with ``servers`` ready and each of
    ``channels`` registered (``(server, channel)``; a None server: on any), and, given ``node``,
    whether it is that cluster node's own daemon (a standby's socket forwards to the holder's).
    No daemon there (a node that just died, a standby that refuses: -32000), or none that answers
    (a stopped holder a standby forwards to): False."""
    from mcpl_router.jsonrpc import PeerClosed, RequestTimeout, RpcError

    try:
        async with RouterClient.connect_unix(socket, timeout=timeout) as probe:
            status = await probe.status()
            rows = await probe.all_channels()
            answering = None if node is None else ((await probe.call("status")).get("cluster") or {}).get("node")
    except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, PeerClosed, RequestTimeout):
        return False
    except RpcError as exc:
        if exc.code != -32000:
            raise
        return False
    if answering != node:
        return False
    if servers == 0:
        return True
    registered = {(row.server_id, row.channel_id) for row in rows}
    ids = {channel_id for _, channel_id in registered}
    return status.ready == servers and all(
        channel_id in ids if server_id is None else (server_id, channel_id) in registered for server_id, channel_id in channels
    )


async def wait_daemon_ready(socket: str, *, servers: int = 1) -> None:
    """Until the daemon answers on ``socket`` with ``servers`` ready (and ``general`` registered)."""
    await wait_until(lambda: daemon_serving(socket, servers=servers), timeout=20, interval=0.05)


@asynccontextmanager
async def host_session(daemon: Daemon, agent: Mapping[str, Any] | str = "ann") -> AsyncIterator[RouterClient]:
    """A host on the daemon's Unix socket that has claimed ``agent`` (a name or an AgentSpec)."""
    assert daemon.host_socket_path is not None
    async with RouterClient.connect_unix(daemon.host_socket_path) as client:
        await client.hello("test-host", [agent])
        yield client


@asynccontextmanager
async def two_servers_sharing_general(workdir: Path, first: str) -> AsyncIterator[tuple[Daemon, dict[str, FixtureProcess]]]:
    """Servers a and b (tcp, strict), both registering an open ``general``, ``first`` first."""
    async with AsyncExitStack() as stack:
        servers: dict[str, FixtureProcess] = {}
        for name in ("a", "b"):
            servers[name] = await stack.enter_async_context(
                FixtureProcess.start(transport="tcp", personality="strict", control_dir=workdir, server_name=name)
            )
        config = {name: dialled_server(fixture) for name, fixture in servers.items()}
        daemon = await stack.enter_async_context(running_daemon(workdir, config, unix_socket=True))
        for name in (first, "b" if first == "a" else "a"):
            await wait_ready(daemon, name)
            await servers[name].register([{**channel_descriptor("general"), "initiallyOpen": True}])
            await wait_channel(daemon, name, "general")
        yield daemon, servers
