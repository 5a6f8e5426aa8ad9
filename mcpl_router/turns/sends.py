"""The sends a turn makes to one channel, each on the channel's own server.

:func:`publish_text` is where a publish gets its server: it is handed the servers' sessions by
server id and takes the session of the ref's own ``serverId`` (``servers.get(ref.server_id)``);
nothing else is ever tried.
:func:`acknowledge_message` marks one message (a decline, a refused turn's reaction). Both
return an outcome and never raise: a turn reports what happened, it does not fail for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from mcpl_router.mcpl.session import LIFECYCLE, AcknowledgeParams, PublishParams, ServerSession, TextContent
from mcpl_router.routing import texts
from mcpl_router.routing.decisions import Decisions
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.turns import Delivery

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
    servers: Mapping[str, ServerSession],
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
    """Publish ``text`` to ``ref`` through its own server's session; the outcome, never raised.

    The session is ``servers[ref.server_id]`` and no other; it counts each outcome
    (``/metrics`` reads ``session.publishes``).

    ``thread_id`` (channel_publish's ``threadId``) posts into that thread of the channel.
    ``timeout`` defaults to the server's own ``requestTimeout`` (as docs/config.md says of
    every request sent to a server).

    ``delivered`` only on ``{delivered: true}``; ``failed`` when nothing left (no link, not
    granted, not registered) or the server answered no; ``unknown`` after a timeout, a lost
    connection, a malformed receipt, or a Notification-form publish (it has no receipt).
    A server that takes publishes only as Notifications (-32601 to the Request) gets one.
    """

    session = servers.get(ref.server_id)
    if session is None:
        delivery = Delivery(ref, shown, "failed", round_, reason=texts.Reason.NO_LINK)
    else:
        params = PublishParams(conversation_id=conversation_id, channel_id=ref.channel_id,
                               content=(TextContent(type="text", text=text),), thread_id=thread_id or None)
        published = await session.publish(params, timeout=timeout, registered=registered)
        delivery = Delivery(ref, shown, published.outcome, round_, message_id=published.message_id, reason=published.reason)
    if decisions is not None:
        # What operators see of where words went (the status page's decisions).
        decisions.published(via, agent, ref, shown, delivery.outcome, delivery.reason, delivery.message_id, text)
    return delivery


async def acknowledge_message(
    session: ServerSession, ref: ChannelRef, message_id: str, *, intent: str, value: str | None, timeout: float
) -> texts.Reason | None:
    """Send ``channels/acknowledge`` for one message on ``ref``'s own server; None when done,
    else a stable reason (:meth:`ServerSession.acknowledge <mcpl_router.mcpl.session.ServerSession.acknowledge>`)."""
    params = AcknowledgeParams(channel_id=ref.channel_id, message_id=message_id, intent=intent, value=value)
    return await session.acknowledge(params, timeout=timeout)
