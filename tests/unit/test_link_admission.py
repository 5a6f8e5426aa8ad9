"""Admission against the grant *at receipt*: a message that arrived before the policy receipt
is refused even if the ordered dispatcher only reaches it after the grant took effect."""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing

from mcpl_router.config import parse_config
from mcpl_router.jsonrpc.framing import NdjsonStream
from mcpl_router.mcpl.link import ServerLink
from mcpl_router.mcpl.transports import OpenTransport


class Recorder:
    def __init__(self) -> None:
        self.admitted: list[str] = []

    def link_state_changed(self, *_: Any) -> None: ...

    def link_epoch_ended(self, *_: Any) -> None: ...

    async def handle_server_message(self, link: ServerLink, inbound: Any) -> Any:
        self.admitted.append(inbound.method)
        return {"results": []}


async def early_registering_server(stream: trio.abc.Stream, answers: list[dict[str, Any]]) -> None:
    """A 0.5 server that sends channels/register *before* answering featureSets/update."""
    framed = NdjsonStream(stream, stream)
    while True:
        try:
            message = json.loads(await framed.receive_message())
        except trio.EndOfChannel:
            return
        method = message.get("method")
        if method == "initialize":
            manifest = {"version": "0.5", "channels": {"register": True}}
            await framed.send_message(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": {"capabilities": {"experimental": {"mcpl": manifest}}}}).encode())
        elif method == "featureSets/update":
            early = {"jsonrpc": "2.0", "id": "early", "method": "channels/register", "params": {"channels": [{"id": "x"}]}}
            receipt = {"jsonrpc": "2.0", "id": message["id"], "result": {"accepted": True}}
            # Both in one write: the receipt is read right behind the register.
            await stream.send_all((json.dumps(early) + "\n" + json.dumps(receipt) + "\n").encode())
        elif "method" not in message:
            answers.append(message)


async def test_a_message_sent_before_the_receipt_is_refused_every_time(tmp_path) -> None:
    config = parse_config({"mcplServers": {"s": {"url": "tcp://127.0.0.1:9"}}}, source="<t>", base_dir=tmp_path)
    for _ in range(10):  # the old dispatch-time check let this through about half the time
        answers: list[dict[str, Any]] = []
        recorder = Recorder()

        async def open_memory_transport(_config: Any, nursery: trio.Nursery) -> OpenTransport:
            ours, theirs = trio.testing.memory_stream_pair()
            nursery.start_soon(early_registering_server, theirs, answers)
            return OpenTransport(stream=NdjsonStream(ours, ours), description="memory")

        link = ServerLink(config.servers["s"], recorder, open_transport_fn=open_memory_transport)
        with trio.fail_after(5):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(link.run)
                await link.wait_ready()
                while not answers:
                    await trio.sleep(0.001)
                assert link.grant.allows("channels.register")  # the receipt did take effect
                nursery.cancel_scope.cancel()
        assert recorder.admitted == []
        assert answers[0]["id"] == "early" and answers[0]["error"]["code"] == -32002
