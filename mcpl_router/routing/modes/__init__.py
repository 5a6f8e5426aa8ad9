"""The prose-routing modes (``proseRouting``), one value each.

Each mode's file says all that mode does differently (see :class:`ProseMode` for the questions
every mode answers); nothing outside this package asks a mode its name to decide something.
A sixth mode is one new file and one entry in :data:`MODES`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from mcpl_router.routing.modes.base import ProseMode, ReceiptFacts, SilentAction
from mcpl_router.routing.modes.disabled import DISABLED
from mcpl_router.routing.modes.explicit import EXPLICIT
from mcpl_router.routing.modes.hybrid import HYBRID
from mcpl_router.routing.modes.locus import LOCUS
from mcpl_router.routing.modes.named import NAMED

__all__ = [
    "DEFAULT_MODE",
    "MODES",
    "MODE_NAMES",
    "ProseMode",
    "ReceiptFacts",
    "SilentAction",
    "mode_named",
]

#: Every mode by its config name, in the order docs and config messages list them.
MODES: Final[Mapping[str, ProseMode]] = {mode.name: mode for mode in (DISABLED, LOCUS, HYBRID, EXPLICIT, NAMED)}
MODE_NAMES: Final = tuple(MODES)
DEFAULT_MODE: Final[ProseMode] = LOCUS


def mode_named(name: str) -> ProseMode:
    """The mode called ``name``. Config validation refuses any other name before this is asked."""
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"not a prose routing mode: {name!r} (one of {', '.join(MODE_NAMES)})") from None
