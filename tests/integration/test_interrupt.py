"""A Ctrl-C stops a test run (``tests/conftest.py``), through a real pytest process.

The suite's tests run under trio, which hands a Ctrl-C to the running test inside an exception
group; without the conftest's rule pytest reported that one test failed and ran the others on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from mcpl_router.testing.control import wait_until

pytestmark = pytest.mark.integration

TESTS = Path(__file__).resolve().parents[1]

#: Two trio tests: the first waits in a nursery (where the interrupt lands), the second must not run.
PROBE = '''
from pathlib import Path

import trio

HERE = Path(__file__).parent


async def test_first() -> None:
    (HERE / "first-started").touch()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.sleep, 60)


async def test_second() -> None:
    (HERE / "second-started").touch()
'''


#: pytest, with Python's own SIGINT handler whatever the disposition it was started with.
STARTER = "import signal, sys, pytest; signal.signal(signal.SIGINT, signal.default_int_handler); sys.exit(pytest.main(sys.argv[1:]))"


async def test_a_ctrl_c_during_a_trio_test_stops_the_run(tmp_path: Path) -> None:
    (tmp_path / "test_probe.py").write_text(PROBE)
    (tmp_path / "pytest.ini").write_text("[pytest]\ntrio_mode = true\n")
    output = tmp_path / "output.txt"
    # The suite's own conftest, loaded as a plugin: the rule under test, nothing copied.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])}
    # SIGINT handled as at a terminal even where this run came in with it ignored (a shell's
    # background job, a CI step's), which the child would inherit and never be interrupted.
    argv = [sys.executable, "-c", STARTER, "-p", "conftest", "-p", "no:cacheprovider", "-q", "test_probe.py"]
    with output.open("wb") as sink:
        run = await trio.lowlevel.open_process(argv, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
    try:
        with trio.fail_after(60):
            await wait_until(lambda: (tmp_path / "first-started").exists(), timeout=30)
            run.send_signal(signal.SIGINT)
            code = await run.wait()
    finally:
        if run.poll() is None:
            run.kill()
            await run.wait()
    said = output.read_text()
    assert code == pytest.ExitCode.INTERRUPTED, said
    assert not (tmp_path / "second-started").exists(), said
    assert "KeyboardInterrupt" in said
