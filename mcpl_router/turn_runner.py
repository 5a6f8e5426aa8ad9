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
- **Speech** (prose routing, :mod:`mcpl_router.routing.prose` decides): each round's text is
  routed as the round ends, along the route in force when its first words arrived; published
  on the destination's own server, drafted (journaled), or counted; ``[routing]`` notices and
  the receipt at close say what happened.

Each turn's timers run in a *keeper* task. The daemon wires no nursery for turns, so keepers
are trio system tasks: each ends with its turn, and every exception in one is caught and logged
(a system task's escaping exception would end the whole run).
"""

from __future__ import annotations

import functools
import itertools
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from mcpl_router.jsonrpc import INVALID_PARAMS, PeerClosed, RequestTimeout, RpcError
from mcpl_router.logs import get_logger
from mcpl_router.mcpl.context import BEFORE_INFERENCE_TIMEOUT, HookFacts, before_inference, send_lifecycle
from mcpl_router.mcpl.link import NOTIFIED, CapabilityNotGranted, LinkState, LinkUnavailable
from mcpl_router.routing import prose, texts
from mcpl_router.routing.drafts import Attempt, Draft, new_draft_id
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
from mcpl_router.store.journal import JournalFailure
from mcpl_router.tools import ToolCall, ToolTable, agent_may_call, tool_result

if TYPE_CHECKING:
    from mcpl_router.daemon import Daemon
    from mcpl_router.hosts.sessions import AgentSpec
    from mcpl_router.mcpl.link import ServerLink

__all__ = [
    "CHANNEL_REFUSED",
    "LEASE",
    "PUBLISH_TIMEOUT",
    "TURN_NOT_OPEN",
    "TYPING_INTERVAL",
    "WAKE_UNKNOWN",
    "TurnManager",
    "acknowledge_message",
    "message_ids_of",
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
#: A host's own ``channels/typing start`` holds this long unless renewed by another start;
#: then the daemon sends the stop itself, so a crashed host can't leave a channel typing.
HOST_TYPING_LEASE: Final = 30.0
#: The most an ending turn waits on its stop and lifecycle sends (shielded from cancellation).
FINISH_GRACE: Final = 5.0

# Host API error codes owned by turns (documented in docs/host-api.md).
TURN_NOT_OPEN: Final = -32050
WAKE_UNKNOWN: Final = -32051
CHANNEL_REFUSED: Final = -32052
DAEMON_DRAINING: Final = -32053

TYPING: Final = "channels.typing"
PUBLISH: Final = "channels.publish"
ACKNOWLEDGE: Final = "channels.acknowledge"
STREAMING: Final = "channels.streaming"
#: The reaction a turn the model provider refused leaves on the message it answered.
REFUSAL_REACTION: Final = "🚫"
#: Rendered closed-channel invitations kept (cleared whenever the registry changes).
INVITATION_CACHE: Final = 1024
#: The most a refusal reaction's answer is waited for (it goes out after the turn has ended).
REFUSAL_REACTION_TIMEOUT: Final = 5.0


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
    # Prose routing: the turn's pins and holds; each round's route when its first words came.
    prose: prose.ProseState = attrs.field(factory=prose.ProseState)
    round_routes: dict[int, tuple[ChannelRef | None, ChannelRef | None]] = attrs.field(factory=dict)
    notices: list[str] = attrs.field(factory=list)
    private: int = 0
    suppressed: int = 0
    kept: int = 0
    drafts: list[str] = attrs.field(factory=list)
    again: bool = False
    subagent: bool = False
    # Outgoing streams: per destination ref, the epoch its chunks went in and the words sent.
    streams: dict[ChannelRef, tuple[int, list[str]]] = attrs.field(factory=dict)
    stream_index: int = 0
    # The journal's last inbound seq this turn has looked at (mid-turn arrivals come after it).
    seen_seq: int = 0
    # The locus the last routed round went by: a different one since means a deliberate move.
    last_locus: ChannelRef | None = None


def message_ids_of(payload: Any) -> tuple[str | None, str | None]:
    """The (messageId, threadId) of a wake's newest message, wherever the payload holds it."""
    message: Any = payload
    if isinstance(payload, Mapping) and isinstance(payload.get("messages"), list) and payload["messages"]:
        message = payload["messages"][-1]
    elif isinstance(payload, list) and payload:
        message = payload[-1]
    if not isinstance(message, Mapping):
        return None, None
    origin = message.get("origin")
    if "messageId" not in message and isinstance(origin, Mapping):
        # A push names its message in `origin` (discord-mcpl's push for a closed channel,
        # src/server.ts:3176): that is the message a decline or refusal reaction marks.
        message = origin
    message_id = message.get("messageId")
    thread_id = message.get("threadId")
    return (
        message_id if isinstance(message_id, str) else None,
        thread_id if isinstance(thread_id, str) else None,
    )


def wake_fact(wake: Any) -> WakeFact:
    """What routing needs of one of the sessions' ``Wake`` objects."""
    message_id, thread_id = message_ids_of(getattr(wake, "payload", None))
    channel = getattr(wake, "channel", None)
    return WakeFact(
        seq=int(wake.seq),
        channel=channel if isinstance(channel, ChannelRef) else None,
        addressed=bool(getattr(wake, "addressed", False)),
        message_id=message_id,
        thread_id=thread_id,
    )


def _counted(publish: Callable[..., Awaitable[Delivery]]) -> Callable[..., Awaitable[Delivery]]:
    """Count each publish's outcome on its link (``/metrics`` reads ``link.publishes``)."""

    @functools.wraps(publish)
    async def counting(link: ServerLink | None, *args: Any, **kwargs: Any) -> Delivery:
        delivery = await publish(link, *args, **kwargs)
        if link is not None:
            link.publishes[(delivery.outcome, delivery.reason or "")] += 1
        return delivery

    return counting


@_counted
async def publish_text(
    link: ServerLink | None,
    ref: ChannelRef,
    shown: str,
    text: str,
    *,
    conversation_id: str,
    round_: int,
    registered: bool,
    timeout: float | None = None,
    thread_id: str | None = None,
) -> Delivery:
    """Publish ``text`` to ``ref`` through its own server's link; the outcome, never raised.

    ``thread_id`` (channel_publish's ``threadId``) posts into that thread of the channel.
    ``timeout`` defaults to the server's own ``requestTimeout`` (as docs/config.md says of
    every request sent to a server).

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
    params: dict[str, Any] = {"conversationId": conversation_id, "channelId": ref.channel_id, "content": [{"type": "text", "text": text}]}
    if thread_id:
        params["threadId"] = thread_id
    try:
        deadline = link.config.request_timeout if timeout is None else timeout
        answer = await link.request_or_notify("channels/publish", params, capability=PUBLISH, timeout=deadline)
    except RpcError:
        return outcome("failed", texts.REASON_SERVER_REFUSED)
    except RequestTimeout as exc:
        return outcome("unknown" if exc.sent else "failed", texts.REASON_TIMEOUT)
    except (LinkUnavailable, CapabilityNotGranted):
        return outcome("failed", texts.REASON_NO_LINK)
    except PeerClosed:
        return outcome("unknown", texts.REASON_NO_RECEIPT)
    if answer is NOTIFIED:
        return outcome("unknown", texts.REASON_NO_RECEIPT)
    if isinstance(answer, dict) and answer.get("delivered") is True:
        message_id = answer.get("messageId")
        return outcome("delivered", message_id=message_id if isinstance(message_id, str) else None)
    if isinstance(answer, dict) and answer.get("delivered") is False:
        return outcome("failed", texts.REASON_NOT_DELIVERED)
    return outcome("unknown", texts.REASON_MALFORMED_RECEIPT)


#: ``channels/acknowledge`` intents: why the daemon marks a message (discord-mcpl reads them).
ACK_INTENT_DECLINED: Final = "seen-not-opening"
ACK_INTENT_REFUSED: Final = "refused"


async def acknowledge_message(
    link: ServerLink, ref: ChannelRef, message_id: str, *, intent: str, value: str | None, timeout: float
) -> str | None:
    """Send ``channels/acknowledge`` for one message on ``ref``'s own server; None when done.

    The shape is what discord-mcpl reads (``src/server.ts:78-83``): a **Request**
    ``{channelId, messageId, intent, value}``, where ``value`` is the reaction (without it the
    server falls back to its own 👀). discord-mcpl drops an acknowledge sent as a Notification,
    so the Request comes first; a server that answers it -32601 gets Notifications from then on
    (:meth:`ServerLink.request_or_notify`).
    Returns a stable reason when it wasn't done: ``timeout``, ``unconfirmed`` (sent, no
    answer), ``server-refused`` (an error, or ``acknowledged: false``), ``server-unavailable``.
    """
    params: dict[str, Any] = {"channelId": ref.channel_id, "messageId": message_id, "intent": intent}
    if value is not None:
        params["value"] = value
    try:
        answer = await link.request_or_notify("channels/acknowledge", params, capability=ACKNOWLEDGE, timeout=timeout)
    except RpcError:
        return texts.REASON_SERVER_REFUSED
    except RequestTimeout as exc:
        return texts.REASON_UNCONFIRMED if exc.sent else texts.REASON_TIMEOUT
    except (LinkUnavailable, CapabilityNotGranted):
        return texts.REASON_NO_LINK
    except PeerClosed:
        return texts.REASON_UNCONFIRMED
    if answer is NOTIFIED:
        return texts.REASON_UNCONFIRMED  # sent as a Notification: no answer says it landed
    if isinstance(answer, dict) and answer.get("acknowledged") is False:
        return texts.REASON_SERVER_REFUSED
    return None


class TurnManager:
    """Every open turn and the tasks that keep them; ``daemon.turns``.

    The timing attributes are constants by default; tests shorten them on the instance.
    """

    typing_interval: float = TYPING_INTERVAL
    lease: float = LEASE
    context_timeout: float = BEFORE_INFERENCE_TIMEOUT
    #: None: each server's own ``requestTimeout``; a number overrides it for every server.
    publish_timeout: float | None = None
    connection_poll: float = CONNECTION_POLL
    host_typing_lease: float = HOST_TYPING_LEASE

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon
        self.table = TurnTable()
        self._runs: dict[str, _TurnRun] = {}
        self._ids = itertools.count(1)
        self._log = get_logger()
        self._nursery: trio.Nursery | None = None
        #: The one name table: what each tool name means, for listing and dispatch alike
        #: (:mod:`mcpl_router.tools.table`); the daemon installs the providers.
        self.tools = ToolTable()
        #: A host's typing in progress: the channel → (the connection that started it, lease end).
        self._host_typing: dict[ChannelRef, tuple[Any, float]] = {}
        #: Bounces in a row per agent (a bounce wakes the agent again at most twice in a row).
        self._bounce_streak: dict[str, int] = {}
        #: The reaction a provider-refused turn's latest inbound message gets (not for named).
        self.refusal_reaction: str = REFUSAL_REACTION
        self._invitations: dict[tuple[str, ChannelRef, str | None, bool], str] = {}
        self._invitations_generation = -1

    def tools_for(self, agent: AgentSpec, run: _TurnRun) -> list[dict[str, Any]]:
        """Every provider's tools this agent may call, in provider order (read from the name table)."""
        return self.tools.offered(agent, run)

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
                while True:
                    await trio.sleep(min(self.host_typing_lease / 3, 5.0))
                    await self._expire_host_typing()
            finally:
                self._nursery = None

    async def _expire_host_typing(self, connection: Any = None) -> None:
        """Stop host typing whose lease ran out (or, given ``connection``, all of that host's)."""
        now = trio.current_time()
        ending = [
            ref
            for ref, (owner, expires) in self._host_typing.items()
            if (connection is not None and owner is connection) or (connection is None and expires <= now)
        ]
        for ref in ending:
            self._host_typing.pop(ref, None)
            reason = await self._send_typing(ref, "stop")
            self._log.info("typing.host.expired", server=ref.server_id, channel=ref.channel_id, host_gone=connection is not None, sent=reason is None)

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
        subagent: bool = False,
    ) -> dict[str, Any]:
        """Open a turn for ``agent`` (owned by ``connection``): fix its trigger, start typing.

        The channel comes from one request: the newest addressed wake's ref among ``wakes``,
        or else ``channel`` as the host named it. A name that means none or several channels
        gives the turn no channel, and nothing falls back to another.

        The locus (where plain speech goes) is the one conversation the wakes hold (addressed
        ones first); several → held. ``system`` holds the lines the host puts at the system
        position of every request of the turn (named mode's line); ``subagent`` (or the
        agent spec's ``subagent``) picks the subagent wording.
        """
        if self._daemon.draining:
            # Shutdown ends open turns and then stops the links: a turn opened now would start
            # typing and get no terminal.
            raise RpcError(
                DAEMON_DRAINING,
                "The daemon is shutting down (daemon/shutdown was sent): no new turns. Open the"
                " turn again once it is back.",
                {"agent": agent},
            )
        sessions = self._sessions
        spec = sessions.require_owner(connection, agent)
        facts: list[WakeFact] = []
        for seq in wakes:
            wake = await sessions.wake(seq, agent)
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
        mode = str(getattr(spec, "prose_routing", "locus") or "locus")
        state = prose.ProseState()
        competing: list[str] = []
        if mode in ("disabled", "named"):
            # Nothing plain is ever posted in these modes, so there is no place to show typing.
            turn.routing.locus = turn.routing.typing_channel = None
        elif mode == "explicit":
            # No locus: unprefixed text bounces. Typing shows on the trigger, on its server.
            turn.routing.locus = None
        elif facts:
            choice = prose.locus_of(facts)
            if choice.held:
                turn.routing.locus = turn.routing.typing_channel = None
                state.held_reason = prose.REASON_AMBIGUOUS
                competing = [self._shown(ref) for ref in choice.competing]
            elif choice.ref is None:
                turn.routing.locus = turn.routing.typing_channel = None
        run = _TurnRun(
            turn=turn,
            connection=connection,
            prose_routing=mode,
            lease_deadline=trio.current_time() + self.lease,
            prose=state,
            subagent=bool(subagent or getattr(spec, "subagent", False)),
            seen_seq=max([self._daemon.journal.last_seq(), *(fact.seq for fact in facts)]),
        )
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
        system: list[str] = []
        if mode == "named":
            system.append(texts.named_line(may_publish=agent_may_call(spec, "channel_publish"), subagent=run.subagent))
        routing_line: str | None
        if mode in ("disabled", "named", "explicit"):
            routing_line = None  # no route to announce: no notices in these modes
        elif locus is not None:
            routing_line = texts.speech_lands_in(self._shown(locus))
        elif state.held_reason == prose.REASON_AMBIGUOUS:
            routing_line = texts.speech_held(competing)
        else:
            routing_line = texts.SPEECH_NO_DESTINATION_HELD
        # Drafts no receipt or notice named yet (their turn ended without closing).
        untold = [draft for draft in self.drafts_of(agent) if not draft.told and draft.state == "held"]
        for draft in untold:
            draft.told = True
            self.save_draft(draft)
        return {
            "turnId": turn_id,
            "inferenceId": inference_id,
            "channel": self._ref_wire(trigger),
            "tools": self.tools_for(spec, run),
            "system": system,
            "notices": [texts.untold_drafts([draft.draft_id for draft in untold])] if untold else [],
            "proseRouting": mode,
            "shown": {
                "channel": self._shown(trigger) if trigger else None,
                "locus": self._shown(locus) if locus else None,
                "routing": routing_line,
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
        self._daemon.metrics.context_answered(result.servers, result.elapsed)
        return result.to_wire()

    # ------------------------------------------------------------------ turn/text, turn/round

    def text(self, connection: Any, turn_id: str, round_: int, delta: str) -> None:
        """Buffer a round's text delta (``turn/text`` is a notification: nothing answers).

        The route in force when a round's first words arrive is the one they travel along: a
        ``channel_open`` landing later in the round changes only later rounds' words.
        """
        run = self._run_for(connection, turn_id)
        if not run.turn.add_text(round_, delta):
            self._log.warning("turn.text.late", agent=run.turn.agent, turn=turn_id, round=round_)
            return
        routing = run.turn.routing
        run.round_routes.setdefault(round_, (routing.locus, routing.sticky_target))

    def round_sends(self, tool_calls: Sequence[Mapping[str, Any]]) -> bool:
        """Whether any of a round's tool calls (not yet run) is a send tool."""
        for tool_call in tool_calls:
            name = tool_call.get("name")
            arguments = tool_call.get("arguments")
            arguments = arguments if isinstance(arguments, Mapping) else {}
            if isinstance(name, str) and self.tools.is_send(name, arguments):
                return True
        return False

    async def round(
        self, connection: Any, turn_id: str, round_: int, tool_calls: Sequence[Mapping[str, Any]] = ()
    ) -> dict[str, Any]:
        """A round ended: route its text now; its deliveries and the notices it raised.

        ``tool_calls`` are the calls the model made in this round, which the host runs after
        this: a send among them holds the round's plain text (send-silencing), since the agent
        is already saying what it means to say.
        """
        run = self._run_for(connection, turn_id)
        if self.round_sends(tool_calls):
            run.explicit_send_rounds.add(round_)
        await self._start_inference(run)
        async with run.lock:
            seen = len(run.notices)
            deliveries = await self._route_round(run, round_)
        return {"deliveries": [d.to_wire() for d in deliveries], "notices": run.notices[seen:]}

    # ------------------------------------------------------------------ speech

    def _takes_posts(self, ref: ChannelRef) -> bool:
        entry = self._daemon.router.registry.get(ref)
        return entry is None or entry.descriptor.direction != "inbound"

    def resolve_speech_target(self, token: str, routing: TurnRouting | None, prefix: str = prose.EXPLICIT) -> prose.Target:
        """A target token as speech resolves it: the turn's own channels first, then the one
        resolver; a channel that takes no posts is refused."""
        return prose.resolve_target(token, self._daemon.router.names, routing, prefix=prefix, takes_posts=self._takes_posts)

    async def _route_round(self, run: _TurnRun, round_: int) -> list[Delivery]:
        turn = run.turn
        if run.finished and turn.outcome != "completed":
            # Ended (lease, host gone, superseded) while this call waited: post nothing more.
            return []
        text = turn.take_text(round_)
        routing = turn.routing
        locus_then, pin_then = run.round_routes.pop(round_, (routing.locus, routing.sticky_target))
        log = self._log.bind(agent=turn.agent, turn=turn.turn_id, round=round_)
        mode = run.prose_routing
        prefix = prose.PIN if mode == "hybrid" else prose.EXPLICIT
        silenced = round_ in run.explicit_send_rounds
        # Pins live in the routing (a channel_open with setSpeechTarget clears them); the words
        # go along the pin in force when they were written.
        locus_now, pin_now = routing.locus, routing.sticky_target
        # A tool boundary: messages that arrived meanwhile may hold later words.
        await self._arrivals(run, log)
        if not text.strip():
            return []
        run.prose.pin = pin_then if mode in ("hybrid", "explicit") else None
        if locus_then is not None and locus_then != run.last_locus and pin_then is None:
            # A channel_open that set the speech target supersedes a >>>skip_reply or a failed >>>.
            if run.last_locus is not None or turn.routing.trigger != locus_then:
                run.prose.quiet = run.prose.hold = False
        run.last_locus = locus_then
        quiet_before, hold_before = run.prose.quiet, run.prose.hold
        segments = prose.decide(
            mode,
            text,
            run.prose,
            locus=locus_then,
            resolve=lambda token: self.resolve_speech_target(token, routing, prefix),
            silenced=silenced,
        )
        if mode in ("hybrid", "explicit"):
            moved = (locus_now, pin_now) != (locus_then, pin_then)
            # A channel_open that landed after these words were written wins for later words.
            if not moved:
                if mode == "hybrid" and run.prose.pin != pin_then and run.prose.pin is not None:
                    run.notices.append(texts.speech_lands_in(self._shown(run.prose.pin)))
                routing.sticky_target = run.prose.pin
        deliveries: list[Delivery] = []
        for segment in segments:
            delivery = await self._carry_out(run, round_, segment, prefix, log)
            if delivery is not None:
                deliveries.append(delivery)
        if mode == "hybrid":
            if run.prose.quiet and not quiet_before:
                run.notices.append(texts.SPEECH_PRIVATE_UNTIL_TARGET)
            if run.prose.hold and not hold_before:
                run.notices.append(texts.SPEECH_HELD_UNTIL_TARGET)
        return deliveries

    async def _arrivals(self, run: _TurnRun, log: Any) -> None:
        """Messages that arrived for the agent since the turn last looked (a tool boundary).

        A conversational message clears send-silencing for rounds not routed yet; one from
        another conversation that addresses the agent (or continues one it sent into) holds an
        inferred locus for the rest of the turn, with a notice, and its typing stops.
        """
        turn = run.turn
        if self._daemon.journal.last_seq() <= run.seen_seq:
            return  # nothing at all arrived since: no query (the usual case, per round)
        stored = await self._daemon.journal.unacked_deliveries(turn.agent, after_seq=run.seen_seq, limit=10000)
        if not stored:
            return
        run.seen_seq = max(item.event.seq for item in stored)
        arrivals = []
        for item in stored:
            event = item.event
            ref = ChannelRef(event.server_id, event.channel_id) if event.channel_id else None
            payload = event.payload if isinstance(event.payload, Mapping) else {}
            thread = payload.get("threadId")
            arrivals.append(prose.Arrival(ref, thread if isinstance(thread, str) else None, item.delivery.addressed,
                                          conversational=event.kind == "message"))
        if any(arrival.conversational for arrival in arrivals):
            run.explicit_send_rounds.clear()
        routing = turn.routing
        deliberate = routing.locus is not None and routing.locus != routing.trigger
        competing = prose.hold_for_arrivals(run.prose_routing, routing, run.prose, arrivals, deliberate=deliberate)
        if not competing:
            return
        routing.locus = None
        run.prose.held_reason = prose.REASON_AMBIGUOUS
        # Later rounds' words are held; this round's were written before the arrival.
        for pending, (_locus, pin) in list(run.round_routes.items()):
            run.round_routes[pending] = (None, pin)
        if routing.typing_channel is not None:
            routing.typing_channel = None
            await self._stop_typing(run)
        run.notices.append(texts.speech_held([self._shown(ref) for ref in competing]))
        log.info("speech.held.mid_turn", competing=[ref.qualified_name for ref in competing])

    async def _carry_out(self, run: _TurnRun, round_: int, segment: prose.Segment, prefix: str, log: Any) -> Delivery | None:
        turn = run.turn
        action = segment.action
        if segment.again:
            run.again = True
        if action == "suppressed":
            run.suppressed += 1
            log.info("speech.not_routed", why="disabled", chars=len(segment.text))
            return None
        if action == "kept":
            run.kept += 1
            log.info("speech.not_routed", why="named", chars=len(segment.text))
            return None
        text = segment.text
        if run.finished and action == "deliver":
            # The turn ended (lease, host gone, superseded) while this round was being routed:
            # nothing more goes out; the words are kept as a draft (a {{unsent}} draft stays held).
            if not segment.unsent:
                draft = self._new_draft(run, text, prose.REASON_NO_DESTINATION, target=segment.target, detail=f"turn-{turn.outcome}")
                log.info("speech.drafted", draft=draft.draft_id, reason=draft.reason, why="turn-ended", chars=len(text))
            return None
        unsent: Draft | None = None
        if segment.unsent:
            unsent = self._latest_bounced(turn.agent)
            if unsent is None or unsent.state != "held" or unsent.sending:
                run.notices.append(texts.unsent_unavailable(None if unsent is None else unsent.state))
                log.info("speech.unsent.refused", state=None if unsent is None else unsent.state)
                return None
            if action == "private":
                # ">>skip_reply {{unsent}}" sets the bounced draft aside.
                self._dismiss(unsent)
                run.private += 1
                return None
            text = prose.substitute_unsent(text, unsent.text)
        if action == "private":
            run.private += 1
            log.info("speech.private", chars=len(text))
            return None
        if action == "draft":
            draft = self._new_draft(run, text, segment.reason or prose.REASON_NO_DESTINATION, target=segment.target)
            if unsent is not None:
                # The new draft holds the bounced draft's words: it replaces it (no duplicate).
                self._dismiss(unsent)
            log.info("speech.drafted", draft=draft.draft_id, reason=draft.reason, chars=len(text))
            return None
        if action == "bounce":
            self._bounce(run, text, segment.target, segment.why or texts.BOUNCE_NO_TARGET, segment.why_text,
                         segment.candidates, prefix, log, replaces=unsent)
            return None
        assert segment.ref is not None
        ref = segment.ref
        if unsent is not None:
            # Journaled before the publish, checked and set with no await between: a concurrent
            # resend of the same draft sees it being sent and is refused.
            fresh = self.draft(turn.agent, unsent.draft_id)
            if fresh is None or fresh.state != "held" or fresh.sending:
                run.notices.append(texts.unsent_unavailable(None if fresh is None else ("being sent" if fresh.sending else fresh.state)))
                log.info("speech.unsent.refused", state=None if fresh is None else fresh.state)
                return None
            unsent = fresh
            self._mark_sending(unsent, ref)
        if unsent is not None and not await self._recorded_before_sending(unsent, ref, round_):
            run.notices.append(texts.unsent_not_recorded())
            return None
        try:
            delivery = await self._publish(run, ref, text, round_)
        except BaseException:
            if unsent is not None:
                self._attempted(unsent, Delivery(ref, self._shown(ref), "unknown", round_, reason=texts.REASON_INTERRUPTED))
            raise
        turn.routing.record(delivery)
        if delivery.outcome != "failed" and not run.finished:
            # Decided words only: a chunk goes out once its delivery is known not to have
            # failed, so a stream (and its complete) carries only words that went out.
            await self._stream_chunk(run, ref, text)
        log.info(
            "speech.published",
            server=ref.server_id,
            channel=ref.channel_id,
            outcome=delivery.outcome,
            reason=delivery.reason,
            message_id=delivery.message_id,
        )
        if unsent is not None:
            self._attempted(unsent, delivery)
        if delivery.outcome == "delivered":
            self._bounce_streak[turn.agent] = 0
        elif delivery.outcome == "unknown":
            run.notices.append(texts.delivery_unknown(delivery.shown, ref.server_id, delivery.reason or texts.REASON_NO_RECEIPT))
        elif run.prose_routing == "explicit" or segment.pinned:
            # A failed >> or >>> delivery bounces; a failed >>> clears the pin and holds.
            if segment.pinned:
                run.prose.pin = None
                run.prose.hold = True
                if turn.routing.sticky_target == ref:
                    turn.routing.sticky_target = None
            why = texts.bounce_why_not_delivered(delivery.shown, delivery.reason or texts.REASON_NOT_DELIVERED)
            if unsent is None:
                self._bounce(run, text, segment.target, texts.BOUNCE_NOT_DELIVERED, why, (), prefix, log)
            else:
                self._unsent_failed(run, delivery, unsent, prefix, log)
        elif unsent is not None:
            self._unsent_failed(run, delivery, unsent, prefix, log)
        else:
            run.notices.append(texts.delivery_failed(delivery.shown, ref.server_id, delivery.reason or texts.REASON_NOT_DELIVERED))
        return delivery

    def _unsent_failed(self, run: _TurnRun, delivery: Delivery, draft: Draft, prefix: str, log: Any) -> None:
        """A failed delivery of a bounced draft ({{unsent}}): say where and that it is still held."""
        turn = run.turn
        run.notices.append(texts.unsent_delivery_failed(
            delivery.shown, delivery.ref.server_id, delivery.reason or texts.REASON_NOT_DELIVERED, draft.draft_id, prefix))
        streak = self._bounce_streak.get(turn.agent, 0) + 1
        self._bounce_streak[turn.agent] = streak
        if streak <= prose.BOUNCE_WAKE_CAP:
            run.again = True
        log.info("speech.unsent.failed", draft=draft.draft_id, server=delivery.ref.server_id,
                 channel=delivery.ref.channel_id, reason=delivery.reason, streak=streak)

    async def _stream_chunk(self, run: _TurnRun, ref: ChannelRef, text: str) -> None:
        """Send decided words to ``ref``'s own server as a chunk, if it is granted streaming.

        ``index`` counts per inference across channels. The stream belongs to the ref and the
        epoch of its first chunk: a reconnected server (or another server taking the id) never
        gets the rest of it.
        """
        link = self._daemon.links.get(ref.server_id)
        if link is None or link.state is not LinkState.READY or not link.grant.allows(STREAMING):
            return
        stream = run.streams.get(ref)
        if stream is not None and stream[0] != link.epoch:
            return
        turn = run.turn
        index = run.stream_index
        run.stream_index += 1
        # Each channel's deltas join into its complete text: later words start a new paragraph.
        delta = text if stream is None else "\n\n" + text
        params = {"inferenceId": turn.inference_id, "conversationId": turn.conversation_id, "channelId": ref.channel_id,
                  "index": index, "delta": delta}
        # Recorded before the send: whoever completes the streams meanwhile completes this one.
        if stream is None:
            run.streams[ref] = stream = (link.epoch, [])
        stream[1].append(delta)
        try:
            await link.send_notification("channels/outgoing/chunk", params, capability=STREAMING)
        except (LinkUnavailable, CapabilityNotGranted, PeerClosed):
            self._log.info("stream.chunk.failed", agent=turn.agent, turn=turn.turn_id, server=ref.server_id, channel=ref.channel_id)
            if delta in stream[1]:
                stream[1].remove(delta)
            if not stream[1] and run.streams.get(ref) is stream:
                del run.streams[ref]

    async def _complete_streams(self, run: _TurnRun) -> None:
        """``complete`` once per channel that got chunks, with its full text (every exit path)."""
        streams, run.streams = run.streams, {}
        turn = run.turn
        for ref, (epoch, parts) in streams.items():
            link = self._daemon.links.get(ref.server_id)
            if link is None or link.epoch != epoch or link.state is not LinkState.READY:
                continue
            params = {"inferenceId": turn.inference_id, "conversationId": turn.conversation_id, "channelId": ref.channel_id,
                      "content": "".join(parts)}
            try:
                await link.send_notification("channels/outgoing/complete", params, capability=STREAMING)
            except (LinkUnavailable, CapabilityNotGranted, PeerClosed):
                self._log.info("stream.complete.failed", agent=turn.agent, turn=turn.turn_id, server=ref.server_id)

    async def publish_for(self, run: _TurnRun, ref: ChannelRef, text: str) -> Delivery:
        """Publish ``text`` for ``run``'s turn to ``ref`` on its own server (a speech tool's send)."""
        return await self._publish(run, ref, text, run.turn.round)

    def _longest_publish(self) -> float:
        """The longest a publish may take now (the bound on waiting for one at a turn's end)."""
        if self.publish_timeout is not None:
            return self.publish_timeout
        return max((link.config.request_timeout for link in self._daemon.links.values()), default=PUBLISH_TIMEOUT)

    async def _publish(self, run: _TurnRun, ref: ChannelRef, text: str, round_: int) -> Delivery:
        return await publish_text(
            self._daemon.links.get(ref.server_id),
            ref,
            self._shown(ref),
            text,
            conversation_id=run.turn.conversation_id,
            round_=round_,
            registered=self._daemon.router.registry.is_registered(ref),
            timeout=self.publish_timeout,
        )

    def _bounce(
        self, run: _TurnRun, text: str, target: str | None, why: str, why_text: str,
        candidates: Sequence[str], prefix: str, log: Any, *, replaces: Draft | None = None,
    ) -> None:
        """Hold ``text`` as a bounced draft, with the notice. ``replaces``: the bounced draft
        ``{{unsent}}`` stood for; the new bounce takes its place instead of adding a copy (the
        same draft when the words are exactly its own, else a new one and the old dismissed)."""
        turn = run.turn
        if replaces is not None and replaces.text == text:
            draft = replaces
            draft.target, draft.detail = target, why
            self.save_draft(draft)
            if draft.draft_id not in run.drafts:
                run.drafts.append(draft.draft_id)
        else:
            draft = self._new_draft(run, text, prose.REASON_BOUNCED, target=target, detail=why)
            if replaces is not None:
                self._dismiss(replaces)
        fallback = self._daemon.router.names.pick_name(turn.routing.trigger) if turn.routing.trigger else None
        example = prose.example_target(candidates, prefix, fallback)
        run.notices.append(texts.bounce(len(text), why_text, draft.draft_id, candidates, prefix=prefix, example_target=example))
        streak = self._bounce_streak.get(turn.agent, 0) + 1
        self._bounce_streak[turn.agent] = streak
        if streak <= prose.BOUNCE_WAKE_CAP:
            run.again = True
        log.info("speech.bounced", draft=draft.draft_id, why=why, chars=len(text), streak=streak)

    def invitation_for(self, wake: Any) -> str | None:
        """The closed-channel invitation a message wake carries, or None.

        Only for a message that addresses the agent in a channel that is registered and not
        open (the agent hasn't joined it); the first option is the agent's mode's way to reach
        that channel alone.
        """
        ref = getattr(wake, "channel", None)
        if not isinstance(ref, ChannelRef) or not getattr(wake, "addressed", False):
            return None
        entry = self._daemon.router.registry.get(ref)
        if entry is None or entry.open:
            return None
        spec = self._sessions.agent(wake.agent)
        mode = str(getattr(spec, "prose_routing", "locus") or "locus")
        payload = getattr(wake, "payload", None)
        author = payload.get("author") if isinstance(payload, Mapping) else None
        if isinstance(author, Mapping):
            author = author.get("name") or author.get("id")
        author = author if isinstance(author, str) else None
        may_publish = agent_may_call(spec, "channel_publish")
        # One text per (agent's mode, channel, author) while the registry stands: a busy channel's
        # wakes don't each render it anew.
        generation = self._daemon.router.registry.generation
        if generation != self._invitations_generation or len(self._invitations) >= INVITATION_CACHE:
            self._invitations.clear()
            self._invitations_generation = generation
        key = (mode, ref, author, may_publish)
        text = self._invitations.get(key)
        if text is None:
            text = self._invitations[key] = prose.invitation_text(mode, self._daemon.router.names, ref, author, may_publish=may_publish)
        return text

    # ------------------------------------------------------------------ drafts

    def _journal(self) -> Any:
        return self._daemon.journal

    def drafts_of(self, agent: str) -> list[Draft]:
        """Every draft of ``agent``, oldest first (durable: read from the journal)."""
        return [Draft.from_row(row) for row in self._journal().drafts_of(agent)]

    def draft(self, agent: str, draft_id: str) -> Draft | None:
        """One of ``agent``'s drafts by id."""
        row = self._journal().draft(draft_id)
        if row is None or row.get("agent") != agent:
            return None
        return Draft.from_row(row)

    def save_draft(self, draft: Draft) -> None:
        """Journal ``draft`` as it is now."""
        self._journal().save_draft(draft.row())

    def _new_draft(self, run: _TurnRun, text: str, reason: str, *, target: str | None = None, detail: str | None = None) -> Draft:
        journal = self._journal()
        draft = Draft(
            draft_id=new_draft_id(lambda candidate: journal.draft(candidate) is not None),
            agent=run.turn.agent,
            text=text,
            reason=reason,
            created_at=time.time(),
            turn_id=run.turn.turn_id,
            target=target,
            detail=detail,
        )
        self.save_draft(draft)
        run.drafts.append(draft.draft_id)
        return draft

    def _latest_bounced(self, agent: str) -> Draft | None:
        bounced = [draft for draft in self.drafts_of(agent) if draft.reason == prose.REASON_BOUNCED]
        return bounced[-1] if bounced else None

    def _dismiss(self, draft: Draft) -> None:
        draft.state = "dismissed"
        self.save_draft(draft)

    def _attempted(self, draft: Draft, delivery: Delivery) -> None:
        """Record a finished send of ``draft`` (journaled) and move its state."""
        attempt = Attempt(delivery.ref.server_id, delivery.ref.channel_id, delivery.shown, time.time(), delivery.outcome, delivery.reason)
        if draft.attempts and draft.attempts[-1].outcome == "sending":
            draft.attempts[-1] = attempt
        else:
            draft.attempts.append(attempt)
        draft.state = {"delivered": "delivered", "unknown": "unconfirmed"}.get(delivery.outcome, draft.state)  # type: ignore[assignment]
        self.save_draft(draft)

    def _mark_sending(self, draft: Draft, ref: ChannelRef) -> None:
        """Journal a ``sending`` attempt of ``draft`` to ``ref`` (before its publish goes out)."""
        draft.attempts.append(Attempt(ref.server_id, ref.channel_id, self._shown(ref), time.time(), "sending"))
        self.save_draft(draft)

    async def _recorded_before_sending(self, draft: Draft, ref: ChannelRef, round_: int) -> bool:
        """Wait until the draft's ``sending`` mark is on disk; if the journal can't, the send
        doesn't go out and the attempt is recorded failed (nothing was sent), the draft held."""
        try:
            await self._journal().flush()
        except JournalFailure as exc:
            self._log.error("draft.not_recorded", draft=draft.draft_id, server=ref.server_id, channel=ref.channel_id, error=str(exc))
            self._attempted(draft, Delivery(ref, self._shown(ref), "failed", round_, reason=texts.REASON_NOT_RECORDED))
            return False
        return True

    async def resend_draft(self, run: _TurnRun, draft: Draft, ref: ChannelRef) -> Delivery:
        """Send ``draft`` to ``ref``: the attempt is journaled before the publish goes out.

        The caller checked ``draft`` (fresh from the journal) in the same task with no await
        since, so the check and the ``sending`` mark are one step. A send interrupted (the
        call cancelled) is recorded ``unknown``: the draft becomes unconfirmed, never stuck.
        """
        self._mark_sending(draft, ref)
        if not await self._recorded_before_sending(draft, ref, run.turn.round):
            return Delivery(ref, self._shown(ref), "failed", run.turn.round, reason=texts.REASON_NOT_RECORDED)
        try:
            delivery = await self.publish_for(run, ref, draft.text)
        except BaseException:
            self._attempted(draft, Delivery(ref, self._shown(ref), "unknown", run.turn.round, reason=texts.REASON_INTERRUPTED))
            raise
        # A failed attempt leaves the draft held (nothing arrived); see _attempted.
        self._attempted(draft, delivery)
        return delivery

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
        """A tool call from the model, sent to the tool the name table says ``name`` means.

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
        entry = self.tools.entry(name)
        if entry is None:
            log.info("turn.tool.unknown")
            return tool_result(texts.unknown_tool(name), error=True, reason="unknown-tool")
        if not agent_may_call(agent, name):
            log.info("turn.tool.not_permitted")
            return tool_result(texts.tool_not_permitted(name), error=True, reason="not-permitted")
        call = ToolCall(
            run=run,
            scope=scope,
            agent=agent,
            call_id=call_id,
            tool=entry.tool,
            arguments=dict(arguments) if isinstance(arguments, Mapping) else {},
        )
        result = await entry.provider.call(call)
        log.info("turn.tool.called", error=bool(result.get("isError")), reason=result.get("reason"))
        return result

    # ------------------------------------------------------------------ turn/close

    async def close(self, connection: Any, turn_id: str, outcome: str, usage: Any = None) -> dict[str, Any]:
        """End a turn: route what's left, stop typing, send the lifecycle terminal; the receipt.

        ``refused`` (the model provider refused) ends the turn as ``failed`` for servers and
        marks the turn's latest inbound message with :attr:`refusal_reaction` through
        ``channels/acknowledge`` on that message's own server, except for a named agent.
        """
        if outcome not in OUTCOMES:
            raise RpcError(INVALID_PARAMS, f"outcome must be one of completed, aborted, failed, refused; got {texts.quoted(str(outcome))}")
        run = self._run_for(connection, turn_id)
        turn = run.turn
        async with run.lock:
            seen = len(run.notices)
            if outcome == "completed":
                for round_ in turn.unrouted_rounds():
                    await self._route_round(run, round_)
            else:
                # An aborted, failed or refused turn's unfinished words are not posted.
                for round_ in turn.unrouted_rounds():
                    text = turn.take_text(round_)
                    if not text.strip():
                        continue
                    if run.prose_routing == "named":
                        run.kept += 1
                    elif run.prose_routing == "disabled":
                        run.suppressed += 1
                    else:
                        self._new_draft(run, text, prose.REASON_NO_DESTINATION, detail=f"turn-{outcome}")
        await self._finish(run, "failed" if outcome == "refused" else outcome, why="closed", usage=usage)
        if outcome == "refused":
            # After the turn has ended (typing stopped, terminal sent), and in the background:
            # a server slow to answer the reaction must not hold the host's close.
            if self._nursery is not None:
                self._nursery.start_soon(self._react_to_refusal, run)
            else:
                await self._react_to_refusal(run)
        deliveries = turn.routing.deliveries
        receipt_text = self._receipt(run)
        receipt = {
            "text": receipt_text,
            "delivered": [d.to_wire() for d in deliveries if d.outcome == "delivered"],
            "held": len(run.drafts),
            "private": run.private,
            "suppressed": run.suppressed,
            "kept": run.kept,
        }
        made = [d for d in self.drafts_of(turn.agent) if d.draft_id in run.drafts]
        for draft in made:
            if not draft.told:
                draft.told = True  # the receipt (or a bounce notice) names it
                self.save_draft(draft)
        drafts = [d.to_wire(time.time()) for d in made]
        again = run.again and outcome == "completed"
        return {
            "receipt": receipt,
            "deliveries": [d.to_wire() for d in deliveries],
            "drafts": drafts,
            "notices": run.notices[seen:],
            "again": again,
        }

    def _receipt(self, run: _TurnRun) -> str | None:
        """The turn's receipt text; None in explicit mode (which has none)."""
        mode = run.prose_routing
        if mode == "explicit":
            return None
        deliveries = run.turn.routing.deliveries

        def shown(outcome: str) -> list[str]:
            # Each place once (server + channel + thread), in delivery order, by the name the
            # agent is shown now: a name taken at delivery may no longer mean that place alone.
            refs = dict.fromkeys((d.ref, getattr(d, "thread_id", None)) for d in deliveries if d.outcome == outcome)
            return list(dict.fromkeys(self._shown(ref) for ref, _thread in refs))

        places = shown("delivered")
        notes: list[str] = []
        if mode == "named":
            if run.kept:
                notes.append(texts.note_named(run.kept))
            return texts.prose_receipt([], notes)
        if run.drafts:
            notes.append(texts.note_drafts(run.drafts))
        unknown = shown("unknown")
        failed = shown("failed")
        if unknown:
            notes.append(texts.note_unconfirmed(unknown))
        if failed:
            notes.append(texts.note_failed(failed))
        if run.private:
            notes.append(texts.note_private(run.private))
        if run.suppressed:
            notes.append(texts.note_suppressed(run.suppressed))
        return texts.prose_receipt(places, notes)

    async def _react_to_refusal(self, run: _TurnRun) -> None:
        """Mark the turn's latest inbound message (on its own server) with the refusal reaction."""
        turn = run.turn
        log = self._log.bind(agent=turn.agent, turn=turn.turn_id)
        ref, message_id = turn.routing.trigger, turn.trigger_message_id
        if run.prose_routing == "named" or ref is None or message_id is None:
            log.info("refusal.reaction.skipped", why="named" if run.prose_routing == "named" else "no-inbound-message")
            return
        link = self._daemon.links.get(ref.server_id)
        if link is None or link.state is not LinkState.READY or not link.grant.allows(ACKNOWLEDGE):
            log.info("refusal.reaction.skipped", why="not-permitted", server=ref.server_id)
            return
        reason = await acknowledge_message(
            link, ref, message_id, intent=ACK_INTENT_REFUSED, value=self.refusal_reaction,
            timeout=min(REFUSAL_REACTION_TIMEOUT, link.config.request_timeout),
        )
        if reason is not None:
            log.info("refusal.reaction.failed", server=ref.server_id, channel=ref.channel_id, reason=reason)
            return
        log.info("refusal.reaction.sent", server=ref.server_id, channel=ref.channel_id, message=message_id)

    # ------------------------------------------------------------------ ending a turn

    async def _finish(self, run: _TurnRun, outcome: str, *, why: str, usage: Any = None) -> None:
        """End a turn once, whichever way: stop its typing and send its lifecycle terminal.

        Exclusive with round routing: ``finished`` is set first (a round being routed re-checks
        it before each publish and chunk, so it stops after the publish in flight), then the
        end waits for the turn's lock, so the streams complete after the round's last chunk.
        The wait is bounded by one publish (and shielded, like the sends after it).
        """
        if run.finished:
            return
        run.finished = True
        turn = run.turn
        turn.outcome = outcome
        self.table.remove(turn)
        self._runs.pop(turn.turn_id, None)
        run.cancel.cancel()
        log = self._log.bind(agent=turn.agent, turn=turn.turn_id)
        acquired = False
        with trio.CancelScope(shield=True, deadline=trio.current_time() + self._longest_publish() + FINISH_GRACE):
            await run.lock.acquire()
            acquired = True
        if not acquired:
            log.warning("turn.finish.lock_timeout", why=why)
        try:
            # Shielded: the stop and the terminal must go out even when the caller is being
            # cancelled (a lease expiry inside the keeper, a host gone mid-call), within a bound.
            with trio.CancelScope(shield=True, deadline=trio.current_time() + FINISH_GRACE):
                # Concurrently: a typing stop stuck on one server must not cost another server
                # its lifecycle terminal.
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._stop_typing, run)
                    nursery.start_soon(self._end_streams_and_inference, run, outcome, usage)
        finally:
            if acquired:
                run.lock.release()
        log.info("turn.ended", outcome=outcome, why=why)

    async def _end_streams_and_inference(self, run: _TurnRun, outcome: str, usage: Any) -> None:
        await self._complete_streams(run)
        if run.started is None:
            return
        await run.started_done.wait()
        turn = run.turn
        params: dict[str, Any] = {
            "inferenceId": turn.inference_id,
            "conversationId": turn.conversation_id,
            "turnIndex": turn.turn_index,
            "phase": outcome,
        }
        if usage is not None:
            params["usage"] = usage
        await send_lifecycle(self._links(), params, only=run.started, log_fields={"agent": turn.agent, "turn": turn.turn_id})

    def typing_statistics(self) -> dict[str, int]:
        """Typing indicators the daemon holds now: for turns, and started by hosts."""
        return {
            "turn": sum(1 for run in self._runs.values() if run.typing_sent is not None),
            "host": len(self._host_typing),
        }

    async def drain(self) -> None:
        """Abort every open turn (daemon shutdown): typing stopped, lifecycle terminals sent.

        All at once, so the whole drain takes one turn's bound, not one per turn.
        """
        async with trio.open_nursery() as nursery:
            for turn in self.table.all():
                run = self._runs.get(turn.turn_id)
                if run is not None:
                    nursery.start_soon(functools.partial(self._finish, run, "aborted", why="shutdown"))

    def connection_closed(self, connection: Any) -> None:
        """A host connection is gone: its turns end at their keeper's next check (soon), and
        the typing it started by itself is stopped now."""
        if self._nursery is not None and any(owner is connection for owner, _ in self._host_typing.values()):
            self._nursery.start_soon(self._expire_host_typing, connection)
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
            # Shielded and recorded server by server: a host dropping mid-call must not leave
            # a server told "started" that the turn then forgets to end.
            with trio.CancelScope(shield=True, deadline=trio.current_time() + FINISH_GRACE):
                await send_lifecycle(self._links(), params, told=run.started, log_fields={"agent": turn.agent, "turn": turn.turn_id})
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
        if run.typing_sent is not None and run.typing_sent[0] != ref:
            # The typing channel moved (a channel_open that set the speech target): the old
            # channel stops, on its own server, before the new one starts.
            await self._stop_typing(run)
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

    async def stop_typing_in(self, ref: ChannelRef) -> None:
        """``channel_close`` of ``ref``: stop the typing of turns typing in exactly that channel.

        Another server's channel with the same id keeps its typing. (Channel tools' helper.)
        """
        for run in list(self._runs.values()):
            if run.turn.routing.typing_channel == ref:
                run.turn.routing.typing_channel = None
                await self._stop_typing(run)
                self._log.info("typing.closed", agent=run.turn.agent, turn=run.turn.turn_id, server=ref.server_id, channel=ref.channel_id)

    def channels_removed(self, refs: Iterable[ChannelRef]) -> None:
        """Channels withdrawn (or their server gone): stop only those channels' typing.

        Another server's channel with the same id keeps its typing. Nothing is sent: the
        server withdrew the channel, so a stop for it would name an unknown channel.
        """
        refs = list(refs)
        for ref in refs:
            self._host_typing.pop(ref, None)
        for run in self._runs.values():
            stopped = run.turn.routing.withdrawn(refs)
            if stopped is not None:
                if run.typing_sent is not None and run.typing_sent[0] == stopped:
                    run.typing_sent = None
                self._log.info("typing.withdrawn", agent=run.turn.agent, turn=run.turn.turn_id, server=stopped.server_id, channel=stopped.channel_id)

    async def host_typing(self, channel: str | Mapping[str, Any], op: str, connection: Any = None) -> dict[str, Any]:
        """A host's ``channels/typing``: a bare id in each server's channel with it (the
        deliberate fan-out); a ref or qualified name there alone.

        A ``start`` holds for :attr:`host_typing_lease` (renewed by the next start); the
        daemon stops it when the lease runs out or the host's connection closes.
        """
        try:
            targets = host_typing_targets(self._daemon.router.names, channel)
        except MalformedChannel as exc:
            raise RpcError(INVALID_PARAMS, str(exc), {"field": "channel"}) from None
        if not isinstance(targets, tuple):
            raise RpcError(CHANNEL_REFUSED, targets.text, targets.to_dict())
        rows = []
        for ref in targets:
            if op == "stop":
                self._host_typing.pop(ref, None)
            else:
                self._host_typing[ref] = (connection, trio.current_time() + self.host_typing_lease)
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
                    moved = run.typing_sent is not None and run.typing_sent[0] != turn.routing.typing_channel
                    if moved or (turn.routing.typing_channel is not None and now >= run.next_typing):
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
