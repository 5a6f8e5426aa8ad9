"""The stable reasons (machine strings) of refusals and outcomes: a delivery's, a connector
tool's, a tune-out tool's. Each is said in words by the texts of its audience.
"""

from __future__ import annotations

from typing import Final

# ---------------------------------------------------------------------- delivery reasons (stable)

REASON_NO_LINK: Final = "server-unavailable"
REASON_NOT_PERMITTED: Final = "not-permitted"
REASON_NOT_REGISTERED: Final = "channel-not-registered"
REASON_SERVER_REFUSED: Final = "server-refused"
REASON_NOT_DELIVERED: Final = "not-delivered"
REASON_TIMEOUT: Final = "timeout"
REASON_NO_RECEIPT: Final = "no-receipt"
REASON_MALFORMED_RECEIPT: Final = "malformed-receipt"
#: A send interrupted before its outcome was known (cancelled, or the daemon stopped).
REASON_INTERRUPTED: Final = "interrupted"
#: The journal could not record the attempt before it went out, so nothing was sent.
REASON_NOT_RECORDED: Final = "not-recorded"


#: Stable reasons of connector-tool results (the servers' own tools, forwarded by the daemon).
REASON_TOOL_DISABLED: Final = "tool-disabled"
REASON_TOOL_UNKNOWN: Final = "unknown-tool"
REASON_UNCONFIRMED: Final = "unconfirmed"
REASON_TOOL_FAILED: Final = "tool-failed"

REASON_NOT_SUBCONSCIOUS: Final = "not-subconscious"
REASON_NOT_TUNED_OUT: Final = "not-tuned-out"
REASON_BAD_ARGUMENT: Final = "bad-argument"
