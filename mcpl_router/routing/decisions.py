"""The last routing decisions: where words went (receipts), names refused, speech bounced.

A bounded ring the router owns, for operators (``status``'s ``decisions``, the status page):
the newest :attr:`Decisions.keep` are kept, older ones fall off and are counted
(:attr:`Decisions.recorded` minus what is kept). It holds no message text unless ``preview``
(``[health] preview``) asks for that many characters of it.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable

import attrs

from mcpl_router.routing.refs import ChannelRef

#: How many decisions are kept by default (``[health] decisions``).
DEFAULT_KEEP = 100

#: The kinds of decision: a publish's outcome, a name refused, plain speech bounced.
DELIVERED = "delivered"
FAILED = "failed"
UNKNOWN = "unknown"
REFUSED = "refused"
BOUNCED = "bounced"


@attrs.frozen
class Decision:
    """One decision: what happened, to which channel (or which candidates), and why."""

    at: float
    kind: str
    #: What made it: ``channel_publish``, ``speech``, ``host``, ``subconscious``, ``name``.
    via: str
    agent: str | None = None
    ref: ChannelRef | None = None
    shown: str | None = None
    reason: str | None = None
    message_id: str | None = None
    #: The name given, for a refusal or a bounce's target.
    name: str | None = None
    candidates: tuple[ChannelRef, ...] = ()
    #: The first ``preview`` characters of the words, when ``[health] preview`` asks for them.
    preview: str | None = None

    def to_wire(self) -> dict[str, object]:
        """As ``status`` shows it: refs as ``{serverId, channelId}``, never one joined string."""
        return {
            "at": self.at,
            "kind": self.kind,
            "via": self.via,
            "agent": self.agent,
            "channel": None if self.ref is None else self.ref.to_wire(),
            "shown": self.shown,
            "reason": self.reason,
            "messageId": self.message_id,
            "name": self.name,
            "candidates": [ref.to_wire() for ref in self.candidates],
            "preview": self.preview,
        }


@attrs.define(eq=False)
class Decisions:
    """The newest ``keep`` decisions, oldest first; ``preview`` characters of text (0: none)."""

    keep: int = DEFAULT_KEEP
    preview: int = 0
    #: Decisions recorded since start (``recorded - len(kept)`` fell off the ring).
    recorded: int = 0
    _ring: collections.deque[Decision] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._ring = collections.deque(maxlen=max(self.keep, 0))

    def configure(self, *, keep: int, preview: int) -> None:
        """Take the config's sizes (the newest decisions stay when the ring shrinks)."""
        self.keep, self.preview = keep, preview
        self._ring = collections.deque(self._ring, maxlen=max(keep, 0))

    def published(
        self, via: str, agent: str | None, ref: ChannelRef, shown: str, outcome: str, reason: str | None,
        message_id: str | None, text: str,
    ) -> None:
        """A publish's outcome: ``delivered`` (with the server's message id), ``failed``, ``unknown``."""
        self._add(Decision(time.time(), outcome, via, agent, ref, shown, reason, message_id, preview=self._preview(text)))

    def refused(self, kind: str, name: str, candidates: Iterable[ChannelRef], server_id: str | None = None) -> None:
        """A name that picked no single channel (``kind``: ``ambiguous``, ``unknown``, …)."""
        ref = ChannelRef(server_id, name) if server_id and name else None
        self._add(Decision(time.time(), REFUSED, "name", reason=kind, name=name, ref=ref, candidates=tuple(candidates)))

    def bounced(self, agent: str, target: str | None, why: str, text: str) -> None:
        """Plain speech held as a bounced draft instead of sent (``why``: its stable reason)."""
        self._add(Decision(time.time(), BOUNCED, "speech", agent, reason=why, name=target, preview=self._preview(text)))

    def latest(self) -> list[Decision]:
        """The kept decisions, newest first."""
        return list(reversed(self._ring))

    def to_wire(self) -> dict[str, object]:
        """As ``status`` shows it: newest first, with how many were recorded and are kept."""
        return {
            "recorded": self.recorded,
            "keep": self.keep,
            "previewChars": self.preview,
            "latest": [decision.to_wire() for decision in self.latest()],
        }

    def _preview(self, text: str) -> str | None:
        if self.preview <= 0:
            return None
        return text if len(text) <= self.preview else text[: self.preview] + "…"

    def _add(self, decision: Decision) -> None:
        self.recorded += 1
        if self.keep > 0:
            self._ring.append(decision)
