"""What a turn reads of the wakes it is opened with (the sessions' :class:`Wake`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final, Protocol

import attrs

from mcpl_router.jsonrpc import RpcError
from mcpl_router.routing import texts
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.turns import WakeFact
from mcpl_router.routing.wakes import Wake
from mcpl_router.turns.run import WAKE_UNKNOWN

__all__ = ["NO_FENCE", "RouteFence", "fenced", "message_ids_of", "wake_fact", "wake_facts"]

#: A wake of an agent by seq, None when unknown or acked and gone (``SessionManager.wake``).
WakeOf = Callable[[int, str], Awaitable[Wake | None]]


def message_ids_of(payload: object) -> tuple[str | None, str | None]:
    """The (messageId, threadId) of a wake's newest message, wherever the payload holds it."""
    if type(payload) is dict and "messageId" in payload and "messages" not in payload:
        # A message as a server sends it (most wakes, once a wake on the commit's callback):
        # its own ids, read straight off it.
        message_id = payload["messageId"]
        thread_id = payload.get("threadId")
        return (message_id if type(message_id) is str else None, thread_id if type(thread_id) is str else None)
    message: object = payload
    # A decoded payload is a plain dict: ``type(...) is dict`` is answered at once, where the
    # Mapping ABC's check is a Python call.
    if type(payload) is dict or isinstance(payload, Mapping):
        messages = payload.get("messages")
        if type(messages) is list and messages:
            message = messages[-1]
    elif type(payload) is list and payload:
        message = payload[-1]
    if not (type(message) is dict or isinstance(message, Mapping)):
        return None, None
    if "messageId" not in message:
        origin = message.get("origin")
        if type(origin) is dict or isinstance(origin, Mapping):
            # A push names its message in `origin` (discord-mcpl's push for a closed channel,
            # src/server.ts:3176): that is the message a decline or refusal reaction marks.
            message = origin
    message_id = message.get("messageId")
    thread_id = message.get("threadId")
    return (
        message_id if type(message_id) is str else None,
        thread_id if type(thread_id) is str else None,
    )


def wake_fact(wake: Wake) -> WakeFact:
    """What routing needs of one wake."""
    message_id, thread_id = message_ids_of(wake.payload)
    return WakeFact(seq=wake.seq, channel=wake.channel, addressed=wake.addressed, message_id=message_id, thread_id=thread_id)


async def wake_facts(wake_of: WakeOf, agent: str, wakes: Sequence[int], *, nothing_done: str) -> list[WakeFact]:
    """The facts of each of ``wakes`` (``agent``'s), in order.

    Raises:
        RpcError: ``WAKE_UNKNOWN`` for the first seq that is not a wake of the agent;
            ``nothing_done`` says what the refused call left undone.
    """
    facts: list[WakeFact] = []
    for seq in wakes:
        wake = await wake_of(seq, agent)
        if wake is None:
            raise RpcError(
                WAKE_UNKNOWN,
                f"Wake {seq} is not a wake of agent {texts.quoted(agent)} (unknown, or acked"
                f" and gone). {nothing_done}",
                {"seq": seq, "agent": agent},
            )
        facts.append(wake_fact(wake))
    return facts


class RouteFence(Protocol):
    """Which channels an agent's turn may take as its own (the conversation forks').

    A fork takes only its home; a trunk takes no channel one of its forks holds (seed 000:
    ``mayTakeGateRoute``), so a trunk's batch or turn never speaks into a fork's conversation.
    """

    def home_of(self, agent: str) -> ChannelRef | None: ...

    def may_take_route(self, agent: str, ref: ChannelRef) -> bool: ...


class _NoFence:
    def home_of(self, agent: str) -> ChannelRef | None:
        return None

    def may_take_route(self, agent: str, ref: ChannelRef) -> bool:
        return True


NO_FENCE: Final = _NoFence()


def fenced(facts: Sequence[WakeFact], fence: RouteFence, agent: str) -> list[WakeFact]:
    """``facts`` with each channel ``agent`` may not take cleared: the wake is still answered,
    but it gives the turn no channel (and so no server to post or type on)."""
    return [
        fact if fact.channel is None or fence.may_take_route(agent, fact.channel) else attrs.evolve(fact, channel=None)
        for fact in facts
    ]
