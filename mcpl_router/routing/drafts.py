"""Drafts: plain speech held instead of posted, as values (pure; the journal keeps them).

A draft has an id like ``d-k7x3q``, the agent's words exactly as written, a reason (why it was
held) and a state:

- ``held``: never sent; may be resent or dismissed;
- ``unconfirmed``: a send went out and its outcome is unknown; resending needs
  ``confirmDuplicate`` (the words may already be there);
- ``delivered``: sent, confirmed;
- ``dismissed``: set aside by the agent.

Every send attempt is recorded on the draft (journaled before the publish goes out).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Final, Literal, NotRequired, TypedDict

import attrs

__all__ = [
    "DRAFT_STATES",
    "Attempt",
    "AttemptRow",
    "Draft",
    "DraftRow",
    "new_draft_id",
    "page",
]

DraftState = Literal["held", "unconfirmed", "delivered", "dismissed"]
DRAFT_STATES: Final = ("held", "unconfirmed", "delivered", "dismissed")
#: Drafts per page of ``drafts list``.
PAGE_SIZE: Final = 10
_ALPHABET: Final = "abcdefghijkmnpqrstuvwxyz23456789"


def new_draft_id(taken: Callable[[str], bool], rng: random.Random | None = None) -> str:
    """A fresh id ``d-xxxxx`` (five letters and digits, no look-alikes) not yet ``taken``."""
    source = rng or random.SystemRandom()
    while True:
        draft_id = "d-" + "".join(source.choice(_ALPHABET) for _ in range(5))
        if not taken(draft_id):
            return draft_id


class AttemptRow(TypedDict):
    """An attempt as the journal keeps it and a draft's ``show`` gives it."""

    serverId: str  # noqa: N815 - the wire's names
    channelId: str  # noqa: N815
    shown: str
    at: float
    outcome: str
    reason: NotRequired[str]


class DraftRow(TypedDict):
    """A draft as the journal stores it (plain JSON). Rows written before a field existed lack
    it (read with its default); ``settledAt`` is the journal's, once the draft is settled."""

    id: str
    agent: str
    text: str
    reason: str
    createdAt: float  # noqa: N815 - the wire's names
    turnId: NotRequired[str]  # noqa: N815
    state: NotRequired[DraftState]
    target: NotRequired[str | None]
    detail: NotRequired[str | None]
    attempts: NotRequired[list[AttemptRow]]
    told: NotRequired[bool]
    settledAt: NotRequired[float]  # noqa: N815


@attrs.frozen
class Attempt:
    """One send of a draft: where (server, channel, shown), when, and what came of it."""

    server_id: str
    channel_id: str
    shown: str
    at: float
    outcome: str  # "sending" until it is known: delivered | failed | unknown
    reason: str | None = None

    def to_wire(self) -> AttemptRow:
        wire: AttemptRow = {"serverId": self.server_id, "channelId": self.channel_id, "shown": self.shown, "at": self.at, "outcome": self.outcome}
        if self.reason is not None:
            wire["reason"] = self.reason
        return wire

    @classmethod
    def from_wire(cls, wire: AttemptRow) -> Attempt:
        return cls(wire["serverId"], wire["channelId"], wire["shown"], float(wire["at"]), wire["outcome"], wire.get("reason"))


@attrs.define
class Draft:
    """One draft; ``target`` is the token its envelope named (hybrid/explicit), if any."""

    draft_id: str
    agent: str
    text: str
    reason: str
    created_at: float
    turn_id: str = ""
    state: DraftState = "held"
    target: str | None = None
    detail: str | None = None
    attempts: list[Attempt] = attrs.field(factory=list)
    told: bool = False

    @property
    def sending(self) -> bool:
        """Whether an attempt is in flight (neither resent nor dismissed meanwhile)."""
        return bool(self.attempts) and self.attempts[-1].outcome == "sending"

    def preview(self, width: int = 60) -> str:
        flat = " ".join(self.text.split())
        return flat if len(flat) <= width else flat[: width - 1] + "…"

    def to_wire(self, now: float | None = None) -> dict[str, object]:
        wire: dict[str, object] = {
            "id": self.draft_id,
            "state": self.state,
            "reason": self.reason,
            "size": len(self.text),
            "preview": self.preview(),
            "createdAt": self.created_at,
        }
        if now is not None:
            wire["ageSeconds"] = max(0, round(now - self.created_at))
        if self.target is not None:
            wire["target"] = self.target
        if self.detail is not None:
            wire["detail"] = self.detail
        return wire

    def row(self) -> DraftRow:
        """The draft as the journal stores it (plain JSON values)."""
        return {
            "id": self.draft_id,
            "agent": self.agent,
            "text": self.text,
            "reason": self.reason,
            "createdAt": self.created_at,
            "turnId": self.turn_id,
            "state": self.state,
            "target": self.target,
            "detail": self.detail,
            "attempts": [attempt.to_wire() for attempt in self.attempts],
            "told": self.told,
        }

    @classmethod
    def from_row(cls, row: DraftRow) -> Draft:
        return cls(
            draft_id=row["id"],
            agent=row["agent"],
            text=row["text"],
            reason=row["reason"],
            created_at=float(row["createdAt"]),
            turn_id=row.get("turnId", ""),
            state=row.get("state", "held"),
            target=row.get("target"),
            detail=row.get("detail"),
            attempts=[Attempt.from_wire(a) for a in row.get("attempts", [])],
            told=bool(row.get("told", False)),
        )


def page(drafts: Sequence[Draft], number: int) -> list[Draft]:
    """Page ``number`` (from 1) of ``drafts``, newest first."""
    ordered = sorted(drafts, key=lambda d: d.created_at, reverse=True)
    start = max(0, number - 1) * PAGE_SIZE
    return ordered[start : start + PAGE_SIZE]
