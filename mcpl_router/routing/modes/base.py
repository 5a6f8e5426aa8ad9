"""What every prose-routing mode answers: the questions the turn shell asks of a mode.

A mode is a value (one instance per mode, see :mod:`mcpl_router.routing.modes`), not a string
compared here and there: the shell asks ``mode.infers_locus`` or ``mode.receipt(...)`` and
never which mode it holds, so what one mode does differently is read in that mode's own file.
The defaults below are those of a mode whose plain words are routed somewhere; each mode's
file overrides what it does otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Final, Literal

import attrs

from mcpl_router.routing import prose, texts
from mcpl_router.routing.refs import ChannelRef

__all__ = ["ProseMode", "ReceiptFacts", "SilentAction"]

#: What a mode that never posts plain words does with them: ``suppressed`` (counted, the agent
#: told only send tools publish) or ``kept`` (left in the agent's context, handed to no one).
SilentAction = Literal["suppressed", "kept"]

SUPPRESSED: Final = "suppressed"
KEPT: Final = "kept"


@attrs.frozen
class ReceiptFacts:
    """What a turn did with its plain words, as a receipt reads it (names as shown now)."""

    delivered: Sequence[str] = ()
    unknown: Sequence[str] = ()
    failed: Sequence[str] = ()
    drafts: Sequence[str] = ()
    private: int = 0
    suppressed: int = 0
    kept: int = 0


class ProseMode:
    """One prose-routing mode (``proseRouting``). Subclasses set the class attributes.

    Attributes:
        name: the config and wire name (``proseRouting``).
        silent_action: what plain words become when this mode never posts them; None when
            they are routed (to a locus, a pin or an envelope's target).
        infers_locus: a turn's plain speech goes to the conversation that woke it (the locus,
            :func:`~mcpl_router.routing.prose.locus_of`); mid-turn arrivals may hold it, and
            a ``channel_open`` that sets the speech target moves it.
        keeps_pins: a ``>>``/``>>>`` target sticks for later words of the turn.
        target_prefix: how an envelope line begins (bounce candidates and examples are written
            with it).
        tells_pin_changes: the turn gets a ``[routing]`` notice when a ``>>>`` moves where
            speech lands, and when later words turn private or held.
        bounces_failed_delivery: a failed delivery of a segment bounces it (a draft and a
            notice that wakes the agent again) rather than only being noted.
        sends_only_where_named: a send must name its channel: nothing falls back to a default
            channel, a locus or a pin.
        reacts_to_refusal: a turn the model provider refused marks the message it answered.
        help_text: what ``prose_help`` answers.
    """

    name: ClassVar[str]
    silent_action: ClassVar[SilentAction | None] = None
    infers_locus: ClassVar[bool] = False
    keeps_pins: ClassVar[bool] = False
    target_prefix: ClassVar[str] = prose.EXPLICIT
    tells_pin_changes: ClassVar[bool] = False
    bounces_failed_delivery: ClassVar[bool] = False
    sends_only_where_named: ClassVar[bool] = False
    reacts_to_refusal: ClassVar[bool] = True
    help_text: ClassVar[str]

    def __repr__(self) -> str:
        return f"<prose mode {self.name}>"

    @property
    def speaks(self) -> bool:
        """Plain words can be posted at all (so typing shows, and ``sleep`` may announce)."""
        return self.silent_action is None

    # -- deciding where words go -----------------------------------------------------------

    def segments(
        self,
        text: str,
        state: prose.ProseState,
        *,
        locus: ChannelRef | None,
        resolve: prose.Resolve,
        silenced: bool = False,
    ) -> list[prose.Segment]:
        """Where a round's text goes, in order; moves ``state`` (pins, holds) as it reads.

        Args:
            text: the round's whole text.
            state: the turn's prose state.
            locus: the turn's locus when the words were written (None: no destination).
            resolve: a target token → :class:`~mcpl_router.routing.prose.Target` (the one
                resolver, the turn's own channels first).
            silenced: the round made an explicit send (its plain text is then held).
        """
        if not text.strip():
            return []
        if self.silent_action is not None:
            return [prose.Segment(self.silent_action, text)]
        if state.all_private:
            return [prose.Segment("private", text)]
        return self.route(text, state, locus=locus, resolve=resolve, silenced=silenced)

    def route(
        self,
        text: str,
        state: prose.ProseState,
        *,
        locus: ChannelRef | None,
        resolve: prose.Resolve,
        silenced: bool,
    ) -> list[prose.Segment]:
        """A speaking mode's own reading of a round's words (after the shared checks)."""
        raise NotImplementedError(f"prose mode {self.name} posts no plain text")

    # -- what the agent is told ------------------------------------------------------------

    def system_lines(self, *, may_publish: bool, subagent: bool) -> list[str]:
        """Lines the host puts at the system position of every request of the turn."""
        return []

    def routing_line(self, locus: str | None, competing: Sequence[str], *, held_ambiguous: bool) -> str | None:
        """The turn's opening line on where plain speech lands (None: this mode has none).

        ``locus`` is the locus's shown name; ``competing`` the conversations that held it.
        """
        return None

    def invitation_reply(self, picked: str | None, *, token: str | None, may_publish: bool) -> str:
        """The closed-channel invitation's first option: how this agent reaches that channel
        alone. ``picked``: the one name that picks it, if any (a ``channelId``); ``token``: the
        one ``>>``/``>>>`` target token that reaches it alone, if any
        (:func:`~mcpl_router.routing.prose.target_token`), which may be its qualified name
        where ``picked`` is its id: ``skip_reply`` is a fine ``channelId`` and no target."""
        if may_publish and picked is not None:
            return texts.invitation_reply_publish(picked)
        return texts.INVITATION_REPLY_NONE

    def receipt(self, facts: ReceiptFacts) -> str | None:
        """The turn's receipt text (None: this mode has none)."""
        notes: list[str] = []
        if facts.drafts:
            notes.append(texts.note_drafts(facts.drafts))
        if facts.unknown:
            notes.append(texts.note_unconfirmed(facts.unknown))
        if facts.failed:
            notes.append(texts.note_failed(facts.failed))
        if facts.private:
            notes.append(texts.note_private(facts.private))
        if facts.suppressed:
            notes.append(texts.note_suppressed(facts.suppressed))
        return texts.prose_receipt(facts.delivered, notes)

    # -- the speech tools' descriptions ----------------------------------------------------

    @property
    def skip_reply_description(self) -> str:
        return texts.SKIP_REPLY_DESCRIPTION_ROUTED

    @property
    def think_description(self) -> str:
        return texts.THINK_DESCRIPTION + (texts.THINK_DESCRIPTION_ROUTED if self.speaks else "")

    @property
    def sleep_description(self) -> str:
        return texts.SLEEP_DESCRIPTION_ANNOUNCES if self.speaks else texts.SLEEP_DESCRIPTION_QUIET
