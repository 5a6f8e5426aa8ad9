"""config/fixtures.toml, the config a fresh clone runs as it is: check-config says OK, run
starts both bundled fixture servers, status and explain answer, SIGTERM stops it all."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import trio

from mcpl_router.testing.control import wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "mcpl_router"]


@pytest.fixture
def clone() -> object:
    """The shipped file in a directory of its own (a short path: the socket's is bounded), as
    a fresh clone has it: nothing in config/run/ yet. Run there rather than in the repository,
    so two test runs of one checkout can't share a journal."""
    with tempfile.TemporaryDirectory(prefix="mr-fx-", dir="/tmp") as directory:
        config_dir = Path(directory, "config")
        config_dir.mkdir()
        shutil.copy(REPO / "config" / "fixtures.toml", config_dir / "fixtures.toml")
        yield config_dir


def child_env() -> dict[str, str]:
    # The fixture servers run `python3 -m mcpl_router.testing.fixture_server`: this checkout's.
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    bindir = os.path.dirname(sys.executable)
    return {**os.environ, "PYTHONPATH": path, "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}


async def test_the_fixtures_config_checks_runs_and_stops(clone: Path) -> None:
    config = clone / "fixtures.toml"
    env = child_env()
    with trio.fail_after(90):
        checked = await trio.run_process([*CLI, "check-config", str(config)], capture_stdout=True, env=env)
        assert checked.stdout.decode().startswith("OK: 2 servers (a: stdio, b: stdio), 1 agent (kai: named)")
        daemon = await trio.lowlevel.open_process([*CLI, "run", "--config", str(config)], env=env, stderr=subprocess.DEVNULL)
        try:

            async def ready() -> bool:
                result = await trio.run_process([*CLI, "status", "--config", str(config)], capture_stdout=True, check=False, env=env)
                return b"2/2 servers ready, 4 channels" in result.stdout

            await wait_until(ready, timeout=30, interval=0.2)
            explained = await trio.run_process([*CLI, "explain", "a:general", "--config", str(config)], capture_stdout=True, env=env)
            assert explained.stdout.decode().startswith('"a:general" picks channel general on server a')
            # Read by a person: it names their command, not an agent's tool.
            nosuch = await trio.run_process([*CLI, "explain", "nosuch", "--config", str(config)], capture_stdout=True, check=False, env=env)
            assert nosuch.returncode == 3
            assert b"`mcpl-router channels` lists every channel" in nosuch.stdout and b"channel_list" not in nosuch.stdout
            assert (clone / "run" / "host.sock").exists()
            # What docs/client.md tells a host author to try: the example host beside it, and
            # a message made to arrive with the drive command the config's header names.
            host_log = clone / "host.log"
            with host_log.open("wb") as out:
                host = await trio.lowlevel.open_process(
                    [sys.executable, str(REPO / "examples" / "fixed_reply_host.py"), "--socket", str(clone / "run" / "host.sock"),
                     "--agent", "kai", "--reply", "On it.", "--count", "1"],
                    env=env, stdout=out, stderr=out,
                )
            try:

                async def claimed() -> bool:
                    result = await trio.run_process([*CLI, "status", "--config", str(config)], capture_stdout=True, check=False, env=env)
                    return b"agent kai" in result.stdout and b"not claimed" not in result.stdout

                await wait_until(claimed, timeout=30, interval=0.2)
                drive = [sys.executable, "-m", "mcpl_router.testing.drive", str(clone / "run" / "b.control.json")]
                sent = await trio.run_process([*drive, "message", "general", "hello kai"], capture_stdout=True, env=env)
                assert b'"accepted": true' in sent.stdout, sent.stdout
                with trio.fail_after(30):
                    assert await host.wait() == 0, host_log.read_text()
                assert "[delivered]" in host_log.read_text(), host_log.read_text()
                # A channel the fixture never registered: refused, and the command says so.
                refused = await trio.run_process([*drive, "message", "nosuch", "x"], capture_stdout=True, check=False, env=env)
                assert refused.returncode == 1 and b'"accepted": false' in refused.stdout
            finally:
                if host.returncode is None:
                    host.kill()
                    await host.wait()
            daemon.send_signal(signal.SIGTERM)
            assert await daemon.wait() == 0
        finally:
            if daemon.returncode is None:
                daemon.kill()
                await daemon.wait()
    run = clone / "run"
    assert not (run / "host.sock").exists()
    # The fixtures removed their control files as they exited: no server is left behind.
    assert not list(run.glob("*.control.json"))
