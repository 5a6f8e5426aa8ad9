"""What the benchmarks share: fixture servers, the daemon and the bare forwarder as processes.

Both sides under test run as processes of their own, so each one's CPU time is read from
``/proc`` (messages per CPU-second) and the bench's own host client doesn't count against
either. Everything is on loopback; every process is stopped when its block ends.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mcpl_router.client import RouterClient  # noqa: E402
from mcpl_router.store.journal import Journal  # noqa: E402
from mcpl_router.testing.control import FixtureProcess, wait_until  # noqa: E402

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, *, main_thread: bool = False) -> float:
    """User + system CPU a process has used so far (every thread's, ended ones too), or only
    its main thread's (for the daemon: the trio thread; the rest is its SQLite work)."""
    stat = f"/proc/{pid}/task/{pid}/stat" if main_thread else f"/proc/{pid}/stat"
    fields = Path(stat).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def prefill(path: Path, rows: int) -> None:
    """``rows`` acked events (and a delivery each), as a busy daemon's last day leaves them."""
    Journal(path).close()  # the schema
    if not rows:
        return
    db = sqlite3.connect(str(path))
    now = time.time()
    with db:
        db.executemany(
            "INSERT INTO inbound (server, channel, kind, dedup, digest, payload, received_at, acked) VALUES (?, ?, ?, ?, ?, ?, ?, 1)",
            ((f"old{n % 4}", "general", "message", f"old-{n}", b"d", b'{"text":"old"}', now) for n in range(rows)),
        )
        db.execute("INSERT INTO deliveries (agent, seq, reason, tags, addressed, acked) SELECT 'bench', seq, 'message', '[]', 1, 1 FROM inbound")
    # Checkpointed, as a journal that has been running is: the measured run doesn't pay for
    # moving the pre-fill out of the WAL.
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()


@asynccontextmanager
async def fixtures_running(workdir: Path, count: int, *, channels: Sequence[str] = ("general",)) -> AsyncIterator[list[FixtureProcess]]:
    async with AsyncExitStack() as stack:
        fixtures = []
        for n in range(count):
            fixtures.append(
                await stack.enter_async_context(
                    FixtureProcess.start(transport="tcp", channels=list(channels), control_dir=workdir, server_name=f"s{n}", log_level="error", timeout=60)
                )
            )
        yield fixtures


@asynccontextmanager
async def process(argv: list[str], log: Path, *, env: dict[str, str] | None = None) -> AsyncIterator[trio.Process]:
    with log.open("ab") as sink:
        proc = await trio.lowlevel.open_process(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=sink, cwd=ROOT, env=env)
    try:
        yield proc
    finally:
        with trio.CancelScope(shield=True):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                with trio.move_on_after(10):
                    await proc.wait()
            if proc.poll() is None:
                proc.kill()
                await proc.wait()


@asynccontextmanager
async def daemon_running(
    workdir: Path,
    servers: dict[str, dict[str, Any]],
    *,
    tag: str,
    rows: int = 0,
    fsync: bool = True,
    agents: Sequence[str] = ("bench",),
    postgres_dsn: str | None = None,
    launcher: str | None = None,
) -> AsyncIterator[tuple[trio.Process, str]]:
    """The daemon as a process (``python -m mcpl_router run``) dialling ``servers``; yields it
    and its host socket once every server is ready. Its journal is a SQLite file (pre-filled
    with ``rows`` acked events), or the PostgreSQL database at ``postgres_dsn``. ``launcher``:
    Python source run with ``-c`` instead of ``-m mcpl_router`` (the profiler's, say)."""
    run = workdir / f"run-{tag}"
    run.mkdir(mode=0o700)
    journal = workdir / f"journal-{tag}.sqlite3"
    if postgres_dsn is None:
        prefill(journal, rows)
        section: dict[str, Any] = {"path": str(journal)}
    else:
        section = {"backend": "postgres", "dsn": postgres_dsn, "path": str(journal)}
    config = {
        "mcplServers": servers,
        "host": {"unixSocket": str(run / "host.sock"), "websocket": {"enabled": False}},
        "journal": section,
        # The daemon's log level: errors only unless MCPL_ROUTER_BENCH_LOG_LEVEL says (``info`` is
        # a deployment's default, and what a per-message log line costs shows only there).
        "logging": {"level": os.environ.get("MCPL_ROUTER_BENCH_LOG_LEVEL", "error"), "format": "json"},
    }
    config_path = workdir / f"config-{tag}.json"
    config_path.write_text(json.dumps(config))
    env_argv = [sys.executable, "-c", _DAEMON_NO_FSYNC] if not fsync else [sys.executable, "-m", "mcpl_router"]
    if launcher is not None:
        env_argv = [sys.executable, "-c", launcher]
    async with process([*env_argv, "run", "--config", str(config_path)], workdir / f"daemon-{tag}.log") as proc:
        socket = str(run / "host.sock")

        async def ready() -> bool:
            try:
                async with RouterClient.connect_unix(socket, timeout=5) as probe:
                    status = await probe.call("status")
            except OSError:
                return False
            return status["ready"] == len(servers) and status["channels"] >= len(servers)

        await wait_until(ready, timeout=120, interval=0.05)
        yield proc, socket


# The daemon with its journal's fsync turned off (synchronous=OFF): the journal's share of the
# cost shows against the real thing. A bench-only variant, not a setting the daemon offers.
_DAEMON_NO_FSYNC = """
import sys
import mcpl_router.store.sqlite_backend as backend
_connect = backend.SqliteBackend._connect_writable
def _no_fsync(self):
    db = _connect(self)
    db.execute("PRAGMA synchronous=OFF")
    return db
backend.SqliteBackend._connect_writable = _no_fsync
from mcpl_router.cli import main
sys.argv = ["mcpl-router", *sys.argv[1:]]
sys.exit(main())
"""


@asynccontextmanager
async def forwarder_running(
    workdir: Path, fixtures: list[FixtureProcess], *, tag: str, mode: str = "inbound", answers: Path | None = None, journal: bool = False,
    launcher: str | None = None,
) -> AsyncIterator[tuple[trio.Process, str]]:
    """The bare forwarder (bench/forwarder.py) as a process, dialling every fixture; ``answers``
    is the daemon's answers to a turn's host calls, for the forwarder to give back. With
    ``journal``, the journal floor: the forwarder journaling each message and ack first.
    ``launcher``: Python source run with ``-c`` that runs the forwarder (a tracer's, say)."""
    socket = str(workdir / f"fwd-{tag}.sock")
    ports = [str(f.listen_port) for f in fixtures]
    given = ["--answers", str(answers)] if answers is not None else []
    if journal:
        given += ["--journal", str(workdir / f"floor-{tag}.sqlite3")]
    program = [str(ROOT / "bench" / "forwarder.py")] if launcher is None else ["-c", launcher]
    argv = [sys.executable, *program, "--socket", socket, "--mode", mode, *given, *ports]
    async with process(argv, workdir / f"forwarder-{tag}.log") as proc:

        async def ready() -> bool:
            try:
                async with RouterClient.connect_unix(socket, timeout=5) as probe:
                    await probe.call("session/hello", {"host": "probe", "agents": []})
            except OSError:
                return False
            return True

        await wait_until(ready, timeout=60, interval=0.05)
        yield proc, socket


async def read_wakes(host: RouterClient, total: int, *, latencies: list[float] | None = None) -> float:
    """Read ``total`` wakes, acking each as a host as shipped would: one ``host.ack([seq])`` a wake
    from a task of its own, which the client gathers into one ``wake/ack`` a round trip
    (client/acks.py); the moment the last wake arrived.

    With ``latencies``, each wake's delay from its ``metadata.sentAt`` (CLOCK_MONOTONIC) is kept.
    """
    async with trio.open_nursery() as nursery:
        for _ in range(total):
            wake = await host.next_wake()
            if latencies is not None and wake.messages:
                sent_at = (wake.messages[0].get("metadata") or {}).get("sentAt")
                if isinstance(sent_at, (int, float)):
                    latencies.append(time.monotonic() - sent_at)
            nursery.start_soon(host.ack, [wake.seq])
        done = time.perf_counter()
    return done
