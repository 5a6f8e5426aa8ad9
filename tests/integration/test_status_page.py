"""The status page (issue 31), from a daemon process with two servers sharing ``general``:
``/status.json`` is the host socket's ``status``; the page escapes every value; and a real
headless Chromium (Debian's ``chromium``) shows a person both ``general`` rows with the names
that pick each, an agent's backlog, a refusal in the decisions, and a hostile channel name as text.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from mcpl_router.client import RouterClient
from mcpl_router.query import http_get
from mcpl_router.status_page import render_status_page
from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import FAST_RECONNECT, daemon_process, wait_daemon_ready, write_config

pytestmark = pytest.mark.integration

HOSTILE = '<script>alert("x")</script>'


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@asynccontextmanager
async def _daemon_with_shared_general(workdir: Path) -> AsyncIterator[tuple[str, int]]:
    """Servers a and b both registering ``general`` (b also the hostile name), a daemon process
    with its health listener, an agent with one unacked wake, and one refused name."""
    port = _free_port()
    async with AsyncExitStack() as stack:
        servers: dict[str, FixtureProcess] = {}
        for name in ("a", "b"):
            servers[name] = await stack.enter_async_context(
                FixtureProcess.start(transport="tcp", channels=["general"], control_dir=workdir, server_name=name)
            )
        config = write_config(workdir, None, servers={n: {"url": f.listen_url, "reconnect": FAST_RECONNECT} for n, f in servers.items()})
        data = json.loads(config.read_text())
        data["health"] = {"enabled": True, "bind": "127.0.0.1", "port": port}
        config.write_text(json.dumps(data))
        socket_path = str(workdir / "run" / "host.sock")
        daemon = await stack.enter_async_context(daemon_process(config, workdir / "daemon.log"))
        await daemon.start()
        await wait_daemon_ready(socket_path, servers=2)
        await servers["b"].register([HOSTILE])
        host = await stack.enter_async_context(RouterClient.connect_unix(socket_path, timeout=10))
        await host.hello("page-host", ["ann"])
        await servers["b"].incoming([{"channelId": "general", "text": "hello ann", "tags": ["chat:mention"]}])
        await host.next_wake()  # not acked: ann's backlog is 1
        refused = await host.publish("ann", "general", "to which general?")  # ambiguous: refused
        assert refused.delivered is False and refused.candidates

        async def settled() -> bool:
            status = await host.call("status", {})
            return status["channels"] == 3 and status["decisions"]["recorded"] >= 1
        await wait_until(settled, timeout=10)
        yield socket_path, port


async def test_status_json_is_the_status_model_and_the_page_escapes_every_value(short_tmp: Path) -> None:
    with trio.fail_after(60):
        async with _daemon_with_shared_general(short_tmp) as (socket_path, port):
            async with RouterClient.connect_unix(socket_path, timeout=10) as probe:
                over_socket = await probe.call("status", {})
            status, body = await http_get(f"http://127.0.0.1:{port}/status.json", 10)
            assert status == 200
            over_http = json.loads(body)
            status, page = await http_get(f"http://127.0.0.1:{port}/", 10)
            assert status == 200
    # One model: the same keys, and the same values where they don't move between two reads.
    assert set(over_http) == set(over_socket)
    for key in ("version", "channels", "lastSeq", "channelList", "agents", "readiness", "decisions"):
        assert over_http[key] == over_socket[key], key
    rows = over_http["channelList"]["rows"]
    generals = [row for row in rows if row["channelId"] == "general"]
    assert {row["name"] for row in generals} == {"a:general", "b:general"} and all(row["sharedId"] for row in generals)
    [ann] = [agent for agent in over_http["agents"] if agent["name"] == "ann"]
    assert ann["unackedWakes"] == 1 and ann["host"] == "page-host"
    [refusal] = [d for d in over_http["decisions"]["latest"] if d["kind"] == "refused"]
    assert refusal["reason"] == "shared-id" and refusal["name"] == "general" and len(refusal["candidates"]) == 2
    html_text = page.decode()
    assert HOSTILE not in html_text and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html_text


def test_no_value_reaches_the_page_unescaped() -> None:
    hostile = '"><img src=x onerror=alert(1)>'
    model: dict[str, Any] = {
        "version": hostile,
        "servers": [{"serverId": hostile, "state": hostile, "problem": hostile, "grant": {"granted": [hostile]}, "liveness": {"state": hostile}}],
        "channelList": {"rows": [{"channelId": hostile, "serverId": hostile, "name": hostile, "label": hostile, "sharedId": True}],
                        "filter": hostile, "page": 0, "pages": 2, "total": 1},
        "agents": [{"name": hostile, "host": hostile, "wake": {"tags": [hostile]}, "tunedOut": [{"shown": hostile}]}],
        "hostConnections": [{"connection": hostile, "transport": hostile, "host": hostile, "agents": [hostile]}],
        "decisions": {"latest": [{"kind": hostile, "via": hostile, "agent": hostile, "name": hostile, "reason": hostile,
                                  "candidates": [{"serverId": hostile, "channelId": hostile}], "preview": hostile}]},
        "journal": {"backend": hostile, "path": hostile, "failing": hostile},
        "readiness": {"ready": False, "problems": [hostile]},
        "cluster": {"node": hostile, "state": hostile, "placement": hostile, "nodes": [{"node": hostile, "state": hostile, "live": True}],
                    "links": [{"server": hostile, "node": hostile, "epoch": hostile, "expiresIn": 3}]},
    }
    page = render_status_page(model)
    assert "<img" not in page and "onerror=alert(1)>" not in page
    assert page.count("&quot;&gt;&lt;img src=x onerror=alert(1)&gt;") >= 22


def test_a_cluster_nodes_page_shows_every_node_and_who_holds_each_link() -> None:
    now = 1_000_000.0
    model: dict[str, Any] = {
        "version": "0.1.0",
        "cluster": {
            "node": "n3", "state": "holding", "leaseTtl": 5, "lease": {"epoch": 2, "since": now - 65},
            "placement": "balanced over the live nodes (a on n1 while live), relay on 127.0.0.1:7001",
            "nodes": [{"node": "n1", "state": "standby", "live": True, "seenAgo": 0.4},
                      {"node": "n2", "state": "holding", "live": False, "seenAgo": 12.0}],
            "links": [{"server": "a", "node": "n1", "epoch": 3, "since": now - 30, "expiresIn": 4.1},
                      {"server": "b", "node": "n2", "epoch": 1, "since": now - 90, "expiresIn": -2.0}],
        },
    }
    page = render_status_page(model, now=now)
    assert "<h2>Cluster</h2><p>node <b>n3</b>: holding, epoch 2 since 1m 5s ago · lease 5 s · links balanced" in page
    assert "<td>n1</td><td>standby</td><td>0.4s ago</td>" in page
    assert '<td>n2</td><td><span class="bad">gone</span> (last said holding)</td>' in page
    assert "<td>a</td><td>n1</td><td>3</td><td>0m 30s ago</td>" in page
    assert '<td>b</td><td><span class="bad">free</span></td>' in page
    assert "<h2>Cluster</h2>" not in render_status_page({"version": "0.1.0"})


def _chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail("chromium is not installed; .ci/run installs Debian's chromium")
    pytest.skip("chromium is not installed (apt-get install chromium)")


def _browse(browser: str, url: str, screenshot: Path, profile: Path) -> str:
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
              f"--user-data-dir={profile}", "--window-size=1280,2000"]
    shot = subprocess.run([*common, f"--screenshot={screenshot}", url], capture_output=True, text=True, timeout=120)
    assert screenshot.exists(), shot.stderr[-2000:]
    dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    return dom.stdout


async def test_a_person_sees_the_page_in_a_real_browser(short_tmp: Path, tmp_path: Path) -> None:
    browser = _chromium()
    with trio.fail_after(240):
        async with _daemon_with_shared_general(short_tmp) as (_socket_path, port):
            dom = await trio.to_thread.run_sync(_browse, browser, f"http://127.0.0.1:{port}/", tmp_path / "status.png", tmp_path / "profile")
    # What a person reads on it.
    assert "a:general" in dom and "b:general" in dom
    assert "page-host" in dom and "shared-id" in dom and "refused" in dom
    assert "&lt;script&gt;alert(\"x\")&lt;/script&gt;" in dom  # shown as text, never run
    assert "<script>" not in dom
    assert (tmp_path / "status.png").stat().st_size > 10_000
    if os.environ.get("MCPL_ROUTER_DOCS_SCREENSHOT"):
        shutil.copy(tmp_path / "status.png", os.environ["MCPL_ROUTER_DOCS_SCREENSHOT"])


def test_a_listener_off_loopback_shows_the_page_only_with_the_host_token() -> None:
    from mcpl_router.health import _Pages, _route

    def status(*, channels_page: int = 0, channels_filter: str = "") -> dict[str, Any]:
        return {"version": "t", "servers": [], "readiness": {"ready": True, "problems": []}}

    def never() -> Any:
        raise AssertionError("not asked")

    guarded = _Pages(never, never, status, "s3cret", True)  # type: ignore[arg-type]
    assert _route(guarded, "GET", "/status.json", "")[0] == 401
    assert _route(guarded, "GET", "/", "", "token=wrong")[0] == 401
    assert _route(guarded, "GET", "/status.json", "", "", "Bearer s3cret")[0] == 200
    assert _route(guarded, "GET", "/", "", "token=s3cret")[0] == 200
    no_token = _Pages(never, never, status, None, True)  # type: ignore[arg-type]
    assert _route(no_token, "GET", "/", "")[0] == 403
    loopback = _Pages(never, never, status, None, False)  # type: ignore[arg-type]
    code, body, content_type = _route(loopback, "GET", "/", "")
    assert code == 200 and content_type.startswith("text/html") and b"<h1>mcpl-router t</h1>" in body


async def test_status_lists_channels_whole_only_while_few_and_pages_them_on_request(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mcpl_router import read_model

    from .conftest import dialled_server, running_daemon, wait_channel

    monkeypatch.setattr(read_model, "INLINE_CHANNELS", 5)
    with trio.fail_after(60):
        async with FixtureProcess.start(transport="tcp", channels=[f"c{i}" for i in range(8)], control_dir=short_tmp) as fixture:
            async with running_daemon(short_tmp, {"s": dialled_server(fixture)}) as daemon:
                await wait_channel(daemon, "s", "c7")
                cheap = daemon.status()
                assert cheap["channels"] == 8 and cheap["channelList"]["rows"] == [] and "omitted" in cheap["channelList"]
                paged = daemon.status(channels_page=0)
                assert len(paged["channelList"]["rows"]) == 8
                filtered = daemon.status(channels_filter="c3")
                assert [row["channelId"] for row in filtered["channelList"]["rows"]] == ["c3"]
                assert [row["channelCount"] for row in cheap["servers"]] == [8]
