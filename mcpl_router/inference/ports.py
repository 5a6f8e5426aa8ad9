"""What server-initiated inference needs of the floors above it: a host's connection (which
host answers, and whether it is still there) and where outcomes are counted. The host API and
the metrics implement these; nothing here imports ``hosts/`` or ``metrics.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol

from mcpl_router.inference.refusals import ChunkDrop, InferenceRefusal

if TYPE_CHECKING:
    from mcpl_router.jsonrpc import Peer

__all__ = ["ChunkOutcome", "HostEnd", "InferenceCounts", "InferenceOutcome"]

#: How a server's request ended: answered, refused, sent as a notification (nothing to answer),
#: or ``not-granted`` (a reload took the server's ``inference`` table away meanwhile).
InferenceOutcome = InferenceRefusal | Literal["answered", "notification", "not-granted"]
#: A host's chunk: forwarded, or why it was dropped.
ChunkOutcome = ChunkDrop | Literal["forwarded"]


class HostEnd(Protocol):
    """A host's connection as the broker asks it: its id (for logs) and its peer (the request
    goes to it; closed, the host is gone). Held by identity."""

    @property
    def id(self) -> int: ...

    @property
    def peer(self) -> Peer | None: ...


class InferenceCounts(Protocol):
    """Where each request's outcome and each chunk's fate are counted."""

    def inference_outcome(self, server_id: str, method: str, outcome: InferenceOutcome) -> None: ...

    def inference_chunk(self, outcome: ChunkOutcome) -> None: ...
