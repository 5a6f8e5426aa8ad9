"""``/metrics`` renders while hosts are connected (their outboxes are read at scrape time)."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from .conftest import host_session, running_daemon

pytestmark = pytest.mark.integration


async def test_a_scrape_with_a_host_connected_reads_its_outbox(short_tmp: Path) -> None:
    with trio.fail_after(30):
        async with running_daemon(short_tmp, {}, unix_socket=True) as daemon:
            async with host_session(daemon):
                families = {family.name: family for family in text_string_to_metric_families(daemon.metrics.render().decode())}
                [in_flight] = families["mcpl_router_wakes_in_flight"].samples
                assert in_flight.value == 0
                depths = {sample.labels["queue"]: sample.value for sample in families["mcpl_router_queue_depth"].samples}
                assert depths["host-wakes"] == 0
