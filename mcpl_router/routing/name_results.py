"""What the resolver answers with: a channel picked, a refusal, a listing row, an explanation.

Plain values, apart from :mod:`mcpl_router.routing.names` (which builds them and exports them
too), so the resolver's module holds how names are read and this one what a reading returns.
"""

from __future__ import annotations


import attrs

from mcpl_router.routing.refs import ChannelRef

__all__ = ["Candidate", "ChannelRow", "Explanation", "Refusal", "Resolved"]


@attrs.frozen
class Resolved:
    """A name that picks exactly one channel; ``rule`` says how (``exact-pair``, ``one-match``,
    ``qualified-pair``)."""

    ref: ChannelRef
    rule: str


@attrs.frozen
class Refusal:
    """A name that picks no single channel, with the text the agent reads.

    ``kind`` is a stable machine string (``ambiguous``, ``unknown``, ``not-on-server``,
    ``qualified-with-server``, ``no-name``); ``candidates`` are the channels the refusal names,
    in registration order.
    """

    kind: str
    text: str
    candidates: tuple[ChannelRef, ...] = ()
    name: str = ""
    server_id: str | None = None

    def to_dict(self) -> dict[str, object]:
        """The refusal as JSON: kind, text, candidates as refs."""
        return {
            "kind": self.kind,
            "text": self.text,
            "candidates": [ref.to_wire() for ref in self.candidates],
        }


@attrs.frozen
class ChannelRow:
    """One row of ``channel_list``.

    ``name`` is present (not None) only where the channel's id names another channel too, and
    then it is the qualified name, which picks this row alone; where no string picks the row
    alone it stays None and ``shown`` has the id-and-server form. ``shown`` is always
    :meth:`~mcpl_router.routing.names.ChannelNames.name_shown`.
    """

    server_id: str
    channel_id: str
    label: str
    type: str
    direction: str
    open: bool
    lazy: bool
    name: str | None
    shown: str

    @property
    def ref(self) -> ChannelRef:
        """The row's channel."""
        return ChannelRef(self.server_id, self.channel_id)

    def to_dict(self) -> dict[str, object]:
        """The row as JSON, ``name`` only where it is present."""
        row: dict[str, object] = {
            "serverId": self.server_id,
            "channelId": self.channel_id,
            "label": self.label,
            "type": self.type,
            "direction": self.direction,
            "open": self.open,
            "lazy": self.lazy,
            "shown": self.shown,
        }
        if self.name is not None:
            row["name"] = self.name
        return row


@attrs.frozen
class Candidate:
    """A channel a name reached, how it matched, and how it is named."""

    ref: ChannelRef
    matched_by: tuple[str, ...]
    shown: str
    picks_alone: str | None

    def to_dict(self) -> dict[str, object]:
        """The candidate as JSON."""
        return {
            **self.ref.to_wire(),
            "matchedBy": list(self.matched_by),
            "shown": self.shown,
            "picksAlone": self.picks_alone,
        }


@attrs.frozen
class Explanation:
    """How a name resolves and why: candidates, the rule that picked or refused, the refusal."""

    name: str
    server_id: str | None
    rule: str
    rule_text: str
    resolved: ChannelRef | None
    refusal: Refusal | None
    candidates: tuple[Candidate, ...]

    def to_dict(self) -> dict[str, object]:
        """The explanation as JSON (for the CLI's ``explain`` and the host API's)."""
        return {
            "name": self.name,
            "serverId": self.server_id,
            "rule": self.rule,
            "ruleText": self.rule_text,
            "resolved": self.resolved.to_wire() if self.resolved is not None else None,
            "refusal": self.refusal.to_dict() if self.refusal is not None else None,
            "candidates": [candidate.to_dict() for candidate in self.candidates],
        }
