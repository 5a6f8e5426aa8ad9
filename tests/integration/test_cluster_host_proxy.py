"""Hosts connect to any node (issue 29): a standby forwards each host connection to the holder.

Real processes throughout: PostgreSQL (a database of the test's own), the fixture server over
TCP, ``mcpl-router run`` nodes from one config file, and the typed client as shipped.

- A host given only the standby's socket is served by the holder through it: it declares an
  agent, is woken by the server's message and answers a turn, the post reaching the server on
  the holder's connection; the standby's WebSocket forwards too. The holder ``kill -9``ed: the
  forwarded connection closes, the standby refuses while the dead holder's lease runs out, takes
  the links, and the same client, on the same one address, is served by it, itself.
- A standby while no node holds the links (the lease expired, its row held by a transaction
  left open: the standby's take waits out its lock timeout at every poll) refuses a host with a
  JSON-RPC error answering its request; a ``FailoverClient`` on that one address keeps trying and
  is served once the node takes the links.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from mcpl_router.client import FailoverClient, RouterClient, RpcError
from mcpl_router.store.leases import CLUSTER_TABLES
from mcpl_router.testing import postgres
from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import daemon_process
from .test_cluster import WEBSOCKET_TOKEN, cluster_config, health_page, log_events, serving, socket_of, two_nodes

pytestmark = pytest.mark.integration


async def status_json(workdir: Path, node: str) -> dict[str, Any]:
    page, body = await health_page(workdir, node, "/status.json")
    assert page == 200, body
    cluster: dict[str, Any] = json.loads(body)["cluster"]
    return cluster


async def woken_and_answered(host: FailoverClient, server: FixtureProcess, message_id: str, reply: str) -> None:
    """The server says ``message_id`` in general, mentioning; the host is woken and answers it."""
    await server.incoming([{"channelId": "general", "messageId": message_id, "text": "hi", "tags": ["chat:mention"]}])
    while True:
        wake = await host.next_wake()
        if wake.messages and wake.messages[0].get("messageId") == message_id:
            break
        await host.ack([wake.seq])
    async with host.turn(wake.agent, wakes=[wake.seq]) as turn:
        await turn.text(reply)
    await host.ack([wake.seq])


async def posted(server: FixtureProcess) -> dict[str, int]:
    """Each text the server was sent to post, and the server connection's epoch it came on."""
    found = {}
    for entry in await server.recorded("channels/publish"):
        content = entry["params"].get("content") or []
        found["".join(block.get("text", "") for block in content if isinstance(block, dict))] = entry["epoch"]
    return found


async def test_a_host_on_the_standbys_socket_is_served_by_the_holder_then_by_the_standby_after_a_kill(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    dsn = postgres.fresh_database(postgres_server, "cluster_proxy")
    b_socket = socket_of(short_tmp, "b")
    with trio.fail_after(180):
        async with two_nodes(short_tmp, dsn, websocket=True) as (server, nodes):
            # b has seen a's addresses (a's WebSocket URL is in its heartbeat once it listens).
            async def sees_a() -> bool:
                rows = {row["node"]: row for row in (await status_json(short_tmp, "b"))["nodes"]}
                return bool(rows.get("a", {}).get("info", {}).get("websocket"))

            await wait_until(sees_a, timeout=15, interval=0.1)
            b_websocket = next(url for url in (await status_json(short_tmp, "b"))["proxied"]["listening"] if url.startswith("ws://"))
            async with FailoverClient.connect([b_socket], give_up_after=60) as host:
                await host.hello("host", ["kai"])
                # Served by a, through b.
                status = await host.call("status")
                assert (status["cluster"]["node"], status["cluster"]["state"]) == ("a", "holding")
                await woken_and_answered(host, server, "m-1", "answered through b")
                proxied = (await status_json(short_tmp, "b"))["proxied"]
                assert (proxied["open"], proxied["total"]) == (1, 1), proxied
                assert b_socket in proxied["listening"]
                # b's WebSocket forwards too: the handshake and the token are a's to check.
                async with RouterClient.connect_websocket(b_websocket, WEBSOCKET_TOKEN, timeout=10) as over_websocket:
                    assert ((await over_websocket.call("status"))["cluster"] or {})["node"] == "a"

                nodes["a"].kill9()
                await nodes["a"].wait()
                # The forwarded connection ends with a; b refuses while a's lease runs out, then
                # takes the links; the client, on its one address, is served by b itself.
                await wait_until(lambda: [line for line in log_events(short_tmp / "b.log", "cluster.proxy.closed") if line["reason"] == "holder-closed"],
                                 timeout=10)
                await wait_until(lambda: serving(short_tmp, "b"), timeout=30, interval=0.1)
                await woken_and_answered(host, server, "m-2", "answered by b")
                status = await host.call("status")
                assert (status["cluster"]["node"], status["cluster"]["state"]) == ("b", "holding")
                statistics = host.statistics()
            proxied = status["cluster"]["proxied"]
            refusals = log_events(short_tmp / "b.log", "cluster.proxy.refused")
            posts = await posted(server)
            # What an operator sees of it on the new holder.
            shown = await trio.run_process([sys.executable, "-m", "mcpl_router", "status", "--socket", b_socket], capture_stdout=True)
            text = shown.stdout.decode()
            assert f"host connections forwarded to the holder while a standby: 0 now, {proxied['total']} in all; refused" in text, text
    assert statistics.address == b_socket and statistics.failovers >= 1, statistics
    # Each answer reached the server: the first on a's connection to it, the second on b's.
    assert posts["answered through b"] < posts["answered by b"], posts
    assert proxied["total"] >= 2 and proxied["open"] == 0, proxied  # the host's, and the WebSocket's
    assert refusals and {line["reason"] for line in refusals} <= {"holder-unreachable", "no-holder"}, refusals
    unreachable = [line for line in refusals if line["reason"] == "holder-unreachable"]
    assert all(f"node a holds the links, but {socket_of(short_tmp, 'a')} can't be reached" in line["error"] for line in unreachable), unreachable



async def raw_exchange(path: str, request: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
    """One request line on a Unix socket; the first line answered, and what came after it
    until the connection closed."""
    async with await trio.open_unix_socket(path) as stream:
        await stream.send_all(json.dumps(request).encode() + b"\n")
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    line, _, rest = data.partition(b"\n")
    return json.loads(line), rest


def hold_the_lease_row(dsn: str) -> psycopg.Connection[Any]:
    """An expired lease, of a node that is gone, with its row locked by a transaction left
    open: a node's take of it waits out its lock timeout (and tries again at its next poll), so
    no node holds the links until the transaction ends (the returned connection's rollback)."""
    blocker = psycopg.connect(dsn)
    for statement in CLUSTER_TABLES:
        blocker.execute(statement)
    blocker.execute("INSERT INTO cluster_leases VALUES ('links', 'gone', 1, now() - interval '1 minute', now() - interval '1 second')")
    blocker.commit()
    blocker.execute("SELECT * FROM cluster_leases WHERE scope = 'links' FOR UPDATE")
    return blocker


async def test_a_standby_with_no_holder_refuses_clearly_and_serves_the_host_once_it_holds_the_links(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    dsn = postgres.fresh_database(postgres_server, "cluster_proxy_no_holder")
    b_socket = socket_of(short_tmp, "b")
    hello = {"jsonrpc": "2.0", "id": 1, "method": "session/hello", "params": {"host": "raw", "agents": [{"name": "kai"}]}}
    blocker = await trio.to_thread.run_sync(hold_the_lease_row, dsn)
    try:
        with trio.fail_after(120):
            async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp) as server:
                assert server.listen_url is not None
                config = cluster_config(short_tmp, server.listen_url, dsn)
                async with daemon_process(config, short_tmp / "b.log", env={**os.environ, "MCPL_ROUTER_NODE": "b"}) as node:
                    await node.start()
                    await wait_until(lambda: log_events(short_tmp / "b.log", "cluster.proxy.listening") and log_events(short_tmp / "b.log", "cluster.node.standby"),
                                     timeout=20)
                    # A host's first request is answered with the refusal, then the connection closes.
                    answer, after = await raw_exchange(b_socket, hello)
                    assert answer == {
                        "jsonrpc": "2.0",
                        "id": 1,
                        "error": {
                            "code": -32000,
                            "message": "node b is a standby and no node holds the links now; try another node",
                            "data": {"reason": "no-holder", "node": "b"},
                        },
                    }
                    assert after == b""
                    # The typed client reads it as the hello's error.
                    async with RouterClient.connect_unix(b_socket) as direct:
                        with pytest.raises(RpcError) as refused:
                            await direct.hello("typed", ["kai"])
                    assert (refused.value.code, refused.value.data) == (-32000, {"reason": "no-holder", "node": "b"})
                    ready, body = await health_page(short_tmp, "b", "/readyz")
                    assert (ready, body.strip()) == (503, "not ready:\n- standby: node b does not hold the links, and no node holds them now")
                    _, metrics = await health_page(short_tmp, "b", "/metrics")
                    assert 'mcpl_router_cluster_proxy_refused_total{node="b",reason="no-holder"} 2.0' in metrics, metrics
                    said = log_events(short_tmp / "b.log", "cluster.proxy.refused")  # once a second at most
                    assert 1 <= len(said) <= 2 and (said[0]["reason"], said[0]["holder"], said[0]["transport"]) == ("no-holder", None, "unix"), said

                    # A FailoverClient on this one address keeps trying; once the transaction ends,
                    # b takes the links and serves it.
                    async with FailoverClient.connect([b_socket], give_up_after=60) as host:
                        async with trio.open_nursery() as nursery:
                            hellos: list[Any] = []

                            async def say_hello() -> None:
                                hellos.append(await host.hello("host", ["kai"]))

                            nursery.start_soon(say_hello)
                            await wait_until(lambda: host.statistics().attempts_failed >= 2, timeout=20, interval=0.05)
                            assert hellos == []
                            await trio.to_thread.run_sync(blocker.rollback)
                        status = await host.call("status")
                        statistics = host.statistics()
                    assert (status["cluster"]["node"], status["cluster"]["state"], status["cluster"]["lease"]["epoch"]) == ("b", "holding", 2)
                    assert statistics.address == b_socket and statistics.attempts_failed >= 2, statistics
    finally:
        await trio.to_thread.run_sync(blocker.close)
