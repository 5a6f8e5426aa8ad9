"""The bare forwarder the benchmarks measure the daemon against: the same wire work, no routing.

    python bench/forwarder.py --socket PATH [--mode inbound|speech] [--answers FILE] [--journal FILE] PORT [PORT …]

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
  on both wires. Its host connections keep the daemon's order of a turn's calls (the lanes of
  :func:`~mcpl_router.hosts.listener.host_lane`: a turn's calls after ``turn/open`` in a lane
  of their own; only ``turn/context`` runs beside them), so a turn's words arrive before its
  close publishes them;
- ``speak {server, channel, text}`` does that server wire work in one host call (the figure
  before the turn calls above were mirrored: kept as a second reading).

With ``--journal FILE`` (an SQLite file, made if new) it is the **journal floor** instead: the
least any daemon keeping the durability promises does beyond forwarding. Each message's event
and delivery rows (the daemon's schema and insert statements, WAL, ``synchronous=FULL``) are committed, in a group
commit off the trio thread, before the server hears ``accepted`` and before the message's wake
goes out, in seq order; each ``wake/ack`` is committed before it is answered, by the daemon's own
two ack statements (the deliveries, then the events all of whose deliveries are acked). Nothing
else: no dedup or digest, grant, registry, wake policy, window or replay; a host that stops
reading stops the floor with an error (:data:`WAITING_LIMIT`). What is left between the
floor and the daemon is the daemon's work beyond the durable writes.

Both modes tune the cyclic collector as the daemon does (``mcpl_router.cli.tune_gc``: start-up
objects frozen, the young generation collected every 20,000 allocations), so a difference in a
tail is not a difference in collectors.
"""

from __future__ import annotations

import argparse
import itertools
import signal
import sqlite3
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec  # noqa: E402
import trio  # noqa: E402

from mcpl_router.cli import tune_gc  # noqa: E402
from mcpl_router.hosts.listener import host_lane  # noqa: E402
from mcpl_router.jsonrpc import Inbound, MethodTable, NdjsonStream, Peer, PeerClosed  # noqa: E402
from mcpl_router.jsonrpc.handlers import Later  # noqa: E402
from mcpl_router.jsonrpc.peer import Deferred  # noqa: E402
from mcpl_router.store.schema import (  # noqa: E402
    SCHEMA,
    SQL_ACK_DELIVERIES,
    SQL_ACK_EVENTS,
    SQL_INSERT_DELIVERY,
    SQL_INSERT_EVENT_AT,
)


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


class Ack(msgspec.Struct):
    seqs: list[int] = []


class Speak(msgspec.Struct):
    server: int
    channel: str
    text: str


#: A bench whose host doesn't read is broken: past this many wakes waiting for it, the floor stops
#: with an error rather than grow (the daemon, here, would read them back from its journal).
WAITING_LIMIT: Final = 100_000


class JournalFloor:
    """Group commit of what arrived since the last commit, in a worker thread; each caller's
    ``then`` runs on the trio thread once the commit holding its rows is durable.

    What waits for a commit is bounded by the peers that sent it: a link's answers awaiting
    their commit (the peer's deferred-answer bound, after which its lane waits) and a host's
    ``wake/ack`` calls (each handled in turn, under the peer's inbound bound)."""

    def __init__(self, path: str) -> None:
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        for pragma in ("journal_mode=WAL", "synchronous=FULL", "cache_size=-65536"):
            self._db.execute(f"PRAGMA {pragma}")
        self._db.executescript(SCHEMA)
        #: Seqs go on after the file's last (a file used before keeps its rows).
        self.seqs = itertools.count(int(self._db.execute("SELECT COALESCE(MAX(seq), 0) FROM inbound").fetchone()[0]) + 1)
        self._encode = msgspec.json.Encoder().encode
        self._events: list[tuple[Any, ...]] = []
        self._acks: list[int] = []
        self._then: list[Callable[[], None]] = []
        self._work = trio.Event()

    def record(self, numbered: list[tuple[int, dict[str, Any]]], server: str, then: Callable[[], None]) -> None:
        now = time.time()
        for seq, message in numbered:
            # The daemon's own row: no digest (the floor keeps no dedup), unacked.
            self._events.append(
                (seq, server, message.get("channelId"), "message", str(message.get("messageId")), None, self._encode(message), now, 0)
            )
        self._then.append(then)
        self._work.set()

    def ack(self, seqs: list[int], then: Callable[[], None]) -> None:
        self._acks.extend(seqs)
        self._then.append(then)
        self._work.set()

    def _commit(self, events: list[tuple[Any, ...]], acks: list[int]) -> None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        # The journal's own statements (store/schema.py), as its writer runs them.
        db.executemany(SQL_INSERT_EVENT_AT, events)
        db.executemany(SQL_INSERT_DELIVERY, [("bench", event[0], "message", b"[]", 1) for event in events])
        if acks:
            seqs = self._encode(sorted(set(acks)))
            db.execute(SQL_ACK_DELIVERIES, ("bench", seqs))
            db.execute(SQL_ACK_EVENTS, (seqs,))
        db.execute("COMMIT")

    async def run(self) -> None:
        while True:
            await self._work.wait()
            self._work = trio.Event()
            events, acks, then = self._events, self._acks, self._then
            self._events, self._acks, self._then = [], [], []
            await trio.to_thread.run_sync(self._commit, events, acks)
            for callback in then:
                callback()


class FloorWakes:
    """The floor's wakes to the newest host, in seq order: queued straight into its outbox while
    that has room, the rest sent by :meth:`run` as room comes (or as a host comes)."""

    def __init__(self, hosts: list[Peer]) -> None:
        self._hosts = hosts
        self._waiting: deque[dict[str, Any]] = deque()
        self._sending = False  # run() is waiting for room with the head of the queue
        self._more = trio.Event()

    def send(self, wakes: list[dict[str, Any]]) -> None:
        self._waiting.extend(wakes)
        if len(self._waiting) > WAITING_LIMIT:
            raise SystemExit(f"journal floor: {len(self._waiting):,} wakes wait for a host that doesn't read; stopping")
        while not self._sending and self._waiting and self._hosts:
            try:
                if not self._hosts[-1].notify_nowait("wake", self._waiting[0]):
                    break
            except PeerClosed:
                break
            self._waiting.popleft()
        if self._waiting:
            self._more.set()

    def host_came(self) -> None:
        self._more.set()

    async def run(self) -> None:
        while True:
            await self._more.wait()
            self._more = trio.Event()
            while self._waiting and self._hosts:
                self._sending = True
                try:
                    await self._hosts[-1].notify("wake", self._waiting[0])
                except PeerClosed:
                    break  # that host is gone: the next one gets it (host_came)
                finally:
                    self._sending = False
                self._waiting.popleft()


def _wake(seq: int, message: dict[str, Any]) -> dict[str, Any]:
    return {"seq": seq, "agent": "bench", "reason": "message",
            "channel": {"serverId": "s", "channelId": message.get("channelId"), "shown": "s:general"},
            "tags": [], "messages": [message]}


async def main(socket_path: str, ports: list[int], answers: dict[str, Any], journal_path: str | None = None) -> None:
    hosts: list[Peer] = []
    servers: list[Peer] = []
    journal = JournalFloor(journal_path) if journal_path else None
    seqs = journal.seqs if journal is not None else itertools.count(1)
    floor_wakes = FloorWakes(hosts)
    async with trio.open_nursery() as nursery:

        def journaled(messages: list[dict[str, Any]]) -> Deferred:
            assert journal is not None
            numbered = [(next(seqs), message) for message in messages]
            later = Later()

            def durable() -> None:
                floor_wakes.send([_wake(seq, message) for seq, message in numbered])
                later.settle({"results": [{"messageId": m.get("messageId"), "accepted": True} for m in messages]})

            journal.record(numbered, "s", durable)
            return Deferred.pushed(later)

        async def from_server(inbound: Inbound) -> Any:
            if inbound.method == "channels/incoming":
                messages = inbound.decode_params(Incoming).messages
                if journal is not None:
                    return journaled(messages)
                for message in messages:
                    if hosts:
                        await hosts[-1].notify("wake", _wake(next(seqs), message))
                return {"results": [{"messageId": m.get("messageId"), "accepted": True} for m in messages]}
            return None if inbound.is_notification else {"results": []}

        if journal is not None:
            nursery.start_soon(journal.run)
            nursery.start_soon(floor_wakes.run)

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

        async def ack(params: Ack, _inbound: Inbound) -> Any:
            if journal is not None:
                durable = trio.Event()
                journal.ack(params.seqs, durable.set)
                await durable.wait()
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
            # The daemon's order at a turn's end: the typing stop, the stream's complete, the terminal.
            await server.notify("channels/typing", {"channelId": "general", "op": "stop"})
            await server.notify("channels/outgoing/complete", {"inferenceId": inference, "conversationId": "c", "channelId": "general", "content": text})
            await server.notify("inference/lifecycle", {"inferenceId": inference, "conversationId": "c", "turnIndex": 0, "phase": "completed"})
            return answers.get("close", {})

        table.add("session/hello", hello)
        table.add("turn/open", turn_open, TurnOpen)
        table.add("turn/context", turn_context, TurnRef, concurrent=True)
        table.add("turn/text", turn_text, TurnText)
        table.add("turn/close", turn_close, TurnRef)
        table.add("wake/ack", ack, Ack)
        table.add("speak", speak, Speak, concurrent=True)

        async def serve(stream: trio.SocketStream) -> None:
            peer = Peer(NdjsonStream(stream, stream, skip_log_lines=False), table, concurrent_methods=table.concurrent_methods, lane_of=host_lane)
            hosts.append(peer)
            floor_wakes.host_came()
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
    parser.add_argument("--journal", help="be the journal floor: journal each message and ack in this SQLite file first")
    parser.add_argument("ports", nargs="+", type=int)
    args = parser.parse_args()
    tune_gc()
    # Stopped by SIGINT (the floor's tests), which must raise KeyboardInterrupt whatever this
    # process inherited: started from a shell's background job, SIGINT comes in ignored, and
    # Python (and trio) then leave it ignored, so the floor would outlive its test's stop.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        trio.run(main, args.socket, args.ports, msgspec.json.decode(args.answers.read_bytes()) if args.answers else {}, args.journal)
    except KeyboardInterrupt:
        pass
    finally:
        Path(args.socket).unlink(missing_ok=True)
