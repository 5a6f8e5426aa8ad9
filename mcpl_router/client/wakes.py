"""The ``wake`` notification, parsed: which agent to run, for what, from where."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["WakeChannel", "WakeNotice"]


@attrs.frozen
class WakeChannel:
    """The channel a wake came from: its ref's two ids and the name the agent is shown."""

    server_id: str
    channel_id: str
    shown: str


@attrs.frozen
class WakeNotice:
    """A parsed ``wake`` notification (docs/host-api.md, *Sessions, agents and wakes*).

    ``messages`` for a message wake, ``event`` for a push; ``invitation`` on a wake for a
    message addressing the agent in a closed channel; ``held``, ``dropped``, ``summary``,
    ``final`` and ``text`` on a tune-out summary (``reason == "tuneout-summary"``). ``params``
    is the notification as received.
    """

    seq: int
    agent: str
    reason: str
    channel: WakeChannel | None
    tags: tuple[str, ...]
    addressed: bool
    messages: tuple[Any, ...] = ()
    event: Any = None
    invitation: str | None = None
    held: tuple[int, ...] = ()
    dropped: int = 0
    summary: Any = None
    final: bool = False
    text: str | None = None
    params: Mapping[str, Any] = attrs.field(factory=dict, repr=False, eq=False)

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> WakeNotice:
        channel = params.get("channel")
        return cls(
            seq=int(params["seq"]),
            agent=params["agent"],
            reason=params["reason"],
            channel=None
            if channel is None
            else WakeChannel(channel["serverId"], channel["channelId"], channel["shown"]),
            tags=tuple(params.get("tags") or ()),
            addressed=bool(params.get("addressed")),
            messages=tuple(params.get("messages") or ()),
            event=params.get("event"),
            invitation=params.get("invitation"),
            held=tuple(int(seq) for seq in params.get("held") or ()),
            dropped=int(params.get("dropped") or 0),
            summary=params.get("summary"),
            final=bool(params.get("final")),
            text=params.get("text"),
            params=params,
        )

    @property
    def message_text(self) -> str:
        """The text of the wake's messages, joined by newlines (``text`` or text blocks)."""
        parts = []
        for message in self.messages:
            if not isinstance(message, Mapping):
                continue
            if isinstance(message.get("text"), str):
                parts.append(message["text"])
            content = message.get("content")
            if isinstance(content, list):
                parts.extend(block["text"] for block in content if isinstance(block, Mapping) and isinstance(block.get("text"), str))
        return "\n".join(parts)
