"""A channel as its server describes it: :class:`ChannelDescriptor`, read from and written to the wire.

Here, apart from the registry, because a descriptor is a value with rules of its own (what a
well-formed one is, how its metadata is frozen, what its address holds) that the registry, the
name index and the context a server is told all read, while none of them decides anything in
it. :meth:`ChannelDescriptor.from_wire` says exactly what is malformed, so the registry can send
that back to the server as the refusal's reason.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Final, Literal

import attrs

__all__ = [
    "DIRECTIONS",
    "DM_TYPE",
    "NATIVE_CHANNEL_KEY",
    "ChannelDescriptor",
    "Direction",
]

Direction = Literal["inbound", "outbound", "bidirectional"]
DIRECTIONS: Final = frozenset({"inbound", "outbound", "bidirectional"})

#: The descriptor ``type`` whose label is also a name (matched without case), as a DM's is.
DM_TYPE: Final = "dm"

#: The address key a push's native channel id (``origin.channelId``) is matched under.
NATIVE_CHANNEL_KEY: Final = "channelId"


def _freeze(value: object) -> object:
    """A deep, read-only copy of a JSON value: objects become mapping proxies, arrays tuples."""
    if isinstance(value, Mapping):
        # The proxy wraps a dict nobody else holds, so the copy can't change under it.
        return types.MappingProxyType({str(k): _freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def _thaw(value: object) -> object:
    """The plain JSON value :func:`_freeze` froze (dicts and lists again), for encoding."""
    if isinstance(value, Mapping):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def _address(value: object) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, (list, tuple)):
        pairs = list(value)
    else:
        raise ValueError(f"channel descriptor address must be an object, got {type(value).__name__}")
    out: list[tuple[str, str]] = []
    for pair in pairs:
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
            raise ValueError("channel descriptor address entries must be key/value pairs")
        key, native = pair
        # Native ids arrive as strings or as numbers (a Discord snowflake, a Telegram peer); a
        # boolean or nested value is no id at all.
        if not isinstance(key, str) or isinstance(native, bool) or not isinstance(native, (str, int)):
            raise ValueError(f"channel descriptor address {key!r} must map to a string or number")
        out.append((key, str(native)))
    return tuple(out)


@attrs.frozen
class ChannelDescriptor:
    """One channel as its server described it (PROTOCOL §4).

    ``id`` is unique within its server's connection only; a descriptor never names its server,
    the registry pairs it with one in a :class:`ChannelRef`. ``metadata`` is kept as the server
    sent it, frozen (objects as read-only mappings, arrays as tuples), and takes no part in the
    hash.
    """

    id: str = attrs.field(validator=attrs.validators.and_(attrs.validators.instance_of(str), attrs.validators.min_len(1)))
    type: str = "channel"
    # A channel without a label of its own is labelled by its id, as from_wire reads it.
    label: str = attrs.field(default=attrs.Factory(lambda self: self.id, takes_self=True))
    direction: Direction = attrs.field(default="bidirectional", validator=attrs.validators.in_(DIRECTIONS))
    address: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_address)
    metadata: object = attrs.field(default=None, converter=_freeze, hash=False)
    initially_open: bool = False

    @classmethod
    def from_wire(cls, obj: object) -> ChannelDescriptor:
        """Read a descriptor from its wire form (``id``, ``type``, ``label``, ``direction``, …).

        Raises:
            ValueError: the descriptor is malformed (not an object; an id that is missing,
                empty or not a string; a field of the wrong type; an unknown direction). The
                message says which, so it can go back to the server as the refusal's reason.
        """
        if not isinstance(obj, Mapping):
            raise ValueError(f"channel descriptor must be an object, got {type(obj).__name__}")
        channel_id = obj.get("id")
        if channel_id is None:
            raise ValueError("channel descriptor has no id")
        if not isinstance(channel_id, str):
            raise ValueError(f"channel descriptor id must be a string, got {type(channel_id).__name__}")
        if not channel_id:
            raise ValueError("channel descriptor id is empty")
        kind = obj.get("type", "channel")
        if not isinstance(kind, str) or not kind:
            raise ValueError(f"channel {channel_id!r}: type must be a non-empty string")
        label = obj.get("label", channel_id)
        if label is None:
            label = channel_id
        if not isinstance(label, str):
            raise ValueError(f"channel {channel_id!r}: label must be a string")
        direction = obj.get("direction", "bidirectional")
        if direction not in DIRECTIONS:
            raise ValueError(
                f"channel {channel_id!r}: direction must be inbound, outbound or bidirectional,"
                f" got {direction!r}"
            )
        initially_open = obj.get("initiallyOpen", False)
        if not isinstance(initially_open, bool):
            raise ValueError(f"channel {channel_id!r}: initiallyOpen must be a boolean")
        try:
            address = _address(obj.get("address"))
        except ValueError as exc:
            raise ValueError(f"channel {channel_id!r}: {exc}") from None
        return cls(
            id=channel_id,
            type=kind,
            label=label,
            direction=direction,
            address=address,
            metadata=obj.get("metadata"),
            initially_open=initially_open,
        )

    def to_wire(self) -> dict[str, object]:
        """The descriptor in its wire form, metadata thawed back to plain JSON values."""
        wire: dict[str, object] = {
            "id": self.id,
            "type": self.type,
            "label": self.label,
            "direction": self.direction,
            "address": dict(self.address),
            "initiallyOpen": self.initially_open,
        }
        if self.metadata is not None:
            wire["metadata"] = _thaw(self.metadata)
        return wire

    @property
    def is_dm(self) -> bool:
        """Whether this is a DM, whose label is also a name (matched without case)."""
        return self.type == DM_TYPE

    def native(self, key: str = NATIVE_CHANNEL_KEY) -> str | None:
        """The native id under ``key`` in the descriptor's address, if it has one."""
        for k, v in self.address:
            if k == key:
                return v
        return None
