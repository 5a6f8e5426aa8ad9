"""``hybrid``: plain words as in locus mode, and ``>>> target`` lines that pin a destination.

A pin wins over the locus until another ``>>>`` line or a ``channel_open`` that sets the
speech target; ``>>>skip_reply`` makes later unprefixed words private; a failed ``>>>`` holds
them as drafts until a new target works. The turn is told each of these changes.
"""

from __future__ import annotations

from typing import ClassVar

from mcpl_router.routing import prose, texts
from mcpl_router.routing.modes.locus import LocusMode
from mcpl_router.routing.refs import ChannelRef


class HybridMode(LocusMode):
    name: ClassVar[str] = "hybrid"
    keeps_pins: ClassVar[bool] = True
    target_prefix: ClassVar[str] = prose.PIN
    tells_pin_changes: ClassVar[bool] = True
    help_text: ClassVar[str] = texts.PROSE_HELP_HYBRID

    def route(
        self, text: str, state: prose.ProseState, *, locus: ChannelRef | None, resolve: prose.Resolve, silenced: bool
    ) -> list[prose.Segment]:
        return prose.decide_hybrid(text, state, locus, resolve, silenced)

    def invitation_reply(self, picked: str | None, *, token: str | None, may_publish: bool) -> str:
        # The token, not ``picked``: for a channel whose id is skip_reply, ``picked`` is that id,
        # which the line reads as private speech; the token is then its qualified name.
        if token is not None:
            return texts.invitation_reply_prefix(f"{prose.PIN} {token}")
        return texts.INVITATION_REPLY_NONE


HYBRID = HybridMode()
