"""Typing: which channels a host's ``channels/typing`` names. Pure; the shell sends.

A bare id names every server's channel with that id, and typing shows in **each** of them: the
deliberate fan-out (seed ``000_…``). A bare id doesn't say which server the host means, and
typing posts nothing, so it shows in both rather than in neither. A host that means one channel
gives a ref or the qualified ``serverId:channelId`` name, and typing shows there alone.
"""

from __future__ import annotations

from collections.abc import Mapping

from mcpl_router.routing.names import ChannelNames, Refusal, Resolved
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.turns import ref_from_wire

__all__ = ["TYPING_NOT_DONE", "host_typing_targets"]

TYPING_NOT_DONE = "No typing was shown."


def host_typing_targets(names: ChannelNames, channel: str | Mapping[str, object]) -> tuple[ChannelRef, ...] | Refusal:
    """The channels a host's typing call names, or the refusal saying why none.

    - a ref ``{serverId, channelId}``: that exact pair (registered or not: the caller checks);
    - a string every channel answering to which (through the one resolver) answers *by its
      id*: each of them, on every server — the deliberate fan-out;
    - any other string: the one channel the resolver picks (a qualified name, a DM label),
      or its refusal — including a string that is one channel's id and another's qualified
      name, which is ambiguous rather than a bare id.

    Raises:
        MalformedChannel: a ref without a non-empty ``serverId`` and ``channelId``.
    """
    if not isinstance(channel, str):
        return (ref_from_wire(channel),)
    answering = names.channels_named(channel)
    if len(answering) > 1 and all(ref.channel_id == channel for ref in answering):
        return tuple(answering)
    resolved = names.channel_named(channel, not_done=TYPING_NOT_DONE)
    if isinstance(resolved, Resolved):
        return (resolved.ref,)
    return resolved
