"""An agent as the daemon serves it (:class:`AgentSpec`): its prose-routing mode, the tools it may
call, its wake policy, home channel, wake gate and conversation forks.

An agent comes from the operator's config (``agents``) or from a host's ``session/hello``; either
way the daemon holds one :class:`AgentSpec`. Reading one from either source is the config's and
the host API's business (``hosts/agents.py``); every part above routing reads the spec from here.
Pure.
"""

from __future__ import annotations

import fnmatch

import attrs

from mcpl_router.routing.forks import ConversationsSpec
from mcpl_router.routing.gating import WakeGateSpec
from mcpl_router.routing.modes import DEFAULT_MODE, ProseMode, mode_named
from mcpl_router.routing.refs import ChannelRef

__all__ = ["AgentSpec", "agent_may_call"]


@attrs.frozen
class AgentSpec:
    """An agent as the daemon serves it: prose routing, tools, wake policy, home channel.

    ``wake_tags`` of ``None`` means the default policy's tags (see
    :mod:`mcpl_router.routing.wakes`); ``allowed_tools`` of ``None`` allows every tool.
    """

    name: str
    prose_routing: str = DEFAULT_MODE.name
    allowed_tools: tuple[str, ...] | None = None
    home_channel: ChannelRef | None = None
    wake_channels: tuple[str, ...] = ()
    wake_servers: tuple[str, ...] = ()
    wake_tags: tuple[str, ...] | None = None
    #: Declared in the daemon's config (its spec is the operator's, not the host's).
    configured: bool = False
    #: The primary agent this one is the subconscious of (its tune-out tools act on the primary's).
    subconscious_for: str | None = None
    #: When its admitted wakes go out (routing/gating.py; hosts/gate.py runs it).
    wake_gate: WakeGateSpec = WakeGateSpec()
    #: Its conversation forks (routing/forks.py; hosts/forks.py runs them), or None.
    conversations: ConversationsSpec | None = None

    @property
    def mode(self) -> ProseMode:
        """The agent's prose-routing mode (config and hello validate the name)."""
        return mode_named(self.prose_routing)

    def to_wire(self) -> dict[str, object]:
        wake: dict[str, object] = {"channels": list(self.wake_channels), "servers": list(self.wake_servers)}
        if self.wake_tags is not None:
            wake["tags"] = list(self.wake_tags)
        return {
            "name": self.name,
            "proseRouting": self.prose_routing,
            "allowedTools": None if self.allowed_tools is None else list(self.allowed_tools),
            "wake": wake,
            "homeChannel": None if self.home_channel is None else self.home_channel.to_wire(),
            "configured": self.configured,
            "subconsciousFor": self.subconscious_for,
            "wakeGate": self.wake_gate.to_wire(),
            "conversations": None if self.conversations is None else self.conversations.to_wire(),
        }


def agent_may_call(agent: AgentSpec | None, name: str) -> bool:
    """The agent's allowed tools (globs); ``None`` allows every tool (so does no spec at all)."""
    if agent is None or agent.allowed_tools is None:
        return True
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in agent.allowed_tools)
