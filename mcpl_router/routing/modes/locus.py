"""``locus`` (the default): plain words go to the conversation that woke the turn.

No conversation, or several competing, holds them as drafts rather than guessing; a round
with an explicit send holds its plain text (send-silencing).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from mcpl_router.routing import prose, texts
from mcpl_router.routing.modes.base import ProseMode
from mcpl_router.routing.refs import ChannelRef


class LocusMode(ProseMode):
    name: ClassVar[str] = "locus"
    infers_locus: ClassVar[bool] = True
    help_text: ClassVar[str] = texts.PROSE_HELP_LOCUS

    def route(
        self, text: str, state: prose.ProseState, *, locus: ChannelRef | None, resolve: prose.Resolve, silenced: bool
    ) -> list[prose.Segment]:
        return [prose.locus_route(text, locus, state, silenced)]

    def routing_line(self, locus: str | None, competing: Sequence[str], *, held_ambiguous: bool) -> str | None:
        if locus is not None:
            return texts.speech_lands_in(locus)
        if held_ambiguous:
            return texts.speech_held(competing)
        return texts.SPEECH_NO_DESTINATION_HELD

    def invitation_reply(self, picked: str | None, *, token: str | None, may_publish: bool) -> str:
        return texts.invitation_reply_locus()


LOCUS = LocusMode()
