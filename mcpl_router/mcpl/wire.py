"""Wire shapes of the MCPL methods servers send us (PROTOCOL.md §4), as msgspec Structs.

Lists of items (descriptors, messages) are kept as :class:`msgspec.Raw` and decoded one by one,
so one malformed item is refused alone while the rest of its batch goes through.
"""

from __future__ import annotations

import msgspec


class RegisterParams(msgspec.Struct):
    channels: list[msgspec.Raw]


class ChangedParams(msgspec.Struct):
    added: list[msgspec.Raw] = []
    # Each id as sent: one malformed id is skipped (and logged by the registry), not the whole change.
    removed: list[object] = []
    updated: list[msgspec.Raw] = []


class Author(msgspec.Struct):
    id: str | None = None
    name: str | None = None


class IncomingMessage(msgspec.Struct, rename="camel"):
    channel_id: str
    message_id: str
    thread_id: str | None = None
    author: Author | None = None
    timestamp: str | None = None
    content: list[object] = []
    metadata: object = None
    tags: list[str] = []


class IncomingParams(msgspec.Struct):
    messages: list[msgspec.Raw]


class PushOrigin(msgspec.Struct, rename="camel"):
    mcpl_channel_id: str | None = None
    # Native ids arrive as numbers too (a Discord snowflake); compared as strings.
    channel_id: str | int | None = None
    source: str | None = None
    label: str | None = None


class PushParams(msgspec.Struct, rename="camel"):
    event_id: str
    feature_set: str | None = None
    timestamp: str | None = None
    origin: PushOrigin | None = None
    payload: object = None
    tags: list[str] = []


def raw_to_plain(raw: msgspec.Raw) -> object:
    """The JSON value ``raw`` holds (dicts, lists, strings, numbers, bools, None)."""
    decoded: object = msgspec.json.decode(raw)
    return decoded
