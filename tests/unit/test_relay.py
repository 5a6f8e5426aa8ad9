"""A node's relay (mcpl_router/cluster/relay.py), over real loopback TCP.

The server behind the relay is a trio memory stream pair (the relay opens it as it would a
server's transport); the router's side is :func:`dial_relay`, as the router's links use it.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest
import trio
import trio.testing

from mcpl_router.cluster.relay import HeldLink, Relay, dial_relay
from mcpl_router.config import RouterConfig, ServerConfig, parse_config
from mcpl_router.jsonrpc.framing import NdjsonStream
from mcpl_router.mcpl.transports import OpenTransport, TransportError
from mcpl_router.store.leases import LeaseFence, LeaseTerm
from mcpl_router.store.link_leases import LinkHolder


#: The cluster's relay token, as a node reads it from the database.
TOKEN = "relay-token-of-this-cluster"


def config(tmp_path: Path) -> RouterConfig:
    return parse_config(
        {
            "mcplServers": {"s": {"url": "tcp://127.0.0.1:9"}, "t": {"url": "tcp://127.0.0.1:9"}},
            "journal": {"backend": "postgres", "dsn": "host=127.0.0.1 dbname=x"},
            "cluster": {"node": "n1", "links": "balanced"},
        },
        source="<test>", base_dir=tmp_path,
    )


class FramedEnd:
    """One end of a message-framed connection (as a WebSocket's: a message may hold a newline)."""

    line_oriented = False

    def __init__(self, send: trio.MemorySendChannel[bytes], receive: trio.MemoryReceiveChannel[bytes]) -> None:
        self._send, self._receive = send, receive

    async def send_message(self, data: bytes) -> None:
        await self._send.send(data)

    async def send_messages(self, messages: list[bytes], *, progress: object = None) -> None:
        for message in messages:
            await self._send.send(message)

    async def receive_message(self) -> bytes:
        return await self._receive.receive()

    async def aclose(self) -> None:
        await self._send.aclose()
        await self._receive.aclose()


class Servers:
    """What the relay opens: a framed pair per connection, the far end kept for the test."""

    def __init__(self) -> None:
        self.far_ends: list[FramedEnd] = []

    async def open(self, server: ServerConfig, nursery: trio.Nursery) -> OpenTransport:
        to_far, from_near = trio.open_memory_channel[bytes](16)
        to_near, from_far = trio.open_memory_channel[bytes](16)
        self.far_ends.append(FramedEnd(to_near, from_near))
        return OpenTransport(stream=FramedEnd(to_far, from_far), description=f"memory:{server.id}")


def held(epoch: int = 4, valid_for: float = 60.0) -> HeldLink:
    term = LeaseTerm("link", "n1", epoch, time.time(), server="s")
    return HeldLink(LeaseFence(term, time.monotonic() + valid_for))


async def start(tmp_path: Path, nursery: trio.Nursery, holding: dict[str, HeldLink], router: tuple[str, int] = ("n3", 7)) -> tuple[Relay, Servers, str]:
    servers = Servers()

    async def router_holds(node: str, epoch: int) -> bool:
        return (node, epoch) == router

    relay = Relay("n1", config(tmp_path), holding, router_holds, open_transport_fn=servers.open)
    relay.token = TOKEN
    address = await nursery.start(relay.serve)
    return relay, servers, address


def holder(address: str, server: str = "s") -> LinkHolder:
    return LinkHolder(server, "n1", 4, address)


async def test_messages_go_both_ways_unchanged_and_a_newline_inside_one_stays_whitespace(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        holding = {"s": held()}
        relay, servers, address = await start(tmp_path, nursery, holding)
        transport, _ = await dial_relay(holder(address), config(tmp_path).servers["s"], router="n3", router_epoch=7, token=TOKEN)
        assert transport.description == "memory:s via node n1" and transport.stream.line_oriented is False
        [server] = servers.far_ends
        await transport.stream.send_message(b'{"jsonrpc":"2.0","id":1,"method":"initialize"}')
        assert await server.receive_message() == b'{"jsonrpc":"2.0","id":1,"method":"initialize"}'
        await server.send_message(b'{"jsonrpc":"2.0",\n"id":1,"result":{}}')
        assert await transport.stream.receive_message() == b'{"jsonrpc":"2.0", "id":1,"result":{}}'
        assert holding["s"].router == ("n3", 7) and relay.counts.served == 1
        await transport.aclose()
        await trio.testing.wait_all_tasks_blocked()
        with trio.fail_after(2):  # the router gone: the server's connection closes too
            with pytest.raises((trio.EndOfChannel, trio.ClosedResourceError)):
                await server.receive_message()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("server", "router_epoch", "refused"),
    [
        ("t", 7, "node n1 does not hold server t's link"),
        ("s", 6, "node n3 does not hold the router's lease with epoch 6"),
        ("nope", 7, "server nope is not in node n1's config"),
    ],
)
async def test_a_relay_is_refused_with_the_reason_when_this_node_may_not_serve_it(
    tmp_path: Path, server: str, router_epoch: int, refused: str
) -> None:
    async with trio.open_nursery() as nursery:
        relay, servers, address = await start(tmp_path, nursery, {"s": held()})
        wanted = config(tmp_path).servers.get(server) or ServerConfig(id=server, transport="tcp", host="127.0.0.1", port=9)
        with pytest.raises(TransportError, match=refused):
            await dial_relay(holder(address, server), wanted, router="n3", router_epoch=router_epoch, token=TOKEN)
        assert relay.counts.refused == 1 and not servers.far_ends
        nursery.cancel_scope.cancel()


async def test_a_relay_whose_link_lease_ran_out_writes_nothing_more_to_the_server(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        link = held()
        relay, servers, address = await start(tmp_path, nursery, {"s": link})
        transport, _ = await dial_relay(holder(address), config(tmp_path).servers["s"], router="n3", router_epoch=7, token=TOKEN)
        [server] = servers.far_ends
        link.fence.lost("node n1's lease on server s's link (epoch 4) ran out unrenewed")
        await transport.stream.send_message(b'{"jsonrpc":"2.0","method":"late"}')
        with trio.fail_after(2):  # the relay ends: the router's stream and the server's close
            with pytest.raises(trio.EndOfChannel):
                await transport.stream.receive_message()
            with pytest.raises((trio.EndOfChannel, trio.ClosedResourceError)):
                await server.receive_message()  # and "late" never reached it
        await transport.aclose()
        nursery.cancel_scope.cancel()


async def test_a_newer_router_replaces_the_relay_and_an_older_one_is_refused(tmp_path: Path) -> None:
    router = ["n3", 7]

    async with trio.open_nursery() as nursery:
        servers = Servers()

        async def router_holds(node: str, epoch: int) -> bool:
            return [node, epoch] == router

        holding = {"s": held()}
        relay = Relay("n1", config(tmp_path), holding, router_holds, open_transport_fn=servers.open)
        relay.token = TOKEN
        address = await nursery.start(relay.serve)
        first, _ = await dial_relay(holder(address), config(tmp_path).servers["s"], router="n3", router_epoch=7, token=TOKEN)
        router[:] = ["n2", 8]  # n3 paused past its lease; n2 took the router's
        second, _ = await dial_relay(holder(address), config(tmp_path).servers["s"], router="n2", router_epoch=8, token=TOKEN)
        with trio.fail_after(2):
            with pytest.raises(trio.EndOfChannel):
                await first.stream.receive_message()
            with pytest.raises((trio.EndOfChannel, trio.ClosedResourceError)):
                await servers.far_ends[0].receive_message()
        assert holding["s"].router == ("n2", 8)
        # The view shows the router's lease at epoch 9 now: the epoch-8 relay ends too.
        relay.router_seen(9, True)
        with trio.fail_after(2), pytest.raises(trio.EndOfChannel):
            await second.stream.receive_message()
        await first.aclose()
        await second.aclose()
        nursery.cancel_scope.cancel()


async def test_what_is_not_a_hello_is_answered_and_counted(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        relay, servers, address = await start(tmp_path, nursery, {"s": held()})
        host, _, port = address.rpartition(":")
        socket = await trio.open_tcp_stream(host, int(port))
        stream = NdjsonStream(socket, socket, skip_log_lines=False)
        await stream.send_message(b"GET / HTTP/1.1")
        answer = await stream.receive_message()
        assert b'"ok": false' in answer and b"not a relay hello" in answer
        assert relay.counts.refused == 1 and not servers.far_ends
        await socket.aclose()
        nursery.cancel_scope.cancel()


async def test_a_fault_serving_one_relay_is_answered_and_the_relay_serves_the_next(tmp_path: Path) -> None:
    calls = []

    async def router_holds(node: str, epoch: int) -> bool:
        calls.append(epoch)
        if len(calls) == 1:
            raise OSError("the journal's database can't be reached")
        return True

    async with trio.open_nursery() as nursery:
        servers = Servers()
        relay = Relay("n1", config(tmp_path), {"s": held()}, router_holds, open_transport_fn=servers.open)
        relay.token = TOKEN
        address = await nursery.start(relay.serve)
        with pytest.raises(TransportError, match="node n1's relay failed: OSError: the journal's database can't be reached"):
            await dial_relay(holder(address), config(tmp_path).servers["s"], router="n3", router_epoch=7, token=TOKEN)
        transport, _ = await dial_relay(holder(address), config(tmp_path).servers["s"], router="n3", router_epoch=7, token=TOKEN)
        assert len(servers.far_ends) == 1
        await transport.aclose()
        nursery.cancel_scope.cancel()


async def test_the_relay_publishes_an_address_to_dial_never_a_wildcard(tmp_path: Path) -> None:
    import attrs

    base = config(tmp_path)
    assert base.cluster is not None
    for cluster, host in ((attrs.evolve(base.cluster, relay_bind="0.0.0.0"), None),
                          (attrs.evolve(base.cluster, relay_bind="0.0.0.0", relay_advertise="10.1.2.3"), "10.1.2.3")):
        async with trio.open_nursery() as nursery:
            relay = Relay("n1", attrs.evolve(base, cluster=cluster), {}, lambda node, epoch: trio.sleep(0))  # type: ignore[arg-type,return-value]
            address = await nursery.start(relay.serve)
            assert not address.startswith("0.0.0.0")
            if host is not None:
                assert address.startswith(f"{host}:")
            nursery.cancel_scope.cancel()


class SlowClosingServers(Servers):
    """Each connection's close takes a while (a stdio child given its graces): overlap counted."""

    def __init__(self) -> None:
        super().__init__()
        self.open_now = 0
        self.most_open = 0

    async def open(self, server: ServerConfig, nursery: trio.Nursery) -> OpenTransport:
        opened = await super().open(server, nursery)
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        inner, outer = opened.stream, self

        class Slow(FramedEnd):
            async def aclose(self) -> None:
                with trio.CancelScope(shield=True):
                    await trio.sleep(0.3)
                    await inner.aclose()
                    outer.open_now -= 1

        return OpenTransport(stream=Slow(inner._send, inner._receive), description=opened.description)  # type: ignore[attr-defined]


async def test_a_newer_router_is_served_only_once_the_old_server_connection_is_closed(tmp_path: Path) -> None:
    async def router_holds(node: str, epoch: int) -> bool:
        return True

    async with trio.open_nursery() as nursery:
        servers = SlowClosingServers()
        relay = Relay("n1", config(tmp_path), {"s": held()}, router_holds, open_transport_fn=servers.open)
        relay.token = TOKEN
        address = await nursery.start(relay.serve)
        first, _ = await dial_relay(holder(address), config(tmp_path).servers["s"], router="n3", router_epoch=7, token=TOKEN)
        second, _ = await dial_relay(holder(address), config(tmp_path).servers["s"], router="n2", router_epoch=8, token=TOKEN)
        assert (servers.most_open, len(servers.far_ends)) == (1, 2)  # never two connections to the server at once
        await first.aclose()
        await second.aclose()
        nursery.cancel_scope.cancel()


async def test_a_link_handed_over_while_the_hello_was_checked_opens_no_connection(tmp_path: Path) -> None:
    holding = {"s": held()}
    link = holding["s"]

    async def router_holds(node: str, epoch: int) -> bool:
        holding.pop("s")  # while the database answers, the placement hands the link over
        link.fence.lost("handed over: test")
        await trio.sleep(0)
        return True

    async with trio.open_nursery() as nursery:
        servers = Servers()
        relay = Relay("n1", config(tmp_path), holding, router_holds, open_transport_fn=servers.open)
        relay.token = TOKEN
        address = await nursery.start(relay.serve)
        with pytest.raises(TransportError, match="does not hold server s's link|handed server s's link over"):
            await dial_relay(holder(address), config(tmp_path).servers["s"], router="n3", router_epoch=7, token=TOKEN)
        assert not servers.far_ends
        nursery.cancel_scope.cancel()


async def test_a_hello_without_the_clusters_token_is_refused_and_the_routers_relay_goes_on(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        relay, servers, address = await start(tmp_path, nursery, {"s": held()})
        real, _ = await dial_relay(holder(address), config(tmp_path).servers["s"], router="n3", router_epoch=7, token=TOKEN)
        # The router's name and epoch are public (/status.json, /metrics); the token is not.
        with pytest.raises(TransportError, match="the relay token does not match"):
            await dial_relay(holder(address), config(tmp_path).servers["s"], router="n3", router_epoch=7, token="guessed")
        [server] = servers.far_ends
        await server.send_message(b'{"jsonrpc":"2.0","method":"still here"}')
        assert await real.stream.receive_message() == b'{"jsonrpc":"2.0","method":"still here"}'
        await real.aclose()
        nursery.cancel_scope.cancel()


async def test_nothing_the_server_says_after_the_link_lease_ran_out_reaches_the_router(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        link = held()
        relay, servers, address = await start(tmp_path, nursery, {"s": link})
        transport, link_epoch = await dial_relay(holder(address), config(tmp_path).servers["s"], router="n3", router_epoch=7, token=TOKEN)
        assert link_epoch == 4
        [server] = servers.far_ends
        link.fence.lost("node n1's lease on server s's link (epoch 4) ran out unrenewed")
        await server.send_message(b'{"jsonrpc":"2.0","method":"stale"}')
        with trio.fail_after(2), pytest.raises(trio.EndOfChannel):
            await transport.stream.receive_message()  # the relay ended; "stale" never came
        await transport.aclose()
        nursery.cancel_scope.cancel()


async def test_a_server_refusing_the_relays_dial_is_said_to_the_router_with_its_status(tmp_path: Path) -> None:
    import trio_websocket

    async def refuse(request: trio_websocket.WebSocketRequest) -> None:
        await request.reject(401)

    async def router_holds(node: str, epoch: int) -> bool:
        return True

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            server = await nursery.start(trio_websocket.serve_websocket, refuse, "127.0.0.1", 0, None)
            refusing = parse_config(
                {"mcplServers": {"s": {"url": f"ws://127.0.0.1:{server.port}/mcpl", "token": "t", "tokenIn": "auto"}},
                 "journal": {"backend": "postgres", "dsn": "host=127.0.0.1 dbname=x"}, "cluster": {"node": "n1", "links": "balanced"}},
                source="<test>", base_dir=tmp_path)
            link = held()
            relay = Relay("n1", refusing, {"s": link}, router_holds)
            relay.token = TOKEN
            address = await nursery.start(relay.serve)
            for _ in range(2):  # the relay goes on serving after each refusal
                with pytest.raises(TransportError, match=r"websocket handshake refused \(status 401\)") as refused:
                    await dial_relay(holder(address), refusing.servers["s"], router="n3", router_epoch=7, token=TOKEN)
                # The router's link reads the status, as from its own dial (it may move the token).
                assert refused.value.status == 401
            assert relay.counts.refused == 0
            # A refusal is the server's answer, not a server this node can't reach.
            assert (link.unreachable, link.unreachable_since) == (0, None)
            nursery.cancel_scope.cancel()


async def test_a_leaving_node_serves_no_new_relay_and_the_one_under_way_goes_on(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        relay, servers, address = await start(tmp_path, nursery, {"s": held()})
        under_way, _ = await dial_relay(holder(address), config(tmp_path).servers["s"], router="n3", router_epoch=7, token=TOKEN)
        relay.refusing = "node n1 is leaving the cluster"
        with pytest.raises(TransportError, match="node n1 is leaving the cluster"):
            await dial_relay(holder(address), config(tmp_path).servers["s"], router="n3", router_epoch=8, token=TOKEN)
        [server] = servers.far_ends
        await under_way.stream.send_message(b'{"jsonrpc":"2.0","method":"drain"}')
        assert await server.receive_message() == b'{"jsonrpc":"2.0","method":"drain"}'
        await under_way.aclose()
        nursery.cancel_scope.cancel()


async def test_during_a_hand_over_the_server_gets_no_new_request_and_answers_the_ones_under_way(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        link = held()
        relay, servers, address = await start(tmp_path, nursery, {"s": link})
        transport, _ = await dial_relay(holder(address), config(tmp_path).servers["s"], router="n3", router_epoch=7, token=TOKEN)
        [server] = servers.far_ends
        router = transport.stream
        await router.send_message(b'{"jsonrpc":"2.0","id":1,"method":"channels/publish","params":{}}')
        assert b'"id":1' in await server.receive_message()
        assert list(link.pending) == [b"1"]
        link.closing = "node n1 hands server s's link over (a node joined)"
        await router.send_message(b'{"jsonrpc":"2.0","id":"two","method":"channels/publish","params":{}}')
        await router.send_message(b'{"jsonrpc":"2.0","method":"channels/typing","params":{}}')  # a notification goes on
        refused = msgspec.json.decode(await router.receive_message())
        assert refused["id"] == "two" and refused["error"]["data"] == {"reason": "link-moving"}
        assert "not sent: node n1 hands server s's link over" in refused["error"]["message"]
        assert b"channels/typing" in await server.receive_message()
        # The server's answer to the request under way reaches the router; nothing is pending.
        await server.send_message(b'{"jsonrpc":"2.0","id":1,"result":{"messageId":"m1"}}')
        assert await router.receive_message() == b'{"jsonrpc":"2.0","id":1,"result":{"messageId":"m1"}}'
        assert not link.pending
        await transport.aclose()
        nursery.cancel_scope.cancel()


PAD = b"x" * 8192


async def test_a_router_reading_slower_than_the_server_sends_holds_the_server_back_and_loses_nothing(tmp_path: Path) -> None:
    async with trio.open_nursery() as nursery:
        relay, servers, address = await start(tmp_path, nursery, {"s": held()})
        transport, _ = await dial_relay(holder(address), config(tmp_path).servers["s"], router="n3", router_epoch=7, token=TOKEN)
        [server] = servers.far_ends
        sent = 0

        async def flood() -> None:
            nonlocal sent
            for n in range(2000):  # one message a batch (a framed stream), 8 KiB each: past any socket buffer
                await server.send_message(b'{"jsonrpc":"2.0","method":"m","params":{"n":%d,"pad":"%s"}}' % (n, PAD))
                sent += 1

        nursery.start_soon(flood)
        await trio.testing.wait_all_tasks_blocked(0.05)
        assert 0 < sent < 2000 and relay.counts.backpressured > 0  # the server waits; the router has not read
        got = [await transport.stream.receive_message() for _ in range(2000)]
        assert got == [b'{"jsonrpc":"2.0","method":"m","params":{"n":%d,"pad":"%s"}}' % (n, PAD) for n in range(2000)]
        await transport.aclose()
        nursery.cancel_scope.cancel()
