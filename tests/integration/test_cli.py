"""The command line and the container, as a user runs them: real processes, real signals."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trio

from mcpl_router.testing.control import FixtureProcess, wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "mcpl_router"]


def children_of(pid: int) -> set[int]:
    """Every live descendant of ``pid`` (read from /proc)."""
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                text = (task / "children").read_text()
            except OSError:
                continue
            for child in map(int, text.split()):
                if child not in found:
                    found.add(child)
                    frontier.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes; its parent reaps it.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


async def test_demo_once_shows_both_servers_ready_with_general() -> None:
    with trio.fail_after(60):
        result = await trio.run_process([*CLI, "demo", "--once"], capture_stdout=True, capture_stderr=True)
    out = result.stdout.decode()
    assert "server a: ready" in out and "server b: ready" in out
    # The observer's lines: each server's channels as they are registered.
    assert "[a] registered channel 'general'" in out and "[b] registered channel 'b-only'" in out
    assert "general (shown as a:general)" in out and "general (shown as b:general)" in out
    assert 'the name "general" is refused' in out and "is on more than one server" in out
    assert "the name \"b:general\" picks server b's channel general" in out
    # The scripted host: woken on b's general; typing and the reply land on b, nothing on a.
    assert "host: woken (seq 1) by a message on b:general (server b)" in out
    assert "host: turn closed: [delivered] plain speech → b:general" in out
    b_line = next(line for line in out.splitlines() if line.startswith("server b received:"))
    assert "typing start in general" in b_line and "the reply in general" in b_line and "typing stop" in b_line
    assert "server a received: no typing and no reply" in out
    # Only the demo's own lines: no log line of the daemon's, on either stream.
    for line in (out + result.stderr.decode()).splitlines():
        assert not line.startswith(("{", "20")) and "[warning" not in line and "[info" not in line, line


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
async def test_demo_stops_cleanly_on_signal_leaving_no_child(signum: int) -> None:
    with trio.fail_after(60):
        process = await trio.lowlevel.open_process([*CLI, "demo"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert process.stdout is not None
        seen = b""
        try:
            while b"Press Ctrl-C to stop." not in seen:
                chunk = await process.stdout.receive_some(65536)
                assert chunk, f"demo exited early: {seen.decode()}"
                seen += chunk
            socket_line = next(line for line in seen.decode().splitlines() if line.startswith("The daemon's host socket is "))
            socket_path = socket_line.removeprefix("The daemon's host socket is ")
            assert f"mcpl-router status --socket {socket_path}" in seen.decode()
            status = await trio.run_process([*CLI, "status", "--socket", socket_path], capture_stdout=True)
            assert b"2/2 servers ready" in status.stdout
            descendants = children_of(process.pid)
            assert len(descendants) >= 2, "the demo should have spawned servers a and b"
            process.send_signal(signum)
            while chunk := await process.stdout.receive_some(65536):
                seen += chunk
            code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert code == 0, seen.decode()
    assert "every server process has exited" in seen.decode()
    await wait_until(lambda: not any(alive(pid) for pid in descendants), timeout=5)


async def test_check_config_names_file_key_and_fix(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"mcplServers": {"a": {"command": sys.executable, "args": ["--stdio"]}}}))
    bad = tmp_path / "bad.toml"
    bad.write_text('[mcplServers.a]\ntransport = "smtp"\ncommand = "x"\n')
    with trio.fail_after(30):
        ok = await trio.run_process([*CLI, "check-config", str(good)], capture_stdout=True)
        refused = await trio.run_process([*CLI, "check-config", str(bad)], capture_stderr=True, check=False)
    assert ok.stdout.decode().startswith("OK")
    assert refused.returncode == 2
    message = refused.stderr.decode()
    assert str(bad) in message and "mcplServers.a.transport" in message and "stdio" in message


def _dockerfile_command(instruction: str) -> list[str]:
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    match = re.search(rf"^{instruction}\s.*?(\[.*\])\s*$", text, re.MULTILINE)
    assert match, f"no exec-form {instruction} in the Dockerfile"
    return json.loads(match.group(1))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def test_container_entrypoint_and_health_check_without_docker(tmp_path: Path) -> None:
    """Run the Dockerfile's own ENTRYPOINT and HEALTHCHECK against a real daemon, with the
    image's own config (config/container.toml), its paths moved into a temporary state dir."""
    entrypoint = _dockerfile_command("ENTRYPOINT")
    health = _dockerfile_command("HEALTHCHECK.*CMD")
    mounted = "/etc/mcpl-router/config.toml"
    assert entrypoint[:3] == ["tini", "--", "mcpl-router"], "tini is PID 1 (it reaps orphans)"
    assert health[0] == "mcpl-router" and "health" in health
    assert mounted in entrypoint and mounted in health
    dockerfile = (REPO / "Dockerfile").read_text()
    assert re.search(r"^EXPOSE 7420 9464$", dockerfile, re.MULTILINE)
    assert "COPY config/container.toml /etc/mcpl-router/config.toml" in dockerfile
    image_config = (REPO / "config" / "container.toml").read_text()
    with trio.fail_after(60), tempfile.TemporaryDirectory(prefix="mr-ct-", dir="/tmp") as run_dir:
        state = Path(run_dir, "state")
        state.mkdir(mode=0o700)
        async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=tmp_path) as fixture:
            config = tmp_path / "config.toml"
            ws_port, health_port = _free_port(), _free_port()
            text = (
                image_config.replace("/var/lib/mcpl-router", str(state))
                .replace("0.0.0.0", "127.0.0.1")
                .replace("port = 7420", f"port = {ws_port}")
                .replace("port = 9464", f"port = {health_port}")
            )
            config.write_text(text + f'\n[mcplServers.a]\nurl = "{fixture.listen_url}"\nrequired = true\n')

            def as_run_here(argv: list[str]) -> list[str]:
                # The image's mounted path becomes this test's file; mcpl-router is the module.
                # tini is used when this machine has it (the image always does).
                start = argv.index("mcpl-router")
                init = argv[:start] if shutil.which("tini") else []
                return [*init, *CLI, *[str(config) if part == mounted else part for part in argv[start + 1 :]]]

            # The health check needs neither the socket nor any of the daemon's variables.
            bare_env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
            daemon = await trio.lowlevel.open_process(as_run_here(entrypoint), stderr=subprocess.DEVNULL)
            try:

                async def healthy() -> bool:
                    result = await trio.run_process(as_run_here(health), capture_stdout=True, capture_stderr=True, check=False, env=bare_env)
                    return result.returncode == 0 and result.stdout.strip() == b"ready"

                await wait_until(healthy, timeout=30, interval=0.2)
                listing = await trio.run_process([*CLI, "channels", "--config", str(config)], capture_stdout=True)
                assert b"general" in listing.stdout
                # Everything it wrote is in the state dir, for its user only.
                assert stat.S_IMODE(state.stat().st_mode) == 0o700
                assert Path(state, "host.sock").exists()
                for name in ("journal.sqlite3", "host-token"):
                    assert stat.S_IMODE(Path(state, name).stat().st_mode) == 0o600, name
                daemon.send_signal(signal.SIGTERM)
                assert await daemon.wait() == 0
            finally:
                if daemon.returncode is None:
                    daemon.kill()
                    await daemon.wait()
            # With the daemon gone, the health check fails: nothing answers.
            result = await trio.run_process(as_run_here(health), capture_stdout=True, capture_stderr=True, check=False)
            assert result.returncode == 1
            assert b"cannot reach" in result.stderr and b"Traceback" not in result.stderr
            assert not Path(state, "host.sock").exists()


def test_cli_lists_its_commands() -> None:
    result = subprocess.run([*CLI, "--help"], capture_output=True, text=True, check=True)
    for command in ("run", "demo", "check-config", "status", "channels", "explain", "health"):
        assert command in result.stdout
    assert shlex.split("mcpl-router run --config x")[0] == "mcpl-router"


async def test_run_refuses_an_unsafe_socket_directory_with_a_clear_message(tmp_path: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="mr-bad-", dir="/tmp") as directory:
        socket_dir = Path(directory, "sock")
        socket_dir.mkdir(mode=0o755)
        socket_dir.chmod(0o755)
        config = tmp_path / "config.toml"
        config.write_text(
            f'[host]\nunixSocket = "{socket_dir}/host.sock"\n[host.websocket]\nenabled = false\n'
            f'[journal]\npath = "{tmp_path}/journal.sqlite3"\n'
        )
        with trio.fail_after(30):
            result = await trio.run_process([*CLI, "run", "--config", str(config)], capture_stderr=True, check=False)
    assert result.returncode == 2
    stderr = result.stderr.decode()
    assert f"chmod 700 {socket_dir}" in stderr
    assert "Traceback" not in stderr


async def test_run_refuses_what_check_config_refuses_before_making_anything(tmp_path: Path) -> None:
    """A journal directory that can't be made is refused in one line, like check-config's (not a
    traceback), and nothing is made or started first."""
    with tempfile.TemporaryDirectory(prefix="mr-pre-", dir="/tmp") as directory:
        Path(directory, "state").write_text("a file where the journal's directory goes")
        config = tmp_path / "config.toml"
        config.write_text(
            f'[host]\nunixSocket = "{directory}/run/host.sock"\n[host.websocket]\nenabled = false\n'
            f'[journal]\npath = "{directory}/state/journal.sqlite3"\n'
        )
        with trio.fail_after(30):
            checked = await trio.run_process([*CLI, "check-config", str(config)], capture_stderr=True, check=False)
            result = await trio.run_process([*CLI, "run", "--config", str(config)], capture_stderr=True, check=False)
        assert not Path(directory, "run").exists(), "the socket's directory was made before the refusal"
    assert checked.returncode == 2 and result.returncode == 2
    refusal = checked.stderr.decode().strip()
    assert "journal.path" in refusal and "is not a directory" in refusal
    assert result.stderr.decode().strip() == f"mcpl-router: not started: {refusal}"
