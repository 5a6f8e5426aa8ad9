"""systemd's notify protocol (issue 25 item 7): a daemon process started with ``$NOTIFY_SOCKET``
sends ``READY=1`` once serving, ``WATCHDOG=1`` at half of ``$WATCHDOG_USEC``, and ``STOPPING=1``
when SIGTERM starts its drain, each a datagram on the socket this test made."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import trio

from mcpl_router.supervision import SystemdNotifier

from .conftest import daemon_process, wait_daemon_ready, write_config

pytestmark = pytest.mark.integration


async def _datagrams_until(sock: trio.socket.SocketType, wanted: str, seen: list[str]) -> None:
    while not any(wanted in datagram.split("\n") for datagram in seen):
        seen.append((await sock.recv(4096)).decode())


async def test_a_daemon_under_systemd_says_ready_watchdog_and_stopping(short_tmp: Path) -> None:
    notify_path = short_tmp / "notify.sock"
    with trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        await sock.bind(str(notify_path))
        config = write_config(short_tmp, None)
        env = {**os.environ, "NOTIFY_SOCKET": str(notify_path), "WATCHDOG_USEC": "200000"}
        seen: list[str] = []
        with trio.fail_after(60):
            async with daemon_process(config, short_tmp / "daemon.log", env=env) as daemon:
                await daemon.start()
                await wait_daemon_ready(str(short_tmp / "run" / "host.sock"), servers=0)
                await _datagrams_until(sock, "READY=1", seen)
                # Two pings after READY: the watchdog keeps going, not a single datagram.
                after_ready = len(seen)
                while sum(datagram == "WATCHDOG=1" for datagram in seen[after_ready - 1 :]) < 2:
                    seen.append((await sock.recv(4096)).decode())
                assert not any("STOPPING=1" in datagram for datagram in seen), seen
                await daemon.stop()
                await _datagrams_until(sock, "STOPPING=1", seen)
    ready = next(i for i, datagram in enumerate(seen) if "READY=1" in datagram.split("\n"))
    stopping = next(i for i, datagram in enumerate(seen) if "STOPPING=1" in datagram.split("\n"))
    assert ready < stopping
    assert "STATUS=serving" in seen[ready].split("\n")


def test_a_watchdog_for_another_process_is_not_pinged_by_this_one() -> None:
    # A stdio server the daemon started inherits the variables; WATCHDOG_PID says whose they are.
    env = {"NOTIFY_SOCKET": "/run/x", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid() + 1)}
    assert SystemdNotifier.from_environ(env).watchdog_interval is None
    env["WATCHDOG_PID"] = str(os.getpid())
    assert SystemdNotifier.from_environ(env).watchdog_interval == 0.5
    assert SystemdNotifier.from_environ({}).address is None


def test_an_abstract_socket_address_and_a_vanished_socket(tmp_path: Path) -> None:
    name = f"@mcpl-router-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name[1:])
        SystemdNotifier(name).notify("READY=1", "STATUS=serving")
        assert sock.recv(4096) == b"READY=1\nSTATUS=serving"
    gone = SystemdNotifier(str(tmp_path / "nobody.sock"))
    gone.notify("READY=1")  # logged and counted, never raised: systemd may have gone away
    assert gone.failures == 1
