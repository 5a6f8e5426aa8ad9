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
