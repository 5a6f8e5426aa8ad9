"""What the daemon tells a host unasked: each notification a typed value that carries its own
method, so nothing below the host API sends a host ``(method, params)`` of its own making.

docs/host-api.md documents each: ``wake`` (a message or push, a gate's batch, a tune-out's
summary, a fork's closure prompt: the rendered params, :class:`WakeNotice`), ``server/state``,
``channels/changed``, ``daemon/shutdown``, and the ``inference:started`` trace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import attrs
import msgspec

from mcpl_router.routing.refs import ChannelRef

__all__ = [
    "ChannelsChangedNotice",
    "HostNotice",
    "InferenceStartedNotice",
    "ServerStateNotice",
    "ShutdownNotice",
    "WakeNotice",
    "wire_of",
]


class _Notice(msgspec.Struct, rename="camel"):
    """A notification's params, as the wire names them."""

    METHOD: ClassVar[str]


class RefParams(msgspec.Struct, rename="camel", frozen=True):
    """A channel as the host API writes it: ``{serverId, channelId}``."""

    server_id: str
    channel_id: str

    @classmethod
    def of(cls, ref: ChannelRef) -> RefParams:
        return cls(ref.server_id, ref.channel_id)


class ServerStateNotice(_Notice):
    """A server link changed state (every host that said hello hears it)."""

    server_id: str
    old: str
    state: str

    METHOD: ClassVar[str] = "server/state"


class ChannelsChangedNotice(_Notice):
    """Channels a server registered or that are gone, each by its ref (every host hears it)."""

    server_id: str
    added: tuple[RefParams, ...]
    removed: tuple[RefParams, ...]

    METHOD: ClassVar[str] = "channels/changed"

    @classmethod
    def of(cls, server_id: str, added: tuple[ChannelRef, ...], removed: tuple[ChannelRef, ...]) -> ChannelsChangedNotice:
        return cls(server_id, tuple(RefParams.of(ref) for ref in added), tuple(RefParams.of(ref) for ref in removed))


class ShutdownNotice(_Notice):
    """The daemon is draining: turns end within ``grace`` seconds."""

    grace: float
    reason: str | None

    METHOD: ClassVar[str] = "daemon/shutdown"


class InferenceStartedNotice(_Notice):
    """A turn's inference started (a trace for the agent's host)."""

    agent: str
    turn_id: str
    inference_id: str
    server_id: str | None
    channel_id: str | None

    METHOD: ClassVar[str] = "inference:started"


@attrs.frozen
class WakeNotice:
    """A ``wake`` not paced by the outbox's window: a tune-out's summary, a fork's closure
    prompt. ``params`` are rendered by its maker (their shapes: docs/host-api.md)."""

    params: Mapping[str, object]

    METHOD: ClassVar[str] = "wake"


HostNotice = ServerStateNotice | ChannelsChangedNotice | ShutdownNotice | InferenceStartedNotice | WakeNotice


def wire_of(notice: HostNotice) -> tuple[str, object]:
    """The notification's method and the params to encode."""
    if isinstance(notice, WakeNotice):
        return notice.METHOD, notice.params
    return notice.METHOD, notice
