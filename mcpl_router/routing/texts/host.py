"""What a host reads: refusals of the host API's own calls (a malformed ref, a host's
``channels/publish`` of a name several channels answer to, or none).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from mcpl_router.routing.texts.shown import quoted

# ---------------------------------------------------------------------- turns (host API)

MALFORMED_REF_SERVER: Final = (
    "channel: a ref needs a non-empty serverId; to name a channel without its server, give"
    " the name as a string"
)
MALFORMED_REF_CHANNEL: Final = "channel: a ref needs a non-empty channelId"




# Host channels/publish (publishForAgent) reasons: stable strings hosts read.
REASON_SHARED_ID: Final = "shared-id"


def host_publish_shared(name: str, candidates: Sequence[str]) -> str:
    """A host's bare name several channels answer to: a ref or a qualified name settles it."""
    return (
        f"{quoted(name)} names more than one channel ({', '.join(candidates)}). Nothing was sent."
        " Give a ref {serverId, channelId} or the serverId:channelId name."
    )


def host_publish_unknown(name: str) -> str:
    """A host's name or ref no registered channel answers to."""
    return f"No registered channel is {name}. Nothing was sent. channels/list lists the channels."
