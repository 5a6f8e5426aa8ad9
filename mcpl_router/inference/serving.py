"""Which host connection serves which agent's model: ``session/hello``'s ``serves``.

A host declares, per kind (``inference``: it answers ``inference/request``; ``modelInfo``: it
answers ``model/info``), the agents it owns on that connection whose model it serves. The
declaration holds while the connection owns the agent and ends with the connection; a later
hello on the same connection adds to it, as it adds agents.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Final

from mcpl_router.jsonrpc import INVALID_PARAMS, RpcError

if TYPE_CHECKING:
    from mcpl_router.inference.ports import HostEnd

__all__ = ["INFERENCE", "KINDS", "MODEL_INFO", "Serving"]

INFERENCE: Final = "inference"
MODEL_INFO: Final = "modelInfo"
KINDS: Final = (INFERENCE, MODEL_INFO)


class Serving:
    """The hosts' declarations, per connection and kind.

    Args:
        owner_of: the connection owning an agent now: a declaration counts only there, so an
            agent taken over by the host's newer connection is served by that one's, if any.
    """

    def __init__(self, owner_of: Callable[[str], HostEnd | None]) -> None:
        self._owner_of = owner_of
        self._declared: dict[HostEnd, dict[str, set[str]]] = {}

    @staticmethod
    def check(declared: Mapping[str, Collection[str]], claimable: Collection[str]) -> None:
        """Refuse (-32602, naming it) an agent in ``declared`` that is not one of ``claimable``:
        the agents the connection owns or claims in this hello. Call before claiming anything."""
        for kind, agents in declared.items():
            for agent in agents:
                if agent not in claimable:
                    raise RpcError(
                        INVALID_PARAMS,
                        f"serves.{kind}: agent {agent!r} is not one this connection owns or claims in "
                        "this hello, so it can't serve its model. Nothing was claimed. List it in "
                        "agents (or claim it first).",
                        {"field": f"serves.{kind}", "agent": agent},
                    )

    def declare(self, connection: HostEnd, declared: Mapping[str, Collection[str]]) -> dict[str, list[str]]:
        """Add ``declared`` to what ``connection`` serves; returns all it serves now (hello's echo)."""
        mine = self._declared.setdefault(connection, {kind: set() for kind in KINDS})
        for kind, agents in declared.items():
            mine[kind].update(agents)
        return self.serves_of(connection)

    def serves_of(self, connection: HostEnd) -> dict[str, list[str]]:
        mine = self._declared.get(connection, {})
        return {kind: sorted(mine.get(kind, ())) for kind in KINDS}

    def host_for(self, agent: str, kind: str) -> HostEnd | None:
        """The connection serving ``agent``'s model for ``kind`` now, if one does."""
        owner = self._owner_of(agent)
        if owner is None or agent not in self._declared.get(owner, {}).get(kind, ()):
            return None
        return owner

    def forget(self, connection: HostEnd) -> None:
        self._declared.pop(connection, None)
