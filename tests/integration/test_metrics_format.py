"""``/metrics`` as Prometheus users expect it (issue 25 item 6), scraped over HTTP from a daemon
process: process and platform series, a build_info, no ``_created`` series, the journal's commit
time as a histogram, high-water marks named so, every HELP a sentence, OpenMetrics to a scraper
that asks for it, and ``promtool check metrics`` clean when promtool is installed."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import trio
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from mcpl_router.client import RouterClient
from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import daemon_process, wait_daemon_ready, write_config

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _scrape(port: int, accept: str | None = None) -> tuple[str, str]:
    """``GET /metrics``: the Content-Type and the body."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        extra = f"Accept: {accept}\r\n" if accept else ""
        await stream.send_all(f"GET /metrics HTTP/1.1\r\nHost: t\r\n{extra}Connection: close\r\n\r\n".encode())
        reply = b""
        while chunk := await stream.receive_some(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    content_type = re.search(rb"(?im)^content-type:\s*(.*?)\r?$", head)
    assert content_type is not None
    return content_type.group(1).decode(), body.decode()


async def test_metrics_as_prometheus_users_expect_them(short_tmp: Path) -> None:
    port = _free_port()
    with trio.fail_after(90):
        async with FixtureProcess.start(transport="tcp", channels=["general"], control_dir=short_tmp) as fixture:
            config = write_config(short_tmp, fixture.listen_url)
            data = json.loads(config.read_text())
            data["health"] = {"enabled": True, "bind": "127.0.0.1", "port": port}
            config.write_text(json.dumps(data))
            socket_path = str(short_tmp / "run" / "host.sock")
            async with daemon_process(config, short_tmp / "daemon.log") as daemon:
                await daemon.start()
                await wait_daemon_ready(socket_path)
                # A message journaled: at least one commit for the histogram to count.
                async with RouterClient.connect_unix(socket_path, timeout=5) as host:
                    await host.hello("t", agents=["ann"])
                    await fixture.incoming([{"channelId": "general", "text": "hi"}])

                    async def committed() -> bool:
                        _, text = await _scrape(port)
                        return bool(re.search(r"^mcpl_router_journal_commit_seconds_count [1-9]", text, re.MULTILINE))

                    await wait_until(committed, timeout=20)
                    content_type, text = await _scrape(port)
                    om_type, om_text = await _scrape(port, "application/openmetrics-text; version=1.0.0,text/plain;q=0.5")

    assert content_type.startswith("text/plain; version=0.0.4")
    families = {family.name: family for family in text_string_to_metric_families(text)}
    assert "_created" not in text
    for name in ("process_resident_memory_bytes", "process_open_fds", "process_start_time_seconds", "python_info"):
        assert name in families, f"{name} missing"
    [build] = families["mcpl_router_build_info"].samples
    assert build.name == "mcpl_router_build_info" and build.labels["version"] and build.value == 1
    commit = families["mcpl_router_journal_commit_seconds"]
    assert commit.type == "histogram"
    assert {sample.labels.get("le") for sample in commit.samples if sample.name.endswith("_bucket")} >= {"0.001", "+Inf"}
    assert "mcpl_router_journal_batch_size_high_water_mark" in families
    assert "mcpl_router_journal_last_commit_seconds" not in families  # a last value is not a distribution
    # Every HELP of the daemon's own is a sentence: a capital (or a figure) first, a full stop last.
    helps = {family.name: family.documentation for family in families.values() if family.name.startswith("mcpl_router_")}
    bad = {name: text for name, text in helps.items() if not re.match(r"^[A-Z0-9].*\.$", text)}
    assert not bad, bad

    assert om_type.startswith("application/openmetrics-text")
    assert om_text.endswith("# EOF\n") and "_created" not in om_text
    om_names = {family.name for family in openmetrics_families(om_text)}
    assert "mcpl_router_journal_commit_seconds" in om_names

    promtool = shutil.which("promtool")
    if promtool is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is not installed; .ci/run installs it")
        pytest.skip("promtool is not installed")
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and not check.stdout.strip() and not check.stderr.strip(), check.stdout + check.stderr
