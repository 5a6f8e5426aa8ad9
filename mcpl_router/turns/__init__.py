"""The turn shell: carries out, over the server links, what routing decides for each turn.

:class:`TurnManager` opens, keeps and closes turns (:mod:`.manager`); a round's words are routed
and published by :mod:`.speech`; typing is :mod:`.typing`'s; drafts and receipts
:mod:`.drafts`'; the inference lifecycle :mod:`.lifecycle`'s; every send to one channel goes
through :mod:`.sends` on that channel's own server. The decisions themselves are pure and
live in :mod:`mcpl_router.routing`.
"""

from __future__ import annotations

from mcpl_router.turns.drafts import DraftBook
from mcpl_router.turns.invitations import Invitations
from mcpl_router.turns.lifecycle import REFUSAL_REACTION
from mcpl_router.turns.manager import TurnManager
from mcpl_router.turns.run import (
    CHANNEL_REFUSED,
    DAEMON_DRAINING,
    FINISH_GRACE,
    LEASE,
    PUBLISH_TIMEOUT,
    TURN_NOT_OPEN,
    TYPING_INTERVAL,
    WAKE_UNKNOWN,
    TurnRun,
    TurnTimings,
)
from mcpl_router.turns.sends import ACK_INTENT_DECLINED, ACK_INTENT_REFUSED, acknowledge_message, publish_text
from mcpl_router.turns.speech import Speech
from mcpl_router.turns.typing import TypingIndicators
from mcpl_router.turns.wakes import message_ids_of, wake_fact

__all__ = [
    "ACK_INTENT_DECLINED",
    "ACK_INTENT_REFUSED",
    "CHANNEL_REFUSED",
    "DAEMON_DRAINING",
    "FINISH_GRACE",
    "LEASE",
    "PUBLISH_TIMEOUT",
    "REFUSAL_REACTION",
    "TURN_NOT_OPEN",
    "TYPING_INTERVAL",
    "WAKE_UNKNOWN",
    "DraftBook",
    "Invitations",
    "Speech",
    "TurnManager",
    "TurnRun",
    "TurnTimings",
    "TypingIndicators",
    "acknowledge_message",
    "message_ids_of",
    "publish_text",
    "wake_fact",
]
