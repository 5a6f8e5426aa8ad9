"""The daemon's channel tools: ``channel_list``, ``channel_open``, ``channel_close``,
``channel_decline`` and ``channel_publish`` (a :class:`~mcpl_router.tools.seam.ToolProvider`).

How every tool reads a channel name (issue 6, seed ``000_…``):

- ``channelId`` takes an id or the qualified ``serverId:channelId``; a ``serverId`` beside it
  names that exact pair. A model's empty string is "not given". No schema changes because ids
  are shared.
- **The turn's own channel first**: for a call made inside the agent's open turn
  (``call.scope.turn``), an id of a channel the turn has been in means that channel on its
  server (:func:`~mcpl_router.routing.turns.own_channel_named`), before any other reading, and
  is refused once that server withdraws it. A call made outside the turn (a script left running
  after its turn) reads no turn's channels, moves no routing and engages nothing.
- ``channel_publish`` with no ``channelId`` posts to the agent's default channel on the server
  whose message set it (:mod:`mcpl_router.routing.defaults`); ``named`` agents must name one.

Every result carries ``serverId`` in ``structuredContent``; every refusal says what was not done
and what would work, with a stable ``reason`` (the resolver's refusal kind, or a delivery reason).

Declines are durable (the journal's ``declines`` table, per agent). What each agent last decided
for each channel (``open``/``closed``/``declined``, its *desired state*,
:class:`~mcpl_router.routing.desired.DesiredChannels`) is its own: keyed by agent and channel,
``channel_list`` shows the calling agent's, and one agent's decline never shows for, nor is
forgotten by, another. :meth:`ChannelLifecycle.has_open` answers from it whether an agent is in a
channel (the closed-channel invitation asks, per agent: ``turns/invitations.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Final, Protocol

from mcpl_router.events import EventBus, ServerWithdrawn, WakeDelivered
from mcpl_router.logs import get_logger
from mcpl_router.mcpl.session import ACKNOWLEDGE, LIFECYCLE, HistoryParams, ServerSession
from mcpl_router.routing import texts
from mcpl_router.routing.defaults import DefaultChannel, DefaultChannels, DefaultTarget
from mcpl_router.routing.desired import CLOSED, DECLINED, OPEN
from mcpl_router.routing.fork_fence import FenceRefusal, fenced
from mcpl_router.routing.names import Refusal, Resolved
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.turns import own_channel_named
from mcpl_router.tools.arguments import ChannelArgs, DeclineArgs, OpenArgs, PublishArgs
from mcpl_router.tools.seam import ToolCall, ToolName, ToolSpec, record_explicit_send, tool_result
from mcpl_router.tools.tune_out import tune_out_owner
from mcpl_router.turns import ACK_INTENT_DECLINED, acknowledge_message, message_ids_of, publish_text
from mcpl_router.turns.sends import LIFECYCLE_TIMEOUT

if TYPE_CHECKING:
    from mcpl_router.routing.agents import AgentSpec
    from mcpl_router.routing.router import Router
    from mcpl_router.tools.channel_lifecycle import ChannelLifecycle
    from mcpl_router.tools.tune_out import TuneOuts
    from mcpl_router.turns import TurnRun, TurnTimings

__all__ = ["CHANNEL_TOOLS", "LIFECYCLE_TIMEOUT", "ChannelTools"]

CHANNEL_TOOLS: Final = ("channel_list", "channel_open", "channel_close", "channel_decline", "channel_publish")
_NAMES: Final = tuple(ToolName(name) for name in CHANNEL_TOOLS)


# Stable reasons of the tools' own refusals (the resolver's kinds and delivery reasons too).
REASON_NO_CONTENT: Final = "no-content"
REASON_TUNED_OUT: Final = "tuned-out"

_STRING: Final = {"type": "string"}


def _schema(properties: dict[str, object], required: tuple[str, ...] = ()) -> dict[str, object]:
    schema: dict[str, object] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


def _channel_id(description: str = texts.CHANNEL_ID_DESCRIPTION) -> dict[str, object]:
    return {**_STRING, "description": description}


_SERVER_ID: Final = {**_STRING, "description": texts.SERVER_ID_DESCRIPTION}


def _refused(refusal: Refusal) -> dict[str, object]:
    data: dict[str, object] = {"candidates": [ref.to_wire() for ref in refusal.candidates]}
    if refusal.server_id is not None:
        data["serverId"] = refusal.server_id
    return tool_result(refusal.text, error=True, reason=refusal.kind, data=data)


class LatestAcked(Protocol):
    """The journal's read of each agent's latest acked wake on a channel."""

    async def latest_acked_channels(self, agents: Iterable[str]) -> dict[str, tuple[str, str, object]]: ...


#: The tools whose call records an agent's channel decision.
_DECIDING: Final = frozenset({"channel_open", "channel_close", "channel_decline"})


class ChannelTools:
    """The channel tools of one daemon, and each agent's default channel.

    A tool provider of the name table. It hears each wake that goes out (:class:`WakeDelivered`,
    the sessions' and the gates') and each server connection that ends (:class:`ServerWithdrawn`).

    Args:
        router: the registry (what is registered and open) and the one resolver.
        servers: each server's session by server id (a live view of the daemon's links: a reload changes it).
        channels: each agent's decisions per channel (journaled; the servers held to them).
        stop_typing_in: stops the typing of every turn typing in one channel (a close).
        timings: the publish deadline.
        tune_outs: whose tuned-out channels open/close/decline refuse.
        fork_home: a conversation fork's home, by the agent's name (None: no fork). A fork's
            calls are fenced to its home (routing/fork_fence.py).
        events: where it hears the wakes delivered and the server connections ended.
    """

    def __init__(
        self,
        router: Router,
        servers: Mapping[str, ServerSession],
        channels: ChannelLifecycle,
        stop_typing_in: Callable[[ChannelRef], Awaitable[None]],
        timings: TurnTimings,
        tune_outs: TuneOuts,
        fork_home: Callable[[str], ChannelRef | None] = lambda agent: None,
        may_take: Callable[[str, ChannelRef], bool] = lambda agent, ref: True,
        events: EventBus | None = None,
    ) -> None:
        self._router = router
        self._servers = servers
        self._channels = channels
        self._stop_typing_in = stop_typing_in
        self._timings = timings
        self._tune_outs = tune_outs
        self._fork_home = fork_home
        self._may_take = may_take
        self.defaults = DefaultChannels()
        #: What each agent last decided for each channel: "open", "closed" or "declined".
        self._desired = channels.desired
        # The specs read nothing but the mode's one flag: built once per value, not per turn.
        self._specs: dict[bool, list[ToolSpec]] = {}
        self._log = get_logger()
        if events is not None:
            events.subscribe(WakeDelivered, self._wake_delivered)
            events.subscribe(ServerWithdrawn, lambda ended: self.server_removed(ended.server_id))

    # ------------------------------------------------------------------ daemon events

    def _wake_delivered(self, delivered: WakeDelivered) -> None:
        """A wake went to its agent (alone, or as a batch's route): it sets the agent's default
        channel, to the wake's channel on its server.

        Only while its channel is registered: a message admitted after its server was removed
        sets no default. Wakes held back (a tuned-out channel's, a gate's until its batch) are
        never passed here, so they set none; nor does a channel the agent may not take (a
        trunk's wake from a channel one of its forks holds).
        """
        wake = delivered.wake
        ref = wake.channel
        if ref is None:
            return
        if not self._may_take(wake.agent, ref):
            self._log.info("default_channel.not_set", agent=wake.agent, server=ref.server_id, channel=ref.channel_id,
                           seq=wake.seq, why="fork-holds-it")
            return
        # A message's own ids, or those a push names in its origin (discord-mcpl's push for a
        # message in a closed channel): the message a decline acknowledges by default.
        message_id, thread_id = message_ids_of(wake.payload)
        registered = self._router.registry.is_registered(ref)
        if not self.defaults.woke(wake.agent, ref, message_id=message_id, thread_id=thread_id, registered=registered):
            self._log.info("default_channel.not_set", agent=wake.agent, server=ref.server_id, channel=ref.channel_id, seq=wake.seq)

    async def restore_defaults(self, journal: LatestAcked, agents: Iterable[str]) -> int:
        """At a start: each agent's default channel as its latest acked wake on a channel set it
        before the stop (a restart, a cluster's takeover), so a publish with no ``channelId``
        goes where it went. Wakes sent again since (unacked ones) set it anew as they go out.
        How many were restored."""
        restored = 0
        for agent, (server_id, channel_id, payload) in (await journal.latest_acked_channels(agents)).items():
            ref = ChannelRef(server_id, channel_id)
            if not self._may_take(agent, ref):
                continue
            message_id, thread_id = message_ids_of(payload)
            if self.defaults.restore(agent, DefaultChannel(ref, message_id, thread_id)):
                restored += 1
        if restored:
            self._log.info("default_channel.restored", agents=restored)
        return restored

    def server_removed(self, server_id: str) -> None:
        """A server's connection ended: defaults on it keep their ref, lose message and thread."""
        for agent in self.defaults.server_removed(server_id):
            self._log.info("default_channel.server_removed", agent=agent, server=server_id)

    # ------------------------------------------------------------------ ToolProvider

    def tool_names(self) -> Iterable[ToolName]:
        return _NAMES

    def is_send(self, tool: ToolName, arguments: Mapping[str, object]) -> bool:
        """``channel_publish`` posts: its round's plain text is held (send-silencing)."""
        return tool.name == "channel_publish"

    def tools_for(self, agent: AgentSpec, run: TurnRun) -> list[ToolSpec]:
        named = agent.mode.sends_only_where_named
        specs = self._specs.get(named)
        if specs is None:
            specs = self._specs[named] = _channel_tool_specs(named)
        return specs

    async def call(self, call: ToolCall) -> dict[str, object]:
        handler = {
            "channel_list": self._list,
            "channel_open": self._open,
            "channel_close": self._close,
            "channel_decline": self._decline,
            "channel_publish": self._publish,
        }[call.name]
        result = await handler(call)
        if call.name in _DECIDING:
            # The agent hears of its decision only once the journal has it (a takeover's new
            # holder, a restart, knows what the agent was told).
            await self._channels.recorded()
        return result

    # ------------------------------------------------------------------ reading names

    def resolve(
        self, call: ToolCall, name: str | None, server_id: str | None, *, not_done: str, server_id_accepted: bool = True
    ) -> Resolved | Refusal:
        """The channel a tool's ``channelId`` (and ``serverId``) names, for this call.

        Inside the turn, with no ``serverId``, the turn's own channels come first.
        """
        router = self._router
        if name and server_id is None and call.scope.turn is not None:
            own = own_channel_named(call.scope.turn.routing, name, router.registry, not_done=not_done)
            if own is not None:
                return own
        return router.names.channel_named(name, server_id, not_done=not_done, server_id_accepted=server_id_accepted)

    def _shown(self, ref: ChannelRef) -> str:
        return self._router.names.name_shown(ref)

    def _data(self, ref: ChannelRef, **extra: object) -> dict[str, object]:
        return {**ref.to_wire(), "shown": self._shown(ref), **extra}

    def _session(self, ref: ChannelRef) -> ServerSession | None:
        """``ref``'s own server's session, if that server is ready."""
        session = self._servers.get(ref.server_id)
        return session if session is not None and session.ready else None

    def _tuned_out(self, call: ToolCall, ref: ChannelRef, verb: str, not_done: str) -> dict[str, object] | None:
        """The refusal for a channel the calling agent tuned out, saying how the tune-out ends."""
        # A subconscious agent's tools act on its primary's tune-outs.
        ends = self._tune_outs.end_text(tune_out_owner(call.agent), ref)
        if ends is None:
            return None
        self._log_call(call, f"channel_{verb}.tuned_out", ref)
        text = texts.channel_tuned_out(verb, self._shown(ref), ref.server_id, ends, not_done)
        return tool_result(text, error=True, reason=REASON_TUNED_OUT, data=self._data(ref))

    def _log_call(self, call: ToolCall, event: str, ref: ChannelRef | None = None, **fields: object) -> None:
        self._log.info(
            event,
            agent=call.run.turn.agent,
            turn=call.run.turn.turn_id,
            calling_turn=call.scope.turn.turn_id if call.scope.turn else None,
            server=ref.server_id if ref else None,
            channel=ref.channel_id if ref else None,
            **fields,
        )

    def _fork_target(self, call: ToolCall, verb: str, name: str | None, server_id: str | None,
                     not_done: str) -> ChannelRef | dict[str, object] | None:
        """A fork's call: its home, or the fence's refusal; None for an agent that is no fork."""
        home = self._fork_home(call.agent.name)
        if home is None:
            return None
        entry = self._router.registry.get(home)
        names = {self._shown(home)} | ({entry.descriptor.label} if entry is not None and entry.descriptor.is_dm and entry.descriptor.label else set())
        target = fenced(verb, home, name, server_id, is_registered=self._router.registry.is_registered,
                        home_names=frozenset(names), home_shown=self._shown(home), not_done=not_done)
        if isinstance(target, FenceRefusal):
            self._log_call(call, f"channel_{verb}.fenced", home, reason=target.reason, asked=target.asked)
            return tool_result(target.text, error=True, reason=target.reason, data=self._data(home, asked=target.asked))
        return target

    # ------------------------------------------------------------------ channel_list

    async def _list(self, call: ToolCall) -> dict[str, object]:
        rows = []
        lines = []
        agent = call.run.turn.agent
        for row in self._router.names.channel_list():
            desired = self._desired.get(agent, row.ref)
            rows.append({**row.to_dict(), "desired": desired})
            lines.append(texts.channel_row(row.shown, row.server_id, row.label, row.direction, row.open, desired))
        return tool_result(texts.channel_listing(lines), data={"channels": rows})

    # ------------------------------------------------------------------ channel_open

    def _lifecycle_target(self, call: ToolCall, named: ChannelArgs, verb: str, not_done: str) -> ChannelRef | dict[str, object]:
        """The channel an open/close/decline names, or the refusal to return (a name that
        picks no channel alone, or a tuned-out channel)."""
        fork = self._fork_target(call, verb, named.channel_id, named.server_id, not_done)
        if fork is not None:
            return fork if not isinstance(fork, ChannelRef) else self._tuned_out(call, fork, verb, not_done) or fork
        resolved = self.resolve(call, named.channel_id, named.server_id, not_done=not_done)
        if isinstance(resolved, Refusal):
            self._log_call(call, f"channel_{verb}.refused", kind=resolved.kind)
            return _refused(resolved)
        tuned_out = self._tuned_out(call, resolved.ref, verb, not_done)
        return tuned_out if tuned_out is not None else resolved.ref

    async def _open(self, call: ToolCall) -> dict[str, object]:
        args = OpenArgs.read(call.arguments)
        not_done = texts.OPEN_NOT_DONE
        ref = self._lifecycle_target(call, args.channel, "open", not_done)
        if not isinstance(ref, ChannelRef):
            return ref
        shown = self._shown(ref)
        registry = self._router.registry
        entry = registry.get(ref)
        session = self._session(ref)
        if session is None:
            return tool_result(texts.lifecycle_failed("open", shown, texts.Reason.NO_LINK, not_done), error=True,
                               reason=texts.Reason.NO_LINK, data=self._data(ref))
        if not session.allows(LIFECYCLE):
            if entry is None or not entry.open:
                return tool_result(texts.lifecycle_not_granted("open", shown, ref.server_id, not_done), error=True,
                                   reason=texts.Reason.NOT_PERMITTED, data=self._data(ref))
            reason = None  # open already, and its server decides: nothing to ask
        else:
            # Backscroll travels as `history: {limit, beforeMessageId?}`, the shape discord-mcpl
            # reads (src/server.ts:68-71, :2379); a bare `backscroll` number it never sees.
            # `beforeMessageId` goes alone too: the schema offers it alone.
            history = None
            if args.backscroll is not None or args.before_message_id is not None:
                history = HistoryParams(limit=args.backscroll, before_message_id=args.before_message_id)
            reason = await self._channels.send_open(session, ref, history=history, thread_id=args.thread_id)
        if reason == texts.Reason.UNCONFIRMED:
            self._log_call(call, "channel_open.unconfirmed", ref)
            return tool_result(texts.lifecycle_unconfirmed("open", shown), error=True, reason=reason, data=self._data(ref))
        if reason is not None:
            self._log_call(call, "channel_open.failed", ref, reason=reason)
            return tool_result(texts.lifecycle_failed("open", shown, reason, not_done), error=True, reason=reason,
                               data=self._data(ref))
        registry.set_open(ref, True)
        agent = call.run.turn.agent
        # This agent opened it after all: its decision replaces its own decline, journaled, so
        # the server is held to it after a restart; another agent's decline stays.
        self._channels.decide(agent, ref, OPEN)
        set_target = args.set_speech_target
        turn = call.scope.turn
        speech_here = False
        if turn is not None and call.scope.may_move_routing:
            # Only a call made inside the turn moves it; between turns an open sets no trigger.
            speech_here = set_target and call.run.mode.infers_locus
            turn.routing.moved_to(ref, set_locus=speech_here)
        self._log_call(call, "channel_open.opened", ref, speech_target=speech_here)
        text = texts.opened(shown, ref.server_id, speech_here=speech_here, outside_turn=turn is None)
        return tool_result(text, data=self._data(ref, open=True, speechTarget=speech_here))

    # ------------------------------------------------------------------ channel_close

    async def _close(self, call: ToolCall) -> dict[str, object]:
        not_done = texts.CLOSE_NOT_DONE
        ref = self._lifecycle_target(call, ChannelArgs.read(call.arguments), "close", not_done)
        if not isinstance(ref, ChannelRef):
            return ref
        shown = self._shown(ref)
        session = self._session(ref)
        if session is None:
            return tool_result(texts.lifecycle_failed("close", shown, texts.Reason.NO_LINK, not_done), error=True,
                               reason=texts.Reason.NO_LINK, data=self._data(ref))
        if not session.allows(LIFECYCLE):
            return tool_result(texts.lifecycle_not_granted("close", shown, ref.server_id, not_done), error=True,
                               reason=texts.Reason.NOT_PERMITTED, data=self._data(ref))
        reason = await self._channels.send_close(session, ref)
        if reason == texts.Reason.UNCONFIRMED:
            return tool_result(texts.lifecycle_unconfirmed("close", shown), error=True, reason=reason, data=self._data(ref))
        if reason is not None:
            self._log_call(call, "channel_close.failed", ref, reason=reason)
            return tool_result(texts.lifecycle_failed("close", shown, reason, not_done), error=True, reason=reason,
                               data=self._data(ref))
        self._channels.decide(call.run.turn.agent, ref, CLOSED)
        # Typing stops in exactly this channel; another server's with the id keeps its own.
        await self._stop_typing_in(ref)
        self._log_call(call, "channel_close.closed", ref)
        return tool_result(texts.closed(shown, ref.server_id), data=self._data(ref, open=False))

    # ------------------------------------------------------------------ channel_decline

    async def _decline(self, call: ToolCall) -> dict[str, object]:
        args = DeclineArgs.read(call.arguments)
        not_done = texts.DECLINE_NOT_DONE
        ref = self._lifecycle_target(call, args.channel, "decline", not_done)
        if not isinstance(ref, ChannelRef):
            return ref
        agent = call.run.turn.agent
        self._channels.decide(agent, ref, DECLINED)
        emoji = args.acknowledge
        acknowledged: bool | None = None
        note = None
        if emoji is not None:
            message_id = args.message_id
            default = self.defaults.get(agent)
            if message_id is None and default is not None and default.ref == ref:
                message_id = default.message_id
            session = self._session(ref)
            if message_id is None:
                acknowledged, note = False, texts.ACK_NO_MESSAGE
            elif session is None:
                acknowledged, note = False, texts.ack_not_sent(texts.Reason.NO_LINK)
            elif not session.allows(ACKNOWLEDGE):
                acknowledged, note = False, texts.ack_not_sent(texts.Reason.NOT_PERMITTED)
            else:
                reason = await acknowledge_message(
                    session, ref, message_id, intent=ACK_INTENT_DECLINED, value=emoji, timeout=self._channels.timeout
                )
                acknowledged = reason is None
                note = texts.ACK_SENT if reason is None else texts.ack_not_sent(reason)
        self._log_call(call, "channel_decline.declined", ref, acknowledged=acknowledged)
        return tool_result(
            texts.declined(self._shown(ref), ref.server_id, note),
            data=self._data(ref, declined=True, acknowledged=acknowledged),
        )

    # ------------------------------------------------------------------ channel_publish

    async def _publish(self, call: ToolCall) -> dict[str, object]:
        args = PublishArgs.read(call.arguments)
        not_done = texts.PUBLISH_NOT_SENT
        content = args.content
        if not content:
            return tool_result(texts.publish_no_content(), error=True, reason=REASON_NO_CONTENT)
        name, server_id, thread_id = args.channel.channel_id, args.channel.server_id, args.thread_id
        agent = call.run.turn.agent
        fork = self._fork_target(call, "publish", name, server_id, not_done)
        if isinstance(fork, dict):
            return fork
        if isinstance(fork, ChannelRef):
            ref = fork
        elif name is not None:
            # The schema has no serverId; one given beside channelId is read as that exact pair.
            resolved = self.resolve(call, name, server_id, not_done=not_done, server_id_accepted=False)
            if isinstance(resolved, Refusal):
                self._log_call(call, "channel_publish.refused", kind=resolved.kind)
                return _refused(resolved)
            ref = resolved.ref
        else:
            named = call.agent.mode.sends_only_where_named or call.run.mode.sends_only_where_named
            target = self.defaults.target(
                agent, self._router.names, server_id=server_id, named_mode=named, not_done=not_done
            )
            if isinstance(target, Refusal):
                self._log_call(call, "channel_publish.refused", kind=target.kind, default=True)
                return _refused(target)
            assert isinstance(target, DefaultTarget)
            ref = target.ref
            thread_id = thread_id or target.thread_id
        shown = self._shown(ref)
        delivery = await publish_text(
            self._servers,
            ref,
            shown,
            content,
            conversation_id=call.run.turn.conversation_id,
            round_=call.run.turn.round,
            decisions=self._router.names.decisions,
            via="channel_publish",
            agent=call.run.turn.agent,
            registered=self._router.registry.is_registered(ref),
            timeout=self._timings.publish_timeout,
            thread_id=thread_id,
        )
        self._log_call(call, "channel_publish.outcome", ref, outcome=delivery.outcome, reason=delivery.reason,
                       message_id=delivery.message_id)
        data = self._data(ref, outcome=delivery.outcome)
        if delivery.message_id is not None:
            data["messageId"] = delivery.message_id
        if delivery.outcome != "failed":
            # The words (may have) gone out: an explicit send, for the calling turn only.
            record_explicit_send(call, ref)
        # Read once the answer came: a registration meanwhile can change which name picks it.
        shown = self._shown(ref)
        if delivery.outcome == "delivered":
            return tool_result(texts.published(shown, ref.server_id, delivery.message_id), data=data)
        if delivery.outcome == "unknown":
            return tool_result(texts.publish_unconfirmed(shown), reason=texts.Reason.UNCONFIRMED, data=data)
        return tool_result(texts.publish_failed(shown, delivery.reason), error=True, reason=delivery.reason, data=data)


def _channel_tool_specs(named: bool) -> list[ToolSpec]:
    """The channel tools' specs; ``named``: the mode posts plain speech only where named."""
    publish_props = {
        "channelId": _channel_id(),
        "threadId": {**_STRING, "description": "Post into this thread of the channel. Optional."},
        "content": {**_STRING, "description": "The message to post."},
        "text": {**_STRING, "description": "The message to post (the same as content)."},
    }
    return [
        {"name": "channel_list", "description": texts.CHANNEL_LIST_DESCRIPTION, "inputSchema": _schema({})},
        {
            "name": "channel_open",
            "description": texts.CHANNEL_OPEN_DESCRIPTION,
            "inputSchema": _schema(
                {
                    "channelId": _channel_id(),
                    "serverId": _SERVER_ID,
                    "backscroll": {"type": "integer", "minimum": 0, "description": "How many recent messages to fetch. Optional."},
                    "beforeMessageId": {**_STRING, "description": "Fetch the backscroll before this message. Optional."},
                    "setSpeechTarget": {"type": "boolean", "default": True, "description": "Make it where your plain speech lands for the rest of this turn."},
                    "threadId": {**_STRING, "description": "Open this thread of the channel. Optional."},
                },
                ("channelId",),
            ),
        },
        {
            "name": "channel_close",
            "description": texts.CHANNEL_CLOSE_DESCRIPTION,
            "inputSchema": _schema({"channelId": _channel_id(), "serverId": _SERVER_ID}, ("channelId",)),
        },
        {
            "name": "channel_decline",
            "description": texts.CHANNEL_DECLINE_DESCRIPTION,
            "inputSchema": _schema(
                {
                    "channelId": _channel_id(),
                    "serverId": _SERVER_ID,
                    "acknowledge": {**_STRING, "description": "An emoji to acknowledge the inviting message with. Optional."},
                    "messageId": {**_STRING, "description": "The message to acknowledge (default: the latest that woke you there)."},
                },
                ("channelId",),
            ),
        },
        {
            "name": "channel_publish",
            "description": texts.CHANNEL_PUBLISH_NAMED_DESCRIPTION if named else texts.CHANNEL_PUBLISH_DESCRIPTION,
            "inputSchema": _schema(publish_props, ("channelId", "content") if named else ("content",)),
        },
    ]
