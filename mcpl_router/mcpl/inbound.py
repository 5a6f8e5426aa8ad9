"""What the daemon does with each admitted server message (the link has checked the grant).

``channels/register`` and ``channels/changed`` go to the registry, each descriptor authorized
alone; ``channels/incoming`` admits each message only into a channel **its sender** registered,
journals the accepted ones (one transaction per batch) and only then answers ``accepted``;
``push/event`` belongs to the pushing server's channel, never another's with that id.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

import msgspec

from mcpl_router.events import ChannelsChanged, EventBus, InboundAccepted, RegistrationsAnswered, ServerWithdrawn
from mcpl_router.jsonrpc import INTERNAL_ERROR, METHOD_NOT_FOUND, Inbound, RpcError
from mcpl_router.jsonrpc.envelope import describe_decode_failure
from mcpl_router.jsonrpc.handlers import Later
from mcpl_router.jsonrpc.peer import Deferred
from mcpl_router.logs import Logger, get_logger
from mcpl_router.mcpl.grants import Grant
from mcpl_router.mcpl.wire import (
    ChangedParams,
    IncomingMessage,
    IncomingParams,
    PushOrigin,
    PushParams,
    RegisterParams,
    raw_to_plain,
)
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import ChannelRegistry, RegistrationPolicy
from mcpl_router.store.journal import Delivery, EventKind, InboundEvent, Journal, JournalFailure, Recorded, content_digest

if TYPE_CHECKING:
    from mcpl_router.mcpl.link import ServerLink

#: Server-initiated inference, answered by :class:`mcpl_router.inference.InferenceBroker`.
INFERENCE_METHODS = ("inference/request", "model/info")


class InferenceHandler(Protocol):
    """Answers a server's admitted ``inference/request`` or ``model/info``."""

    async def handle(self, link: ServerLink, inbound: Inbound) -> object: ...


INVALID_ITEM = -32602
#: Conversation ids kept (cleared when full: one per channel that received a message).
CONVERSATION_IDS = 4096
#: MCP's notice that a server's tool list changed (the connector tools re-list).
TOOLS_LIST_CHANGED = "notifications/tools/list_changed"


def registration_policy(link: ServerLink, inbound: Inbound | None = None) -> RegistrationPolicy:
    """The registry's view of a server's grant as it stood when ``inbound`` arrived.

    The grant is the one the link stamped on the message in its read loop (at receipt), not
    the one in force when the ordered dispatcher reached it.
    """
    grant = inbound.stamp if inbound is not None and isinstance(inbound.stamp, Grant) else link.grant
    return RegistrationPolicy(
        may_register=grant.allows("channels.register"),
        may_receive=grant.allows("channels.incoming"),
        id_patterns=link.config.channel_patterns,
    )


#: Fields that change when a server re-sends the very same message (when this copy was sent or
#: received), so they are not part of what the message says. ``timestamp`` is when the message
#: was posted: the same in every retry, and often all that tells two "ok"s apart.
_VOLATILE_FIELDS = frozenset({"receivedAt", "sentAt", "deliveredAt"})


def substance_digest(payload: object) -> bytes:
    """What a message (or push) says, for telling a re-send from a new message under an old id.

    A server retrying a message sends the same content; one that restarted its counter sends
    other content under an id it used before.
    """
    if isinstance(payload, dict) and not _VOLATILE_FIELDS.isdisjoint(payload):
        # Copied only when there is something to leave out: most messages carry none of them.
        payload = {key: value for key, value in payload.items() if key not in _VOLATILE_FIELDS}
    return content_digest(payload)


def message_dedup_key(channel_id: str, message_id: str) -> str:
    """A message's identity on its server: message ids are often unique only per chat.

    JSON-encoded, so no separator can make two different pairs one key.
    """
    return msgspec.json.encode([channel_id, message_id]).decode()


class ServerInbound:
    """Applies admitted server messages to the router's registry and the journal.

    Args:
        registry: the router's channel registry (the one state's).
        journal: where accepted inbound events are committed before ``accepted`` is answered.
        events: where it publishes what changed: :class:`ChannelsChanged` for every ref a
            server added or withdrew (and every ref of a server withdrawn, which it hears as
            :class:`ServerWithdrawn`), :class:`InboundAccepted` for each newly journaled
            event right after its commit, in seq order.
        deliveries_for: which agents an event wakes (decided before the commit, written with it).
        on_tools_changed: told of a server's ``notifications/tools/list_changed`` (the
            connector tools fetch its list again).
        inference: answers ``inference/request`` and ``model/info`` (-32601 without it).
        counted: told of each ``channels/incoming`` and ``push/event`` answer as it is made:
            the server, how many messages it accepted and the code of each it refused (the
            daemon's count of them). Told here, where the answer is made and the counts are
            known, so no wrapper is built around each answer to read them back out of it.
    """

    def __init__(
        self,
        registry: ChannelRegistry,
        journal: Journal,
        *,
        events: EventBus,
        deliveries_for: Callable[[InboundEvent], Sequence[Delivery]] | None = None,
        on_tools_changed: Callable[[ServerLink], None] | None = None,
        inference: InferenceHandler | None = None,
        counted: Callable[[str, int, Sequence[object]], None] | None = None,
    ) -> None:
        self.registry = registry
        self.journal = journal
        self._events = events
        self._deliveries_for = deliveries_for or (lambda event: [])
        self._on_tools_changed = on_tools_changed or (lambda link: None)
        self._counted = counted or (lambda server_id, accepted, refused: None)
        self._logs: dict[str, Logger] = {}
        # Per server: the grant and id patterns its registry policy was last built from, and that
        # policy; the same objects give the same policy (a regrant or a reload makes new ones).
        self._policies: dict[str, tuple[Grant, tuple[str, ...], RegistrationPolicy]] = {}
        # Each (server, channel)'s conversation id, as answered with every accepted message.
        self._conversations: dict[tuple[str, str | None], str] = {}
        self._handlers = {
            "channels/register": self._register,
            "channels/changed": self._changed,
            "channels/incoming": self._incoming,
            "channels/list": self._list,
            "push/event": self._push,
        }
        if inference is not None:
            for method in INFERENCE_METHODS:
                self._handlers[method] = inference.handle
        events.subscribe(ServerWithdrawn, self._withdrawn)

    def _withdrawn(self, event: ServerWithdrawn) -> None:
        self._policies.pop(event.server_id, None)
        # No name may resolve to a withdrawn server's channels (until a reconnect registers them again).
        removed = self.registry.remove_server(event.server_id)
        if not removed:
            return
        if event.why is not None:
            self._log_of(event.server_id).info("server.channels.withdrawn", channels=len(removed), why=event.why)
        self._events.publish(ChannelsChanged(event.server_id, removed=tuple(removed)))

    def _policy_of(self, link: ServerLink, inbound: Inbound) -> RegistrationPolicy:
        """:func:`registration_policy`, built once per grant and id patterns, not per request."""
        grant = inbound.stamp if isinstance(inbound.stamp, Grant) else link.grant
        patterns = link.config.channel_patterns
        kept = self._policies.get(link.server_id)
        if kept is not None and kept[0] is grant and kept[1] is patterns:
            return kept[2]
        policy = registration_policy(link, inbound)
        self._policies[link.server_id] = (grant, patterns, policy)
        return policy

    def _conversation_id(self, event: InboundEvent) -> str:
        key = (event.server_id, event.channel_id)
        conversation = self._conversations.get(key)
        if conversation is None:
            if len(self._conversations) >= CONVERSATION_IDS:
                self._conversations.clear()
            conversation = self._conversations[key] = _conversation_id(event)
        return conversation

    def _log_of(self, server_id: str) -> Logger:
        # One bound logger per server, not one per message.
        log = self._logs.get(server_id)
        if log is None:
            log = self._logs[server_id] = get_logger(server=server_id)
        return log

    async def handle(self, link: ServerLink, inbound: Inbound) -> object:
        handler = self._handlers.get(inbound.method)
        if handler is not None:
            return await handler(link, inbound)
        if inbound.method == TOOLS_LIST_CHANGED:
            self._on_tools_changed(link)
            return None if inbound.is_notification else {}
        if inbound.method.startswith("notifications/"):
            # MCP notifications we don't act on (logging, progress): noted, not refused.
            get_logger(server=link.server_id).debug("server.notification", method=inbound.method)
            return None
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {inbound.method}")

    # -- channels ----------------------------------------------------------------------------

    async def _register(self, link: ServerLink, inbound: Inbound) -> object:
        params = inbound.decode_params(RegisterParams)
        form: Literal["request", "notification"] = "notification" if inbound.is_notification else "request"
        descriptors = [_plain_or_none(raw) for raw in params.channels]
        results = self.registry.register(link.server_id, descriptors, registration_policy(link, inbound), form=form)
        self._events.publish(RegistrationsAnswered(link.server_id, tuple(results)))
        added = [ChannelRef(link.server_id, r.id) for r in results if r.accepted]
        if added:
            self._events.publish(ChannelsChanged(link.server_id, added=tuple(added)))
        return {"results": [r.to_wire() for r in results]}

    async def _changed(self, link: ServerLink, inbound: Inbound) -> object:
        params = inbound.decode_params(ChangedParams)
        form: Literal["request", "notification"] = "notification" if inbound.is_notification else "request"
        removed = [item for item in params.removed if isinstance(item, str)]
        if len(removed) != len(params.removed):
            get_logger(server=link.server_id).warning(
                "channels.changed.removal_skipped",
                form=form,
                skipped=[item for item in params.removed if not isinstance(item, str)][:10],
                reason="a removed channel id must be a string",
            )
        outcome = self.registry.change(
            link.server_id,
            [_plain_or_none(raw) for raw in params.added],
            removed,
            [_plain_or_none(raw) for raw in params.updated],
            registration_policy(link, inbound),
            form=form,
        )
        self._events.publish(RegistrationsAnswered(link.server_id, tuple(outcome.results)))
        added = [ChannelRef(link.server_id, r.id) for r in outcome.added if r.accepted]
        if added or outcome.withdrawn:
            self._events.publish(ChannelsChanged(link.server_id, tuple(added), tuple(outcome.withdrawn)))
        return {"results": [r.to_wire() for r in outcome.results]}

    async def _list(self, link: ServerLink, inbound: Inbound) -> object:
        return {"channels": [entry.descriptor.to_wire() for entry in self.registry.channels_for(link.server_id)]}

    # -- inbound messages --------------------------------------------------------------------

    async def _incoming(self, link: ServerLink, inbound: Inbound) -> object:
        params = inbound.decode_params(IncomingParams)
        form: Literal["request", "notification"] = "notification" if inbound.is_notification else "request"
        policy = self._policy_of(link, inbound)
        log = self._log_of(link.server_id)
        results: list[dict[str, object] | None] = []
        pending: list[tuple[int, str, InboundEvent]] = []
        # Each admitted event with whom it wakes, as the journal records them.
        batch: list[tuple[InboundEvent, Sequence[Delivery]]] = []
        refused: list[object] = []
        for index, raw in enumerate(params.messages):
            try:
                # Read once: the message as plain values (stored and forwarded as they are),
                # then held to its type from those values, not decoded a second time.
                payload = msgspec.json.decode(raw)
                message = msgspec.convert(payload, IncomingMessage)
            except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
                detail = str(exc) if isinstance(exc, msgspec.ValidationError) else describe_decode_failure(bytes(raw), exc)
                message_id = _message_id_of(raw)
                log.warning("channels.incoming.malformed", index=index, message_id=message_id, detail=detail)
                refused.append(INVALID_ITEM)
                results.append(
                    {"messageId": message_id, "accepted": False, "code": INVALID_ITEM,
                     "reason": f"Malformed message at messages[{index}]: {detail}"}
                )
                continue
            admission = self.registry.admit_incoming(link.server_id, message.channel_id, policy, form=form)
            if not admission.accepted:
                refused.append(admission.code)
                results.append(
                    {"messageId": message.message_id, "accepted": False, "code": admission.code, "reason": admission.reason}
                )
                continue
            event = InboundEvent(link.server_id, message.channel_id, EventKind.MESSAGE,
                                 message_dedup_key(message.channel_id, message.message_id), payload, substance_digest(payload))
            pending.append((len(results), message.message_id, event))
            batch.append((event, self._deliveries_for(event)))
            results.append(None)
        if not pending:
            self._counted(link.server_id, 0, refused)
            return {"results": results}

        def committed(recorded: list[Recorded]) -> None:
            # On the trio thread right after the commit, in commit order: wakes go out in seq order.
            debug = log.is_enabled_for(logging.DEBUG)
            for (_slot, message_id, event), (_, deliveries), outcome in zip(pending, batch, recorded, strict=True):
                if debug or outcome.duplicate or outcome.reused_id:
                    # The common case, a new message with the debug line off, builds no line.
                    self._log_outcome(log, "channels.incoming", outcome, channel=event.channel_id, message_id=message_id)
                if not outcome.duplicate:
                    self._events.publish(InboundAccepted(outcome.seq, event, tuple(deliveries)))

        later = Later()

        def done(failure: JournalFailure | None) -> None:
            # Right after ``committed``, on the trio thread: the answer is pushed to the link's
            # peer from here, with no task per request waiting for the commit.
            if failure is not None:
                later.settle(None, _not_accepted(failure))
                return
            for slot, message_id, event in pending:
                results[slot] = {"messageId": message_id, "accepted": True, "conversationId": self._conversation_id(event)}
            self._counted(link.server_id, len(pending), refused)
            later.settle({"results": results})

        # Queued for the next group commit; this link's next message is dispatched meanwhile,
        # and "accepted" goes out only once the commit holding these messages is durable. At
        # once while the write queue has room; when it is full, this link waits for room.
        try:
            queued = self.journal.submit_inbound_nowait(batch, committed, done)
        except JournalFailure as exc:  # the daemon is stopping
            raise _not_accepted(exc) from exc
        if not queued:
            await _submitted(self.journal.submit_inbound(batch, committed, on_done=done))
        return Deferred.pushed(later)

    async def _push(self, link: ServerLink, inbound: Inbound) -> object:
        params = inbound.decode_params(PushParams)
        log = self._log_of(link.server_id)
        origin = params.origin or _EMPTY_ORIGIN
        channel = None
        if origin.mcpl_channel_id or origin.channel_id:
            placed = self.registry.push_channel(
                link.server_id,
                registration_policy(link, inbound),
                mcpl_channel_id=origin.mcpl_channel_id,
                native_channel_id=None if origin.channel_id is None else str(origin.channel_id),
                label=origin.label,
            )
            channel = placed.ref
            if placed.registered_lazily and placed.ref is not None:
                self._events.publish(ChannelsChanged(link.server_id, added=(placed.ref,)))
            if placed.ref is None:
                log.info("push.channel.unresolved", event_id=params.event_id, reason=placed.reason)
        payload = raw_to_plain(inbound.params) if inbound.params is not None else None
        event = InboundEvent(
            server_id=link.server_id,
            channel_id=channel.channel_id if channel else None,
            kind=EventKind.PUSH,
            dedup_key=params.event_id,
            payload=payload,
            digest=substance_digest(payload),
        )
        deliveries = self._deliveries_for(event)

        def committed(recorded: list[Recorded]) -> None:
            [outcome] = recorded
            self._log_outcome(log, "push", outcome, channel=event.channel_id, event_id=params.event_id)
            if not outcome.duplicate:
                self._events.publish(InboundAccepted(outcome.seq, event, tuple(deliveries)))

        wait = await _submitted(self.journal.submit_inbound([(event, deliveries)], committed))

        async def answer() -> dict[str, object]:
            await _durable(wait)
            self._counted(link.server_id, 1, ())
            return {"accepted": True}

        return Deferred(answer)

    @staticmethod
    def _log_outcome(log: Logger, prefix: str, outcome: Recorded, **fields: object) -> None:
        if outcome.duplicate:
            log.info(f"{prefix}.duplicate", seq=outcome.seq, **fields)
            return
        if outcome.reused_id:
            # Same id, different content: a server that restarted its counter. Accepted as new.
            log.warning(f"{prefix}.reused_id", detail="server reused message id", seq=outcome.seq, **fields)
        # Every message: a line at info would be a JSON line written per message on the trio
        # thread in every deployment; counted instead (mcpl_router_inbound_messages_total).
        log.debug(f"{prefix}.accepted", seq=outcome.seq, **fields)


def _not_accepted(exc: JournalFailure) -> RpcError:
    return RpcError(
        INTERNAL_ERROR,
        f"Not accepted: the daemon could not commit it to its journal ({exc}). Retry later: a retry is never"
        " recorded twice (one the journal kept after all is woken once, then answered as a duplicate).",
        {"retry": True},
    )


async def _submitted(submit: Awaitable[Callable[[], Awaitable[list[Recorded]]]]) -> Callable[[], Awaitable[list[Recorded]]]:
    try:
        return await submit
    except JournalFailure as exc:  # the daemon is stopping
        raise _not_accepted(exc) from exc


async def _durable(wait: Callable[[], Awaitable[list[Recorded]]]) -> list[Recorded]:
    try:
        return await wait()
    except JournalFailure as exc:
        raise _not_accepted(exc) from exc


_EMPTY_ORIGIN = PushOrigin()


def _plain_or_none(raw: msgspec.Raw) -> object:
    try:
        return raw_to_plain(raw)
    except (msgspec.DecodeError, RecursionError):
        return None


def _message_id_of(raw: msgspec.Raw) -> object:
    try:
        value = raw_to_plain(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    return value.get("messageId") if isinstance(value, dict) else None


def _conversation_id(event: InboundEvent) -> str:
    # A conversation is per server and channel; encoded as JSON so no separator can collide.
    return msgspec.json.encode([event.server_id, event.channel_id]).decode()
