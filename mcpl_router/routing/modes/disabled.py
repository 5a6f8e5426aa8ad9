"""``disabled``: no plain word is ever posted (``>>``/``>>>`` lines included).

The words are counted as suppressed and the receipt says only send tools publish. With no
place plain words could land, there is no locus and no typing.
"""

from __future__ import annotations

from typing import ClassVar

from mcpl_router.routing import texts
from mcpl_router.routing.modes.base import SUPPRESSED, ProseMode, SilentAction


class DisabledMode(ProseMode):
    name: ClassVar[str] = "disabled"
    silent_action: ClassVar[SilentAction | None] = SUPPRESSED
    help_text: ClassVar[str] = texts.PROSE_HELP_DISABLED

    @property
    def skip_reply_description(self) -> str:
        return texts.SKIP_REPLY_DESCRIPTION_DISABLED


DISABLED = DisabledMode()
