"""Nodes (issue 29): two daemons on one PostgreSQL journal, one holding the links under a lease.

Real processes throughout: PostgreSQL (the suite's server, a database of the test's own), the
fixture server over TCP re-sending what it never heard ``accepted`` for (as real servers do),
two ``mcpl-router run`` nodes started from ONE config file (``[cluster] node`` and the host
socket from ``${MCPL_ROUTER_NODE}``), and a host that acks every wake and, when its node goes,
connects to the other one.

- The holder ``kill -9``ed during a flood: the standby holds the links within the lease plus a
  handshake; every accepted message wakes the host, none again after its ack was answered.
- The holder stopped (SIGSTOP) past its lease and resumed: the standby took over meanwhile; the
  resumed node ends its term (fenced), accepts nothing more, and the server got no post twice.
- The holder drained (SIGTERM): it releases the lease, the standby takes over within its poll
  (not the lease's length), and no wake is lost or repeated.
- The journal's PostgreSQL primary killed and its standby promoted under the nodes: nothing
  lost, nothing repeated (the holder renews on the new primary).
- A node started before its database: it waits, says why, and stops cleanly.
- The holder stopped (SIGSTOP) for good: the host's connection to it stays open and silent; the
  client's liveness probe finds it unanswered and leaves it, and the host is woken by the new
  holder within the lease and the probe's bounds.

The figures (takeover times) are printed (``pytest -s``) for the closing note and
docs/performance.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import FailoverClient
from mcpl_router.testing import postgres
from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import FAST_RECONNECT, DaemonProcess, daemon_process, daemon_serving
from .test_journal_failover import SENDERS, TOTAL, Ledger, check, read_and_ack, send_all

pytestmark = pytest.mark.integration

#: The lease the tests run with: the default, so the takeover measured is the documented one.
LEASE = 5.0
#: Every node's host token when the nodes listen on WebSockets (a forwarded host presents the
#: holder's token: the nodes share one).
WEBSOCKET_TOKEN = "cluster-test-token"


def cluster_config(workdir: Path, fixture_url: str, dsn: str, *, websocket: bool = False) -> Path:
    """One file for every node: the node's name and host socket come from its environment (and,
    with ``websocket``, each listens on a WebSocket port of its own, one token for all)."""
    host: dict[str, Any] = {"unixSocket": str(workdir / "run" / "${MCPL_ROUTER_NODE}.sock"), "websocket": {"enabled": False}}
    if websocket:
        host.update(websocket={"bind": "127.0.0.1", "port": 0}, token=WEBSOCKET_TOKEN)
    config = {
        "mcplServers": {"s": {"url": fixture_url, "reconnect": FAST_RECONNECT}},
        "host": host,
        "journal": {"backend": "postgres", "dsn": dsn, "path": str(workdir / "unused.sqlite3")},
        "cluster": {"node": "${MCPL_ROUTER_NODE}", "leaseTtl": LEASE},
        "health": {"enabled": True, "port": 0},
        "logging": {"level": "debug", "format": "json"},
    }
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "cluster.json"
    path.write_text(json.dumps(config))
    return path


def socket_of(workdir: Path, node: str) -> str:
    return str(workdir / "run" / f"{node}.sock")


async def serving(workdir: Path, node: str) -> bool:
    """Whether ``node`` holds the links and serves hosts on its socket itself (not forwarded to
    the holder, as a standby's socket is), with server ``s`` ready."""
    return await daemon_serving(socket_of(workdir, node), timeout=2, node=node)


@asynccontextmanager
async def two_nodes(workdir: Path, dsn: str, *, websocket: bool = False) -> AsyncIterator[tuple[FixtureProcess, dict[str, DaemonProcess]]]:
    """The fixture server, node ``a`` holding the links (ready), node ``b`` a standby."""
    async with AsyncExitStack() as stack:
        server = await stack.enter_async_context(FixtureProcess.start(transport="tcp", channels=["general"], control_dir=workdir))
        assert server.listen_url is not None
        config = cluster_config(workdir, server.listen_url, dsn, websocket=websocket)
        nodes: dict[str, DaemonProcess] = {}
        for name in ("a", "b"):
            env = {**os.environ, "MCPL_ROUTER_NODE": name}
            nodes[name] = await stack.enter_async_context(daemon_process(config, workdir / f"{name}.log", env=env))
            await nodes[name].start()
            if name == "a":
                await wait_until(lambda: serving(workdir, "a"), timeout=30, interval=0.1)
        # b is up and a standby: it says so before the test goes on.
        await wait_until(lambda: '"cluster.node.standby"' in (workdir / "b.log").read_text(), timeout=20)
        yield server, nodes


async def failover_host(sockets: Sequence[str], ledger: Ledger, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """The typed client as shipped, given both nodes: it acks every wake and follows the
    links' holder by itself (client/failover.py)."""
    async with FailoverClient.connect(list(sockets), give_up_after=120) as host:
        await host.hello("host", ["kai"])
        task_status.started()
        await read_and_ack(host, ledger)


async def wait_woken(ledger: Ledger, workdir: Path, timeout: float = 90) -> None:
    every = {f"m-{n}" for n in range(TOTAL)}
    try:
        await wait_until(lambda: every <= {m for _, m in ledger.woken}, timeout=timeout)
    except trio.TooSlowError:
        missing = sorted(every - {m for _, m in ledger.woken})
        tails = {name: (workdir / f"{name}.log").read_text(errors="replace").splitlines()[-30:] for name in ("a", "b")}
        raise AssertionError(f"never woken: {missing[:20]} ({len(missing)}); logs: {json.dumps(tails, indent=1)}") from None


async def health_page(workdir: Path, node: str, page: str) -> tuple[int, str]:
    """GET ``page`` from ``node``'s health listener (its URL from its log)."""
    from mcpl_router.query import http_get

    [listening] = log_events(workdir / f"{node}.log", "health.listening")
    status, body = await http_get(f"{listening['url']}{page}", 5.0)
    return status, body.decode()


def log_events(path: Path, event: str) -> list[dict[str, Any]]:
    found = []
    for line in path.read_text(errors="replace").splitlines():
        if f'"{event}"' in line:
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
    return found


async def takeover_seconds(workdir: Path, since: float) -> float:
    """From ``since`` until node b serves hosts with the server ready (polled every 50 ms)."""
    await wait_until(lambda: serving(workdir, "b"), timeout=60, interval=0.05)
    return time.monotonic() - since


def quiet_window(ledger: Ledger, around: float) -> float:
    """The longest time after ``around`` − 1 s in which no message was accepted."""
    times = sorted(ledger.accepted_at.values())
    return max((later - earlier for earlier, later in zip(times, times[1:], strict=False) if later > around - 1), default=0.0)


async def flood_until_third(server: FixtureProcess, ledger: Ledger, senders: trio.Nursery) -> None:
    for index in range(SENDERS):
        senders.start_soon(send_all, server, ledger, list(range(index, TOTAL, SENDERS)))
    await wait_until(lambda: len(ledger.accepted) >= TOTAL // 3, timeout=60)


async def test_the_holder_killed_during_a_flood_is_taken_over_within_the_lease_and_loses_nothing(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    ledger = Ledger()
    dsn = postgres.fresh_database(postgres_server, "cluster_kill9")
    with trio.fail_after(240):
        async with two_nodes(short_tmp, dsn) as (server, nodes):
            # The standby says who holds the links (a load balancer's check sends no host to it).
            ready, body = await health_page(short_tmp, "b", "/readyz")
            assert (ready, body.strip()) == (503, "not ready:\n- standby: node a holds the links (epoch 1); host connections here are forwarded to it")
            page, body = await health_page(short_tmp, "b", "/status.json")
            standby = json.loads(body)["cluster"]
            assert page == 200 and (standby["node"], standby["state"], standby["holder"]["node"]) == ("b", "standby", "a")
            assert (await health_page(short_tmp, "b", "/"))[0] == 200  # the status page of a standby
            async with trio.open_nursery() as nursery:
                await nursery.start(failover_host, [socket_of(short_tmp, "a"), socket_of(short_tmp, "b")], ledger)
                async with trio.open_nursery() as senders:
                    await flood_until_third(server, ledger, senders)
                    killed_at = time.monotonic()
                    accepted_before = len(ledger.accepted)
                    nodes["a"].kill9()
                    assert await nodes["a"].wait() == -signal.SIGKILL
                    took = await takeover_seconds(short_tmp, killed_at)
                await wait_woken(ledger, short_tmp)
                nursery.cancel_scope.cancel()
            # What an operator sees of it: status (host API, the CLI) and /metrics of the new holder.
            shown = await trio.run_process(
                [sys.executable, "-m", "mcpl_router", "status", "--socket", socket_of(short_tmp, "b")], capture_stdout=True
            )
            text = shown.stdout.decode()
            assert "cluster: node b holding the links, epoch 2 since" in text, text
            assert " node a " in text and "gone (last said holding)" in text.split(" node a ")[1].splitlines()[0], text
            _, metrics = await health_page(short_tmp, "b", "/metrics")
            assert 'mcpl_router_cluster_holding{node="b"} 1.0' in metrics
            assert "mcpl_router_cluster_lease_epoch 2.0" in metrics
            assert 'mcpl_router_cluster_terms_total{node="b"} 1.0' in metrics
            checked = await trio.run_process(
                [sys.executable, "-m", "mcpl_router", "journal", "check", "--config", str(short_tmp / "cluster.json")],
                capture_stdout=True, env={**os.environ, "MCPL_ROUTER_NODE": "b"},
            )
            assert "cluster: node b holds the links (epoch 2)" in checked.stdout.decode(), checked.stdout.decode()
    print(f"\nholder kill -9: {accepted_before} accepted before; b serving {took:.2f} s after the kill (lease {LEASE:g} s);"
          f" nothing accepted for {quiet_window(ledger, killed_at):.2f} s;"
          f" {len(ledger.woken)} wakes for {TOTAL} messages; woken again after an answered ack: {len(ledger.woken_after_ack())}")
    check(ledger)
    [taken] = log_events(short_tmp / "b.log", "cluster.lease.taken")
    assert taken["epoch"] == 2


async def test_a_holder_paused_past_its_lease_is_fenced_when_it_resumes(short_tmp: Path, postgres_server: postgres.Server) -> None:
    ledger = Ledger()
    dsn = postgres.fresh_database(postgres_server, "cluster_pause")
    with trio.fail_after(240):
        async with two_nodes(short_tmp, dsn) as (server, nodes):
            a = nodes["a"].process
            assert a is not None
            async with trio.open_nursery() as nursery:
                await nursery.start(failover_host, [socket_of(short_tmp, "a"), socket_of(short_tmp, "b")], ledger)
                async with trio.open_nursery() as senders:
                    await flood_until_third(server, ledger, senders)
                    paused_at = time.monotonic()
                    os.kill(a.pid, signal.SIGSTOP)
                    try:
                        # b takes the links while a is stopped, and serves.
                        await wait_until(lambda: serving(short_tmp, "b"), timeout=30, interval=0.1)
                        taken_at = time.monotonic()
                        await trio.sleep(1)  # the flood goes on through b
                    finally:
                        resumed_wall = time.time()
                        os.kill(a.pid, signal.SIGCONT)
                    # a finds its lease gone and ends its term at once.
                    await wait_until(lambda: log_events(short_tmp / "a.log", "cluster.lease.lost") != [], timeout=10)
                await wait_woken(ledger, short_tmp)
                nursery.cancel_scope.cancel()
            state = await server.state()
            # a runs on, a standby again (not crashed), while b holds.
            await wait_until(lambda: log_events(short_tmp / "a.log", "cluster.node.standby_again") != [], timeout=5)
            assert a.poll() is None
    check(ledger)
    # What a said "accepted" after it resumed had committed before the pause (its COMMIT was on
    # the wire): every such seq is below b's first. Nothing a committed landed after the takeover.
    late = [int(line["seq"]) for line in log_events(short_tmp / "a.log", "channels.incoming.accepted") if _wall(line) > resumed_wall]
    first_of_b = min(int(line["seq"]) for line in log_events(short_tmp / "b.log", "channels.incoming.accepted"))
    assert all(seq < first_of_b for seq in late), (late, first_of_b)
    fenced = log_events(short_tmp / "a.log", "journal.fenced")
    print(f"\nholder paused: b serving {taken_at - paused_at:.2f} s after the pause (lease {LEASE:g} s);"
          f" a answered {len(late)} commits made before its pause, all below b's first seq {first_of_b};"
          f" {len(fenced)} fenced; server epochs {state.get('epoch')}")


async def test_a_drained_holder_hands_the_links_over_at_once(short_tmp: Path, postgres_server: postgres.Server) -> None:
    ledger = Ledger()
    dsn = postgres.fresh_database(postgres_server, "cluster_drain")
    with trio.fail_after(240):
        async with two_nodes(short_tmp, dsn) as (server, nodes):
            async with trio.open_nursery() as nursery:
                await nursery.start(failover_host, [socket_of(short_tmp, "a"), socket_of(short_tmp, "b")], ledger)
                async with trio.open_nursery() as senders:
                    await flood_until_third(server, ledger, senders)
                    a = nodes["a"].process
                    assert a is not None
                    a.send_signal(signal.SIGTERM)
                    drained_at = time.monotonic()
                    assert await nodes["a"].wait() == 0
                    stopped_at = time.monotonic()
                    took = await takeover_seconds(short_tmp, stopped_at)
                await wait_woken(ledger, short_tmp)
                nursery.cancel_scope.cancel()
    check(ledger)
    print(f"\nholder drained: stopped {stopped_at - drained_at:.2f} s after SIGTERM; b serving {took:.2f} s after a stopped"
          f" (lease {LEASE:g} s)")
    assert log_events(short_tmp / "a.log", "cluster.lease.released") != []
    # Every line of a node says which node wrote it, its daemon's too.
    assert {line.get("node") for line in log_events(short_tmp / "a.log", "daemon.draining")} == {"a"}
    # Asked of a's config after it left: the error says a cluster's node may be a standby.
    asked = subprocess.run([sys.executable, "-m", "mcpl_router", "status", "--config", str(short_tmp / "cluster.json")],
                           capture_output=True, text=True, env={**os.environ, "MCPL_ROUTER_NODE": "a"}, check=False)
    assert asked.returncode != 0 and "a cluster's node: its socket answers while the node runs" in asked.stderr, asked.stderr
    # Released, not waited out: b took the lease under the next epoch after a's release (the time
    # it took is printed above, for docs/performance.md; tests assert no wall clock).
    [released] = log_events(short_tmp / "a.log", "cluster.lease.released")
    [taken] = log_events(short_tmp / "b.log", "cluster.lease.taken")
    assert released["released"] is True and taken["epoch"] == released["epoch"] + 1, (released, taken)


#: FailoverClient's defaults (docs/client.md): the test measures the documented bound.
PROBE_AFTER, PROBE_TIMEOUT = 5.0, 5.0


async def send_until_accepted(server: FixtureProcess, message_id: str) -> None:
    while True:
        try:
            answer = await server.incoming([{"channelId": "general", "messageId": message_id, "text": "hi", "tags": ["chat:mention"]}])
            if answer["results"][0]["accepted"]:
                return
        except Exception:
            pass
        await trio.sleep(0.1)


async def test_a_host_leaves_a_holder_stopped_for_good_and_is_woken_by_the_new_holder_within_the_bounds(
    short_tmp: Path, postgres_server: postgres.Server
) -> None:
    """SIGSTOP and never SIGCONT while the host waits: the connection to a neither closes nor
    answers. Without the probe the host waits on it for ever; with it, it is woken by b."""
    dsn = postgres.fresh_database(postgres_server, "cluster_stopped")
    woken: list[tuple[float, str]] = []
    with trio.fail_after(180):
        async with two_nodes(short_tmp, dsn) as (server, nodes):
            a = nodes["a"].process
            assert a is not None
            async with FailoverClient.connect([socket_of(short_tmp, "a"), socket_of(short_tmp, "b")], give_up_after=120) as host:
                await host.hello("host", ["kai"])

                async def acking() -> None:
                    while True:
                        wake = await host.next_wake()
                        woken.append((time.monotonic(), str(wake.messages[0]["messageId"])))
                        with contextlib.suppress(Exception):  # a's connection left meanwhile: b sends it again
                            await host.ack([wake.seq])

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(acking)
                    await send_until_accepted(server, "m-before")
                    await wait_until(lambda: any(m == "m-before" for _, m in woken), timeout=20)
                    stopped_at = time.monotonic()
                    os.kill(a.pid, signal.SIGSTOP)
                    try:
                        await wait_until(lambda: serving(short_tmp, "b"), timeout=30, interval=0.1)
                        taken = time.monotonic() - stopped_at
                        await send_until_accepted(server, "m-after")
                        accepted = time.monotonic() - stopped_at
                        try:
                            await wait_until(lambda: any(m == "m-after" for _, m in woken), timeout=PROBE_AFTER + PROBE_TIMEOUT + LEASE + 15)
                        except trio.TooSlowError:
                            raise AssertionError(f"the host was never woken by b; it is still on {host.address}: {host.statistics()}") from None
                        followed = next(at for at, m in woken if m == "m-after") - stopped_at
                        statistics = host.statistics()
                    finally:
                        nodes["a"].kill9()  # never resumed during the wait; SIGKILL ends a stopped process too
                        os.kill(a.pid, signal.SIGCONT)
                    nursery.cancel_scope.cancel()
    print(f"\nholder stopped for good: b serving {taken:.2f} s after the stop, m-after accepted at {accepted:.2f} s,"
          f" the host woken by b {followed:.2f} s after the stop (lease {LEASE:g} s, probe {PROBE_AFTER:g}+{PROBE_TIMEOUT:g} s)")
    assert (statistics.address, statistics.failovers) == (socket_of(short_tmp, "b"), 1), statistics
    assert statistics.probes_unanswered >= 1, statistics
    # Left within the probe's bounds after the last thing a sent (m-before's ack, just before
    # the stop), or once b served, whichever is later; then a backoff round at most.
    assert followed <= max(PROBE_AFTER + PROBE_TIMEOUT, accepted) + 3, followed
    assert [m for _, m in woken].count("m-after") == 1


def _wall(line: dict[str, Any]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(str(line["timestamp"]).replace("Z", "+00:00")).timestamp()


async def test_a_node_whose_database_is_not_up_waits_for_it_and_says_so(short_tmp: Path) -> None:
    """Started before its database (a port nothing listens on): it neither exits nor serves;
    /readyz says why, the log says it once, and SIGTERM stops it cleanly."""
    from mcpl_router.testing.postgres import free_port

    dsn = f"host=127.0.0.1 port={free_port()} dbname=nothing user=postgres connect_timeout=1"
    config = cluster_config(short_tmp, "tcp://127.0.0.1:9", dsn)
    with trio.fail_after(60):
        async with daemon_process(config, short_tmp / "a.log", env={**os.environ, "MCPL_ROUTER_NODE": "a"}) as node:
            await node.start()
            await wait_until(lambda: log_events(short_tmp / "a.log", "health.listening") != [], timeout=20)
            await trio.sleep(3)  # a few attempts
            status, body = await health_page(short_tmp, "a", "/readyz")
            assert status == 503 and "standby: the journal's database can't be reached" in body, body
            assert len(log_events(short_tmp / "a.log", "cluster.database.unreachable")) == 1
            assert node.process is not None and node.process.poll() is None
            node.process.send_signal(signal.SIGTERM)
            assert await node.wait() == 0


async def test_the_databases_primary_lost_under_a_cluster_loses_nothing(short_tmp: Path) -> None:
    """The journal's PostgreSQL primary killed during a flood and its synchronous standby promoted
    (as an HA manager would), under two nodes on the multi-host DSN: the lease row was replicated
    with every commit, so the holder renews on the new primary (or, had the promotion taken longer
    than its local deadline, another node takes over); either way every accepted message wakes the
    host and none is woken again after its ack was answered."""
    postgres.require()
    ledger = Ledger()
    with postgres.postgres_pair() as pair:
        with trio.fail_after(240):
            async with two_nodes(short_tmp, pair.multi_host_dsn) as (server, _nodes):
                async with trio.open_nursery() as nursery:
                    await nursery.start(failover_host, [socket_of(short_tmp, "a"), socket_of(short_tmp, "b")], ledger)
                    async with trio.open_nursery() as senders:
                        await flood_until_third(server, ledger, senders)
                        killed_at = time.monotonic()
                        pair.primary.kill()
                        await trio.sleep(0.5)  # the HA manager notices
                        await trio.to_thread.run_sync(pair.promote)
                        promoted_at = time.monotonic()
                    await wait_woken(ledger, short_tmp)
                    nursery.cancel_scope.cancel()
    check(ledger)
    taken = [(name, line["epoch"]) for name in ("a", "b") for line in log_events(short_tmp / f"{name}.log", "cluster.lease.taken")]
    lost = [name for name in ("a", "b") if log_events(short_tmp / f"{name}.log", "cluster.lease.lost")]
    print(f"\ndatabase primary lost under the cluster: promoted {promoted_at - killed_at:.2f} s after the kill;"
          f" nothing accepted for {quiet_window(ledger, killed_at):.2f} s; leases taken {taken}, lost by {lost or 'none'};"
          f" {len(ledger.woken)} wakes for {TOTAL} messages; woken again after an answered ack: {len(ledger.woken_after_ack())}")


async def test_two_processes_given_one_node_name_say_so(short_tmp: Path, postgres_server: postgres.Server) -> None:
    dsn = postgres.fresh_database(postgres_server, "cluster_name_clash")
    config = cluster_config(short_tmp, "tcp://127.0.0.1:9", dsn)
    env = {**os.environ, "MCPL_ROUTER_NODE": "a"}
    with trio.fail_after(60):
        async with daemon_process(config, short_tmp / "first.log", env=env) as first, daemon_process(config, short_tmp / "second.log", env=env) as second:
            await first.start()
            await wait_until(lambda: log_events(short_tmp / "first.log", "cluster.lease.taken") != [], timeout=20)
            await second.start()
            await wait_until(lambda: log_events(short_tmp / "second.log", "cluster.node.name_clash") != [], timeout=20)
            [said] = log_events(short_tmp / "second.log", "cluster.node.name_clash")
            assert first.process is not None and said["other_pid"] == first.process.pid
            # Neither takes the lease from the other: the first still holds it, epoch 1.
            assert log_events(short_tmp / "second.log", "cluster.lease.taken") == []
