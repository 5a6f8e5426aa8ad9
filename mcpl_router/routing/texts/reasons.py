"""The stable reasons (machine strings) of refusals and outcomes: a delivery's, a connector
tool's, a tune-out tool's. Each is said in words by the texts of its audience.
"""

from __future__ import annotations

import enum

__all__ = ["Reason"]


class Reason(enum.StrEnum):
    """A refusal's or an outcome's stable reason, kept beside the sentence that says it: hosts
    and agents read the value as ``reason`` (docs/errors.md), ``/metrics`` labels by it, and the
    words come from the texts of the audience. A ``StrEnum``, so the value is what goes on the
    wire and in the logs."""

    # -- a delivery's (a publish, an acknowledgement, a channel opened or closed)
    NO_LINK = "server-unavailable"
    NOT_PERMITTED = "not-permitted"
    NOT_REGISTERED = "channel-not-registered"
    SERVER_REFUSED = "server-refused"
    NOT_DELIVERED = "not-delivered"
    TIMEOUT = "timeout"
    NO_RECEIPT = "no-receipt"
    MALFORMED_RECEIPT = "malformed-receipt"
    #: A send interrupted before its outcome was known (cancelled, or the daemon stopped).
    INTERRUPTED = "interrupted"
    #: The journal could not record the attempt before it went out, so nothing was sent.
    NOT_RECORDED = "not-recorded"

    # -- a connector tool's result (the servers' own tools, forwarded by the daemon)
    TOOL_DISABLED = "tool-disabled"
    TOOL_UNKNOWN = "unknown-tool"
    UNCONFIRMED = "unconfirmed"
    TOOL_FAILED = "tool-failed"

    # -- a tune-out tool's
    NOT_SUBCONSCIOUS = "not-subconscious"
    NOT_TUNED_OUT = "not-tuned-out"
    BAD_ARGUMENT = "bad-argument"
