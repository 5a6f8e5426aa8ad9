"""``explicit``: plain words go only where a ``>>target`` line sends them.

There is no locus: the first valid target sticks for the turn, words with no target bounce
(a draft, a notice, another turn), and so does a failed delivery. Typing shows on the
trigger's channel. There is no receipt: the bounces and deliveries say it all.
"""

from __future__ import annotations

from typing import ClassVar

from mcpl_router.routing import prose, texts
from mcpl_router.routing.modes.base import ProseMode, ReceiptFacts
from mcpl_router.routing.refs import ChannelRef


class ExplicitMode(ProseMode):
    name: ClassVar[str] = "explicit"
    keeps_pins: ClassVar[bool] = True
    bounces_failed_delivery: ClassVar[bool] = True
    help_text: ClassVar[str] = texts.PROSE_HELP_EXPLICIT

    def route(
        self, text: str, state: prose.ProseState, *, locus: ChannelRef | None, resolve: prose.Resolve, silenced: bool
    ) -> list[prose.Segment]:
        # A send in the round silences nothing here: every word already says where it goes.
        return prose.decide_explicit(text, state, resolve)

    def invitation_reply(self, picked: str | None, *, token: str | None, may_publish: bool) -> str:
        # The token, not ``picked``: for a channel whose id is skip_reply, ``picked`` is that id,
        # which the line reads as private speech; the token is then its qualified name.
        if token is not None:
            return texts.invitation_reply_prefix(f"{prose.EXPLICIT}{token}")
        return texts.INVITATION_REPLY_NONE

    def receipt(self, facts: ReceiptFacts) -> str | None:
        return None


EXPLICIT = ExplicitMode()
