"""The seam between turns and the tools a model may call through its host.

A :class:`ToolProvider` offers tool specs for a turn and executes calls. The TurnManager
asks every provider for its tools at ``turn/open`` and sends each ``turn/tool`` to the one
that handles the name, after checking the agent's allowed tools **at dispatch** (a name the
agent may not call is refused even when the host calls it without listing it).

Providers: the daemon's channel tools (:mod:`mcpl_router.tools.channel_tools`), the speech tools of
prose routing (:mod:`mcpl_router.tools.speech_tools`), and the servers' own MCP tools
(:mod:`mcpl_router.tools.connector_tools`).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

import attrs

if TYPE_CHECKING:
    from mcpl_router.hosts.sessions import AgentSpec
    from mcpl_router.routing.turns import CallScope
    from mcpl_router.turn_runner import _TurnRun


@attrs.frozen
class ToolCall:
    """One ``turn/tool`` call, with what decides what it may touch.

    Attributes:
        run: the open turn the host sent the call in (its ``turnId``).
        scope: the turn the call was *made* in, when that is the agent's open turn
            (``scope.turn``), else a scope that reads no turn's own channels and moves no
            routing (a script left running after its turn).
        agent: the agent's spec (``prose_routing``, ``allowed_tools``, …).
    """

    run: _TurnRun
    scope: CallScope
    agent: AgentSpec
    call_id: str
    name: str
    arguments: dict[str, Any]


def tool_result(text: str, *, error: bool = False, reason: str | None = None, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """A tool result as the model sees it: text content, ``isError``, and machine-readable extras.

    ``reason`` is a stable string for refusals; ``data`` lands in ``structuredContent`` (e.g.
    ``serverId`` of the channel a call acted on).
    """
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": error}
    if reason is not None:
        result["reason"] = reason
    if data is not None:
        result["structuredContent"] = data
    return result


class ToolProvider(Protocol):
    def tools_for(self, agent: AgentSpec, run: _TurnRun) -> list[dict[str, Any]]:
        """Tool specs (``{name, description, inputSchema}``) offered to this agent in this turn."""
        ...

    def handles(self, name: str) -> bool: ...

    def is_send(self, name: str, arguments: Mapping[str, Any]) -> bool:
        """Whether this call posts somewhere: its round's plain text is then held."""
        ...

    async def call(self, call: ToolCall) -> dict[str, Any]:
        """Execute; return :func:`tool_result`. Refusals are results, not exceptions."""
        ...


def agent_may_call(agent: AgentSpec | None, name: str) -> bool:
    """The agent's allowed tools (globs); ``None`` allows every tool (so does no spec at all)."""
    if agent is None or agent.allowed_tools is None:
        return True
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in agent.allowed_tools)
