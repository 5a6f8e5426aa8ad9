"""Several node addresses, one host: :class:`FailoverClient` moves to the next node by itself.

    async with FailoverClient.connect(["/run/a/host.sock", "ws://10.0.0.2:8765/"], token=t) as client:
        await client.hello("my-host", ["kai"])
        async for wake in client.wakes():          # goes on across a node's death
            try:
                async with client.turn(wake.agent, wakes=[wake.seq]) as turn:
                    await turn.text("On it.")
            except ConnectionLost:
                continue                           # the next node sends this wake again
            await client.ack([wake.seq])

A cluster is several daemons on one journal, one of which serves hosts at a time; the others
forward a host's connection to it, or refuse it (a ``-32000`` error) while no node serves or the
serving node can't be reached. The client connects to the first address that accepts (and says
hello). When that connection ends (the node died, or drained after ``daemon/shutdown``, or the
node forwarding it saw the serving node change) it tries the next address,
and the next, round and round, sleeping a backoff after each full round in which none accepted
(doubling from ``backoff[0]`` to ``backoff[1]``; each round logged); with no connection for
``give_up_after`` seconds it stops and raises :class:`NoNodeReachable` to the caller.

A node that stops answering without closing the connection (SIGSTOP, a paused VM, a silent
partition) is found by a liveness probe (:mod:`mcpl_router.client.liveness`): nothing arrived
for ``probe_after`` seconds, a ``servers/list`` with a ``probe_timeout`` deadline, no answer:
the connection is closed (logged, counted) and the client moves on as for a lost one.

**Retried** on the next node: connecting; the hello (same host, every agent declared so far,
the caller's ``resume_from``; inference handlers registered again first); and an ack whose
connection ended before it was answered (acking twice is harmless). **Not retried**: anything
else. A turn is its connection's: a turn open on a lost connection, and any other call made on
it (publish, typing, ``call``), raises :class:`ConnectionLost` (a ``PeerClosed``): it may or
may not have been carried out, so the caller decides. The turn's wake is not acked, so the
next node sends it again and the caller opens the turn again then.

**Wakes.** The journal is the truth: after the hello the next node sends every wake not acked
in it. The caller sees such a wake again unless it issued its ack: a wake it acked (the answer
lost with the connection, or not) is not yielded again, and its ack goes to the next node. The
wakes left unread in a lost connection's buffer are dropped, counted (the next node sends them
again, being unacked). Every address must be a node of the same journal: seqs are the journal's.

``resume_from`` is passed as the caller gave it, never made up here: a wake below the highest
acked seq can still be owed (acks answered out of order, a gate's deferred wake, a batch that
overtakes older ones), and the daemon counts every seq at or below a resume point as the host's.
"""

from __future__ import annotations

import contextlib
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import trio
import trio_websocket

from mcpl_router.client.buffer import DEFAULT_MAX_NOTIFICATIONS, DEFAULT_MAX_WAKES, Notification
from mcpl_router.client.connection import ChannelArg, ClientStatistics, RouterClient
from mcpl_router.client.liveness import ProbeCounts, watch
from mcpl_router.client.results import HelloResult, PublishResult, Status, TypingResult
from mcpl_router.client.serving import ForkSpawnHandler, InferenceHandler, ModelInfoHandler
from mcpl_router.client.turn import Turn, turn_block
from mcpl_router.client.wakes import WakeNotice
from mcpl_router.jsonrpc import PeerClosed, RequestTimeout, RpcError
from mcpl_router.jsonrpc.envelope import OVERLOADED
from mcpl_router.logs import get_logger

__all__ = ["ConnectionLost", "FailoverClient", "FailoverStatistics", "NoNodeReachable"]

T = TypeVar("T")

#: What a failed connect (or hello) to one address raises: that address is passed over.
_PASSED_OVER = (OSError, trio.TooSlowError, trio.BrokenResourceError, trio_websocket.HandshakeError, PeerClosed, RequestTimeout)


def _passed_over(exc: Exception) -> bool:
    """Whether ``exc`` says this address does not serve now (another may), rather than that the
    daemon refused what was asked. A ``-32000`` error is a connection refused at accept: a
    standby with no reachable holder to forward it to, or a node at its connection limit."""
    return isinstance(exc, _PASSED_OVER) or (isinstance(exc, RpcError) and exc.code == OVERLOADED)


class ConnectionLost(PeerClosed):
    """The connection a call (or a turn) was made on ended before the call was answered.

    Not retried: it may have been carried out. A turn is bound to its connection; the wake it
    was for is unacked, so the next node sends it again and the turn is opened again then.
    """

    def __init__(self, address: str, method: str) -> None:
        super().__init__(f"{method}: the connection to {address} was lost; the client moves to the next node")
        self.address = address
        self.method = method


class NoNodeReachable(ConnectionError):
    """No address accepted a connection and a hello for ``give_up_after`` seconds.
    ``errors`` holds the last error of each address."""

    def __init__(self, errors: Mapping[str, str], seconds: float) -> None:
        listed = "; ".join(f"{address}: {error}" for address, error in errors.items())
        super().__init__(f"no node accepted a connection for {seconds:g}s ({listed})")
        self.errors = dict(errors)


@attrs.frozen
class FailoverStatistics:
    """What the failover did; ``connection`` is the current connection's counters."""

    address: str | None
    connects: int
    failovers: int
    attempts_failed: int
    rounds_failed: int
    #: Acks sent again on a next node (their connection ended before the answer).
    acks_resent: int
    #: Wakes a next node sent again whose ack the caller had issued: not yielded again.
    wakes_suppressed: int
    #: Wakes left unread in a lost connection's buffer: dropped (the next node sends them again).
    wakes_left_behind: int
    connection: ClientStatistics | None
    #: Liveness probes sent (each after ``probe_after`` seconds in which nothing arrived), and
    #: those unanswered by ``probe_timeout``: each closed its connection (a failover follows).
    probes: int = 0
    probes_unanswered: int = 0


@attrs.define
class _Link:
    """One live connection: where to, and the wakes the caller had unacked when it was made."""

    client: RouterClient
    address: str
    carried: set[int] = attrs.field(factory=set)


def _address(address: str | os.PathLike[str]) -> str:
    text = os.fspath(address)
    if "://" in text and not text.startswith(("ws://", "wss://")):
        raise ValueError(f"{text!r} is neither a Unix socket path nor a ws:// or wss:// URL")
    return text


class FailoverClient:
    """A host's connection to whichever of ``addresses`` serves hosts (module docstring).
    Open it with :meth:`connect`; it closes when the block ends."""

    def __init__(
        self,
        addresses: Sequence[str | os.PathLike[str]],
        *,
        token: str | None = None,
        timeout: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
        ca_file: str | Path | None = None,
        max_wakes: int = DEFAULT_MAX_WAKES,
        max_notifications: int = DEFAULT_MAX_NOTIFICATIONS,
        backoff: tuple[float, float] = (0.1, 2.0),
        give_up_after: float | None = 60.0,
        probe_after: float | None = 5.0,
        probe_timeout: float = 5.0,
    ) -> None:
        if (probe_after is not None and probe_after <= 0) or probe_timeout <= 0:
            raise ValueError(f"probe_after and probe_timeout must be positive; got {probe_after}, {probe_timeout}")
        self._addresses = [_address(address) for address in addresses]
        if not self._addresses:
            raise ValueError("FailoverClient needs at least one address")
        self._token = token
        self._timeout = timeout
        self._ssl_context = ssl_context
        self._ca_file = ca_file
        self._bounds = (max_wakes, max_notifications)
        self._backoff = backoff
        self._give_up_after = give_up_after
        self._probe_after = probe_after
        self._probe_timeout = probe_timeout
        self._probes = ProbeCounts()
        self._link: _Link | None = None
        self._failure: Exception | None = None
        self._changed = trio.Event()
        # What a next node is told in its hello: the host, every agent declared, resume_from.
        self._host: str | None = None
        self._agents: dict[str, dict[str, Any]] = {}
        self._resume_from: int | None = None
        self._handlers: dict[str, Any] = {}
        #: Wakes yielded and not acked yet: seq → whether the caller issued its ack.
        self._unacked: dict[int, bool] = {}
        self._counts = dict.fromkeys(
            ("connects", "failovers", "attempts_failed", "rounds_failed", "acks_resent", "wakes_suppressed", "wakes_left_behind"), 0
        )
        self._log = get_logger(component="client.failover")

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls,
        addresses: Sequence[str | os.PathLike[str]],
        *,
        token: str | None = None,
        timeout: float = 30.0,
        ssl_context: ssl.SSLContext | None = None,
        ca_file: str | Path | None = None,
        max_wakes: int = DEFAULT_MAX_WAKES,
        max_notifications: int = DEFAULT_MAX_NOTIFICATIONS,
        backoff: tuple[float, float] = (0.1, 2.0),
        give_up_after: float | None = 60.0,
        probe_after: float | None = 5.0,
        probe_timeout: float = 5.0,
    ) -> AsyncIterator[FailoverClient]:
        """Connect to the first of ``addresses`` that accepts: Unix socket paths and
        ``ws://``/``wss://`` URLs (one ``token``, ``ssl_context``/``ca_file`` for them all).

        ``timeout``, ``max_wakes`` and ``max_notifications`` are each connection's, as
        :meth:`RouterClient.connect_unix`'s; ``backoff`` (first, most) is the sleep after a
        full round of refusals, doubling; ``give_up_after`` the seconds with no connection
        before :class:`NoNodeReachable` (None: never). A connection on which nothing arrived
        for ``probe_after`` seconds is probed, and closed when the probe has no answer within
        ``probe_timeout`` (None: never probed; see :mod:`mcpl_router.client.liveness`).

        Raises:
            NoNodeReachable: none accepted for ``give_up_after`` seconds.
            ValueError: an address is neither a path nor a ``ws://``/``wss://`` URL.
        """
        client = cls(
            addresses, token=token, timeout=timeout, ssl_context=ssl_context, ca_file=ca_file, max_wakes=max_wakes,
            max_notifications=max_notifications, backoff=backoff, give_up_after=give_up_after,
            probe_after=probe_after, probe_timeout=probe_timeout,
        )  # fmt: skip
        failure: Exception | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client._keep_connected)
            try:
                await client._live()
                yield client
            except Exception as exc:
                failure = exc  # re-raised below, as raised: not inside an exception group
            finally:
                nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure

    # -- keeping a connection --------------------------------------------------------------------

    async def _keep_connected(self) -> None:
        index, tried, delay = 0, 0, self._backoff[0]
        down_since = trio.current_time()
        errors: dict[str, str] = {}
        while True:
            address = self._addresses[index]
            # After a loss too: the next address first (the lost node no longer serves hosts).
            index = (index + 1) % len(self._addresses)
            try:
                await self._serve(address)
            except Exception as exc:
                if not _passed_over(exc):  # a hello refused (RpcError): no other node would say otherwise
                    self._fail(exc)
                    return
                self._counts["attempts_failed"] += 1
                errors[address] = f"{type(exc).__name__}: {exc}"
                self._log.info("client.failover.refused", address=address, error=errors[address])
            else:  # served until the connection ended: a new round, from the next address
                tried, delay, down_since = 0, self._backoff[0], trio.current_time()
                errors.clear()
                continue
            tried += 1
            if tried < len(self._addresses):
                continue
            tried = 0
            self._counts["rounds_failed"] += 1
            down_for = trio.current_time() - down_since
            if self._give_up_after is not None and down_for >= self._give_up_after:
                self._log.error("client.failover.gave_up", seconds=round(down_for, 1), errors=errors)
                self._fail(NoNodeReachable(errors, down_for))
                return
            self._log.warning("client.failover.round_failed", addresses=self._addresses, errors=errors, retry_in=delay)
            await trio.sleep(delay)
            delay = min(delay * 2, self._backoff[1])

    async def _serve(self, address: str) -> None:
        """Connect to ``address``, say hello, and serve the caller until the connection ends.
        Raises what the connect or the hello raised."""
        link: _Link | None = None
        try:
            async with self._open(address) as client:
                failure: Exception | None = None
                async with trio.open_nursery() as watching:
                    # From the connect on: a stopped node accepts (its kernel does) but never
                    # answers the hello either.
                    if self._probe_after is not None:
                        watching.start_soon(self._watch, client, address, self._probe_after)
                    try:
                        for method, handler in self._handlers.items():
                            getattr(client, method)(handler)
                        if self._host is not None:
                            await client.hello(self._host, list(self._agents.values()), self._resume_from)
                        # A wake the caller had unacked may come again here: see next_wake.
                        link = _Link(client, address, set(self._unacked))
                        failover = self._counts["connects"] > 0
                        self._counts["connects"] += 1
                        self._counts["failovers"] += failover
                        self._log.info("client.failover.connected", address=address, failover=failover, unacked=len(link.carried))
                        self._set_link(link)
                        try:
                            await client.wait_closed()
                        finally:
                            # Not read, and unacked: the next node sends them again.
                            left = 0
                            while client.notifications.receive_nowait("wake") is not None:
                                left += 1
                            self._counts["wakes_left_behind"] += left
                            self._set_link(None)
                        self._log.warning("client.failover.lost", address=address, wakes_left_behind=left)
                    except Exception as exc:
                        failure = exc  # re-raised below, as raised: not inside an exception group
                    finally:
                        watching.cancel_scope.cancel()
                if failure is not None:
                    raise failure
        except Exception as exc:
            if link is None or not _passed_over(exc):
                raise
            # It broke on its way out: it was served all the same.

    async def _watch(self, client: RouterClient, address: str, probe_after: float) -> None:
        silent = await watch(client, probe_after=probe_after, probe_timeout=self._probe_timeout, counts=self._probes)
        if silent is None:
            return
        self._log.warning("client.failover.unresponsive", address=address, silent=round(silent, 1), probe_timeout=self._probe_timeout)
        # Calls waiting on it raise PeerClosed (a hello: the address is passed over), and
        # wait_closed returns: the next address, as for a lost connection.
        await client.aclose(f"{address} answered nothing for {silent:.1f}s, a liveness probe included")

    def _open(self, address: str) -> contextlib.AbstractAsyncContextManager[RouterClient]:
        max_wakes, max_notifications = self._bounds
        if address.startswith(("ws://", "wss://")):
            return RouterClient.connect_websocket(
                address, self._token, timeout=self._timeout, ssl_context=self._ssl_context, ca_file=self._ca_file,
                max_wakes=max_wakes, max_notifications=max_notifications,
            )  # fmt: skip
        return RouterClient.connect_unix(address, timeout=self._timeout, max_wakes=max_wakes, max_notifications=max_notifications)

    def _set_link(self, link: _Link | None) -> None:
        self._link = link
        self._changed.set()
        self._changed = trio.Event()

    def _fail(self, exc: Exception) -> None:
        self._failure = exc
        self._set_link(None)

    async def _live(self) -> _Link:
        """The current connection; waits for one while there is none."""
        while True:
            if self._failure is not None:
                raise self._failure
            link = self._link
            if link is not None and not link.client.is_closed:
                return link
            await self._changed.wait()

    # -- sessions, wakes, acks (retried) ---------------------------------------------------------

    async def hello(self, host: str, agents: Sequence[Mapping[str, Any] | str], resume_from: int | None = None) -> HelloResult:
        """``session/hello`` as :meth:`RouterClient.hello`; every next node is told it too."""
        specs = [{"name": agent} if isinstance(agent, str) else dict(agent) for agent in agents]
        self._host, self._resume_from = host, resume_from
        self._agents.update((str(spec["name"]), spec) for spec in specs)
        while True:
            link = await self._live()
            try:
                return await link.client.hello(host, specs, resume_from)
            except PeerClosed:
                await link.client.wait_closed()  # the next connection says this hello itself
            except RpcError as exc:
                if not _passed_over(exc):
                    raise
                # Refused at accept (connected before this hello): that node closes the
                # connection, and the next one says this hello itself.
                await link.client.wait_closed()

    async def next_wake(self) -> WakeNotice:
        """The next wake, from whichever node is serving (module docstring: which come again)."""
        while True:
            link = await self._live()
            try:
                notification = await link.client.notifications.receive("wake")
            except trio.EndOfChannel:
                continue
            if link.client.is_closed:
                self._counts["wakes_left_behind"] += 1
                continue
            wake = WakeNotice.from_params(notification.params)
            if wake.seq in link.carried:
                link.carried.discard(wake.seq)
                # Not in _unacked any more: its ack was answered meanwhile.
                if self._unacked.get(wake.seq, True):
                    self._counts["wakes_suppressed"] += 1
                    continue
            self._unacked.setdefault(wake.seq, False)
            return wake

    async def wakes(self) -> AsyncIterator[WakeNotice]:
        """Every wake, across nodes, until the block ends (or :class:`NoNodeReachable`)."""
        while True:
            yield await self.next_wake()

    async def ack(self, seqs: Sequence[int], *, agent: str | None = None) -> int:
        """``wake/ack`` as :meth:`RouterClient.ack`; sent again on the next node when its
        connection ends before the answer (the count is then the next node's)."""
        wanted = list(seqs)
        ints = [seq for seq in wanted if type(seq) is int]
        for seq in ints:
            self._unacked[seq] = True
        answered = False
        try:
            while True:
                link = await self._live()
                try:
                    acked = await link.client.ack(wanted, agent=agent)
                except PeerClosed:
                    self._counts["acks_resent"] += 1
                    await link.client.wait_closed()
                    continue
                answered = True
                return acked
        finally:
            for seq in ints:
                if answered:
                    self._unacked.pop(seq, None)
                elif seq in self._unacked:
                    self._unacked[seq] = False  # not acked after all: it may come again

    async def next_notification(self, method: str | None = None) -> Notification:
        """The current connection's next notification (of ``method``); waits across a failover."""
        while True:
            link = await self._live()
            try:
                return await link.client.notifications.receive(method)
            except trio.EndOfChannel:
                continue

    # -- calls on the current connection (not retried) -------------------------------------------

    async def _once(self, method: str, call: Callable[[RouterClient], Awaitable[T]]) -> T:
        return await _OnLink(await self._live()).run(method, call)

    async def call(self, method: str, params: Any = None, *, timeout: float | None = None) -> Any:
        """:meth:`RouterClient.call` on the current connection; :class:`ConnectionLost` if it ends first."""
        return await self._once(method, lambda client: client.call(method, params, timeout=timeout))

    async def request(self, method: str, params: Any, result_type: type[T], *, timeout: float | None = None) -> T:
        return await self._once(method, lambda client: client.request(method, params, result_type, timeout=timeout))

    async def notify(self, method: str, params: Any = None) -> None:
        await self._once(method, lambda client: client.notify(method, params))

    async def status(self) -> Status:
        return await self._once("status", lambda client: client.status())

    async def publish(
        self, agent: str, channel: ChannelArg, content: str | Sequence[Mapping[str, Any]], *, thread_id: str | None = None
    ) -> PublishResult:
        return await self._once("channels/publish", lambda client: client.publish(agent, channel, content, thread_id=thread_id))

    async def typing(self, channel: ChannelArg, op: str = "start") -> TypingResult:
        return await self._once("channels/typing", lambda client: client.typing(channel, op))

    @contextlib.asynccontextmanager
    async def turn(
        self, agent: str, *, wakes: Sequence[int] = (), channel: ChannelArg | None = None, subagent: bool = False
    ) -> AsyncIterator[Turn]:
        """:meth:`RouterClient.turn` on the current connection. Every call about the turn raises
        :class:`ConnectionLost` once that connection has ended: open it again on the next."""
        on_link = _OnLink(await self._live())
        opened = await on_link.run("turn/open", lambda client: client.open_turn(agent, wakes=wakes, channel=channel, subagent=subagent))
        async with turn_block(Turn(on_link, agent, opened)) as turn:
            yield turn

    # -- daemon→host requests: registered on every connection ------------------------------------

    def serve_inference(self, handler: InferenceHandler | None) -> None:
        """As :meth:`RouterClient.serve_inference`, on this and every next connection."""
        self._serve_with("serve_inference", handler)

    def serve_model_info(self, handler: ModelInfoHandler | None) -> None:
        self._serve_with("serve_model_info", handler)

    def serve_fork_spawn(self, handler: ForkSpawnHandler | None) -> None:
        self._serve_with("serve_fork_spawn", handler)

    def _serve_with(self, method: str, handler: object) -> None:
        self._handlers[method] = handler
        if self._link is not None:
            getattr(self._link.client, method)(handler)

    # -- counters --------------------------------------------------------------------------------

    @property
    def address(self) -> str | None:
        """The address of the connection in use (None between two)."""
        return None if self._link is None else self._link.address

    def statistics(self) -> FailoverStatistics:
        link, counts = self._link, self._counts
        return FailoverStatistics(
            address=None if link is None else link.address,
            connects=counts["connects"],
            failovers=counts["failovers"],
            attempts_failed=counts["attempts_failed"],
            rounds_failed=counts["rounds_failed"],
            acks_resent=counts["acks_resent"],
            wakes_suppressed=counts["wakes_suppressed"],
            wakes_left_behind=counts["wakes_left_behind"],
            connection=None if link is None else link.client.statistics(),
            probes=self._probes.sent,
            probes_unanswered=self._probes.unanswered,
        )


class _OnLink:
    """A turn's calls, bound to the connection it was opened on: a lost one raises
    :class:`ConnectionLost` (the turn does not follow the client to the next node)."""

    def __init__(self, link: _Link) -> None:
        self._link = link

    async def run(self, method: str, call: Callable[[RouterClient], Awaitable[T]]) -> T:
        try:
            return await call(self._link.client)
        except PeerClosed as exc:
            if isinstance(exc, ConnectionLost):
                raise
            raise ConnectionLost(self._link.address, method) from exc

    async def request(self, method: str, params: Any, result_type: type[T], *, timeout: float | None = None) -> T:
        return await self.run(method, lambda client: client.request(method, params, result_type, timeout=timeout))

    async def notify(self, method: str, params: Any = None) -> None:
        await self.run(method, lambda client: client.notify(method, params))
