"""What a server reads: the reasons a channel's registration, a message or a push is refused
(``{results: [{id, accepted, reason}]}``; the operator sees them in the logs too).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Final

from mcpl_router.routing.texts.shown import quoted


class RegistrationRefusal(enum.StrEnum):
    """Why a channel descriptor was refused, as a stable value beside its sentence: the
    sentence goes to the server and the logs, the value labels ``/metrics`` and the status."""

    NOT_GRANTED = "not-granted"  # REASON_REGISTER_NOT_GRANTED
    OUTSIDE_PATTERNS = "outside-patterns"  # reason_outside_patterns
    DUPLICATE_IN_CALL = "duplicate-in-call"  # REASON_DUPLICATE_IN_CALL
    UPDATE_UNKNOWN = "update-unknown"  # REASON_UPDATE_UNKNOWN
    MALFORMED = "malformed"  # reason_malformed


class AdmissionRefusal(enum.StrEnum):
    """Why a server's inbound method was refused -32002 at admission: the value labels
    ``/metrics``, the sentence (:func:`admission_why`) goes into the error and the logs."""

    NOT_GRANTED = "not-granted"
    #: Before the host's policy was in force, nothing is granted.
    BEFORE_POLICY = "before-policy"


_ADMISSION_WHY: Final[Mapping[AdmissionRefusal, str]] = {
    AdmissionRefusal.NOT_GRANTED: "not granted",
    AdmissionRefusal.BEFORE_POLICY: "before the policy was in force",
}


def admission_why(refusal: AdmissionRefusal) -> str:
    """The words for ``refusal`` inside the -32002 error's message."""
    return _ADMISSION_WHY[refusal]


# ---------------------------------------------------------------------- server-facing reasons

REASON_REGISTER_NOT_GRANTED: Final = "channels.register is not granted to this server"
REASON_DUPLICATE_IN_CALL: Final = (
    "this id appears more than once in the call, so none of its descriptors was registered"
)
REASON_UPDATE_UNKNOWN: Final = "this server has not registered this channel, so it can't be updated"
REASON_INCOMING_NOT_GRANTED: Final = "channels.incoming is not granted to this server"
REASON_PUSH_NAMES_NO_CHANNEL: Final = "the push names no channel"


def reason_malformed(detail: str) -> str:
    """A descriptor that could not be read."""
    return f"malformed channel descriptor: {detail}"


def reason_outside_patterns(channel_id: str) -> str:
    """An id outside the server's configured id patterns."""
    return f"channel id {quoted(channel_id)} is outside the ids this server may use"


def reason_incoming_unknown(channel_id: str) -> str:
    """A message for a channel the sending server never registered (another's doesn't count)."""
    return f"channel {quoted(channel_id)} is not registered by this server"


def reason_incoming_outside_patterns(channel_id: str) -> str:
    """A message for a channel outside the server's current id patterns."""
    return f"channel {quoted(channel_id)} is outside the ids this server may receive on"


def reason_incoming_outbound(channel_id: str) -> str:
    """A message for a channel its server declared outbound-only."""
    return f"channel {quoted(channel_id)} is outbound-only"


def reason_native_unknown(native_id: str) -> str:
    """A push's native id that none of the pushing server's channels has in its address."""
    return f"no channel of this server has native id {quoted(native_id)}"


def reason_native_ambiguous(native_id: str) -> str:
    """A push's native id that several of the pushing server's channels have."""
    return f"more than one channel of this server has native id {quoted(native_id)}"
