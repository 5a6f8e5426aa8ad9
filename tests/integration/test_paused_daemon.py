"""A publish answered in time is not a timeout (issue 26 item 6): the daemon process stopped
(SIGSTOP) past a publish's deadline while the server's answer, sent in time, waits unread in
the socket. After SIGCONT the publish is delivered, not ``unconfirmed``/``timeout``."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import FAST_RECONNECT, daemon_process, wait_daemon_ready, write_config

pytestmark = pytest.mark.integration


async def test_an_answer_waiting_in_the_socket_through_a_pause_is_taken(short_tmp: Path) -> None:
    with trio.fail_after(90):
        async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp) as fixture:
            config = write_config(short_tmp, None, servers={"s": {"url": fixture.listen_url, "reconnect": FAST_RECONNECT, "requestTimeout": 3}})
            socket_path = str(short_tmp / "run" / "host.sock")
            async with daemon_process(config, short_tmp / "daemon.log") as daemon:
                await daemon.start()
                await wait_daemon_ready(socket_path)
                assert daemon.process is not None
                # The server answers 1.7 s after the publish: inside the 3 s deadline.
                await fixture.configure(publish={"delayMs": 1700})
                async with RouterClient.connect_unix(socket_path, timeout=60) as host:
                    await host.hello("t", ["ann"])
                    async with trio.open_nursery() as nursery:
                        results = []

                        async def publish() -> None:
                            results.append(await host.publish("ann", "general", "through a pause"))

                        nursery.start_soon(publish)
                        await wait_until(lambda: _published(fixture), timeout=10, interval=0.05)
                        # Stopped before the answer comes, and kept stopped past the deadline.
                        os.kill(daemon.process.pid, signal.SIGSTOP)
                        try:
                            await trio.sleep(8)
                        finally:
                            os.kill(daemon.process.pid, signal.SIGCONT)
                    [result] = results
                    assert result.delivered is True and result.reason is None, result
    log = (short_tmp / "daemon.log").read_text()
    assert '"event":"jsonrpc.request.answered_after_a_pause"' in log
    assert '"event":"jsonrpc.response.unmatched"' not in log


async def _published(fixture: FixtureProcess) -> bool:
    return bool(await fixture.recorded("channels/publish"))
