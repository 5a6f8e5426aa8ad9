"""One log stream (issue 25 item 8): a dependency's stdlib ``logging`` record comes out of the
daemon's stderr as the same JSON line as the daemon's own events."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from mcpl_router.testing.control import FixtureProcess

from .conftest import daemon_process, wait_daemon_ready, write_config

pytestmark = pytest.mark.integration


async def test_trio_websockets_records_are_json_lines_in_the_daemons_stderr(short_tmp: Path) -> None:
    # A server dialled over WebSocket: trio-websocket logs (stdlib, debug) as the link talks.
    with trio.fail_after(60):
        async with FixtureProcess.start(transport="ws", personality="strict", channels=["general"], control_dir=short_tmp) as fixture:
            config = write_config(short_tmp, fixture.listen_url)  # debug, JSON
            log = short_tmp / "daemon.log"
            async with daemon_process(config, log) as daemon:
                await daemon.start()
                await wait_daemon_ready(str(short_tmp / "run" / "host.sock"))
    lines = log.read_text().splitlines()
    entries = [json.loads(line) for line in lines]  # every line is JSON: no stdlib default format
    ours = [entry for entry in entries if entry.get("event") == "link.state"]
    theirs = [entry for entry in entries if entry.get("logger") == "trio-websocket"]
    assert ours and theirs, lines[:20]
    assert {"level", "timestamp", "event"} <= set(theirs[0]) and theirs[0]["level"] == "debug"
