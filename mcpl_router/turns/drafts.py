"""Drafts and receipts: what a turn's words became when they were not (or not surely) posted.

A draft is durable (journaled, write-behind): it is held until sent, dismissed or confirmed.
A send of a draft is journaled as ``sending`` before its publish goes out and settled after
(``delivered``, ``unconfirmed``, or back to held), so a crash mid-send leaves a draft that says
so, never one sent twice unknowingly. The receipt at a turn's close says where its plain
words went, each place once, in the agent's mode's words.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from mcpl_router.logs import get_logger
from mcpl_router.routing import prose, texts
from mcpl_router.routing.drafts import Attempt, Draft, new_draft_id
from mcpl_router.routing.modes import ReceiptFacts
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.turns import Delivery
from mcpl_router.store.journal import JournalFailure
from mcpl_router.turns.run import TurnRun

if TYPE_CHECKING:
    from mcpl_router.routing.names import ChannelNames
    from mcpl_router.store.journal import Journal

__all__ = ["DraftBook", "receipt_of"]


class DraftBook:
    """Every agent's drafts, read from and written to the journal."""

    def __init__(self, *, journal: Journal, names: ChannelNames) -> None:
        self._journal = journal
        self._names = names
        self._log = get_logger()

    def drafts_of(self, agent: str) -> list[Draft]:
        """Every draft of ``agent``, oldest first (durable: read from the journal)."""
        return [Draft.from_row(row) for row in self._journal.drafts_of(agent)]

    def draft(self, agent: str, draft_id: str) -> Draft | None:
        """One of ``agent``'s drafts by id."""
        row = self._journal.draft(draft_id)
        if row is None or row.get("agent") != agent:
            return None
        return Draft.from_row(row)

    def save(self, draft: Draft) -> None:
        """Journal ``draft`` as it is now."""
        self._journal.save_draft(draft.row())

    def new(self, run: TurnRun, text: str, reason: str, *, target: str | None = None, detail: str | None = None) -> Draft:
        """A new held draft of ``run``'s words (journaled; the turn's receipt will name it)."""
        journal = self._journal
        draft = Draft(
            draft_id=new_draft_id(lambda candidate: journal.draft(candidate) is not None),
            agent=run.turn.agent,
            text=text,
            reason=reason,
            created_at=time.time(),
            turn_id=run.turn.turn_id,
            target=target,
            detail=detail,
        )
        self.save(draft)
        run.drafts.append(draft.draft_id)
        return draft

    def latest_bounced(self, agent: str) -> Draft | None:
        """The draft ``{{unsent}}`` stands for: the agent's latest bounce."""
        bounced = [draft for draft in self.drafts_of(agent) if draft.reason == prose.REASON_BOUNCED]
        return bounced[-1] if bounced else None

    def dismiss(self, draft: Draft) -> None:
        draft.state = "dismissed"
        self.save(draft)

    def tell_untold(self, agent: str) -> list[Draft]:
        """Held drafts no receipt or notice named yet (their turn ended without closing),
        marked told: the caller names them now."""
        untold = [draft for draft in self.drafts_of(agent) if not draft.told and draft.state == "held"]
        for draft in untold:
            draft.told = True
            self.save(draft)
        return untold

    def made_in(self, run: TurnRun) -> list[Draft]:
        """The drafts ``run``'s turn made, marked told (its receipt names them)."""
        made = [draft for draft in self.drafts_of(run.turn.agent) if draft.draft_id in run.drafts]
        for draft in made:
            if not draft.told:
                draft.told = True
                self.save(draft)
        return made

    # -- a draft's sends ---------------------------------------------------------------------

    def attempted(self, draft: Draft, delivery: Delivery) -> None:
        """Record a finished send of ``draft`` (journaled) and move its state."""
        attempt = Attempt(delivery.ref.server_id, delivery.ref.channel_id, delivery.shown, time.time(), delivery.outcome, delivery.reason)
        if draft.attempts and draft.attempts[-1].outcome == "sending":
            draft.attempts[-1] = attempt
        else:
            draft.attempts.append(attempt)
        draft.state = {"delivered": "delivered", "unknown": "unconfirmed"}.get(delivery.outcome, draft.state)  # type: ignore[assignment]
        self.save(draft)

    def mark_sending(self, draft: Draft, ref: ChannelRef) -> None:
        """Journal a ``sending`` attempt of ``draft`` to ``ref`` (before its publish goes out)."""
        draft.attempts.append(Attempt(ref.server_id, ref.channel_id, self._names.name_shown(ref), time.time(), "sending"))
        self.save(draft)

    async def recorded_before_sending(self, draft: Draft, ref: ChannelRef, round_: int) -> bool:
        """Wait until the draft's ``sending`` mark is on disk; if the journal can't, the send
        doesn't go out and the attempt is recorded failed (nothing was sent), the draft held."""
        try:
            await self._journal.flush()
        except JournalFailure as exc:
            self._log.error("draft.not_recorded", draft=draft.draft_id, server=ref.server_id, channel=ref.channel_id, error=str(exc))
            self.attempted(draft, Delivery(ref, self._names.name_shown(ref), "failed", round_, reason=texts.Reason.NOT_RECORDED))
            return False
        return True


def receipt_of(run: TurnRun, names: ChannelNames) -> str | None:
    """The turn's receipt text, in its mode's words (None for a mode that has none)."""
    deliveries = run.turn.routing.deliveries

    def shown(outcome: str) -> list[str]:
        # Each place once (by its ref), in delivery order, by the name the agent is shown
        # now: a name taken at delivery may no longer mean that place alone.
        refs = dict.fromkeys(d.ref for d in deliveries if d.outcome == outcome)
        return list(dict.fromkeys(names.name_shown(ref) for ref in refs))

    return run.mode.receipt(
        ReceiptFacts(
            delivered=shown("delivered"),
            unknown=shown("unknown"),
            failed=shown("failed"),
            drafts=run.drafts,
            private=run.private,
            suppressed=run.suppressed,
            kept=run.kept,
        )
    )
