"""Agents as hosts declare them (the wire), and the :class:`~mcpl_router.routing.agents.AgentSpec`
read from a declaration or from the operator's config.

Host-declared specs are journaled (as the ``session/hello`` params :func:`params_of` gives), so
they survive a restart.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from mcpl_router.config import AgentConfig
from mcpl_router.config.errors import Problems
from mcpl_router.config.read_conversations import parse_conversations
from mcpl_router.config.read_gate import parse_wake_gate
from mcpl_router.config.section_reader import Section
from mcpl_router.routing.agents import AgentSpec
from mcpl_router.routing.forks import ConversationsSpec
from mcpl_router.routing.gating import WakeGateSpec
from mcpl_router.routing.modes import DEFAULT_MODE, MODE_NAMES
from mcpl_router.routing.refs import ChannelRef

__all__ = [
    "AckParams",
    "AgentSpecParams",
    "ChannelRefParams",
    "HelloParams",
    "ServesParams",
    "WakeParams",
    "params_of",
    "spec_from_config",
    "spec_from_params",
]

#: The wire's names of the prose-routing modes (``routing/modes/`` holds what each does).
ProseRouting = Literal[MODE_NAMES]  # type: ignore[valid-type]


# -- wire ----------------------------------------------------------------------------------------


class ChannelRefParams(msgspec.Struct, rename="camel"):
    server_id: str
    channel_id: str


class WakeParams(msgspec.Struct, rename="camel"):
    channels: list[str] | None = None
    servers: list[str] | None = None
    tags: list[str] | None = None


class AgentSpecParams(msgspec.Struct, rename="camel"):
    name: str
    prose_routing: ProseRouting = DEFAULT_MODE.name
    allowed_tools: list[str] | None = None
    wake: WakeParams | None = None
    home_channel: ChannelRefParams | None = None
    #: Makes this agent the subconscious of the named (primary) agent (see mcpl_router.tools.tune_out).
    subconscious_for: str | None = None
    #: The wake gate, as in the config's ``agents.<name>.wakeGate`` (docs/wake-policy.md).
    wake_gate: dict[str, object] | None = None
    #: Conversation forks, as in the config's ``agents.<name>.conversations`` (docs/forks.md).
    conversations: dict[str, object] | None = None

    def __post_init__(self) -> None:
        # Read now, so a bad gate is refused (-32602) with the config's words, key and fix.
        gate_of_params(self)
        conversations_of_params(self)


class ServesParams(msgspec.Struct, rename="camel"):
    """The agents (owned on this connection) whose model the host serves to servers that ask."""

    inference: list[str] = []
    model_info: list[str] = []

    def by_kind(self) -> dict[str, list[str]]:
        return {"inference": self.inference, "modelInfo": self.model_info}


class HelloParams(msgspec.Struct, rename="camel"):
    host: str
    agents: list[AgentSpecParams] = []
    resume_from: int | None = None
    serves: ServesParams | None = None


class AckParams(msgspec.Struct, rename="camel"):
    seqs: list[int] | None = None
    seq: int | None = None
    agent: str | None = None


# -- reading a spec ------------------------------------------------------------------------------


def spec_from_config(config: AgentConfig) -> AgentSpec:
    """The spec of an agent the operator's config declares."""
    return AgentSpec(
        name=config.name,
        prose_routing=config.prose_routing,
        allowed_tools=config.allowed_tools,
        home_channel=config.home_channel,
        wake_channels=config.wake_channels,
        wake_servers=config.wake_servers,
        # The config can't tell "no tags" from "not given": empty means the default.
        wake_tags=config.wake_tags or None,
        subconscious_for=config.subconscious_for,
        wake_gate=config.wake_gate,
        conversations=config.conversations,
        configured=True,
    )


def spec_from_params(params: AgentSpecParams) -> AgentSpec:
    """The spec of an agent a host declared in ``session/hello`` (or its journaled copy)."""
    wake = params.wake or WakeParams()
    home = params.home_channel
    return AgentSpec(
        name=params.name,
        prose_routing=params.prose_routing,
        allowed_tools=None if params.allowed_tools is None else tuple(params.allowed_tools),
        home_channel=None if home is None else ChannelRef(home.server_id, home.channel_id),
        wake_channels=tuple(wake.channels or ()),
        wake_servers=tuple(wake.servers or ()),
        wake_tags=None if wake.tags is None else tuple(wake.tags),
        subconscious_for=params.subconscious_for or None,
        wake_gate=gate_of_params(params),
        conversations=conversations_of_params(params),
    )


def params_of(spec: AgentSpec) -> AgentSpecParams:
    """The spec as ``session/hello`` would declare it (how a host-declared agent is journaled)."""
    return AgentSpecParams(
        name=spec.name,
        prose_routing=spec.prose_routing,
        allowed_tools=None if spec.allowed_tools is None else list(spec.allowed_tools),
        wake=WakeParams(
            channels=list(spec.wake_channels),
            servers=list(spec.wake_servers),
            tags=None if spec.wake_tags is None else list(spec.wake_tags),
        ),
        home_channel=None
        if spec.home_channel is None
        else ChannelRefParams(spec.home_channel.server_id, spec.home_channel.channel_id),
        subconscious_for=spec.subconscious_for,
        wake_gate=spec.wake_gate.to_wire() if spec.wake_gate != WakeGateSpec() else None,
        conversations=None if spec.conversations is None else spec.conversations.to_wire(),
    )


def gate_of_params(params: AgentSpecParams) -> WakeGateSpec:
    """A hello's ``wakeGate``, read as the config's is.

    Raises:
        ValueError: every problem, each with its key and fix (msgspec makes it -32602).
    """
    if params.wake_gate is None:
        return WakeGateSpec()
    problems = Problems("session/hello")
    spec = parse_wake_gate(Section(problems, f"agents.{params.name}", {"wakeGate": params.wake_gate}), None)
    if problems.errors:
        raise ValueError(" ".join(str(error) for error in problems.errors))
    return spec


def conversations_of_params(params: AgentSpecParams) -> ConversationsSpec | None:
    """A hello's ``conversations``, read as the config's are.

    Raises:
        ValueError: every problem, each with its key and fix (msgspec makes it -32602).
    """
    if params.conversations is None:
        return None
    problems = Problems("session/hello")
    spec = parse_conversations(Section(problems, f"agents.{params.name}", {"conversations": params.conversations}), params.name)
    if problems.errors:
        raise ValueError(" ".join(str(error) for error in problems.errors))
    return spec
