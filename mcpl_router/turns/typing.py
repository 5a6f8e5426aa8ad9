"""Typing indicators: the daemon's own for each turn, and the leases of hosts' own typing.

A turn shows typing in its typing channel, on that channel's server only (and only if granted
``channels.typing``): ``start`` at once and every ``typing_interval`` (the keeper asks), ``stop``
on every way a turn ends, exactly where the start went and only on the transport epoch that saw
it. A host's own ``channels/typing start`` holds for ``host_typing_lease`` unless renewed; the
daemon stops it when the lease runs out or the host's connection closes, so a crashed host can
never leave a channel typing. Withdrawn channels are forgotten without a send (their server no
longer knows them); another server's channel with the same id is never touched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import trio

from mcpl_router.mcpl.session import TYPING, Queued, ServerSession, TypingOp, TypingParams
from mcpl_router.jsonrpc import INVALID_PARAMS, RpcError
from mcpl_router.logs import get_logger
from mcpl_router.routing import texts
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.turns import MalformedChannel
from mcpl_router.routing.typing import host_typing_targets
from mcpl_router.turns.run import CHANNEL_REFUSED, TurnRun, TurnTimings

if TYPE_CHECKING:
    from mcpl_router.turns.run import HostLink
    from mcpl_router.routing.router import Router

__all__ = ["TypingIndicators"]


class TypingIndicators:
    """Every typing indicator the daemon holds, and the sends that start and stop them."""

    def __init__(self, *, servers: Mapping[str, ServerSession], router: Router, timings: TurnTimings) -> None:
        self._servers = servers
        self._router = router
        self._timings = timings
        self._log = get_logger()
        #: A host's typing in progress: the channel → (the connection that started it, lease end).
        self._host_typing: dict[ChannelRef, tuple[HostLink | None, float]] = {}
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Stop hosts' typing whose lease ran out, until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                while True:
                    await trio.sleep(min(self._timings.host_typing_lease / 3, 5.0))
                    await self._expire_host_typing()
            finally:
                self._nursery = None

    # -- one send ---------------------------------------------------------------------------

    def _unsendable(self, ref: ChannelRef, session: ServerSession | None) -> str | None:
        """Why no ``channels/typing`` can go to ``ref`` on ``session`` (its own server's), or None."""
        if session is None:
            return texts.Reason.NO_LINK
        unusable = session.unusable(TYPING)
        if unusable is not None:
            return unusable
        if not self._router.registry.is_registered(ref):
            # A withdrawn channel is unknown to its server: neither start nor stop names it.
            return texts.Reason.NOT_REGISTERED
        return None

    async def send(self, ref: ChannelRef, op: TypingOp) -> str | None:
        """Send one ``channels/typing`` to ``ref``'s own server; None when sent, else why not."""
        session = self._servers.get(ref.server_id)
        reason = self._unsendable(ref, session)
        if reason is not None:
            return reason
        assert session is not None
        if not await session.typing(TypingParams(channel_id=ref.channel_id, op=op)):
            return texts.Reason.NO_LINK
        return None

    # -- a turn's typing --------------------------------------------------------------------

    async def refresh(self, run: TurnRun) -> None:
        """Start (again) the turn's typing in its typing channel; stop it first where it moved from."""
        ref = run.turn.routing.typing_channel
        if run.typing_sent is not None and run.typing_sent[0] != ref:
            # The typing channel moved (a channel_open that set the speech target): the old
            # channel stops, on its own server, before the new one starts.
            await self.stop(run)
        if ref is None:
            return
        session = self._servers.get(ref.server_id)
        previous = run.typing_sent
        # Recorded before the send: a turn ending while the start is in flight still stops it
        # (a stop where no start landed is harmless; a start never stopped is not).
        run.typing_sent = (ref, session.epoch if session else 0)
        if await self.send(ref, "start") is not None and run.typing_sent == (ref, session.epoch if session else 0):
            run.typing_sent = previous

    def start_nowait(self, run: TurnRun) -> bool:
        """A new turn's first ``start``, as :meth:`refresh` sends it, queued now if its server's
        outbox has room. False when it hasn't, or the turn's typing already went somewhere
        (nothing sent: :meth:`refresh`, in a task, waits for room). True when it is queued or
        there is nothing to send (the channel's server can't take typing now).
        """
        ref = run.turn.routing.typing_channel
        if ref is None or run.typing_sent is not None:
            return False
        session = self._servers.get(ref.server_id)
        if self._unsendable(ref, session) is not None:
            return True
        assert session is not None
        run.typing_sent = (ref, session.epoch)  # before the send, as in refresh
        queued = session.typing_nowait(TypingParams(channel_id=ref.channel_id, op="start"))
        if queued is not Queued.QUEUED:
            run.typing_sent = None
        return queued is not Queued.FULL

    async def stop(self, run: TurnRun) -> None:
        """Stop the turn's typing where its start went (if that server's connection saw it)."""
        sent, run.typing_sent = run.typing_sent, None
        if sent is None:
            return
        ref, epoch = sent
        session = self._servers.get(ref.server_id)
        # A server that reconnected since never saw the start on this connection.
        if session is not None and session.epoch == epoch:
            await self.send(ref, "stop")

    def stop_nowait(self, run: TurnRun) -> bool:
        """:meth:`stop` without waiting: True when the stop is queued or there is none to send;
        False when its server's outbox is full (nothing sent: :meth:`stop` waits for room)."""
        sent = run.typing_sent
        if sent is None:
            return True
        ref, epoch = sent
        session = self._servers.get(ref.server_id)
        if session is None or session.epoch != epoch or self._unsendable(ref, session) is not None:
            run.typing_sent = None  # as in stop: nothing this connection could hear
            return True
        # Gone meanwhile counts as queued: as in stop, nothing to wait for.
        queued = session.typing_nowait(TypingParams(channel_id=ref.channel_id, op="stop")) is not Queued.FULL
        if queued:
            run.typing_sent = None
        return queued

    async def stop_in(self, ref: ChannelRef, runs: Iterable[TurnRun]) -> None:
        """``channel_close`` of ``ref``: stop the typing of turns typing in exactly that channel.

        Another server's channel with the same id keeps its typing.
        """
        for run in list(runs):
            if run.turn.routing.typing_channel == ref:
                run.turn.routing.typing_channel = None
                await self.stop(run)
                self._log.info("typing.closed", agent=run.turn.agent, turn=run.turn.turn_id, server=ref.server_id, channel=ref.channel_id)

    def withdrawn(self, refs: Iterable[ChannelRef], runs: Iterable[TurnRun]) -> None:
        """Channels withdrawn (or their server gone): forget only those channels' typing.

        Nothing is sent: the server withdrew the channel, so a stop for it would name an
        unknown channel.
        """
        refs = list(refs)
        for ref in refs:
            self._host_typing.pop(ref, None)
        for run in runs:
            stopped = run.turn.routing.withdrawn(refs)
            if stopped is not None:
                if run.typing_sent is not None and run.typing_sent[0] == stopped:
                    run.typing_sent = None
                self._log.info("typing.withdrawn", agent=run.turn.agent, turn=run.turn.turn_id, server=stopped.server_id, channel=stopped.channel_id)

    def statistics(self, runs: Iterable[TurnRun]) -> dict[str, int]:
        """Typing indicators the daemon holds now: for turns, and started by hosts."""
        return {"turn": sum(1 for run in runs if run.typing_sent is not None), "host": len(self._host_typing)}

    # -- hosts' own typing ------------------------------------------------------------------

    async def host_typing(self, channel: str | Mapping[str, object], op: TypingOp, connection: HostLink | None = None) -> dict[str, object]:
        """A host's ``channels/typing``: a bare id in each server's channel with it (the
        deliberate fan-out); a ref or qualified name there alone. A ``start`` holds for the
        host typing lease (renewed by the next start)."""
        try:
            targets = host_typing_targets(self._router.names, channel)
        except MalformedChannel as exc:
            raise RpcError(INVALID_PARAMS, str(exc), {"field": "channel"}) from None
        if not isinstance(targets, tuple):
            raise RpcError(CHANNEL_REFUSED, targets.text, targets.to_dict())
        rows = []
        for ref in targets:
            if op == "stop":
                self._host_typing.pop(ref, None)
            else:
                self._host_typing[ref] = (connection, trio.current_time() + self._timings.host_typing_lease)
            reason = await self.send(ref, op)
            row: dict[str, object] = {**ref.to_wire(), "shown": self._router.names.name_shown(ref), "sent": reason is None}
            if reason is not None:
                row["reason"] = reason
            rows.append(row)
            self._log.info("typing.host", server=ref.server_id, channel=ref.channel_id, op=op, sent=reason is None, reason=reason)
        return {"typing": rows}

    def host_gone(self, connection: object) -> None:
        """A host connection closed: the typing it started by itself is stopped now."""
        if self._nursery is not None and any(owner is connection for owner, _ in self._host_typing.values()):
            self._nursery.start_soon(self._expire_host_typing, connection)

    async def _expire_host_typing(self, connection: object | None = None) -> None:
        """Stop host typing whose lease ran out (or, given ``connection``, all of that host's)."""
        now = trio.current_time()
        ending = [
            ref
            for ref, (owner, expires) in self._host_typing.items()
            if (connection is not None and owner is connection) or (connection is None and expires <= now)
        ]
        for ref in ending:
            self._host_typing.pop(ref, None)
            reason = await self.send(ref, "stop")
            self._log.info("typing.host.expired", server=ref.server_id, channel=ref.channel_id, host_gone=connection is not None, sent=reason is None)
