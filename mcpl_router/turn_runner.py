"""TurnManager: the shell that runs turns — typing, leases, context fan-out, lifecycle, speech.

The decisions are :mod:`mcpl_router.routing.turns`' (pure); this module carries them out over
the server links:

- **Typing**: the daemon shows typing in the turn's typing channel, on that channel's server
  only (and only if granted ``channels.typing``): ``start`` at once and every
  :attr:`TurnManager.typing_interval` seconds, ``stop`` on every way a turn ends.
- **Lease**: a turn the host says nothing about for :attr:`TurnManager.lease` seconds is
  aborted, and so is a turn whose host connection is gone, so a crashed host can never leave a
  channel typing.
- **Context**: ``turn/context`` fans ``context/beforeInference`` out (:mod:`mcpl_router.mcpl.context`).
- **Lifecycle**: ``inference/lifecycle`` ``started`` once per turn (at ``turn/context`` or the
  first ``turn/round``), and exactly one terminal per ``started`` on every exit path (close,
  supersede, lease expiry, host gone, drain).
- **Speech** (locus mode, minimal): each round's text is published to the turn's locus, on the
  locus's server, as the round ends; held (counted, not posted) when the turn has no locus.

Each turn's timers run in a *keeper* task. The daemon wires no nursery for turns, so keepers
are trio system tasks: each ends with its turn, and every exception in one is caught and logged
(a system task's escaping exception would end the whole run).
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from mcpl_router.jsonrpc import INVALID_PARAMS, METHOD_NOT_FOUND, PeerClosed, RequestTimeout, RpcError
from mcpl_router.logs import get_logger
from mcpl_router.mcpl.context import BEFORE_INFERENCE_TIMEOUT, HookFacts, before_inference, send_lifecycle
from mcpl_router.mcpl.link import CapabilityNotGranted, LinkState, LinkUnavailable
from mcpl_router.routing import texts
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.turns import (
    OUTCOMES,
    Delivery,
    MalformedChannel,
    Turn,
    TurnRouting,
    TurnTable,
    WakeFact,
    call_scope,
    requested_channel,
    trigger_of,
)
from mcpl_router.routing.typing import host_typing_targets
from mcpl_router.tool_calls import ToolCall, ToolProvider, agent_may_call, tool_result

if TYPE_CHECKING:
    from mcpl_router.daemon import Daemon
    from mcpl_router.mcpl.link import ServerLink

__all__ = [
    "CHANNEL_REFUSED",
    "LEASE",
    "PUBLISH_TIMEOUT",
    "TURN_NOT_OPEN",
    "TYPING_INTERVAL",
    "WAKE_UNKNOWN",
    "TurnManager",
    "publish_text",
]

#: Typing expires by itself on most platforms; refresh it this often while a turn runs.
TYPING_INTERVAL: Final = 7.0
#: A turn the host says nothing about for this long is aborted (a crashed host stops typing).
LEASE: Final = 60.0
#: How long a publish may take before its outcome is "unknown".
PUBLISH_TIMEOUT: Final = 10.0
#: How often a keeper checks that its host connection is still there.
CONNECTION_POLL: Final = 0.5
#: The most an ending turn waits on its stop and lifecycle sends (shielded from cancellation).
FINISH_GRACE: Final = 5.0

# Host API error codes owned by turns (documented in docs/host-api.md).
TURN_NOT_OPEN: Final = -32050
WAKE_UNKNOWN: Final = -32051
CHANNEL_REFUSED: Final = -32052

TYPING: Final = "channels.typing"
PUBLISH: Final = "channels.publish"


@attrs.define(eq=False)
class _TurnRun:
    """The shell's state for one open turn: its connection, lease, keeper and lifecycle."""

    turn: Turn
    connection: Any
    prose_routing: str
    lease_deadline: float
    cancel: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    lock: trio.Lock = attrs.field(factory=trio.Lock)
    # Where a typing "start" went (and in which transport epoch), so "stop" goes exactly there.
    typing_sent: tuple[ChannelRef, int] | None = None
    next_typing: float = 0.0
    # None until inference starts; then the servers told "started", with their epochs.
    started: dict[str, int] | None = None
    started_done: trio.Event = attrs.field(factory=trio.Event)
    held: int = 0
    finished: bool = False
    # Rounds in which a send tool delivered (for send-silencing of that round's plain text).
    explicit_send_rounds: set[int] = attrs.field(factory=set)


def _message_ids(payload: Any) -> tuple[str | None, str | None]:
    """The (messageId, threadId) of a wake's newest message, wherever the payload holds it."""
    message: Any = payload
    if isinstance(payload, Mapping) and isinstance(payload.get("messages"), list) and payload["messages"]:
        message = payload["messages"][-1]
    elif isinstance(payload, list) and payload:
        message = payload[-1]
    if not isinstance(message, Mapping):
        return None, None
    message_id = message.get("messageId")
    thread_id = message.get("threadId")
    return (
        message_id if isinstance(message_id, str) else None,
        thread_id if isinstance(thread_id, str) else None,
    )


def wake_fact(wake: Any) -> WakeFact:
    """What routing needs of one of the sessions' ``Wake`` objects."""
    message_id, thread_id = _message_ids(getattr(wake, "payload", None))
    channel = getattr(wake, "channel", None)
    return WakeFact(
        seq=int(wake.seq),
        channel=channel if isinstance(channel, ChannelRef) else None,
        addressed=bool(getattr(wake, "addressed", False)),
        message_id=message_id,
        thread_id=thread_id,
    )


async def publish_text(
    link: ServerLink | None,
    ref: ChannelRef,
    shown: str,
    text: str,
    *,
    conversation_id: str,
    round_: int,
    registered: bool,
    timeout: float = PUBLISH_TIMEOUT,
) -> Delivery:
    """Publish ``text`` to ``ref`` through its own server's link; the outcome, never raised.

    ``delivered`` only on ``{delivered: true}``; ``failed`` when nothing left (no link, not
    granted, not registered) or the server answered no; ``unknown`` after a timeout, a lost
    connection, a malformed receipt, or a Notification-form publish (it has no receipt).
    A server that takes publishes only as Notifications (-32601 to the Request) gets one.
    """

    def outcome(kind: Any, reason: str | None = None, message_id: str | None = None) -> Delivery:
        return Delivery(ref, shown, kind, round_, message_id=message_id, reason=reason)

    if link is None or link.state is not LinkState.READY:
        return outcome("failed", texts.REASON_NO_LINK)
    if not link.grant.allows(PUBLISH):
        return outcome("failed", texts.REASON_NOT_PERMITTED)
    if not registered:
        return outcome("failed", texts.REASON_NOT_REGISTERED)
    params = {"conversationId": conversation_id, "channelId": ref.channel_id, "content": [{"type": "text", "text": text}]}
    try:
        answer = await link.call("channels/publish", params, capability=PUBLISH, timeout=timeout)
    except RpcError as error:
        if error.code != METHOD_NOT_FOUND:
            return outcome("failed", texts.REASON_SERVER_REFUSED)
        try:
            await link.send_notification("channels/publish", params, capability=PUBLISH)
        except (LinkUnavailable, CapabilityNotGranted):
            return outcome("failed", texts.REASON_NO_LINK)
        except PeerClosed:
            return outcome("unknown", texts.REASON_NO_RECEIPT)
        return outcome("unknown", texts.REASON_NO_RECEIPT)
    except RequestTimeout as exc:
        return outcome("unknown" if exc.sent else "failed", texts.REASON_TIMEOUT)
    except (LinkUnavailable, CapabilityNotGranted):
        return outcome("failed", texts.REASON_NO_LINK)
    except PeerClosed:
        return outcome("unknown", texts.REASON_NO_RECEIPT)
    if isinstance(answer, dict) and answer.get("delivered") is True:
        message_id = answer.get("messageId")
        return outcome("delivered", message_id=message_id if isinstance(message_id, str) else None)
    if isinstance(answer, dict) and answer.get("delivered") is False:
        return outcome("failed", texts.REASON_NOT_DELIVERED)
    return outcome("unknown", texts.REASON_MALFORMED_RECEIPT)


class TurnManager:
    """Every open turn and the tasks that keep them; ``daemon.turns``.

    The timing attributes are constants by default; tests shorten them on the instance.
    """

    typing_interval: float = TYPING_INTERVAL
    lease: float = LEASE
    context_timeout: float = BEFORE_INFERENCE_TIMEOUT
    publish_timeout: float = PUBLISH_TIMEOUT
    connection_poll: float = CONNECTION_POLL

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon
        self.table = TurnTable()
        self._runs: dict[str, _TurnRun] = {}
        self._ids = itertools.count(1)
        self._log = get_logger()
        self._nursery: trio.Nursery | None = None
        #: Who offers and executes tools (see :mod:`mcpl_router.tool_calls`); the daemon wires them.
        self.tool_providers: list[ToolProvider] = []

    def tools_for(self, agent: Any, run: _TurnRun) -> list[dict[str, Any]]:
        """Every provider's tools this agent may call, in provider order."""
        offered: list[dict[str, Any]] = []
        for provider in self.tool_providers:
            offered.extend(spec for spec in provider.tools_for(agent, run) if agent_may_call(agent, spec["name"]))
        return offered

    def record_explicit_send(self, call: ToolCall, ref: ChannelRef) -> None:
        """A send tool delivered to ``ref``: engage it for the calling turn, note the round.

        Only a call made inside the turn engages anything (``callingTurnOf``). The round is
        noted so prose routing can hold that round's plain text (send-silencing).
        """
        if not call.scope.may_move_routing or call.scope.turn is None:
            return
        call.scope.turn.routing.engage(ref)
        call.run.explicit_send_rounds.add(call.run.turn.round)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the turns' keeper tasks in the daemon's nursery tree, until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    # ------------------------------------------------------------------ plumbing

    @property
    def _sessions(self) -> Any:
        sessions = getattr(self._daemon, "sessions", None)
        if sessions is None:
            raise RpcError(-32603, "Sessions are not available in this daemon.")
        return sessions

    def _links(self) -> list[ServerLink]:
        return list(self._daemon.links.values())

    def _shown(self, ref: ChannelRef) -> str:
        return self._daemon.router.names.name_shown(ref)

    def _ref_wire(self, ref: ChannelRef | None) -> dict[str, str] | None:
        return None if ref is None else {**ref.to_wire(), "shown": self._shown(ref)}

    def _run_for(self, connection: Any, turn_id: str) -> _TurnRun:
        run = self._runs.get(turn_id)
        if run is None or run.finished:
            raise RpcError(
                TURN_NOT_OPEN,
                f"Turn {texts.quoted(turn_id)} is not open (never opened, closed, superseded, or its"
                " lease expired). Open a new turn with turn/open.",
                {"turnId": turn_id},
            )
        self._sessions.require_owner(connection, run.turn.agent)
        # Anything the host says about a turn renews its lease.
        run.lease_deadline = trio.current_time() + self.lease
        return run

    def _new_ids(self) -> tuple[str, str]:
        n = next(self._ids)
        token = secrets.token_hex(4)
        return f"t-{n}-{token}", f"inf-{n}-{token}"

    def open_turns(self) -> list[Turn]:
        """Every open turn (for status and tests)."""
        return self.table.all()

    def run_of(self, turn_id: str) -> _TurnRun | None:
        """The shell state of an open turn (for tests)."""
        return self._runs.get(turn_id)

    # ------------------------------------------------------------------ turn/open

    async def open(
        self,
        connection: Any,
        agent: str,
        *,
        wakes: Sequence[int] = (),
        channel: str | Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Open a turn for ``agent`` (owned by ``connection``): fix its trigger, start typing.

        The channel comes from one request: the newest addressed wake's ref among ``wakes``,
        or else ``channel`` as the host named it. A name that means none or several channels
        gives the turn no channel, and nothing falls back to another.
        """
        sessions = self._sessions
        spec = sessions.require_owner(connection, agent)
        facts: list[WakeFact] = []
        for seq in wakes:
            wake = sessions.wake(seq, agent)
            if wake is None:
                raise RpcError(
                    WAKE_UNKNOWN,
                    f"Wake {seq} is not a wake of agent {texts.quoted(agent)} (unknown, or acked"
                    " and gone). No turn was opened.",
                    {"seq": seq, "agent": agent},
                )
            facts.append(wake_fact(wake))
        trigger: ChannelRef | None = None
        message_id = thread_id = None
        chosen = trigger_of(facts)
        if chosen is not None:
            trigger, message_id, thread_id = chosen.channel, chosen.message_id, chosen.thread_id
        elif channel is not None:
            try:
                trigger = requested_channel(self._daemon.router.names, channel)
            except MalformedChannel as exc:
                raise RpcError(INVALID_PARAMS, str(exc), {"field": "channel"}) from None
        turn_id, inference_id = self._new_ids()
        turn = Turn(
            turn_id=turn_id,
            inference_id=inference_id,
            agent=agent,
            routing=TurnRouting.starting_at(trigger),
            wakes=tuple(fact.seq for fact in facts),
            conversation_id=agent,
            turn_index=self.table.next_index(agent),
            trigger_message_id=message_id,
            trigger_thread_id=thread_id,
        )
        prose = str(getattr(spec, "prose_routing", "locus") or "locus")
        if prose in ("disabled", "named"):
            # Nothing plain is ever posted in these modes, so there is no place to show typing.
            turn.routing.locus = turn.routing.typing_channel = None
        run = _TurnRun(turn=turn, connection=connection, prose_routing=prose, lease_deadline=trio.current_time() + self.lease)
        superseded = self.table.add(turn)
        self._runs[turn_id] = run
        log = self._log.bind(agent=agent, turn=turn_id)
        log.info(
            "turn.opened",
            server=trigger.server_id if trigger else None,
            channel=trigger.channel_id if trigger else None,
            wakes=list(turn.wakes),
        )
        if superseded is not None:
            old = self._runs.get(superseded.turn_id)
            if old is not None:
                log.info("turn.superseded", superseded=superseded.turn_id)
                await self._finish(old, "aborted", why="superseded")
        if self._nursery is not None:
            self._nursery.start_soon(self._keep, run, name=f"turn-keeper:{turn_id}")
        else:
            # No daemon nursery (a TurnManager driven directly by a unit test).
            trio.lowlevel.spawn_system_task(self._keep, run, name=f"turn-keeper:{turn_id}")
        locus = turn.routing.locus
        return {
            "turnId": turn_id,
            "inferenceId": inference_id,
            "channel": self._ref_wire(trigger),
            "tools": self.tools_for(spec, run),
            "system": [],
            "shown": {
                "channel": self._shown(trigger) if trigger else None,
                "locus": self._shown(locus) if locus else None,
                "routing": texts.speech_lands_in(self._shown(locus)) if locus else texts.SPEECH_HAS_NO_DESTINATION,
            },
        }

    # ------------------------------------------------------------------ turn/context

    async def context(self, connection: Any, turn_id: str, *, user_message: Any = None, model: str | None = None) -> dict[str, Any]:
        """Fan ``context/beforeInference`` out; the injections grouped by position."""
        run = self._run_for(connection, turn_id)
        turn = run.turn
        await self._start_inference(run)
        facts = HookFacts(
            inference_id=turn.inference_id,
            conversation_id=turn.conversation_id,
            turn_index=turn.turn_index,
            model=model,
            user_message=user_message,
            incoming=turn.routing.trigger,
            incoming_message_id=turn.trigger_message_id,
            incoming_thread_id=turn.trigger_thread_id,
            default_outgoing=turn.routing.locus,
        )
        result = await before_inference(
            self._links(),
            facts,
            self._daemon.router.registry,
            timeout=self.context_timeout,
            log_fields={"agent": turn.agent, "turn": turn.turn_id},
        )
        return result.to_wire()

    # ------------------------------------------------------------------ turn/text, turn/round

    def text(self, connection: Any, turn_id: str, round_: int, delta: str) -> None:
        """Buffer a round's text delta (``turn/text`` is a notification: nothing answers)."""
        run = self._run_for(connection, turn_id)
        if not run.turn.add_text(round_, delta):
            self._log.warning("turn.text.late", agent=run.turn.agent, turn=turn_id, round=round_)

    async def round(self, connection: Any, turn_id: str, round_: int) -> dict[str, Any]:
        """A round ended: route its text now; its deliveries."""
        run = self._run_for(connection, turn_id)
        await self._start_inference(run)
        async with run.lock:
            deliveries = await self._route_round(run, round_)
        return {"deliveries": [d.to_wire() for d in deliveries]}

    async def _route_round(self, run: _TurnRun, round_: int) -> list[Delivery]:
        turn = run.turn
        if run.finished and turn.outcome != "completed":
            # Ended (lease, host gone, superseded) while this call waited: post nothing more.
            return []
        text = turn.take_text(round_)
        if not text.strip():
            return []
        locus = turn.routing.sticky_target or turn.routing.locus
        log = self._log.bind(agent=turn.agent, turn=turn.turn_id, round=round_)
        if run.prose_routing not in ("locus", "hybrid") or locus is None:
            # No destination (or a mode whose routing isn't built yet): held, never guessed.
            run.held += 1
            log.info("speech.held", prose=run.prose_routing, chars=len(text))
            return []
        registry = self._daemon.router.registry
        delivery = await publish_text(
            self._daemon.links.get(locus.server_id),
            locus,
            self._shown(locus),
            text,
            conversation_id=turn.conversation_id,
            round_=round_,
            registered=registry.is_registered(locus),
            timeout=self.publish_timeout,
        )
        turn.routing.record(delivery)
        log.info(
            "speech.published",
            server=locus.server_id,
            channel=locus.channel_id,
            outcome=delivery.outcome,
            reason=delivery.reason,
            message_id=delivery.message_id,
        )
        return [delivery]

    # ------------------------------------------------------------------ turn/tool

    async def tool(
        self,
        connection: Any,
        turn_id: str,
        *,
        call_id: str,
        name: str,
        arguments: Any,
        caller_turn_id: str | None,
    ) -> dict[str, Any]:
        """A tool call from the model, sent to the provider that handles ``name``.

        The call's scope (:func:`~mcpl_router.routing.turns.call_scope`) decides what it may
        touch: a call carrying another turn than the agent's open one reads none of its
        channels and moves none of its routing. The agent's allowed tools are checked here, at
        dispatch, whatever the listing said.
        """
        run = self._run_for(connection, turn_id)
        agent = self._sessions.agent(run.turn.agent)
        scope = call_scope(self.table, run.turn.agent, caller_turn_id or turn_id)
        log = self._log.bind(
            agent=run.turn.agent, turn=turn_id, call=call_id, tool=name,
            calling_turn=scope.turn.turn_id if scope.turn else None,
        )
        provider = next((p for p in self.tool_providers if p.handles(name)), None)
        if provider is None:
            log.info("turn.tool.unknown")
            return tool_result(texts.unknown_tool(name), error=True, reason="unknown-tool")
        if not agent_may_call(agent, name):
            log.info("turn.tool.not_permitted")
            return tool_result(texts.tool_not_permitted(name), error=True, reason="not-permitted")
        call = ToolCall(
            daemon=self._daemon,
            run=run,
            scope=scope,
            agent=agent,
            call_id=call_id,
            name=name,
            arguments=dict(arguments) if isinstance(arguments, Mapping) else {},
        )
        result = await provider.call(call)
        log.info("turn.tool.called", error=bool(result.get("isError")), reason=result.get("reason"))
        return result

    # ------------------------------------------------------------------ turn/close

    async def close(self, connection: Any, turn_id: str, outcome: str, usage: Any = None) -> dict[str, Any]:
        """End a turn: route what's left, stop typing, send the lifecycle terminal; the receipt."""
        if outcome not in OUTCOMES:
            raise RpcError(INVALID_PARAMS, f"outcome must be one of completed, aborted, failed; got {texts.quoted(str(outcome))}")
        run = self._run_for(connection, turn_id)
        turn = run.turn
        async with run.lock:
            if outcome == "completed":
                for round_ in turn.unrouted_rounds():
                    await self._route_round(run, round_)
            else:
                # An aborted or failed turn's unfinished words are not posted.
                for round_ in turn.unrouted_rounds():
                    if turn.take_text(round_).strip():
                        run.held += 1
        await self._finish(run, outcome, why="closed", usage=usage)
        deliveries = turn.routing.deliveries
        receipt = {
            "text": texts.receipt(
                [d.shown for d in deliveries if d.outcome == "delivered"],
                run.held,
                [d.shown for d in deliveries if d.outcome == "failed"],
                [d.shown for d in deliveries if d.outcome == "unknown"],
            ),
            "delivered": [d.to_wire() for d in deliveries if d.outcome == "delivered"],
            "held": run.held,
        }
        return {"receipt": receipt, "deliveries": [d.to_wire() for d in deliveries], "drafts": []}

    # ------------------------------------------------------------------ ending a turn

    async def _finish(self, run: _TurnRun, outcome: str, *, why: str, usage: Any = None) -> None:
        """End a turn once, whichever way: stop its typing and send its lifecycle terminal."""
        if run.finished:
            return
        run.finished = True
        turn = run.turn
        turn.outcome = outcome
        self.table.remove(turn)
        self._runs.pop(turn.turn_id, None)
        run.cancel.cancel()
        log = self._log.bind(agent=turn.agent, turn=turn.turn_id)
        # Shielded: the stop and the terminal must go out even when the caller is being
        # cancelled (a lease expiry inside the keeper, a host gone mid-call), within a bound.
        with trio.CancelScope(shield=True, deadline=trio.current_time() + FINISH_GRACE):
            await self._stop_typing(run)
            if run.started is not None:
                await run.started_done.wait()
                params: dict[str, Any] = {
                    "inferenceId": turn.inference_id,
                    "conversationId": turn.conversation_id,
                    "turnIndex": turn.turn_index,
                    "phase": outcome,
                }
                if usage is not None:
                    params["usage"] = usage
                await send_lifecycle(self._links(), params, only=run.started, log_fields={"agent": turn.agent, "turn": turn.turn_id})
        log.info("turn.ended", outcome=outcome, why=why)

    async def drain(self) -> None:
        """Abort every open turn (daemon shutdown): typing stopped, lifecycle terminals sent."""
        for turn in self.table.all():
            run = self._runs.get(turn.turn_id)
            if run is not None:
                await self._finish(run, "aborted", why="shutdown")

    def connection_closed(self, connection: Any) -> None:
        """A host connection is gone: its turns end at their keeper's next check (soon)."""
        for run in list(self._runs.values()):
            if run.connection is connection:
                run.lease_deadline = min(run.lease_deadline, trio.current_time())

    # ------------------------------------------------------------------ inference start

    async def _start_inference(self, run: _TurnRun) -> None:
        if run.started is not None:
            return
        run.started = {}  # set before any await: started goes out once, whoever comes first
        turn = run.turn
        try:
            params = {
                "inferenceId": turn.inference_id,
                "conversationId": turn.conversation_id,
                "turnIndex": turn.turn_index,
                "phase": "started",
            }
            run.started = await send_lifecycle(self._links(), params, log_fields={"agent": turn.agent, "turn": turn.turn_id})
        finally:
            run.started_done.set()
        where = turn.routing.locus or turn.routing.trigger
        trace = {
            "agent": turn.agent,
            "turnId": turn.turn_id,
            "inferenceId": turn.inference_id,
            "serverId": where.server_id if where else None,
            "channelId": where.channel_id if where else None,
        }
        try:
            await self._sessions.notify_agent(turn.agent, "inference:started", trace)
        except Exception:
            self._log.exception("turn.trace.failed", agent=turn.agent, turn=turn.turn_id)

    # ------------------------------------------------------------------ typing

    async def _send_typing(self, ref: ChannelRef, op: str) -> str | None:
        """Send one ``channels/typing`` to ``ref``'s own server; None when sent, else why not."""
        link = self._daemon.links.get(ref.server_id)
        if link is None or link.state is not LinkState.READY:
            return texts.REASON_NO_LINK
        if not link.grant.allows(TYPING):
            return texts.REASON_NOT_PERMITTED
        if not self._daemon.router.registry.is_registered(ref):
            # A withdrawn channel is unknown to its server: neither start nor stop names it.
            return texts.REASON_NOT_REGISTERED
        try:
            await link.send_notification("channels/typing", {"channelId": ref.channel_id, "op": op}, capability=TYPING)
        except (LinkUnavailable, CapabilityNotGranted, PeerClosed):
            return texts.REASON_NO_LINK
        return None

    async def _refresh_typing(self, run: _TurnRun) -> None:
        ref = run.turn.routing.typing_channel
        if ref is None:
            return
        link = self._daemon.links.get(ref.server_id)
        previous = run.typing_sent
        # Recorded before the send: a turn ending while the start is in flight still stops it
        # (a stop where no start landed is harmless; a start never stopped is not).
        run.typing_sent = (ref, link.epoch if link else 0)
        if await self._send_typing(ref, "start") is not None and run.typing_sent == (ref, link.epoch if link else 0):
            run.typing_sent = previous

    async def _stop_typing(self, run: _TurnRun) -> None:
        sent, run.typing_sent = run.typing_sent, None
        if sent is None:
            return
        ref, epoch = sent
        link = self._daemon.links.get(ref.server_id)
        # A server that reconnected since never saw the start on this connection.
        if link is not None and link.epoch == epoch:
            await self._send_typing(ref, "stop")

    def channels_removed(self, refs: Iterable[ChannelRef]) -> None:
        """Channels withdrawn (or their server gone): stop only those channels' typing.

        Another server's channel with the same id keeps its typing. Nothing is sent: the
        server withdrew the channel, so a stop for it would name an unknown channel.
        """
        refs = list(refs)
        for run in self._runs.values():
            stopped = run.turn.routing.withdrawn(refs)
            if stopped is not None:
                if run.typing_sent is not None and run.typing_sent[0] == stopped:
                    run.typing_sent = None
                self._log.info("typing.withdrawn", agent=run.turn.agent, turn=run.turn.turn_id, server=stopped.server_id, channel=stopped.channel_id)

    async def host_typing(self, channel: str | Mapping[str, Any], op: str) -> dict[str, Any]:
        """A host's ``channels/typing``: a bare id in each server's channel with it (the
        deliberate fan-out); a ref or qualified name there alone."""
        try:
            targets = host_typing_targets(self._daemon.router.names, channel)
        except MalformedChannel as exc:
            raise RpcError(INVALID_PARAMS, str(exc), {"field": "channel"}) from None
        if not isinstance(targets, tuple):
            raise RpcError(CHANNEL_REFUSED, targets.text, targets.to_dict())
        rows = []
        for ref in targets:
            reason = await self._send_typing(ref, op)
            row: dict[str, Any] = {**ref.to_wire(), "shown": self._shown(ref), "sent": reason is None}
            if reason is not None:
                row["reason"] = reason
            rows.append(row)
            self._log.info("typing.host", server=ref.server_id, channel=ref.channel_id, op=op, sent=reason is None, reason=reason)
        return {"typing": rows}

    # ------------------------------------------------------------------ the keeper

    async def _keep(self, run: _TurnRun) -> None:
        """Refresh the turn's typing and watch its lease and connection until the turn ends."""
        turn = run.turn
        try:
            with run.cancel:
                while True:
                    now = trio.current_time()
                    peer = getattr(run.connection, "peer", None)
                    if peer is not None and peer.closed:
                        await self._finish(run, "aborted", why="host-gone")
                        return
                    if now >= run.lease_deadline:
                        self._log.warning("turn.lease.expired", agent=turn.agent, turn=turn.turn_id, lease=self.lease)
                        await self._finish(run, "aborted", why="lease-expired")
                        return
                    if turn.routing.typing_channel is not None and now >= run.next_typing:
                        await self._refresh_typing(run)
                        run.next_typing = trio.current_time() + self.typing_interval
                    wake_at = min(run.lease_deadline, now + self.connection_poll)
                    if turn.routing.typing_channel is not None:
                        wake_at = min(wake_at, run.next_typing)
                    await trio.sleep_until(wake_at)
        except Exception:
            # A system task's exception would crash the whole run: log it, end the turn.
            self._log.exception("turn.keeper.crashed", agent=turn.agent, turn=turn.turn_id)
            await self._finish(run, "failed", why="keeper-crashed")
