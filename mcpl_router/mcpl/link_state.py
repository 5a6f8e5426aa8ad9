"""What the daemon sees of a server link: its states, its status, its delegate, its refusals.

The routing shell, the tools, the context hooks and the status all hold links; they read a
:class:`LinkState`, a :class:`LinkStatus` snapshot, and catch :class:`LinkUnavailable` or
:class:`CapabilityNotGranted` from an outbound call (or see :data:`NOTIFIED` when a method went
as a Notification). (A link reports to its ``LinkDelegate``, in ``link.py``.) Apart from
:class:`~mcpl_router.mcpl.link.ServerLink` because this is the link's whole face, and none of it
needs the link's transport, handshake or reconnect loop.
"""

from __future__ import annotations

import enum
from typing import Final

import attrs


__all__ = [
    "NOTIFIED",
    "CapabilityNotGranted",
    "LinkState",
    "LinkStatus",
    "LinkUnavailable",
]

#: What a session's request returns when the method went as a Notification (mcpl/session.py).
class _Notified(enum.Enum):
    NOTIFIED = "notified"


NOTIFIED: Final = _Notified.NOTIFIED


class LinkState(enum.Enum):
    CONNECTING = "connecting"
    READY = "ready"
    RETRYING = "retrying"
    CLOSED = "closed"
    FAILED = "failed"


class LinkUnavailable(Exception):
    """The link is not ready (or not connected) for an outbound call."""


class CapabilityNotGranted(Exception):
    """We would send a message needing a capability this server's current grant lacks."""

    def __init__(self, server_id: str, capability: str) -> None:
        super().__init__(f"server {server_id!r} is not granted {capability}")
        self.server_id = server_id
        self.capability = capability


@attrs.frozen
class LinkStatus:
    """An immutable snapshot for ``servers/list``, ``status`` and the demo."""

    server_id: str
    state: str
    transport: str
    endpoint: str
    epoch: int
    attempts: int
    legacy: bool
    #: 0.4 name → the 0.5 leaf it was read as, for a legacy server that used one.
    legacy_mapping: dict[str, str]
    manifest_version: str | None
    grant: dict[str, object]
    receipt: object
    last_error: str | None
    since: float
    exit_code: int | None = None
    stderr_tail: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, object]:
        return {
            "serverId": self.server_id,
            "state": self.state,
            "transport": self.transport,
            "endpoint": self.endpoint,
            "epoch": self.epoch,
            "attempts": self.attempts,
            "legacy": self.legacy,
            "legacyMapping": dict(self.legacy_mapping),
            "manifestVersion": self.manifest_version,
            "grant": {
                "granted": self.grant["granted"],
                "deniedCount": self.grant["denied_count"],
                "featureSetsEnabled": self.grant["feature_sets_enabled"],
                "featureSetsDisabled": self.grant["feature_sets_disabled"],
                "legacy": self.grant["legacy"],
            },
            "receipt": self.receipt,
            "lastError": self.last_error,
            "exitCode": self.exit_code,
            "stderr": list(self.stderr_tail),
        }
