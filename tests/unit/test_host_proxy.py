"""A standby's forwarding of host connections (cluster/host_proxy.py), in one trio run.

The pump on in-memory streams (both ways, a host's half-close, the holder's close, the bound on
what it holds); the proxy on real Unix and TCP sockets on loopback, forwarding to a holder that
echoes what it reads: forwarded byte for byte, closed when the holder changes or the standby
phase ends (its socket file gone), refused with the host's own request id when no node holds
the lease or the holder can't be reached, and over ``host.maxConnections``. The whole path
through two real nodes is tests/integration/test_cluster_host_proxy.py.
"""

from __future__ import annotations

import json
import socket
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
import trio_websocket
from structlog.testing import capture_logs

from mcpl_router.client import RouterClient
from mcpl_router.cluster.host_proxy import (
    HOLDER_CHANGED,
    HOLDER_CLOSED,
    HOST_CLOSED,
    STANDBY_ENDED,
    HolderAddress,
    HostProxy,
    holder_in_view,
    splice,
)
from mcpl_router.config import HostConfig, WebSocketListenConfig

HOSTNAME = socket.gethostname()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # Unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="mr-", dir="/tmp") as directory:
        yield Path(directory)


# -- the holder in a node's view -----------------------------------------------------------------


def _view(*, node: str = "a", expires_in: float = 3.0, info: dict[str, Any] | None = None) -> dict[str, object]:
    info = {"hostname": "h1", "hostSocket": "/run/a.sock", "websocket": "ws://127.0.0.1:8765/"} if info is None else info
    return {
        "nodes": [{"node": "a", "state": "holding", "info": info}, {"node": "b", "state": "standby", "info": {}}],
        "leases": [{"scope": "links", "node": node, "epoch": 3, "since": 0.0, "expiresIn": expires_in}],
    }


def test_the_holder_is_read_from_the_lease_and_its_heartbeat_row() -> None:
    assert holder_in_view(_view(), this_node="b") == HolderAddress("a", 3, "h1", "/run/a.sock", "ws://127.0.0.1:8765/")
    assert holder_in_view(_view(info={"hostSocket": None}), this_node="b") == HolderAddress("a", 3, None, None, None)


@pytest.mark.parametrize(
    "view",
    [
        {"nodes": [], "leases": []},  # no lease yet
        _view(expires_in=-0.5),  # expired: no node holds the links now
        _view(node="b"),  # this node's own (a term that just ended): never forwarded to itself
        {},
    ],
    ids=["no-lease", "expired", "this-node", "empty"],
)
def test_no_holder_when_the_lease_is_nobodys_or_this_nodes(view: dict[str, object]) -> None:
    assert holder_in_view(view, this_node="b") is None


# -- the pump ------------------------------------------------------------------------------------


async def _read_exactly(stream: trio.abc.ReceiveStream, size: int) -> bytes:
    data = b""
    while len(data) < size:
        more = await stream.receive_some(size - len(data))
        assert more, f"end of file after {data!r}"
        data += more
    return data


async def test_the_pump_copies_both_ways_and_passes_a_hosts_end_of_file_on() -> None:
    host, host_side = trio.testing.memory_stream_pair()
    holder_side, holder = trio.testing.memory_stream_pair()
    ended: list[str] = []
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:

            async def run() -> None:
                ended.append(await splice(host_side, holder_side))

            nursery.start_soon(run)
            await host.send_all(b'{"id":1}\n')
            assert await _read_exactly(holder, 9) == b'{"id":1}\n'
            await holder.send_all(b"first answer\n")
            assert await _read_exactly(host, 13) == b"first answer\n"
            # The host is done writing (a half-close): the holder reads its end of file, and what
            # its last requests earned still reaches the host.
            await host.send_eof()
            assert await holder.receive_some(10) == b""
            await holder.send_all(b"late answer\n")
            assert await _read_exactly(host, 12) == b"late answer\n"
            await holder.aclose()
            assert await host.receive_some(10) == b""
    assert ended == [HOST_CLOSED]


async def test_the_holders_close_ends_the_connection_both_ways() -> None:
    host, host_side = trio.testing.memory_stream_pair()
    holder_side, holder = trio.testing.memory_stream_pair()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            ended: list[str] = []

            async def run() -> None:
                ended.append(await splice(host_side, holder_side))

            nursery.start_soon(run)
            await holder.send_all(b"bye\n")
            await holder.aclose()
            assert await _read_exactly(host, 4) == b"bye\n"
            assert await host.receive_some(10) == b""
    assert ended == [HOLDER_CLOSED]


async def test_the_pump_holds_at_most_a_chunk_for_a_host_that_does_not_read() -> None:
    """Lockstep streams: a write completes only once the other end has read it. With the host
    not reading, the holder gets one piece (at most a chunk) off its hands, then waits."""
    chunk, piece = 4096, 1024
    host, host_side = trio.testing.lockstep_stream_pair()
    holder_side, holder = trio.testing.lockstep_stream_pair()
    written = 0
    total = 64 * piece

    async def write() -> None:
        nonlocal written
        for index in range(total // piece):
            await holder.send_all(bytes([index % 256]) * piece)
            written += piece

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(splice, host_side, holder_side, chunk=chunk))
            nursery.start_soon(write)
            await trio.testing.wait_all_tasks_blocked()
            assert 0 < written <= chunk
            # Once the host reads, everything arrives, in order.
            received = await _read_exactly(host, total)
            assert received == b"".join(bytes([index % 256]) * piece for index in range(total // piece))
            nursery.cancel_scope.cancel()


# -- the proxy on real sockets -------------------------------------------------------------------


@asynccontextmanager
async def echo_holder(path: Path) -> AsyncIterator[list[trio.SocketStream]]:
    """A stand-in for the holder's daemon: echoes what it reads, on a Unix socket."""
    listener_socket = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener_socket.bind(str(path))
    listener_socket.listen(16)
    accepted: list[trio.SocketStream] = []

    async def echo(stream: trio.SocketStream) -> None:
        accepted.append(stream)
        async with stream:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, echo, [trio.SocketListener(listener_socket)])
        yield accepted
        nursery.cancel_scope.cancel()


class Holder:
    """What the node's view says now (the callable the proxy is given)."""

    def __init__(self, address: HolderAddress | None) -> None:
        self.address = address

    def __call__(self) -> HolderAddress | None:
        return self.address


@asynccontextmanager
async def proxy_serving(host: HostConfig, holder: Holder) -> AsyncIterator[tuple[HostProxy, trio.Event]]:
    """The proxy in its standby phase until the yielded event is set."""
    proxy = HostProxy("b", holder, recheck=0.05)
    stop = trio.Event()

    async def standby() -> str:
        await stop.wait()
        return "taken"

    async with trio.open_nursery() as nursery:

        async def run() -> None:
            assert await proxy.serve_during(host, standby) == "taken"

        nursery.start_soon(run)
        wanted = (host.unix_socket is not None) + (host.websocket is not None)
        while len(proxy.listening) < wanted:
            await trio.sleep(0.01)
        yield proxy, stop
        stop.set()


def unix_host(path: Path, **bounds: Any) -> HostConfig:
    return HostConfig(websocket=None, unix_socket=path, token_file=None, **bounds)


async def read_line(stream: trio.SocketStream) -> dict[str, Any]:
    data = b""
    while not data.endswith(b"\n"):
        more = await stream.receive_some(4096)
        assert more, f"end of file after {data!r}"
        data += more
    return json.loads(data)


async def test_a_connection_is_forwarded_byte_for_byte_and_closed_when_the_holder_changes(short_tmp: Path) -> None:
    holder_path = short_tmp / "a.sock"
    holder = Holder(HolderAddress("a", 1, HOSTNAME, str(holder_path), None))
    with trio.fail_after(10), capture_logs() as logs:
        async with echo_holder(holder_path), proxy_serving(unix_host(short_tmp / "run" / "b.sock"), holder) as (proxy, _):
            stream = await trio.open_unix_socket(str(short_tmp / "run" / "b.sock"))
            payload = b'{"jsonrpc":"2.0","id":1,"method":"status"}\n' * 1000
            async with trio.open_nursery() as nursery:
                nursery.start_soon(stream.send_all, payload)
                assert await _read_exactly(stream, len(payload)) == payload
            assert proxy.statistics() == {"listening": [str(short_tmp / "run" / "b.sock")], "open": 1, "total": 1, "refused": {}, "closed": {}}
            # A takeover the heartbeat saw: the forwarded connection is closed, both ways.
            holder.address = HolderAddress("a", 2, HOSTNAME, str(holder_path), None)
            assert await stream.receive_some(10) == b""
            await stream.aclose()
            await trio.testing.wait_all_tasks_blocked()
            assert proxy.statistics()["closed"] == {HOLDER_CHANGED: 1}
    closed = [line for line in logs if line["event"] == "cluster.proxy.closed"]
    assert [(line["holder"], line["epoch"], line["reason"]) for line in closed] == [("a", 1, HOLDER_CHANGED)]


async def test_the_standby_phase_ends_with_every_listener_and_connection_closed(short_tmp: Path) -> None:
    holder_path, own = short_tmp / "a.sock", short_tmp / "run" / "b.sock"
    holder = Holder(HolderAddress("a", 1, HOSTNAME, str(holder_path), None))
    with trio.fail_after(10):
        async with echo_holder(holder_path) as accepted:
            async with proxy_serving(unix_host(own), holder) as (proxy, stop):
                stream = await trio.open_unix_socket(str(own))
                await stream.send_all(b"ping\n")
                assert await _read_exactly(stream, 5) == b"ping\n"
                stop.set()  # this node took the lease
            # serve_during has returned: the socket file is gone and the host's connection ended.
            assert not own.exists()
            assert await stream.receive_some(10) == b""
            await stream.aclose()
            assert proxy.statistics()["closed"] == {STANDBY_ENDED: 1}
            with pytest.raises(OSError):
                await trio.open_unix_socket(str(own))
            assert len(accepted) == 1


async def test_a_standby_with_no_holder_answers_the_first_request_with_a_refusal(short_tmp: Path) -> None:
    own = short_tmp / "run" / "b.sock"
    with trio.fail_after(10), capture_logs() as logs:
        async with proxy_serving(unix_host(own), Holder(None)) as (proxy, _):
            stream = await trio.open_unix_socket(str(own))
            await stream.send_all(b'{"jsonrpc":"2.0","id":7,"method":"session/hello","params":{"host":"h","agents":[]}}\n')
            answer = await read_line(stream)
            assert await stream.receive_some(10) == b""  # then closed
            await stream.aclose()
            assert proxy.statistics()["refused"] == {"no-holder": 1}
    assert answer == {
        "jsonrpc": "2.0",
        "id": 7,
        "error": {
            "code": -32000,
            "message": "node b is a standby and no node holds the links now; try another node",
            "data": {"reason": "no-holder", "node": "b"},
        },
    }
    [said] = [line for line in logs if line["event"] == "cluster.proxy.refused"]
    assert (said["reason"], said["holder"], said["refused"]) == ("no-holder", None, 1)


@pytest.mark.parametrize(
    ("address", "because"),
    [
        (HolderAddress("a", 1, HOSTNAME, "{tmp}/gone.sock", None), "{tmp}/gone.sock can't be reached (No such file or directory)"),
        (HolderAddress("a", 1, "elsewhere", "/run/a.sock", None), f"its Unix socket /run/a.sock is on elsewhere, not on this machine ({HOSTNAME})"),
        (HolderAddress("a", 1, HOSTNAME, None, None), "it has no Unix socket for hosts"),
        (HolderAddress("a", 1, HOSTNAME, "{tmp}/run/b.sock", None), "its Unix socket {tmp}/run/b.sock is this node's own"),
    ],
    ids=["socket-gone", "another-machine", "no-socket", "own-socket"],
)
async def test_a_holder_that_cant_be_reached_is_said_to_the_host(short_tmp: Path, address: HolderAddress, because: str) -> None:
    own = short_tmp / "run" / "b.sock"
    if address.host_socket is not None:
        address = HolderAddress(address.node, address.epoch, address.hostname, address.host_socket.format(tmp=short_tmp), None)
    with trio.fail_after(10):
        async with proxy_serving(unix_host(own), Holder(address)) as (proxy, _):
            stream = await trio.open_unix_socket(str(own))
            await stream.send_all(b'{"jsonrpc":"2.0","id":"x","method":"status"}\n')
            answer = await read_line(stream)
            assert await stream.receive_some(10) == b""
            await stream.aclose()
            assert proxy.statistics()["refused"] == {"holder-unreachable": 1}
    assert answer["id"] == "x" and answer["error"]["data"]["reason"] == "holder-unreachable"
    assert answer["error"]["message"] == f"node b is a standby; node a holds the links, but {because.format(tmp=short_tmp)}; try another node"


async def test_past_max_connections_a_connection_is_refused_at_once(short_tmp: Path) -> None:
    holder_path, own = short_tmp / "a.sock", short_tmp / "run" / "b.sock"
    holder = Holder(HolderAddress("a", 1, HOSTNAME, str(holder_path), None))
    with trio.fail_after(10):
        async with echo_holder(holder_path), proxy_serving(unix_host(own, max_connections=1), holder) as (proxy, _):
            first = await trio.open_unix_socket(str(own))
            await first.send_all(b"x\n")
            assert await _read_exactly(first, 2) == b"x\n"
            second = await trio.open_unix_socket(str(own))
            answer = await read_line(second)  # said before anything is asked: no id
            assert await second.receive_some(10) == b""
            await second.aclose()
            assert (answer["id"], answer["error"]["code"], answer["error"]["data"]["reason"]) == (None, -32000, "too-many-connections")
            assert proxy.statistics()["open"] == 1 and proxy.statistics()["refused"] == {"too-many-connections": 1}
            # The first is still forwarded.
            await first.send_all(b"y\n")
            assert await _read_exactly(first, 2) == b"y\n"
            await first.aclose()


async def test_the_websocket_listener_forwards_to_the_holders_and_refuses_over_http(short_tmp: Path) -> None:
    """Byte for byte over TCP (the handshake is the holder's to answer); a refusal is HTTP 503."""
    echo_listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    echo_port = echo_listeners[0].socket.getsockname()[1]

    async def echo(stream: trio.SocketStream) -> None:
        async with stream:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)

    holder = Holder(HolderAddress("a", 1, HOSTNAME, None, f"ws://127.0.0.1:{echo_port}/"))
    host = HostConfig(websocket=WebSocketListenConfig(bind="127.0.0.1", port=0), unix_socket=None, token_file=None)
    with trio.fail_after(10), capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.serve_listeners, echo, echo_listeners)
            async with proxy_serving(host, holder) as (proxy, _):
                [url] = proxy.listening
                [listening] = [line for line in logs if line["event"] == "cluster.proxy.listening"]
                assert listening["url"] == url and url.startswith("ws://127.0.0.1:")
                port = int(url.rsplit(":", 1)[1].rstrip("/"))
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await stream.send_all(b"GET / HTTP/1.1\r\n\r\n")
                assert await _read_exactly(stream, 18) == b"GET / HTTP/1.1\r\n\r\n"
                await stream.aclose()
                holder.address = None
                with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
                    async with RouterClient.connect_websocket(url, "a-token", timeout=5):
                        pass
                assert proxy.statistics()["refused"] == {"no-holder": 1}
            nursery.cancel_scope.cancel()
    assert rejected.value.status_code == 503
    assert rejected.value.body == b"node b is a standby and no node holds the links now; try another node (reason: no-holder)\n"
