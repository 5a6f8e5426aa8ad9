"""A cluster whose links are spread (``cluster.links = "balanced"``), driven from outside (issue 29).

Three ``mcpl-router run`` nodes on one PostgreSQL journal: ``n3`` holds the router's lease (it
started first) and serves the host; server ``a``'s link is pinned to ``n1``, ``b``'s and ``c``'s
to ``n2``. The router holds no server connection: it reaches each server through the relay of
the node holding its link. Every routing scenario of the seeds (tests/integration/
test_cluster_scenarios.py, where one node holds everything) must come out as one daemon's, and
the fixture servers must see one connection each, from the node holding their link.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import FailoverClient
from mcpl_router.testing import postgres
from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import FAST_RECONNECT
from .test_cluster import health_page
from .test_cluster_scenarios import (
    AGENTS,
    ONE_DAEMON,
    Cluster,
    check_state,
    fixture_servers,
    raw_status,
    scenarios,
    serving,
    set_up_state,
    socket_of,
)

pytestmark = pytest.mark.integration

LEASE = 5.0
#: Where each server's link belongs while its node is live.
PINS = {"a": "n1", "b": "n2", "c": "n2"}


def split_config(workdir: Path, servers: dict[str, FixtureProcess], dsn: str) -> Path:
    config = {
        "mcplServers": {name: {"url": server.listen_url, "reconnect": FAST_RECONNECT} for name, server in servers.items()},
        "host": {"unixSocket": str(workdir / "run" / "${MCPL_ROUTER_NODE}.sock"), "websocket": {"enabled": False}},
        "journal": {"backend": "postgres", "dsn": dsn, "path": str(workdir / "unused.sqlite3")},
        "cluster": {"node": "${MCPL_ROUTER_NODE}", "leaseTtl": LEASE, "links": "balanced", "pin": PINS},
        "health": {"enabled": True, "port": 0},
        "logging": {"level": "debug", "format": "json"},
    }
    path = workdir / "cluster.json"
    path.write_text(json.dumps(config))
    return path


def holders(status: dict[str, Any]) -> dict[str, str]:
    """server → the node holding its link unexpired, as the router's status shows it."""
    return {row["server"]: row["node"] for row in status["cluster"]["links"] if row["expiresIn"] > 0}


@asynccontextmanager
async def split_cluster(workdir: Path, dsn: str) -> AsyncIterator[Cluster]:
    """Servers a, b, c; n3 the router (serving, every server ready), n1 and n2 holding the
    links pinned to them, the router reaching each through their relays."""
    async with AsyncExitStack() as stack:
        servers = await fixture_servers(stack, workdir)
        nodes = Cluster(workdir, split_config(workdir, servers, dsn), servers, stack)
        await nodes.start("n3")
        await nodes.wait_serving("n3")
        for node in ("n1", "n2"):
            await nodes.start(node)

        async def placed() -> bool:
            status = await raw_status(socket_of(workdir, "n3"))
            return holders(status) == PINS and await serving(workdir, "n3")

        try:
            await wait_until(placed, timeout=40, interval=0.2)
        except trio.TooSlowError:
            status = await raw_status(socket_of(workdir, "n3"))
            raise AssertionError(f"links not placed: {status['cluster']['links']}; n3's log ends: {nodes.log('n3')[-3000:]}") from None
        yield nodes


async def connections_of(server: FixtureProcess) -> int:
    """How many times the server was connected to (each connection's handshake is one)."""
    return len(await server.recorded("initialize"))


async def test_with_links_on_two_nodes_and_the_host_on_a_third_every_scenario_routes_as_one_daemon(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    dsn = postgres.fresh_database(postgres_server, "cluster_split")
    with trio.fail_after(120):
        async with split_cluster(short_tmp, dsn) as nodes, FailoverClient.connect([socket_of(short_tmp, "n3")], give_up_after=30) as client:
            await client.hello("host", AGENTS)
            assert await scenarios(nodes, client, "split") == ONE_DAEMON
            await set_up_state(nodes, client, host_socket=socket_of(short_tmp, "n3"))
            await check_state(nodes, client, "n3", "split")
            status = await raw_status(socket_of(short_tmp, "n3"))
            # The router holds no link: each server's connection is its holder's, through a relay.
            endpoints = {row["serverId"]: row.get("endpoint") for row in status["servers"]}
            assert all(endpoint and endpoint.endswith(f"via node {PINS[server]}") for server, endpoint in endpoints.items()), endpoints
            assert holders(status) == PINS
            # A host may connect to a link node too: it forwards to the router (cluster/host_proxy.py).
            assert (await raw_status(socket_of(short_tmp, "n1")))["cluster"]["node"] == "n3"
            # What an operator reads: status (CLI) and /metrics say who holds which link.
            shown = await trio.run_process([sys.executable, "-m", "mcpl_router", "status", "--socket", socket_of(short_tmp, "n3")],
                                           capture_stdout=True)
            lines = [line.split() for line in shown.stdout.decode().splitlines()]
            assert {(row[1], row[4]) for row in lines if row[:1] == ["link"]} == {(server, node + ",") for server, node in PINS.items()}
            assert any(line[:3] == ["cluster:", "node", "n3"] and "router's" in line for line in lines), shown.stdout
            _, metrics = await health_page(short_tmp, "n1", "/metrics")
            assert 'mcpl_router_cluster_link_holder{node="n1",server="a"} 1.0' in metrics
            assert 'mcpl_router_cluster_links_taken_total{node="n1"}' in metrics


async def test_a_server_added_by_a_reload_is_placed_and_one_removed_is_handed_over(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    dsn = postgres.fresh_database(postgres_server, "cluster_split_reload")
    with trio.fail_after(120):
        async with split_cluster(short_tmp, dsn) as nodes:
            extra = await nodes.stack.enter_async_context(
                FixtureProcess.start(transport="tcp", channels=["extra"], control_dir=short_tmp, server_name="d")
            )
            config = json.loads(nodes.config.read_text())
            config["mcplServers"]["d"] = {"url": extra.listen_url, "reconnect": FAST_RECONNECT}
            del config["mcplServers"]["c"]
            del config["cluster"]["pin"]["c"]
            nodes.config.write_text(json.dumps(config))
            for node in nodes.nodes.values():
                assert node.process is not None
                node.process.send_signal(signal.SIGHUP)

            async def replaced() -> bool:
                status = await raw_status(socket_of(short_tmp, "n3"))
                ready = {row["serverId"] for row in status["servers"] if row["state"] == "ready"}
                return "d" in holders(status) and "c" not in holders(status) and ready == {"a", "b", "d"}

            try:
                await wait_until(replaced, timeout=30, interval=0.2)
            except trio.TooSlowError:
                status = await raw_status(socket_of(short_tmp, "n3"))
                rows = [(row["serverId"], row["state"], row.get("lastError")) for row in status["servers"]]
                raise AssertionError(f"not replaced: links {status['cluster']['links']}, servers {rows}") from None
            # d, unpinned, is balanced: whichever live node asked first holds it, and the router
            # reaches it through that node.
            status = await raw_status(socket_of(short_tmp, "n3"))
            [endpoint] = [row["endpoint"] for row in status["servers"] if row["serverId"] == "d"]
            assert endpoint.endswith(f"via node {holders(status)['d']}"), endpoint
            assert '"cluster.link.handed_over"' in nodes.log("n2") and "no longer in the config" in nodes.log("n2")
