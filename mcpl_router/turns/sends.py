"""The sends a turn makes to one channel, each on the channel's own server.

:func:`publish_text` is where a publish gets its server: it is handed the links by server id
and takes the link of the ref's own ``serverId`` (``links.get(ref.server_id)``); nothing else is
ever tried.
:func:`acknowledge_message` marks one message (a decline, a refused turn's reaction). Both
return an outcome and never raise: a turn reports what happened, it does not fail for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from mcpl_router.jsonrpc import PeerClosed, RequestTimeout, RpcError
from mcpl_router.mcpl.link import NOTIFIED, CapabilityNotGranted, LinkState, LinkUnavailable
from mcpl_router.routing import texts
from mcpl_router.routing.decisions import Decisions
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.turns import Delivery
from mcpl_router.turns.run import ACKNOWLEDGE, PUBLISH

if TYPE_CHECKING:
    from mcpl_router.mcpl.link import ServerLink

__all__ = [
    "ACK_INTENT_DECLINED",
    "ACK_INTENT_REFUSED",
    "LIFECYCLE",
    "LIFECYCLE_TIMEOUT",
    "acknowledge_message",
    "lifecycle_request",
    "publish_text",
]

#: The capability ``channels/open`` and ``channels/close`` need, and how long they may take.
LIFECYCLE: Final = "channels.lifecycle"
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
        link.publishes[(delivery.outcome, delivery.reason or "")] += 1
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


async def lifecycle_request(link: ServerLink, method: str, params: dict[str, Any], *, timeout: float) -> str | None:
    """``channels/open`` or ``channels/close`` on the channel's own server's link; None when
    answered, else a stable reason (``unconfirmed`` when sent and never answered)."""
    try:
        await link.call(method, params, capability=LIFECYCLE, timeout=timeout)
    except RequestTimeout as exc:
        return texts.REASON_UNCONFIRMED if exc.sent else texts.REASON_TIMEOUT
    except RpcError:
        return texts.REASON_SERVER_REFUSED
    except (LinkUnavailable, CapabilityNotGranted):
        return texts.REASON_NO_LINK
    except PeerClosed:
        return texts.REASON_UNCONFIRMED
    return None
