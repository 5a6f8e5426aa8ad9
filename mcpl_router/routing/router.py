"""The Router: the one routing state, owned by the daemon's root nursery.

It holds the channel registry and the name resolver over it (and, as the host socket grows, the
turns, typing and streams). Mutated only from trio tasks of the daemon, never from threads.
"""

from __future__ import annotations

import attrs

from mcpl_router.routing.names import ChannelNames
from mcpl_router.routing.registry import ChannelRegistry


@attrs.define
class Router:
    registry: ChannelRegistry = attrs.field(factory=ChannelRegistry)
    names: ChannelNames = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.names = ChannelNames(self.registry)
