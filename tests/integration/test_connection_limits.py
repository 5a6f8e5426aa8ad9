"""Connections cannot exhaust the daemon (issue 26 items 4, 5), through ``mcpl-router run`` as a
real process and raw Unix-socket connections: a cap per listener and on the bytes of unfinished
messages held together (over it: new connections refused with the reason, the connected served
on), deadlines for a partial message and for a connection that never says hello, memory given
back after the connections close, and a lack of file descriptors said in one rate-limited line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.testing.control import wait_until

from .conftest import DaemonProcess, daemon_process, wait_daemon_ready, write_config

pytestmark = pytest.mark.integration


def _config(workdir: Path, **host: Any) -> Path:
    return write_config(workdir, None, host=host)


async def _status(socket_path: str) -> Any:
    async with RouterClient.connect_unix(socket_path, timeout=10) as probe:
        return await probe.call("status", {})


async def _connect(socket_path: str) -> trio.SocketStream:
    return await trio.open_unix_socket(socket_path)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@asynccontextmanager
async def _running(workdir: Path, config: Path) -> AsyncIterator[tuple[DaemonProcess, str]]:
    socket_path = str(workdir / "run" / "host.sock")
    async with daemon_process(config, workdir / "daemon.log") as daemon:
        await daemon.start()
        await wait_daemon_ready(socket_path, servers=0)
        yield daemon, socket_path


async def test_a_connection_over_the_cap_is_refused_with_its_reason_and_the_connected_go_on(short_tmp: Path) -> None:
    with trio.fail_after(60):
        async with _running(short_tmp, _config(short_tmp, maxConnections=5)) as (_daemon, socket_path):
            async with AsyncExitStack() as stack:
                # Four connections, each answered (so each holds a slot; the readiness probes'
                # slots may take a moment to come back: until then one is refused, and tried
                # again)...
                held = 0
                with trio.fail_after(10):
                    while held < 4:
                        stream = await _connect(socket_path)
                        stack.push_async_callback(stream.aclose)
                        await stream.send_all(b'{"jsonrpc":"2.0","id":1,"method":"status","params":{}}\n')
                        if b'"result"' in await stream.receive_some(65536):
                            held += 1
                        else:
                            await trio.sleep(0.1)
                # ...and a host on the fifth.
                host = None
                give_up = trio.current_time() + 10
                while host is None:
                    # No cancel scope around it: the client's nursery lives on in the stack.
                    assert trio.current_time() < give_up, "the fifth connection was never admitted"
                    client = await stack.enter_async_context(RouterClient.connect_unix(socket_path, timeout=10))
                    try:
                        await client.hello("t", ["ann"])
                        host = client
                    except Exception:
                        await trio.sleep(0.1)
                # The sixth is refused, saying why; then closed.
                extra = await _connect(socket_path)
                refusal = await extra.receive_some(4096)
                assert b"too-many-connections" in refusal and b"-32000" in refusal, refusal
                assert await extra.receive_some(4096) == b""
                await extra.aclose()
                # The connected are served on.
                assert (await host.status()).version
            # Slots come back as the daemon sees the closes.
            async def answers() -> bool:
                try:
                    await _status(socket_path)
                except Exception:
                    return False
                return True

            await wait_until(answers, timeout=10)
            status = await _status(socket_path)
            assert status["hosts"]["admission"]["refused"].get("too-many-connections", 0) >= 1
    log = (short_tmp / "daemon.log").read_text()
    assert '"event":"host.connection.refused"' in log


async def test_partial_messages_over_the_byte_budget_refuse_new_connections_not_the_connected(short_tmp: Path) -> None:
    with trio.fail_after(60):
        config = _config(short_tmp, maxBufferedBytes=1024 * 1024, partialMessageTimeout=60, helloTimeout=60)
        async with _running(short_tmp, config) as (_daemon, socket_path):
            holders = []
            for _ in range(3):
                stream = await _connect(socket_path)
                await stream.send_all(b'{"jsonrpc":"2.0","id":1,"method":"status","params":{"pad":"' + b"x" * 400_000)
                holders.append(stream)

            async def refused() -> bool:
                probe = await _connect(socket_path)
                try:
                    with trio.move_on_after(2):
                        return b"buffered-bytes-over-budget" in await probe.receive_some(4096)
                    return False
                finally:
                    await probe.aclose()

            await wait_until(refused, timeout=10, interval=0.1)
            # A connected one finishes its message and is answered.
            await holders[0].send_all(b'"}}\n')
            answer = await holders[0].receive_some(65536)
            assert b'"result"' in answer and b'"version"' in answer, answer[:200]
            for stream in holders:
                await stream.aclose()

            async def admitted_again() -> bool:
                return (await _status(socket_path))["hosts"]["admission"]["bufferedBytes"] == 0

            await wait_until(admitted_again, timeout=10)


async def test_a_partial_message_and_a_silent_connection_without_hello_are_closed_at_their_deadlines(short_tmp: Path) -> None:
    with trio.fail_after(60):
        config = _config(short_tmp, partialMessageTimeout=1, helloTimeout=1)
        async with _running(short_tmp, config) as (_daemon, socket_path):
            slow = await _connect(socket_path)
            await slow.send_all(b'{"jsonrpc":"2.0","id":1,"meth')
            silent = await _connect(socket_path)
            with trio.fail_after(10):
                assert await slow.receive_some(4096) == b""
                assert await silent.receive_some(4096) == b""
            await slow.aclose()
            await silent.aclose()
            # A host that says hello is not closed for its silence afterwards.
            async with RouterClient.connect_unix(socket_path, timeout=10) as host:
                await host.hello("t", ["ann"])
                await trio.sleep(2.5)
                assert (await host.status()).version
            closed = (await _status(socket_path))["hosts"]["admission"]["closed"]
            assert closed == {"partial-message-timeout": 1, "no-hello": 1}, closed


async def test_memory_held_by_partial_messages_is_given_back_after_they_close(short_tmp: Path) -> None:
    with trio.fail_after(120):
        config = _config(short_tmp, maxConnections=400, maxBufferedBytes=512 * 1024 * 1024, partialMessageTimeout=60, helloTimeout=60)
        async with _running(short_tmp, config) as (daemon, socket_path):
            assert daemon.process is not None
            pid = daemon.process.pid
            await _status(socket_path)
            before = _rss_kib(pid)
            streams = []
            for _ in range(150):
                stream = await _connect(socket_path)
                await stream.send_all(b'{"jsonrpc":"2.0","id":1,"method":"status","params":{"pad":"' + b"x" * 1_000_000)
                streams.append(stream)

            async def all_held() -> bool:
                return (await _status(socket_path))["hosts"]["admission"]["bufferedBytes"] >= 140_000_000

            await wait_until(all_held, timeout=60, interval=0.2)
            during = _rss_kib(pid)
            for stream in streams:
                await stream.aclose()

            async def released() -> bool:
                return (await _status(socket_path))["hosts"]["admission"]["bufferedBytes"] == 0

            await wait_until(released, timeout=30)
            await trio.sleep(0.5)
            after = _rss_kib(pid)
    assert during - before > 100_000, (before, during)  # the test held what it meant to
    # Given back: what stays is a small fraction of what was held (not the +134 MiB seen).
    assert after - before < 24_000, (before, during, after)


@pytest.mark.skipif(shutil.which("prlimit") is None, reason="prlimit (util-linux) is not installed")
async def test_out_of_file_descriptors_is_one_rate_limited_line_not_a_traceback_a_try(short_tmp: Path) -> None:
    config = _config(short_tmp, maxConnections=1000, helloTimeout=60)
    socket_path = str(short_tmp / "run" / "host.sock")
    log_path = short_tmp / "daemon.log"
    with trio.fail_after(90):
        with log_path.open("ab") as log:
            process = await trio.lowlevel.open_process(
                ["prlimit", "--nofile=64:64", sys.executable, "-m", "mcpl_router", "run", "--config", str(config)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            )
        try:
            await wait_daemon_ready(socket_path, servers=0)
            streams = []
            for _ in range(80):
                try:
                    streams.append(await _connect(socket_path))
                except OSError:
                    break
            await trio.sleep(2.5)  # the daemon keeps failing to accept the rest meanwhile
            for stream in streams:
                await stream.aclose()

            async def answers() -> bool:
                try:
                    await _status(socket_path)
                except OSError:
                    return False
                return True

            await wait_until(answers, timeout=20)
            status = await _status(socket_path)
            assert status["hosts"]["admission"]["descriptorPauses"] > 0
        finally:
            process.terminate()
            with trio.move_on_after(10):
                await process.wait()
            if process.poll() is None:
                process.kill()
                await process.wait()
    lines = log_path.read_text().splitlines()
    assert "Traceback" not in "\n".join(lines)
    told = [json.loads(line) for line in lines if '"host.accept.out_of_descriptors"' in line]
    assert told and told[0]["error"].startswith("out of file descriptors: ") and ", limit 64" in told[0]["error"]
    # Rate-limited: about one a second over the seconds it lasted, not ten a second.
    assert len(told) <= 8, len(told)
