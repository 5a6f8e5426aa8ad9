"""The seam between turns and the tools a model may call through its host.

A :class:`ToolProvider` says which names it may offer (:meth:`~ToolProvider.tool_names`),
offers tool specs for a turn and executes calls. The names of every provider go into one
table (:class:`~mcpl_router.tools.table.ToolTable`), where each offered name means exactly one
tool; the TurnManager lists a turn's tools at ``turn/open`` and dispatches each ``turn/tool``
through that table, after checking the agent's allowed tools **at dispatch** (a name the agent
may not call is refused even when the host calls it without listing it).

Providers: the daemon's channel tools (:mod:`mcpl_router.tools.channel_tools`), the speech
tools of prose routing (:mod:`mcpl_router.tools.speech_tools`), tune-out and the subconscious
tools (:mod:`mcpl_router.tools.tune_out`), and the servers' own MCP tools
(:mod:`mcpl_router.tools.connector_tools`).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import attrs

if TYPE_CHECKING:
    from mcpl_router.routing.agents import AgentSpec
    from mcpl_router.routing.refs import ChannelRef
    from mcpl_router.routing.turns import CallScope
    from mcpl_router.turns import TurnRun

#: A tool as ``turn/open`` offers it: ``{name, description, inputSchema}``.
ToolSpec = dict[str, object]


@attrs.frozen
class ServerTool:
    """A server's own tool, held as the pair it is (never a string joined from the two)."""

    server_id: str
    tool: str


@attrs.frozen
class ToolName:
    """One name a provider may offer, and what it means.

    Attributes:
        name: the name the model sees and calls.
        server_tool: for a server's own tool, which server and which of its tools; None for
            one of the daemon's own tools (whose names are reserved).
    """

    name: str
    server_tool: ServerTool | None = None


@attrs.frozen
class ToolCall:
    """One ``turn/tool`` call, with what decides what it may touch.

    Attributes:
        run: the open turn the host sent the call in (its ``turnId``).
        scope: the turn the call was *made* in, when that is the agent's open turn
            (``scope.turn``), else a scope that reads no turn's own channels and moves no
            routing (a script left running after its turn).
        agent: the agent's spec (``prose_routing``, ``allowed_tools``, …).
        tool: the tool the called name means, as the name table holds it (for a server's
            tool, the ``(serverId, tool)`` pair).
    """

    run: TurnRun
    scope: CallScope
    agent: AgentSpec
    call_id: str
    tool: ToolName
    arguments: dict[str, object]

    @property
    def name(self) -> str:
        """The name the model called."""
        return self.tool.name


def tool_result(text: str, *, error: bool = False, reason: str | None = None, data: Mapping[str, object] | None = None) -> dict[str, object]:
    """A tool result as the model sees it: text content, ``isError``, and machine-readable extras.

    ``reason`` is a stable string for refusals; ``data`` lands in ``structuredContent`` (e.g.
    ``serverId`` of the channel a call acted on).
    """
    result: dict[str, object] = {"content": [{"type": "text", "text": text}], "isError": error}
    if reason is not None:
        result["reason"] = reason
    if data is not None:
        result["structuredContent"] = data
    return result


class ToolProvider(Protocol):
    def tool_names(self) -> Iterable[ToolName]:
        """Every name this provider may offer now (whoever the agent): the name table's input.

        A daemon provider's names are fixed; a provider whose names change tells the table to
        rebuild (:meth:`~mcpl_router.tools.table.ToolTable.rebuild`).
        """
        ...

    def tools_for(self, agent: AgentSpec, run: TurnRun) -> list[ToolSpec]:
        """Tool specs offered to this agent in this turn (the table drops any name it refused).

        A list once returned is never changed, nor are the specs in it: while a provider
        returns the very same list object, the table serves the agent its filtered answer
        from before (:meth:`~mcpl_router.tools.table.ToolTable.offered`). Different tools
        mean a new list.
        """
        ...

    def is_send(self, tool: ToolName, arguments: Mapping[str, object]) -> bool:
        """Whether this call posts somewhere: its round's plain text is then held."""
        ...

    async def call(self, call: ToolCall) -> dict[str, object]:
        """Execute; return :func:`tool_result`. Refusals are results, not exceptions."""
        ...


def same_objects(before: Sequence[object], now: Sequence[object]) -> bool:
    """Whether two sequences hold the very same objects, in order: compared by identity, in C
    (no Python step an item: every ``turn/open`` asks it of what its tool list is made of)."""
    return len(before) == len(now) and all(map(operator.is_, before, now))


def record_explicit_send(call: ToolCall, ref: ChannelRef) -> None:
    """A send tool delivered to ``ref``: engage it for the calling turn, note the round.

    Only a call made inside the turn engages anything (``callingTurnOf``). The round is
    noted so prose routing can hold that round's plain text (send-silencing).
    """
    if not call.scope.may_move_routing or call.scope.turn is None:
        return
    call.scope.turn.routing.engage(ref)
    call.run.explicit_send_rounds.add(call.run.turn.round)
