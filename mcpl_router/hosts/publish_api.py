"""A host's ``channels/publish``: post for one of its agents (the library's ``publishForAgent``).

``channels/publish {agent, channel: name | {serverId, channelId}, content, threadId?}`` →
``{delivered, messageId?, reason?, text?, serverId?, channelId?, shown?}``.

- A **ref** is its exact pair; a ref with an empty or missing ``serverId`` is malformed (-32602),
  never read as a bare id.
- A **name** goes through the one resolver: a bare id two servers share is refused with
  ``reason: "shared-id"`` (a ref or the qualified name settles it); a name no channel answers
  to, or a ref its server doesn't register, with ``channel-not-registered``.
- The publish itself is the turns' :func:`~mcpl_router.turns.publish_text`: ``reason`` is
  ``server-unavailable``, ``not-permitted`` (the grant lacks ``channels.publish``),
  ``server-refused``, ``not-delivered``, or ``unconfirmed`` (it went out and no receipt came:
  check the channel before resending). ``messageId`` is there when the server gives one.

The connection must own the agent (-32010/-32011 otherwise). Documented in ``docs/host-api.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from mcpl_router.jsonrpc import INVALID_PARAMS, Inbound, MethodTable, RpcError
from mcpl_router.logs import get_logger
from mcpl_router.routing import texts
from mcpl_router.routing.names import Resolved
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.turns import MalformedChannel, ref_from_wire
from mcpl_router.turns import publish_text

if TYPE_CHECKING:
    from mcpl_router.hosts.connection import HostConnection
    from mcpl_router.hosts.services import HostServices

__all__ = ["HostPublishParams", "add_publish_methods", "publish_for_agent"]


class HostPublishParams(msgspec.Struct, rename="camel"):
    agent: str
    channel: str | dict[str, object]
    content: str | list[dict[str, object]]
    thread_id: str | None = None


def _text_of(content: str | list[dict[str, object]]) -> str:
    if isinstance(content, str):
        return content
    return "".join(text for block in content if isinstance(text := block.get("text"), str))


def _refused(reason: str, text: str, **extra: object) -> dict[str, object]:
    return {"delivered": False, "reason": reason, "text": text, **extra}


async def publish_for_agent(services: HostServices, params: HostPublishParams) -> dict[str, object]:
    """Resolve the host's channel and publish ``content`` there for ``params.agent``."""
    names = services.router.names
    log = get_logger().bind(agent=params.agent)
    text = _text_of(params.content)
    if not text.strip():
        raise RpcError(INVALID_PARAMS, "content: nothing to post. Nothing was sent.", {"field": "content"})
    if isinstance(params.channel, str):
        name = params.channel
        if not name:
            raise RpcError(INVALID_PARAMS, "channel: an empty name names no channel. Nothing was sent.", {"field": "channel"})
        candidates = names.channels_named(name)
        if len(candidates) > 1:
            shown = [names.pick_name(ref) or names.name_shown(ref) for ref in candidates]
            log.info("host.publish.refused", reason=texts.REASON_SHARED_ID, name=name)
            names.decisions.refused(texts.REASON_SHARED_ID, name, candidates)
            return _refused(
                texts.REASON_SHARED_ID,
                texts.host_publish_shared(name, shown),
                candidates=[ref.to_wire() for ref in candidates],
            )
        resolved = names.channel_named(name)
        if not isinstance(resolved, Resolved):
            log.info("host.publish.refused", reason=texts.Reason.NOT_REGISTERED, name=name)
            return _refused(texts.Reason.NOT_REGISTERED, texts.host_publish_unknown(texts.quoted(name)))
        ref = resolved.ref
    else:
        try:
            ref = ref_from_wire(params.channel)
        except MalformedChannel as exc:
            raise RpcError(INVALID_PARAMS, f"{exc}. Nothing was sent.", {"field": "channel"}) from None
        # Its exact pair: publish_text says whether its server is there, may publish, and
        # registers it (server-unavailable, not-permitted, channel-not-registered, in that order).
    return await _publish(services, params, ref, text)


async def _publish(services: HostServices, params: HostPublishParams, ref: ChannelRef, text: str) -> dict[str, object]:
    shown = services.router.names.name_shown(ref)
    delivery = await publish_text(
        services.servers,
        ref,
        shown,
        text,
        conversation_id=params.agent,
        round_=0,
        decisions=services.router.names.decisions,
        via="host",
        agent=params.agent,
        registered=services.router.registry.is_registered(ref),
        timeout=services.turns.publish_timeout,
        thread_id=params.thread_id or None,
    )
    get_logger().info(
        "host.publish.outcome",
        agent=params.agent,
        server=ref.server_id,
        channel=ref.channel_id,
        outcome=delivery.outcome,
        reason=delivery.reason,
        message_id=delivery.message_id,
    )
    # Read once the answer came: a registration meanwhile can change which name picks it.
    shown = services.router.names.name_shown(ref)
    answer: dict[str, object] = {"delivered": delivery.outcome == "delivered", **ref.to_wire(), "shown": shown}
    if delivery.message_id is not None:
        answer["messageId"] = delivery.message_id
    if delivery.outcome == "unknown":
        answer["reason"] = texts.Reason.UNCONFIRMED
        answer["detail"] = delivery.reason
        answer["text"] = texts.publish_unconfirmed(shown)
    elif delivery.outcome == "failed" and delivery.reason == texts.Reason.NOT_REGISTERED:
        answer["reason"] = delivery.reason
        answer["text"] = texts.publish_not_there(shown, ref.channel_id, _elsewhere(services, ref))
    elif delivery.outcome == "failed":
        answer["reason"] = delivery.reason
        answer["text"] = texts.publish_failed(shown, delivery.reason)
    return answer


def _elsewhere(services: HostServices, ref: ChannelRef) -> list[str]:
    """Where else a channel with ``ref``'s id is, by the name channelId takes there."""
    registry, names = services.router.registry, services.router.names
    places = []
    for other in sorted(registry.refs_with_id(ref.channel_id), key=registry.order_of):
        picked = names.pick_name(other)
        places.append(texts.place_by_name(other.server_id, picked, advise=False) if picked is not None
                      else texts.place_by_route(other.channel_id, other.server_id, server_id_accepted=True))
    return places


def add_publish_methods(table: MethodTable, services: HostServices, connection: HostConnection) -> None:
    """Add ``channels/publish`` for one host connection."""

    async def channels_publish(params: HostPublishParams, _inbound: Inbound) -> dict[str, object]:
        services.sessions.require_owner(connection, params.agent)
        return await publish_for_agent(services, params)

    table.add("channels/publish", channels_publish, HostPublishParams)
