"""``wss://``: the client verifies the daemon's certificate by default; ``ca_file`` trusts another CA.

A TLS WebSocket server in this test's trio run (trio-websocket, a self-signed certificate made
with the ``openssl`` command) answers ``status``; it checks the bearer token as the daemon does.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio_websocket

from mcpl_router.client import RouterClient, Status
from mcpl_router.jsonrpc import Inbound, MethodTable, Peer, WebSocketMessageStream

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")

TOKEN = "wss-test-token"


def self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return cert, key


@asynccontextmanager
async def tls_daemon(cert: Path, key: Path) -> AsyncIterator[int]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    table = MethodTable()

    async def status(_params: Any, _inbound: Inbound) -> Any:
        return {"version": "0.1.0-tls", "ready": 0, "servers": []}

    table.add("status", status)

    async def handler(request: trio_websocket.WebSocketRequest) -> None:
        if (b"authorization", f"Bearer {TOKEN}".encode()) not in [(k.lower(), v) for k, v in request.headers]:
            await request.reject(401)
            return
        connection = await request.accept()
        await Peer(WebSocketMessageStream(connection), table).run()

    async with trio.open_nursery() as nursery:
        server = await nursery.start(trio_websocket.serve_websocket, handler, "127.0.0.1", 0, context)
        yield server.port
        nursery.cancel_scope.cancel()


async def test_wss_with_the_ca_file_connects_and_without_it_refuses_the_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    with trio.fail_after(20):
        async with tls_daemon(cert, key) as port:
            url = f"wss://localhost:{port}/"
            async with RouterClient.connect_websocket(url, TOKEN, ca_file=cert, timeout=5) as client:
                status = await client.status()
                assert isinstance(status, Status) and status.version == "0.1.0-tls"
            # Verification is on by default: the system CAs don't know this certificate.
            with pytest.raises(ssl.SSLCertVerificationError):
                async with RouterClient.connect_websocket(url, TOKEN, timeout=5):
                    pytest.fail("connected to an unverified daemon")
            # A wrong token over TLS is the same refusal as over ws://.
            with pytest.raises(trio_websocket.ConnectionRejected) as rejected:
                async with RouterClient.connect_websocket(url, "wrong", ca_file=cert, timeout=5):
                    pytest.fail("connected with a wrong token")
            assert rejected.value.status_code == 401


async def test_tls_options_with_a_ws_url_or_another_scheme_are_refused() -> None:
    with pytest.raises(ValueError, match="wss://"):
        async with RouterClient.connect_websocket("ws://127.0.0.1:1/", None, ca_file="x.pem"):
            pass
    with pytest.raises(ValueError, match="not a ws:// or wss:// URL"):
        async with RouterClient.connect_websocket("http://127.0.0.1:1/", None):
            pass
