"""What the journal takes and gives back: events, deliveries, what a commit recorded, statistics.

Plain values, apart from the journal's machinery so that the code handing it messages (the
inbound path, host sessions, tools) reads what it needs without the writer, SQLite or trio. Also
here: :func:`content_digest`, which tells a re-send from a new message under an old id, because
the inbound path computes it before a message reaches the journal.
"""

from __future__ import annotations

import bisect
import enum
import hashlib
import itertools
from typing import Final

import attrs
import msgspec

__all__ = [
    "Delivery",
    "EventKind",
    "InboundEvent",
    "JournalFailure",
    "JournalStatistics",
    "Recorded",
    "SavedTuneOut",
    "StoredDelivery",
    "StoredEvent",
    "content_digest",
]


class EventKind(enum.StrEnum):
    """What an inbound event is: a channel's message (``channels/incoming``) or a push
    (``push/event``). Stored as its value."""

    MESSAGE = "message"
    PUSH = "push"


class JournalFailure(Exception):
    """A write could not be committed (disk full, I/O error); nothing of it was accepted."""


class InboundEvent(msgspec.Struct, frozen=True):
    """One accepted inbound message or push, ready to be journaled.

    A value, frozen; a msgspec Struct rather than attrs because one is made for every message
    on the hot path, where a frozen attrs class's generated ``__init__`` sets each field through
    a bound ``object.__setattr__`` and ran the kind's converter (about 1 µs, against 0.15:
    docs/performance.md). ``kind`` is not converted: give an :class:`EventKind` (what reads it
    compares by value, so its string is read alike).
    """

    server_id: str
    #: The channel's id on ``server_id``; together they are the channel's ref. None for a push
    #: that names no channel.
    channel_id: str | None
    kind: EventKind
    dedup_key: str
    payload: object
    #: What the message said (see :func:`content_digest`); a re-send under the same key with
    #: the same digest is a duplicate, a different one a new message. None: the whole payload's.
    digest: bytes | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        """What a re-send shares with it: its server, kind and id."""
        # The kind as it is: an EventKind is a str, equal to and hashed as its value.
        return (self.server_id, self.kind, self.dedup_key)


@attrs.frozen
class Delivery:
    """One agent woken by one event, as the journal keeps it."""

    agent: str
    reason: str
    tags: tuple[str, ...]
    addressed: bool


@attrs.frozen
class Recorded:
    seq: int
    duplicate: bool
    #: A different message under an id already seen (a server that restarted its counter).
    reused_id: bool = False


@attrs.frozen
class StoredEvent:
    seq: int
    server_id: str
    channel_id: str | None
    kind: EventKind = attrs.field(converter=EventKind)
    payload: object = None
    received_at: float = 0.0


@attrs.frozen
class StoredDelivery:
    """A delivery with its event, for re-sending."""

    delivery: Delivery
    event: StoredEvent


@attrs.frozen
class SavedTuneOut:
    """One agent's tune-out of one channel as the journal keeps it (the ``tune_outs`` table).

    ``started_at`` and ``ends_at`` are wall-clock (``time.time()``); ``held`` is read with it at
    start-up: the agent's unacked deliveries from the channel after ``handed_through``, oldest
    first.
    """

    agent: str
    server_id: str
    channel_id: str
    cadence: float
    backlog_cap: int
    max_wakes: int | None
    duration: float | None
    started_at: float
    ends_at: float | None
    wakes: int = 0
    handed_through: int = 0
    summary: str | None = None
    held: tuple[int, ...] = ()


#: Upper bounds, in seconds, of the commit-duration histogram's buckets: an fsync on a local SSD
#: takes well under a millisecond, on a busy or network disk tens of milliseconds or more.
COMMIT_SECONDS_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


@attrs.define
class CommitDurations:
    """How long each commit took, counted into :data:`COMMIT_SECONDS_BUCKETS` (a histogram's
    state, read at scrape time: one list index per commit, nothing per bucket)."""

    counts: list[int] = attrs.field(factory=lambda: [0] * (len(COMMIT_SECONDS_BUCKETS) + 1))
    total_seconds: float = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(COMMIT_SECONDS_BUCKETS, seconds)] += 1
        self.total_seconds += seconds

    def cumulative(self) -> tuple[int, ...]:
        """Commits at or under each bound, then all of them (the ``+Inf`` bucket)."""
        return tuple(itertools.accumulate(self.counts))


@attrs.frozen
class JournalStatistics:
    last_seq: int
    queued_writes: int
    commits: int
    #: Operations in the last commit, and the most one commit held.
    last_batch: int
    largest_batch: int
    #: Seconds the last commit took in its thread (fsync included).
    last_commit_seconds: float
    #: Commits at or under each of :data:`COMMIT_SECONDS_BUCKETS`, then all of them.
    commit_seconds_buckets: tuple[int, ...]
    #: Seconds all commits took together.
    commit_seconds_total: float
    pruned_events: int
    pruned_drafts: int
    #: The last commit's error while it keeps failing; None when healthy.
    failing: str | None
    #: Commits that failed (each op told so; write-behind ones retried).
    failed_commits: int = 0
    #: Events found written by a commit that had failed (its outcome unknown: a PostgreSQL
    #: commit cut off at COMMIT), recorded when their server re-sent them.
    recorded_again: int = 0

    def to_wire(self) -> dict[str, object]:
        """As ``status`` shows it (``journal``)."""
        return {
            "lastSeq": self.last_seq,
            "queuedWrites": self.queued_writes,
            "commits": self.commits,
            "lastBatch": self.last_batch,
            "largestBatch": self.largest_batch,
            "lastCommitMs": round(self.last_commit_seconds * 1000, 3),
            "prunedEvents": self.pruned_events,
            "prunedDrafts": self.pruned_drafts,
            "failing": self.failing,
            "failedCommits": self.failed_commits,
            "recordedAgain": self.recorded_again,
        }


def content_digest(payload: object) -> bytes:
    """What a message or event said, for telling a re-send from a new message under an old id."""
    return hashlib.blake2b(msgspec.json.encode(payload, order="sorted"), digest_size=16).digest()
