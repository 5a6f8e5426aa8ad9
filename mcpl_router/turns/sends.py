"""The sends a turn makes to one channel, each on the channel's own server.

:func:`publish_text` is where a publish gets its server: it is handed the links by server id
and takes the link of the ref's own ``serverId`` (``links.get(ref.server_id)``); nothing else is
ever tried.
:func:`acknowledge_message` marks one message (a decline, a refused turn's reaction). Both
return an outcome and never raise: a turn reports what happened, it does not fail for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

from mcpl_router.mcpl.session import LIFECYCLE, PUBLISH, AcknowledgeParams, PublishParams, TextContent
from mcpl_router.routing import texts
from mcpl_router.routing.decisions import Decisions
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.turns import Delivery, DeliveryOutcome

if TYPE_CHECKING:
    from mcpl_router.mcpl.link import ServerLink

__all__ = [
    "ACK_INTENT_DECLINED",
    "ACK_INTENT_REFUSED",
    "LIFECYCLE",
    "LIFECYCLE_TIMEOUT",
    "acknowledge_message",
    "publish_text",
]

#: How long ``channels/open`` and ``channels/close`` may take (``LIFECYCLE``: the capability they need).
LIFECYCLE_TIMEOUT: Final = 10.0

#: ``channels/acknowledge`` intents: why the daemon marks a message (discord-mcpl reads them).
ACK_INTENT_DECLINED: Final = "seen-not-opening"
ACK_INTENT_REFUSED: Final = "refused"


async def publish_text(
    links: Mapping[str, ServerLink],
    ref: ChannelRef,
    shown: str,
    text: str,
    *,
    conversation_id: str,
    round_: int,
    registered: bool,
    timeout: float | None = None,
    thread_id: str | None = None,
    decisions: Decisions | None = None,
    via: str = "",
    agent: str | None = None,
) -> Delivery:
    """Publish ``text`` to ``ref`` through its own server's link; the outcome, never raised.

    The link is ``links[ref.server_id]`` and no other; each outcome is counted on it
    (``/metrics`` reads ``link.publishes``).

    ``thread_id`` (channel_publish's ``threadId``) posts into that thread of the channel.
    ``timeout`` defaults to the server's own ``requestTimeout`` (as docs/config.md says of
    every request sent to a server).

    ``delivered`` only on ``{delivered: true}``; ``failed`` when nothing left (no link, not
    granted, not registered) or the server answered no; ``unknown`` after a timeout, a lost
    connection, a malformed receipt, or a Notification-form publish (it has no receipt).
    A server that takes publishes only as Notifications (-32601 to the Request) gets one.
    """

    link = links.get(ref.server_id)
    delivery = await _publish_on(link, ref, shown, text, conversation_id=conversation_id, round_=round_,
                                 registered=registered, timeout=timeout, thread_id=thread_id)
    if link is not None:
        link.publishes[(delivery.outcome, delivery.reason)] += 1
    if decisions is not None:
        # What operators see of where words went (the status page's decisions).
        decisions.published(via, agent, ref, shown, delivery.outcome, delivery.reason, delivery.message_id, text)
    return delivery


async def _publish_on(
    link: ServerLink | None,
    ref: ChannelRef,
    shown: str,
    text: str,
    *,
    conversation_id: str,
    round_: int,
    registered: bool,
    timeout: float | None,
    thread_id: str | None,
) -> Delivery:
    def outcome(kind: DeliveryOutcome, reason: texts.Reason | None = None, message_id: str | None = None) -> Delivery:
        return Delivery(ref, shown, kind, round_, message_id=message_id, reason=reason)

    if link is None:
        return outcome("failed", texts.Reason.NO_LINK)
    unusable = link.session.unusable(PUBLISH)
    if unusable is not None:
        return outcome("failed", unusable)
    if not registered:
        return outcome("failed", texts.Reason.NOT_REGISTERED)
    params = PublishParams(conversation_id=conversation_id, channel_id=ref.channel_id,
                           content=(TextContent(type="text", text=text),), thread_id=thread_id or None)
    published = await link.session.publish(params, timeout=timeout)
    return outcome(published.outcome, published.reason, published.message_id)


async def acknowledge_message(
    link: ServerLink, ref: ChannelRef, message_id: str, *, intent: str, value: str | None, timeout: float
) -> texts.Reason | None:
    """Send ``channels/acknowledge`` for one message on ``ref``'s own server; None when done,
    else a stable reason (:meth:`ServerSession.acknowledge <mcpl_router.mcpl.session.ServerSession.acknowledge>`)."""
    params = AcknowledgeParams(channel_id=ref.channel_id, message_id=message_id, intent=intent, value=value)
    return await link.session.acknowledge(params, timeout=timeout)
