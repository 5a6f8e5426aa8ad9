"""What an operator reads: ``explain``'s rules, in words.
"""

from __future__ import annotations

from typing import Final

# ---------------------------------------------------------------------- explain's rules

_RULE_TEXTS: Final = {
    "exact-pair": "serverId with channelId names exactly that pair",
    "one-match": "exactly one channel answers to the name, by its id, its serverId:channelId"
    " or a DM's label",
    "ambiguous": "more than one channel answers to the name, so it is refused, naming each"
    " candidate by the name that picks it alone, or by its route where no name does",
    "qualified-pair": "exactly one registered pair's serverId:channelId is the name (a gate"
    " rule's channel entry is read that way only)",
    "unknown": "no channel answers to the name",
    "not-on-server": "serverId with channelId names exactly that pair, and that server has no"
    " such channel",
    "qualified-with-server": "a serverId:channelId name was given with a serverId; that pair is"
    " no channel, and the name alone is one",
    "no-name": "no name was given",
}


def rule_text(rule: str) -> str:
    """What a resolver rule (or refusal kind) means, in words, for ``explain``."""
    return _RULE_TEXTS.get(rule, rule)
