"""ChannelRef: the one way the daemon holds a channel.

An MCPL channel id is unique only within one server's connection (SPEC §14.2), so a channel is
the pair (server, channel id) and never a string built from the two.
"""

from __future__ import annotations

import msgspec


class ChannelRef(msgspec.Struct, frozen=True, order=True, cache_hash=True):
    """A channel, named with the server that registered it.

    Frozen and hashable: use it as a dict key, a set member, a stored route. Never join its two
    ids into one string (``"a:b" + ":" + "room"`` and ``"a" + ":" + "b:room"`` are the same
    string); :attr:`qualified_name` exists only to *show* or to *match against registered pairs*.

    A value, as the style makes it, but a msgspec Struct rather than an attrs class: a message
    looks a ref up in half a dozen dicts on its way, and a Struct hashes (once, cached),
    compares and is made in C (docs/decisions/0003-channel-ref-as-a-struct.md).
    """

    server_id: str
    channel_id: str

    @property
    def qualified_name(self) -> str:
        """The ``serverId:channelId`` form an agent may type. Not a key: two refs can share it."""
        return f"{self.server_id}:{self.channel_id}"

    def to_wire(self) -> dict[str, str]:
        """The ref as the host API writes it: ``{"serverId": ..., "channelId": ...}``."""
        return {"serverId": self.server_id, "channelId": self.channel_id}

    def __str__(self) -> str:
        # For logs and debugging only; never parsed back.
        return f"ChannelRef({self.server_id!r}, {self.channel_id!r})"
