"""The bare forwarder the benchmarks measure the daemon against: the same wire work, no routing.

    python bench/forwarder.py --socket PATH [--mode inbound|speech] [--answers FILE] PORT [PORT …]

It dials each fixture server on 127.0.0.1:PORT (initialize, initialized, featureSets/update),
and serves hosts on a Unix socket with the same framing as the daemon (ndjson, the same Peer):

- ``channels/incoming`` from a server is answered ``accepted`` at once and forwarded to the
  host as one ``wake`` per message (no grant, registry, journal, dedup or flow control);
- a turn through the daemon's own host calls — ``turn/open``, ``turn/context``, ``turn/text``,
  ``turn/close`` — puts on the server's wire what the daemon puts there for it (typing start,
  lifecycle ``started``, ``context/beforeInference``, the ``channels/publish`` request, the
  stream's chunk and complete, typing stop, lifecycle ``completed``) on the first server's
  ``general``, with no routing decision, sends the host the ``inference:started`` trace the
  daemon sends it, and answers each call with the daemon's own answer for it, read from
  ``--answers`` (captured by the bench from a daemon turn in the same run): the same wire work
  on both wires;
- ``speak {server, channel, text}`` does that server wire work in one host call (the figure
  before the turn calls above were mirrored: kept as a second reading).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec  # noqa: E402
import trio  # noqa: E402

from mcpl_router.jsonrpc import Inbound, MethodTable, NdjsonStream, Peer  # noqa: E402


class Incoming(msgspec.Struct):
    messages: list[dict[str, Any]]


class TurnOpen(msgspec.Struct):
    agent: str
    wakes: list[int] = []


class TurnRef(msgspec.Struct):
    turnId: str


class TurnText(msgspec.Struct):
    turnId: str
    delta: str
    round: int = 1


class Speak(msgspec.Struct):
    server: int
    channel: str
    text: str


async def main(socket_path: str, ports: list[int], answers: dict[str, Any]) -> None:
    hosts: list[Peer] = []
    servers: list[Peer] = []
    seqs = itertools.count(1)
    async with trio.open_nursery() as nursery:

        async def from_server(inbound: Inbound) -> Any:
            if inbound.method == "channels/incoming":
                messages = inbound.decode_params(Incoming).messages
                for message in messages:
                    if hosts:
                        await hosts[-1].notify(
                            "wake",
                            {"seq": next(seqs), "agent": "bench", "reason": "message",
                             "channel": {"serverId": "s", "channelId": message.get("channelId"), "shown": "s:general"},
                             "tags": [], "messages": [message]},
                        )
                return {"results": [{"messageId": m.get("messageId"), "accepted": True} for m in messages]}
            return None if inbound.is_notification else {"results": []}

        for port in ports:
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            server = Peer(NdjsonStream(stream, stream), from_server)
            await nursery.start(server.run)
            await server.request("initialize", {"protocolVersion": "2024-11-05", "capabilities": {}})
            await server.notify("notifications/initialized")
            await server.request(
                "featureSets/update",
                {"effectiveCapabilities": ["channels.register", "channels.incoming", "channels.publish", "channels.typing",
                                           "channels.streaming", "inferenceLifecycle", "contextHooks.beforeInference.observe"]},
            )
            servers.append(server)

        table = MethodTable()

        async def hello(_params: Any, _inbound: Inbound) -> Any:
            # What the typed client requires of a hello answer (it checks daemonVersion).
            return {"daemonVersion": "forwarder"}

        async def ack(_params: Any, _inbound: Inbound) -> Any:
            return {"acked": 0}

        async def speak(params: Speak, _inbound: Inbound) -> Any:
            # What one daemon turn with context costs the server's wire: beforeInference,
            # lifecycle started, typing start, the publish, typing stop, lifecycle completed.
            server = servers[params.server]
            await server.request("context/beforeInference", {"inferenceId": "i", "conversationId": "c", "channels": {"incoming": [], "candidates": []}})
            await server.notify("inference/lifecycle", {"inferenceId": "i", "phase": "started"})
            await server.notify("channels/typing", {"channelId": params.channel, "op": "start"})
            answer = await server.request(
                "channels/publish",
                {"conversationId": "c", "channelId": params.channel, "content": [{"type": "text", "text": params.text}]},
            )
            await server.notify("channels/typing", {"channelId": params.channel, "op": "stop"})
            await server.notify("inference/lifecycle", {"inferenceId": "i", "phase": "completed"})
            return answer

        turns = itertools.count(1)
        spoken: dict[str, str] = {}
        agents: dict[str, str] = {}

        async def turn_open(params: TurnOpen, _inbound: Inbound) -> Any:
            turn = f"t-{next(turns)}"
            agents[turn] = params.agent
            await servers[0].notify("channels/typing", {"channelId": "general", "op": "start"})
            return {**answers.get("open", {}), "turnId": turn, "inferenceId": f"i{turn}"}

        async def turn_context(params: TurnRef, _inbound: Inbound) -> Any:
            server = servers[0]
            await server.notify("inference/lifecycle", {"inferenceId": f"i{params.turnId}", "conversationId": "c", "turnIndex": 0, "phase": "started"})
            if hosts:
                # The host's trace of the start, as the daemon sends it (docs/host-api.md).
                await hosts[-1].notify(
                    "inference:started",
                    {"agent": agents.get(params.turnId), "turnId": params.turnId, "inferenceId": f"i{params.turnId}", "serverId": "s0", "channelId": "general"},
                )
            await server.request(
                "context/beforeInference",
                {"inferenceId": f"i{params.turnId}", "conversationId": "c", "turnIndex": 0, "userMessage": None, "model": None,
                 "channels": {"incoming": {"channelId": "general", "messageId": "m", "threadId": None},
                              "defaultOutgoing": {"channelId": "general"}, "candidates": []}},
            )
            return answers.get("context", {})

        async def turn_text(params: TurnText, _inbound: Inbound) -> None:
            spoken[params.turnId] = spoken.get(params.turnId, "") + params.delta

        async def turn_close(params: TurnRef, _inbound: Inbound) -> Any:
            server = servers[0]
            text = spoken.pop(params.turnId, "")
            agents.pop(params.turnId, None)
            inference = f"i{params.turnId}"
            await server.request("channels/publish", {"conversationId": "c", "channelId": "general", "content": [{"type": "text", "text": text}]})
            await server.notify("channels/outgoing/chunk", {"inferenceId": inference, "conversationId": "c", "channelId": "general", "index": 0, "delta": text})
            await server.notify("channels/outgoing/complete", {"inferenceId": inference, "conversationId": "c", "channelId": "general", "content": text})
            await server.notify("channels/typing", {"channelId": "general", "op": "stop"})
            await server.notify("inference/lifecycle", {"inferenceId": inference, "conversationId": "c", "turnIndex": 0, "phase": "completed"})
            return answers.get("close", {})

        table.add("session/hello", hello)
        table.add("turn/open", turn_open, TurnOpen, concurrent=True)
        table.add("turn/context", turn_context, TurnRef, concurrent=True)
        table.add("turn/text", turn_text, TurnText)
        table.add("turn/close", turn_close, TurnRef, concurrent=True)
        table.add("wake/ack", ack)
        table.add("speak", speak, Speak, concurrent=True)

        async def serve(stream: trio.SocketStream) -> None:
            peer = Peer(NdjsonStream(stream, stream, skip_log_lines=False), table, concurrent_methods=table.concurrent_methods)
            hosts.append(peer)
            try:
                await peer.run()
            finally:
                hosts.remove(peer)

        listener = trio.socket.socket(trio.socket.AF_UNIX)
        await listener.bind(socket_path)
        listener.listen(16)
        await trio.serve_listeners(serve, [trio.SocketListener(listener)])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--socket", required=True)
    parser.add_argument("--mode", default="inbound")
    parser.add_argument("--answers", type=Path, help="the daemon's answers to a turn's host calls, as JSON {open, context, close}")
    parser.add_argument("ports", nargs="+", type=int)
    args = parser.parse_args()
    try:
        trio.run(main, args.socket, args.ports, msgspec.json.decode(args.answers.read_bytes()) if args.answers else {})
    except KeyboardInterrupt:
        pass
    finally:
        Path(args.socket).unlink(missing_ok=True)
