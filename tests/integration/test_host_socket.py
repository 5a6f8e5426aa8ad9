"""The host Unix socket answers every line: a non-JSON line from a host gets -32700."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from mcpl_router.jsonrpc import NdjsonStream

from .conftest import running_daemon

pytestmark = pytest.mark.integration


async def test_a_hosts_non_json_line_is_answered_and_the_connection_stays(short_tmp: Path) -> None:
    with trio.fail_after(20):
        async with running_daemon(short_tmp, {}, unix_socket=True) as daemon:
            assert daemon.host_socket_path is not None
            stream = await trio.open_unix_socket(daemon.host_socket_path)
            framed = NdjsonStream(stream, stream)
            try:
                await stream.send_all(b"oops not json\n")
                answer = json.loads(await framed.receive_message())
                assert answer["error"]["code"] == -32700 and answer["id"] is None
                await stream.send_all(b'{"jsonrpc": "2.0", "id": 1, "method": "status", "params": {}}\n')
                assert json.loads(await framed.receive_message())["result"]["version"]
            finally:
                await stream.aclose()
