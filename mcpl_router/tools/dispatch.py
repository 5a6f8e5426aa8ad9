"""``turn/tool``: a model's call, sent to the tool the name table says its name means.

The host API finds the call's turn and checks that the connection owns its agent; this decides
what the call may touch and hands it to the tool's provider. The call's scope
(:func:`~mcpl_router.routing.turns.call_scope`) decides which turn's channels it reads and
whose routing it may move: a call carrying another turn than the agent's open one reads none
of its channels and moves none of its routing, and a call in a turn that has ended (a script
left running) reads no turn's channels. The agent's allowed tools are checked here, at
dispatch, whatever the listing said.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from mcpl_router.logs import get_logger
from mcpl_router.routing import texts
from mcpl_router.routing.agents import AgentSpec, agent_may_call
from mcpl_router.routing.turns import TurnTable, call_scope
from mcpl_router.tools.seam import ToolCall, tool_result
from mcpl_router.tools.table import ToolTable

if TYPE_CHECKING:
    from mcpl_router.turns.run import TurnRun

__all__ = ["dispatch_tool_call"]


async def dispatch_tool_call(
    tools: ToolTable,
    turns: TurnTable,
    run: TurnRun,
    agent: AgentSpec,
    *,
    turn_id: str,
    call_id: str,
    name: str,
    arguments: object,
    caller_turn_id: str | None,
) -> dict[str, object]:
    """Run ``name`` for ``agent`` in ``run`` (the turn the host named, ``turn_id``); the tool's
    result, or a refusal with its reason (``unknown-tool``, ``not-permitted``)."""
    scope = call_scope(turns, run.turn.agent, caller_turn_id or turn_id)
    log = get_logger().bind(
        agent=run.turn.agent, turn=turn_id, call=call_id, tool=name,
        calling_turn=scope.turn.turn_id if scope.turn else None,
    )
    entry = tools.entry(name)
    if entry is None:
        log.info("turn.tool.unknown")
        return tool_result(texts.unknown_tool(name), error=True, reason="unknown-tool")
    if not agent_may_call(agent, name):
        log.info("turn.tool.not_permitted")
        return tool_result(texts.tool_not_permitted(name), error=True, reason="not-permitted")
    call = ToolCall(
        run=run,
        scope=scope,
        agent=agent,
        call_id=call_id,
        tool=entry.tool,
        arguments=dict(arguments) if isinstance(arguments, Mapping) else {},
    )
    result = await entry.provider.call(call)
    log.info("turn.tool.called", error=bool(result.get("isError")), reason=result.get("reason"))
    return result
