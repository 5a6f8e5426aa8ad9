"""``named``: plain words are never posted nor handed to anyone; they stay in the agent's context.

To speak, the agent calls a send tool that names where it goes: a ``channel_publish`` with no
``channelId`` goes nowhere (no default channel). Every request of its turns carries a system
line saying so; its receipt counts only the words kept; a refused turn leaves no reaction.
"""

from __future__ import annotations

from typing import ClassVar

from mcpl_router.routing import texts
from mcpl_router.routing.modes.base import KEPT, ProseMode, ReceiptFacts, SilentAction


class NamedMode(ProseMode):
    name: ClassVar[str] = "named"
    silent_action: ClassVar[SilentAction | None] = KEPT
    sends_only_where_named: ClassVar[bool] = True
    reacts_to_refusal: ClassVar[bool] = False
    help_text: ClassVar[str] = texts.PROSE_HELP_NAMED

    def system_lines(self, *, may_publish: bool, subagent: bool) -> list[str]:
        return [texts.named_line(may_publish=may_publish, subagent=subagent)]

    def invitation_reply(self, picked: str | None, *, token: str | None, may_publish: bool) -> str:
        if may_publish and picked is not None:
            return texts.invitation_reply_publish(picked)
        return texts.INVITATION_REPLY_SEND_TOOL

    def receipt(self, facts: ReceiptFacts) -> str | None:
        return texts.prose_receipt([], [texts.note_named(facts.kept)] if facts.kept else [])

    @property
    def skip_reply_description(self) -> str:
        return texts.SKIP_REPLY_DESCRIPTION_NAMED


NAMED = NamedMode()
