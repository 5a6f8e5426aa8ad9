"""Tags (MCPL §16): the closure hosts apply before anything reads them.

``chat:mention ⇒ chat:addressed``, ``chat:reply ⇒ chat:addressed``,
``chat:dm ⇒ chat:addressed, chat:private``; then ``chat:ambient`` is dropped when
``chat:addressed`` is present. Tags are a server's untrusted claims: they may change how an event
is treated (whom it wakes), never whether it is admitted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

ADDRESSED: Final = "chat:addressed"
AMBIENT: Final = "chat:ambient"
DM: Final = "chat:dm"

#: What each tag implies, applied once (no implied tag implies another).
IMPLIES: Final[dict[str, tuple[str, ...]]] = {
    "chat:mention": (ADDRESSED,),
    "chat:reply": (ADDRESSED,),
    DM: (ADDRESSED, "chat:private"),
}


def expand_tags(tags: Iterable[object] | None) -> tuple[str, ...]:
    """The closure of ``tags``: first-seen order, each tag once, implied tags after their source.

    Anything that isn't a ``namespace:value`` string is dropped (the tags came off the wire).
    """
    seen: dict[str, None] = {}
    for tag in tags or ():
        if not isinstance(tag, str) or ":" not in tag:
            continue
        seen[tag] = None
        for implied in IMPLIES.get(tag, ()):
            seen[implied] = None
    if ADDRESSED in seen:
        # Addressed beats ambient: the message is for someone, whatever else it claims.
        seen.pop(AMBIENT, None)
    return tuple(seen)


def tag_matches(pattern: str, tag: str) -> bool:
    """Whether ``tag`` matches ``pattern``: equal, or ``namespace:*`` for any value there."""
    if pattern.endswith(":*"):
        return tag.startswith(pattern[:-1])
    return pattern == tag


def any_tag_matches(patterns: Iterable[str], tags: Iterable[str]) -> bool:
    """Whether any of ``tags`` matches any of ``patterns``."""
    tags = tuple(tags)
    return any(tag_matches(pattern, tag) for pattern in patterns for tag in tags)
