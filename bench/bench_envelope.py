"""JSON-RPC dispatch cost: our msgspec-typed envelope vs alternatives, measured in one run.

    python bench/bench_envelope.py [--n 20000]

Compares, per request (decode → validate → call a handler → encode the answer):
- ``msgspec``: :func:`mcpl_router.jsonrpc.envelope.decode_envelope` + typed params Struct
  (what the daemon does);
- ``json+dicts``: ``json.loads`` with hand-written dict checks (a floor for "no library");
- ``jsonrpcserver``: its synchronous ``dispatch`` (jsonschema validation on every call), only
  when the package is importable (it is not a dependency; install it in a scratch venv).
Prints requests/second and the ratio to msgspec. No assertions: speed is measured, not asserted.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec  # noqa: E402

from mcpl_router.jsonrpc.envelope import ResultOut, decode_envelope, encode  # noqa: E402

REQUEST = json.dumps(
    {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "channels/publish",
        "params": {"conversationId": "c1", "channelId": "general", "content": [{"type": "text", "text": "hello"}]},
    }
).encode()


class PublishParams(msgspec.Struct, rename="camel"):
    conversation_id: str
    channel_id: str
    content: list[dict]


_params_decoder = msgspec.json.Decoder(PublishParams)


def via_msgspec(data: bytes) -> bytes:
    envelope = decode_envelope(data)
    params = _params_decoder.decode(envelope.params)
    return encode(ResultOut(id=envelope.id, result={"delivered": True, "channel": params.channel_id}))


def via_json_dicts(data: bytes) -> bytes:
    message = json.loads(data)
    if message.get("jsonrpc") != "2.0" or not isinstance(message.get("method"), str):
        raise ValueError("invalid")
    params = message["params"]
    if not isinstance(params.get("channelId"), str):
        raise ValueError("invalid params")
    return json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": {"delivered": True, "channel": params["channelId"]}}).encode()


def make_jsonrpcserver():
    try:
        from jsonrpcserver import Success, dispatch, method
    except ImportError:
        return None

    @method(name="channels/publish")
    def publish(conversationId, channelId, content):  # noqa: N803 - the wire's names
        return Success({"delivered": True, "channel": channelId})

    text = REQUEST.decode()
    return lambda _data: dispatch(text).encode()


def rate(fn, n: int) -> float:
    for _ in range(min(1000, n)):
        fn(REQUEST)
    start = time.perf_counter()
    for _ in range(n):
        fn(REQUEST)
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20000)
    args = parser.parse_args()
    rows = [("msgspec (ours)", rate(via_msgspec, args.n)), ("json+dicts", rate(via_json_dicts, args.n))]
    server = make_jsonrpcserver()
    if server is not None:
        rows.append(("jsonrpcserver sync", rate(server, max(1000, args.n // 10))))
    else:
        rows.append(("jsonrpcserver sync", float("nan")))
    base = rows[0][1]
    print(f"{'dispatcher':<22}{'req/s':>14}{'µs/req':>10}{'vs msgspec':>12}")
    for name, value in rows:
        if value != value:  # NaN: not installed
            print(f"{name:<22}{'(not installed)':>14}")
            continue
        print(f"{name:<22}{value:>14,.0f}{1e6 / value:>10.2f}{value / base:>12.3f}")


if __name__ == "__main__":
    main()
