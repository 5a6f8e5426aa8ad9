"""A host that serves the daemon's ``inference/request`` with a stand-in model (docs/client.md).

    python examples/inference_host.py [--socket PATH] [--agent NAME]

The "model" echoes the last user message back. When the request asks for a stream it first
sends the echo in a few ``inference/chunk`` pieces, then answers with the whole result (MCPL
§11: ``content``, ``model``, ``finishReason``, ``usage``). It answers ``model/info`` too.
"""

from __future__ import annotations

import argparse
from typing import Any

import trio

from mcpl_router.client import InferenceRequest, ModelInfoRequest, RouterClient

MODEL = "echo-1"


def last_user_text(request: Any) -> str:
    messages = request.get("messages") if isinstance(request, dict) else None
    for message in reversed(messages or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                return content
            blocks = content if isinstance(content, list) else [content]
            return "".join(b["text"] for b in blocks if isinstance(b, dict) and isinstance(b.get("text"), str))
    return ""


async def echo(request: InferenceRequest) -> dict[str, Any]:
    reply = f"echo: {last_user_text(request.request)}"
    if request.stream:
        pieces = [reply[i : i + 8] for i in range(0, len(reply), 8)]
        for index, piece in enumerate(pieces):
            await request.send_chunk({"index": index, "delta": piece})
    words = len(reply.split())
    return {"content": reply, "model": MODEL, "finishReason": "end_turn", "usage": {"inputTokens": words, "outputTokens": words}}


def model_info(_request: ModelInfoRequest) -> dict[str, Any]:
    return {"id": MODEL, "vendor": "mcpl-router-example", "contextWindow": 8192, "capabilities": []}


async def main(socket: str | None, agent: str) -> None:
    connect = RouterClient.connect_unix(socket) if socket else RouterClient.connect_default()
    async with connect as client:
        client.serve_inference(echo)  # register before hello: hello says what this host serves
        client.serve_model_info(model_info)
        await client.hello("inference-host", [agent])
        print(f"serving inference for {agent}", flush=True)
        async for wake in client.wakes():  # this host runs no turns; it takes its wakes
            await client.ack([wake.seq])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", help="the daemon's host socket (default: its default path)")
    parser.add_argument("--agent", default="inference-agent")
    args = parser.parse_args()
    trio.run(main, args.socket, args.agent)
