"""A connection's bounds and what it counts: :class:`PeerLimits` and :class:`PeerStatistics`.

Every queue a peer keeps is bounded, and every bound is here, with its default, in one place an
operator or a reviewer can read: what a connection that floods, or stops reading, may cost.
The policies that apply them (backpressure, never a drop; the stall timeout) are in
:mod:`mcpl_router.jsonrpc.peer`'s docstring. :class:`PeerStatistics` is what a peer reports of
itself (the status and ``/metrics`` read it), kept beside the limits it measures against.
"""

from __future__ import annotations

import attrs

__all__ = ["PeerLimits", "PeerStatistics"]

@attrs.frozen
class PeerLimits:
    """The bounds of one connection's queues (see the module docstring for the policies)."""

    #: Inbound messages (and their bytes) queued across all lanes before the read loop waits.
    #: One lane may use all of it: a busy turn holds the others only once this is exhausted.
    inbound_messages: int = 4096
    inbound_bytes: int = 16 * 1024 * 1024
    #: Lanes with work at once before the read loop waits for one to finish.
    max_lanes: int = 64
    #: Concurrent-method handlers running at once.
    max_concurrent: int = 64
    #: Deferred answers outstanding at once.
    max_deferred: int = 1024
    #: Outgoing messages queued, and their bytes (a single larger message still goes alone).
    outbox_messages: int = 4096
    outbox_bytes: int = 8 * 1024 * 1024
    #: How long the peer may take nothing we send (the outbox full and no write making
    #: progress) before it is disconnected. A slow reader that keeps reading never trips it.
    stall_timeout: float = 30.0
    #: At a graceful close (or the other side's EOF), how long what is queued may take to go out.
    close_flush: float = 1.0


@attrs.frozen
class PeerStatistics:
    pending_requests: int
    lanes: int
    inbound_queued: int
    requests_sent: int
    inbound_handled: int
    #: Times the read loop waited for room (a lane, a slot): backpressure on the other side.
    backpressure_waits: int
    skipped_lines: int
    malformed_messages: int
    oversized_messages: int
    handler_failures: int
    outbox_messages: int
    outbox_bytes: int
    #: The most bytes queued for this peer at once (what a peer that doesn't read costs).
    outbox_high_water_bytes: int
    #: Times a send waited because the outbox was full.
    outbox_waits: int
    #: 1 once the connection was closed because the peer stopped reading.
    stalled: int
    #: Answers taken although their deadline had fired, because this process had been paused
    #: (the answer was in the socket, unread).
    late_answers: int = 0
