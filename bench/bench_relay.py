"""The limit: a minimal trio + msgspec relay of the same message shape, in messages per CPU-second.

    python bench/bench_relay.py [--messages 20000]

What the machine allows for the daemon's inbound work with nothing but the wire: a relay
process reads ``channels/incoming`` lines (one message each, as the fixture floods them) from
one Unix socket, decodes the envelope and the message with msgspec, answers ``accepted`` on the
same socket and writes one ``wake`` notification to a second socket, in a trio loop with
batched writes. A feeder process writes the requests as fast as the relay takes them; a drain
reads the answers and the wakes. The relay's own CPU time is read from ``/proc``.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from harness import cpu_seconds

_RELAY = r'''
import sys, trio, msgspec

class Message(msgspec.Struct):
    channelId: str
    messageId: str
    content: list = []
    tags: list = []

class Params(msgspec.Struct):
    messages: list[Message]

class Envelope(msgspec.Struct):
    jsonrpc: str
    id: int
    method: str
    params: msgspec.Raw

envelopes = msgspec.json.Decoder(Envelope)
params = msgspec.json.Decoder(Params)
encode = msgspec.json.Encoder().encode

async def main(server_path, host_path):
    server = await trio.open_unix_socket(server_path)
    host = await trio.open_unix_socket(host_path)
    buffer = b""
    seq = 0
    while True:
        chunk = await server.receive_some(65536)
        if not chunk:
            return
        *lines, buffer = (buffer + chunk).split(b"\n")
        answers, wakes = [], []
        for line in lines:
            envelope = envelopes.decode(line)
            batch = params.decode(envelope.params)
            answers.append(encode({"jsonrpc": "2.0", "id": envelope.id, "result": {"results": [{"messageId": m.messageId, "accepted": True} for m in batch.messages]}}))
            for message in batch.messages:
                seq += 1
                wakes.append(encode({"jsonrpc": "2.0", "method": "wake", "params": {"seq": seq, "agent": "bench", "reason": "message", "channel": {"serverId": "s", "channelId": message.channelId}, "messages": [msgspec.structs.asdict(message)]}}))
        if answers:
            await server.send_all(b"\n".join(answers) + b"\n")
            await host.send_all(b"\n".join(wakes) + b"\n")

trio.run(main, sys.argv[1], sys.argv[2])
'''


def _request(n: int) -> bytes:
    message = (
        '{"channelId":"general","messageId":"m-%d","author":{"id":"user-1","name":"Demo User"},'
        '"timestamp":"2026-12-01T00:00:00Z","content":[{"type":"text","text":"x"}],"tags":["chat:mention"],"metadata":{}}' % n
    )
    return b'{"jsonrpc":"2.0","id":%d,"method":"channels/incoming","params":{"messages":[%s]}}\n' % (n, message.encode())


def relay(messages: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mr-relay-", dir="/tmp") as tmp:
        server_path, host_path = str(Path(tmp) / "server.sock"), str(Path(tmp) / "host.sock")
        listeners = []
        for path in (server_path, host_path):
            listener = socket.socket(socket.AF_UNIX)
            listener.bind(path)
            listener.listen(1)
            listeners.append(listener)
        proc = subprocess.Popen([sys.executable, "-c", _RELAY, server_path, host_path])
        server_conn, _ = listeners[0].accept()
        host_conn, _ = listeners[1].accept()
        payload = b"".join(_request(n) for n in range(messages))
        counts = {"answers": 0, "wakes": 0}

        def drain(conn: socket.socket, key: str) -> None:
            while counts[key] < messages:
                data = conn.recv(1 << 20)
                if not data:
                    return
                counts[key] += data.count(b"\n")

        readers = [threading.Thread(target=drain, args=(server_conn, "answers")), threading.Thread(target=drain, args=(host_conn, "wakes"))]
        for reader in readers:
            reader.start()
        cpu_before = cpu_seconds(proc.pid)
        start = time.perf_counter()
        server_conn.sendall(payload)
        for reader in readers:
            reader.join(timeout=300)
        elapsed = time.perf_counter() - start
        cpu = cpu_seconds(proc.pid) - cpu_before
        proc.terminate()
        proc.wait(timeout=10)
        for conn in (server_conn, host_conn, *listeners):
            conn.close()
    return {"messages": messages, "msgs_per_s": messages / elapsed, "msgs_per_cpu_s": messages / cpu if cpu else float("nan")}


def print_relay(figures: dict[str, Any]) -> None:
    print("\nThe limit: a minimal trio + msgspec relay of the same message shape")
    print(f"{figures['msgs_per_s']:,.0f} msgs/s, {figures['msgs_per_cpu_s']:,.0f} msgs per CPU-second of the relay")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--messages", type=int, default=20000)
    print_relay(relay(parser.parse_args().messages))
