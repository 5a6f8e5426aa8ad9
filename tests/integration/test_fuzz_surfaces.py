"""Fuzz both JSON-RPC surfaces of a running daemon process: no input escapes a handler.

One daemon process and one fixture MCPL server (TCP) serve every example. Hypothesis writes
lines at the daemon: on the host Unix socket directly, and on the server link through the
fixture (which writes them raw, as a server would). Each line is a well-formed request with
random method and params, a malformed message, or bytes that are not JSON at all. After
every example:
- every well-formed request got an answer with its own id (a result or an error);
- the connection is still up and answers ``status``;
- the daemon is alive and logged no ``jsonrpc.handler.crashed`` (an input that makes a handler
  raise something it didn't mean to is a bug, even though the peer answers it -32603).

The CI profile is small; ``MCPL_ROUTER_FUZZ_EXAMPLES=2000 python -m pytest
tests/integration/test_fuzz_surfaces.py`` is the long run.
"""

from __future__ import annotations

import json
import os
import queue
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import daemon_process, wait_daemon_ready, write_config

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("MCPL_ROUTER_FUZZ_EXAMPLES", "25"))

HOST_METHODS = ["status", "servers/list", "channels/list", "explain", "session/hello", "wake/ack", "turn/open",
                "turn/context", "turn/text", "turn/round", "turn/tool", "turn/close", "channels/typing",
                "channels/publish"]
SERVER_METHODS = ["channels/register", "channels/changed", "channels/incoming", "channels/list", "push/event",
                  "mcpl/manifestChanged", "ping", "notifications/tools/list_changed", "notifications/message"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


def params_for(methods: list[str]) -> st.SearchStrategy[Any]:
    # Plausible field names, so random params get past the first checks into the handlers.
    keys = st.sampled_from(["agent", "turnId", "channel", "channelId", "serverId", "messages", "channels", "name",
                            "host", "agents", "seq", "seqs", "round", "delta", "op", "content", "eventId", "origin",
                            "added", "removed", "updated", "wakes", "outcome", "callId", "arguments", "text"])
    return st.one_of(json_values, st.dictionaries(keys, json_values, max_size=5))


def requests(methods: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"jsonrpc": st.just("2.0"), "method": st.sampled_from(methods) | st.text(max_size=15)},
        optional={"params": params_for(methods)},
    )


malformed = st.one_of(
    st.binary(max_size=60).filter(lambda b: b"\n" not in b and b"\r" not in b),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.integers(1, 3000).map(lambda depth: b'{"jsonrpc":"2.0","id":1,"method":"status","params":' + b"[" * depth + b"]" * depth + b"}"),
    st.just(b'{"jsonrpc":"2.0","id":"x","method":"status","params":{"k":"\xed\xb3\xbf"}}'),
)


def lines(methods: list[str]) -> st.SearchStrategy[list[tuple[str, Any]]]:
    return st.lists(
        st.one_of(requests(methods).map(lambda r: ("request", r)), malformed.map(lambda m: ("raw", m))),
        min_size=1,
        max_size=8,
    )


class Live:
    """The daemon process and fixture, run by a trio loop in a thread of their own."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.socket = str(workdir / "run" / "host.sock")
        self.log = workdir / "daemon.log"
        self._started: queue.Queue[Any] = queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: trio.run(self._main), daemon=True)
        self.server: FixtureProcess | None = None
        self.token: Any = None
        self.next_id = 0

    def __enter__(self) -> Live:
        self._thread.start()
        failure = self._started.get(timeout=90)
        if failure is not None:
            raise failure
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    async def _main(self) -> None:
        try:
            async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=self.workdir) as server:
                assert server.listen_url is not None
                config = write_config(self.workdir, server.listen_url)
                async with daemon_process(config, self.log) as daemon:
                    await daemon.start()
                    await wait_daemon_ready(self.socket)
                    self.server = server
                    self.daemon = daemon
                    self.token = trio.lowlevel.current_trio_token()
                    self._started.put(None)
                    await trio.to_thread.run_sync(self._stop.wait)
        except BaseException as exc:  # surfaced to the test thread
            self._started.put(exc)
            raise

    def on_loop(self, fn: Any, *args: Any) -> Any:
        return trio.from_thread.run(fn, *args, trio_token=self.token)

    def fresh_id(self) -> str:
        self.next_id += 1
        return f"fz-{self.next_id}"

    def crashes(self) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if '"jsonrpc.handler.crashed"' in line]

    def alive(self) -> bool:
        process = self.daemon.process
        return process is not None and process.poll() is None


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="mr-fz-", dir="/tmp") as directory, Live(Path(directory)) as running:
        yield running


def host_exchange(live: Live, batch: list[tuple[str, Any]]) -> None:
    expected: set[str] = set()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(15)
        conn.connect(live.socket)
        for kind, item in batch:
            if kind == "request":
                request_id = live.fresh_id()
                expected.add(request_id)
                conn.sendall(json.dumps({**item, "id": request_id}).encode() + b"\n")
            else:
                conn.sendall(item + b"\n")
        probe = live.fresh_id()
        conn.sendall(json.dumps({"jsonrpc": "2.0", "id": probe, "method": "status"}).encode() + b"\n")
        expected.add(probe)
        buffer = b""
        answered: set[str] = set()
        while not expected <= answered:
            chunk = conn.recv(65536)
            assert chunk, f"the daemon closed the connection; still unanswered: {sorted(expected - answered)}"
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for line in complete:
                message = json.loads(line)
                if isinstance(message.get("id"), str):
                    answered.add(message["id"])


def server_exchange(live: Live, batch: list[tuple[str, Any]]) -> None:
    server = live.server
    assert server is not None
    expected: set[str] = set()
    for kind, item in batch:
        if kind == "request":
            request_id = live.fresh_id()
            expected.add(request_id)
            live.on_loop(server.send_raw, json.dumps({**item, "id": request_id}) + "\n")
        else:
            live.on_loop(server.send_bytes, item + b"\n")
    probe = live.fresh_id()
    live.on_loop(server.send_raw, json.dumps({"jsonrpc": "2.0", "id": probe, "method": "ping"}) + "\n")
    expected.add(probe)

    async def all_answered() -> None:
        async def answered() -> bool:
            answers = {entry["id"] for entry in await server.recorded() if entry["kind"] == "answer"}
            return expected <= answers

        await wait_until(answered, timeout=15)

    live.on_loop(all_answered)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=lines(HOST_METHODS))
def test_the_host_socket_answers_every_request_and_stays_up(live: Live, batch: list[tuple[str, Any]]) -> None:
    host_exchange(live, batch)
    assert live.alive()
    assert not live.crashes()


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=lines(SERVER_METHODS))
def test_the_server_link_answers_every_request_and_stays_up(live: Live, batch: list[tuple[str, Any]]) -> None:
    server_exchange(live, batch)
    assert live.alive()
    assert not live.crashes()
    status = live.on_loop(_status, live.socket)
    [link] = status["servers"]
    assert link["state"] == "ready" and link["epoch"] == 1


async def _status(path: str) -> Any:
    from mcpl_router.client import RouterClient

    async with RouterClient.connect_unix(path) as client:
        return await client.call("status")
