"""Where a WebSocket server's token goes: a header-reading server never sees
its token in a URL by default, ``tokenIn = "auto"`` puts it there once at most, and what ``auto``
learned survives a reload. The config side is in tests/unit/test_token_in.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio_websocket
from structlog.testing import capture_logs

from mcpl_router.testing.control import FixtureProcess, wait_until

from .conftest import daemon_running, dialled_server, daemon_config

pytestmark = pytest.mark.integration


async def test_a_header_server_never_sees_the_token_in_a_url(short_tmp: Path) -> None:
    """Default tokenIn ("header"): a refused (rotated) token is never retried in the query;
    ``auto`` tries the query once, then goes back to the header with a hint."""
    targets: list[str] = []

    async def refuse(request: Any) -> None:
        targets.append(request.path)
        await request.reject(401)

    reconnect = {"initialDelay": 0.05, "maxDelay": 0.1, "multiplier": 2, "jitter": 0}
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(trio_websocket.serve_websocket, refuse, "127.0.0.1", 0, None)
            url = f"ws://127.0.0.1:{server.port}/mcpl"
            entry = {"url": url, "token": "rotated-SECRET", "reconnect": reconnect}
            async with daemon_running(daemon_config(short_tmp, {"s": entry})):
                await wait_until(lambda: len(targets) >= 4, timeout=10, interval=0.02)
            assert not any("SECRET" in target for target in targets), targets
            targets.clear()
            with capture_logs() as logs:
                async with daemon_running(daemon_config(short_tmp, {"s": {**entry, "tokenIn": "auto"}})):
                    await wait_until(lambda: len(targets) >= 5, timeout=10, interval=0.02)
            assert [("SECRET" in target) for target in targets[:3]] == [False, True, False], targets
            assert not any("SECRET" in target for target in targets[2:]), targets
            assert any(log["event"] == "link.token.refused" for log in logs)
            nursery.cancel_scope.cancel()


async def test_a_learned_token_place_survives_a_reload(short_tmp: Path) -> None:
    """tokenIn = "auto" learned "query"; a reload that keeps the connection keeps that too, so
    the next connection dials the query at once (one attempt, not a refused header first)."""
    with trio.fail_after(60):
        async with FixtureProcess.start(transport="ws", channels=["general"], control_dir=short_tmp, token="tok", token_in="query") as fixture:
            entry = dialled_server(fixture, token="tok", tokenIn="auto")
            async with daemon_running(daemon_config(short_tmp, {"s": entry})) as daemon:
                link = daemon.links["s"]
                await wait_until(lambda: link.state.value == "ready", timeout=20)
                result = await daemon.reload(daemon_config(short_tmp, {"s": {**entry, "required": True}}))
                assert result["updated"] == ["s"]
                result = await daemon.reload(daemon_config(short_tmp, {"s": {**entry, "required": True, "disabledCapabilities": ["channels.typing"]}}))
                assert result["regranted"] == ["s"]
                epoch = link.epoch
                await fixture.disconnect()
                await wait_until(lambda: link.state.value == "ready" and link.epoch > epoch, timeout=20)
                assert link.epoch == epoch + 1
