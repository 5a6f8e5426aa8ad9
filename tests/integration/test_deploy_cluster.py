"""deploy/cluster-local.py, the local cluster recipe (docs/deploy.md), run as a person runs it.

A real process each time: the script brings up PostgreSQL (primary and synchronous standby),
the fixture server and two nodes, and shows a takeover. What it promises is checked from
outside: it exits 0, it printed the takeover's time (and that time is within the lease plus a
handshake), and once it is gone nothing of it is left: no process of its directories, no pid
it named, no port it printed listening, no directory.

- Run through: the takeover, then everything stopped.
- ``--keep``, then Ctrl-C (SIGINT) once it says it is left running: everything stopped too.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from mcpl_router.testing import postgres

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[2] / "deploy" / "cluster-local.py"
#: The lease the script runs with by default, and the documented goal beyond it (a handshake).
LEASE = 5.0
HANDSHAKE = 5.0


def start_script(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def stop(script: subprocess.Popen[str]) -> None:
    """When the test failed with the script still running: asked to stop (it removes what it
    made), killed only if it does not (its processes die with it, its directories stay)."""
    if script.poll() is None:
        script.send_signal(signal.SIGINT)
        try:
            script.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            script.kill()
            script.communicate()


def left_behind(output: str) -> list[str]:
    """What of the script's run is still there: processes, directories, listening ports."""
    directories = re.findall(r"working directory (\S+)", output) + re.findall(r"data in (\S+)", output)
    assert len(directories) == 2, output  # its own, and PostgreSQL's
    pids = {int(pid) for pid in re.findall(r"\bpids? (\d+)", output)}
    pids |= {int(pid) for pid in re.findall(r"\bpids \d+, (\d+)", output)}
    assert len(pids) >= 6, output  # primary, standby, fixture, two nodes, the killed node again
    ports = {int(port) for port in re.findall(r"127\.0\.0\.1:(\d+)", output)}
    assert len(ports) >= 5, output  # two PostgreSQL, the fixture, two health listeners
    found = [f"directory {d}" for d in directories if Path(d).exists()]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if any(d in command or cwd.startswith(d) for d in directories):
            found.append(f"process {entry.name}: {command}")
        elif int(entry.name) in pids and "mcpl" in command + cwd:
            found.append(f"process {entry.name} it started: {command}")
    for port in sorted(ports):
        with socket.socket() as probe:
            probe.settimeout(1)
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                found.append(f"port {port} listening")
    return found


def readyz(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=5) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as refused:
        return int(refused.code), refused.read().decode()


def test_the_recipe_shows_a_takeover_and_leaves_nothing_behind() -> None:
    postgres.require()
    script = start_script()
    try:
        output, _ = script.communicate(timeout=240)
    finally:
        stop(script)
    print(output)
    assert script.returncode == 0, output
    taken = re.search(r"^\[.*\] takeover: (\d+\.\d+) s from kill -9 to the other node ready", output, re.MULTILINE)
    assert taken is not None, output
    assert float(taken.group(1)) <= LEASE + HANDSHAKE, output
    # The killed node came back, and the other stayed the holder: it waits as a standby.
    assert re.search(r"standby: node (a|b) holds the links \(epoch 2\)", output), output
    assert left_behind(output) == []


def test_kept_running_it_stops_everything_on_ctrl_c() -> None:
    postgres.require()
    script = start_script("--keep")
    lines: list[str] = []
    # A script that never gets there is asked to stop (its output then ends, and the test fails).
    watchdog = threading.Timer(240, script.send_signal, (signal.SIGINT,))
    watchdog.start()
    try:
        assert script.stdout is not None
        for line in script.stdout:
            lines.append(line)
            if "left running until Ctrl-C" in line:
                break
        watchdog.cancel()
        assert any("left running until Ctrl-C" in line for line in lines), "".join(lines)
        # What a person would try: the holder's /readyz answers ready.
        health = re.findall(r"curl -s (http://127\.0\.0\.1:\d+)/readyz", "".join(lines))
        assert len(health) == 2, "".join(lines)
        answers = [readyz(url) for url in health]
        assert sorted(code for code, _ in answers) == [200, 503], answers
        assert any("standby: node" in text for _, text in answers), answers
        script.send_signal(signal.SIGINT)
        rest, _ = script.communicate(timeout=60)
    finally:
        watchdog.cancel()
        stop(script)
    output = "".join(lines) + rest
    print(output)
    assert script.returncode == 0, output
    assert "asked to stop (Ctrl-C or SIGTERM)" in output, output
    assert left_behind(output) == []
