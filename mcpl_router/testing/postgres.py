"""A real PostgreSQL for tests: a primary and a synchronous standby on loopback.

The journal's PostgreSQL promises (commit before ``accepted``, nothing lost when the primary
dies) can only be checked against a real server, so tests start their own from Debian's
``postgresql-15`` binaries in a temporary directory. The server refuses to run as root, so
every server process runs as the ``postgres`` user; the test process keeps each postmaster's pid
so it can kill, pause and resume it by signal, as a dying machine or a stalled disk would.

Nothing is left behind: :func:`postgres_pair` stops both servers (SIGKILL after a grace period)
and removes the directory, and each postmaster is told to die with the process that started it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import attrs

BIN_DIRS = (Path("/usr/lib/postgresql/15/bin"),)
SERVER_USER = "postgres"
STANDBY_NAME = "standby"
START_DEADLINE = 30.0
_PR_SET_PDEATHSIG = 1


def bin_dir() -> Path | None:
    """Where ``initdb``, ``postgres`` and ``pg_basebackup`` are, or None."""
    for candidate in BIN_DIRS:
        if all((candidate / tool).exists() for tool in ("initdb", "postgres", "pg_basebackup")):
            return candidate
    return None


def missing_reason() -> str | None:
    """Why a real PostgreSQL cannot be started here, or None when it can."""
    if bin_dir() is None:
        return "PostgreSQL 15 server binaries not found (Debian package postgresql-15)"
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        return f"no {SERVER_USER!r} user to run the server as"
    if os.geteuid() != 0:
        return "starting the server as the postgres user needs root"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed"
    return None


def require() -> None:
    """In a test: skip where the server can't run, saying why and what to install; under CI
    (``CI`` set, as ``.ci/run`` does) fail instead, for CI must run the PostgreSQL tests."""
    import pytest

    reason = missing_reason()
    if reason is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the PostgreSQL tests: {reason}")
    pytest.skip(f"{reason}: install Debian's postgresql-15 and run the tests as root to include them")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _die_with_parent() -> None:
    # Runs in the child after it has become the postgres user (credential changes clear the
    # parent-death signal, so it must be set after them): a test process killed outright
    # takes its servers with it instead of leaving them on a port.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _as_server_user(args: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
    account = pwd.getpwnam(SERVER_USER)
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        args,
        user=account.pw_uid,
        group=account.pw_gid,
        extra_groups=[],
        # Its own session: a Ctrl-C in the terminal reaches the process that started the server
        # (a test run, deploy/cluster-local.py), which stops it after what uses it.
        start_new_session=True,
        preexec_fn=_die_with_parent,
        **kwargs,
    )


def _run_as_server_user(args: list[str]) -> None:
    process = _as_server_user(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output, _ = process.communicate(timeout=120)
    if process.returncode != 0:
        raise RuntimeError(f"{args[0]} failed ({process.returncode}): {output.decode(errors='replace')}")


@attrs.define
class Server:
    """One postmaster: its data directory, port and process."""

    name: str
    data: Path
    port: int
    log: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres connect_timeout=5"

    @property
    def pid(self) -> int:
        assert self.process is not None, f"{self.name} is not running"
        return self.process.pid

    def start(self) -> None:
        bindir = bin_dir()
        assert bindir is not None
        log = self.log.open("ab")
        try:
            self.process = _as_server_user(
                [str(bindir / "postgres"), "-D", str(self.data)], stdout=log, stderr=log
            )
        finally:
            log.close()
        self.wait_ready()

    def wait_ready(self) -> None:
        import psycopg

        deadline = time.monotonic() + START_DEADLINE
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited at start:\n{self.log_tail()}")
            try:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name} not ready in {START_DEADLINE:.0f} s:\n{self.log_tail()}")
                time.sleep(0.05)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signum)

    def kill(self) -> None:
        """As a lost machine: SIGKILL the postmaster. Its children notice and exit."""
        self.signal(signal.SIGKILL)
        if self.process is not None:
            self.process.wait(timeout=30)
        self._wait_children_gone()

    def pause(self) -> None:
        """As a stalled machine: SIGSTOP the postmaster and every process of it (a standby's
        WAL receiver stops confirming, so the primary's synchronous commits wait)."""
        for pid in [self.pid, *_processes_using(self.data)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        for pid in [self.pid, *_processes_using(self.data)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def stop(self) -> None:
        """Fast shutdown (SIGINT), SIGKILL if it is still there after a grace period."""
        if self.process is None:
            return
        self.resume()
        self.signal(signal.SIGINT)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.wait(timeout=15)
        self._wait_children_gone()

    def _wait_children_gone(self) -> None:
        # Backends outlive a killed postmaster briefly; the data directory is removed only
        # when no process of this server is left holding it.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _processes_using(self.data):
            time.sleep(0.05)
        for pid in _processes_using(self.data):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def execute(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.encode())


def _processes_using(data: Path) -> list[int]:
    """Pids of postgres processes whose command line names this data directory, or whose
    working directory is it (backends run with the data directory as their cwd)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if Path(os.readlink(entry / "cwd")) == data:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@attrs.define
class PostgresPair:
    """A primary and one synchronous standby: a commit returns only once the standby has it."""

    root: Path
    primary: Server
    standby: Server

    def promote(self) -> None:
        """Make the standby the primary, as an HA manager would after losing the primary.

        A promoted standby keeps ``synchronous_standby_names`` and would wait forever on every
        commit for a standby that is not there, so it is cleared.
        """
        import psycopg

        with psycopg.connect(self.standby.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_promote(wait => true)")
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = ''")
            conn.execute("SELECT pg_reload_conf()")

    @property
    def multi_host_dsn(self) -> str:
        """Both servers, the client choosing whichever takes writes."""
        return (
            f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port} user=postgres "
            "dbname=postgres connect_timeout=5 target_session_attrs=read-write"
        )

    def stop(self) -> None:
        for server in (self.standby, self.primary):
            server.stop()


def _write_config(data: Path, lines: list[str]) -> None:
    with (data / "postgresql.conf").open("a") as conf:
        conf.write("\n# mcpl-router tests\n" + "\n".join(lines) + "\n")


def _start_primary(root: Path, *, synchronous: bool) -> Server:
    bindir = bin_dir()
    assert bindir is not None
    primary = Server("primary", root / "primary", free_port(), root / "primary.log")
    _run_as_server_user(
        [str(bindir / "initdb"), "-D", str(primary.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"]
    )
    _write_config(
        primary.data,
        [
            "listen_addresses = '127.0.0.1'",
            f"port = {primary.port}",
            f"unix_socket_directories = '{root}'",
            "wal_level = replica",
            "max_wal_senders = 5",
            "max_connections = 50",
            f"synchronous_standby_names = '{f'FIRST 1 ({STANDBY_NAME})' if synchronous else ''}'",
            "synchronous_commit = on",
            "shared_buffers = 32MB",
            "logging_collector = off",
        ],
    )
    with (primary.data / "pg_hba.conf").open("a") as hba:
        hba.write("host replication postgres 127.0.0.1/32 trust\n")
    primary.start()
    return primary


def _start_pair(root: Path) -> PostgresPair:
    bindir = bin_dir()
    assert bindir is not None
    primary = _start_primary(root, synchronous=True)
    standby = Server("standby", root / "standby", free_port(), root / "standby.log")
    _run_as_server_user(
        [
            str(bindir / "pg_basebackup"),
            "-D", str(standby.data),
            "-d", f"host=127.0.0.1 port={primary.port} user=postgres application_name={STANDBY_NAME}",
            "-R", "-X", "stream", "--no-sync",
        ]
    )
    _write_config(standby.data, [f"port = {standby.port}"])
    standby.start()
    _wait_synchronous(primary)
    return PostgresPair(root, primary, standby)


def _wait_synchronous(primary: Server) -> None:
    import psycopg

    deadline = time.monotonic() + START_DEADLINE
    with psycopg.connect(primary.dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync' AND application_name = %s",
                (STANDBY_NAME,),
            ).fetchone()
            if row is not None and row[0] == 1:
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the standby never became synchronous")
            time.sleep(0.05)


def _server_root() -> Path:
    reason = missing_reason()
    if reason is not None:
        raise RuntimeError(reason)
    root = Path(tempfile.mkdtemp(prefix="mcpl-router-pg-"))
    account = pwd.getpwnam(SERVER_USER)
    os.chown(root, account.pw_uid, account.pw_gid)
    os.chmod(root, 0o700)
    return root


def _remove(root: Path) -> None:
    for pid in _processes_using(root / "primary") + _processes_using(root / "standby"):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def postgres_pair() -> Iterator[PostgresPair]:
    """A running primary + synchronous standby, stopped and removed on exit."""
    root = _server_root()
    pair: PostgresPair | None = None
    try:
        pair = _start_pair(root)
        yield pair
    finally:
        if pair is not None:
            pair.stop()
        _remove(root)


@contextlib.contextmanager
def postgres_server() -> Iterator[Server]:
    """One running server (no standby), stopped and removed on exit: for the journal's
    contract tests, each in a database of its own (:func:`fresh_database`)."""
    root = _server_root()
    server: Server | None = None
    try:
        server = _start_primary(root, synchronous=False)
        yield server
    finally:
        if server is not None:
            server.stop()
        _remove(root)


def fresh_database(server: Server, name: str) -> str:
    """Make an empty database ``name`` on ``server``; its DSN."""
    import psycopg

    with psycopg.connect(server.dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    return server.dsn.replace("dbname=postgres", f"dbname={name}")
