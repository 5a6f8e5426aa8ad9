"""Host API methods for turns, typing and context: ``turn/*`` and ``channels/typing``.

Each ``turn/*`` method checks that the connection's session owns the turn's agent
(``SessionManager.require_owner``). The work is :class:`~mcpl_router.turns.TurnManager`'s;
this module only decodes params and shapes answers. Documented in
``docs/host-api.md`` (Turns, Typing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import msgspec

from mcpl_router.jsonrpc import Inbound, MethodTable

from mcpl_router.tools.dispatch import dispatch_tool_call

if TYPE_CHECKING:
    from mcpl_router.hosts.connection import HostConnection
    from mcpl_router.hosts.services import HostServices

__all__ = ["add_turn_methods"]

# A channel as a host names it: a name (an id, a qualified name, a DM label) or a ref object.
ChannelParam = str | dict[str, object]


class TurnOpenParams(msgspec.Struct, rename="camel"):
    agent: str
    wakes: list[int] = []
    channel: ChannelParam | None = None
    subagent: bool = False


class TurnContinueParams(msgspec.Struct, rename="camel"):
    turn_id: str
    #: The wakes this start answers (none: a budget restart, which moves nothing).
    wakes: list[int] = []


class TurnContextParams(msgspec.Struct, rename="camel"):
    turn_id: str
    model: str | None = None
    user_message: object = None


class TurnTextParams(msgspec.Struct, rename="camel"):
    turn_id: str
    round: int
    delta: str


class RoundToolCall(msgspec.Struct):
    name: str
    arguments: dict[str, object] = {}


class TurnRoundParams(msgspec.Struct, rename="camel"):
    turn_id: str
    round: int
    #: The tool calls the model made in this round (the host runs them after turn/round).
    tool_calls: list[RoundToolCall] = []


class TurnToolParams(msgspec.Struct, rename="camel"):
    turn_id: str
    call_id: str
    name: str
    arguments: object = None
    caller_turn_id: str | None = None


class TurnCloseParams(msgspec.Struct, rename="camel"):
    turn_id: str
    outcome: Literal["completed", "aborted", "failed", "refused"]
    usage: object = None


class TypingParams(msgspec.Struct, rename="camel"):
    channel: ChannelParam
    op: Literal["start", "stop"] = "start"


def add_turn_methods(table: MethodTable, services: HostServices, connection: HostConnection) -> None:
    """Add ``turn/open|continue|context|text|round|tool|close`` and ``channels/typing`` to ``table``."""
    turns, typing = services.turns, services.typing

    async def turn_open(params: TurnOpenParams, _inbound: Inbound) -> object:
        return await turns.open(
            connection, params.agent, wakes=params.wakes, channel=params.channel, subagent=params.subagent
        )

    async def turn_continue(params: TurnContinueParams, _inbound: Inbound) -> object:
        return await turns.continue_(connection, params.turn_id, wakes=params.wakes)

    async def turn_context(params: TurnContextParams, _inbound: Inbound) -> object:
        return await turns.context(connection, params.turn_id, user_message=params.user_message, model=params.model)

    async def turn_text(params: TurnTextParams, _inbound: Inbound) -> object:
        turns.text(connection, params.turn_id, params.round, params.delta)
        return {}

    async def turn_round(params: TurnRoundParams, _inbound: Inbound) -> object:
        calls = [{"name": call.name, "arguments": call.arguments} for call in params.tool_calls]
        return await turns.round(connection, params.turn_id, params.round, calls)

    async def turn_tool(params: TurnToolParams, _inbound: Inbound) -> object:
        run = turns.run_for_call(connection, params.turn_id)
        agent = services.sessions.require_owner(connection, run.turn.agent)
        return await dispatch_tool_call(
            services.tools,
            turns.table,
            run,
            agent,
            turn_id=params.turn_id,
            call_id=params.call_id,
            name=params.name,
            arguments=params.arguments,
            caller_turn_id=params.caller_turn_id,
        )

    async def turn_close(params: TurnCloseParams, _inbound: Inbound) -> object:
        return await turns.close(connection, params.turn_id, params.outcome, params.usage)

    async def channels_typing(params: TypingParams, _inbound: Inbound) -> object:
        return await typing.host_typing(params.channel, params.op, connection)

    table.add("turn/open", turn_open, TurnOpenParams)
    table.add("turn/continue", turn_continue, TurnContinueParams)
    # Up to the hook timeout per call: its own task, so the host's other calls don't queue
    # behind it. Everything else runs in arrival order (text before its round's end).
    table.add("turn/context", turn_context, TurnContextParams, concurrent=True)
    table.add("turn/text", turn_text, TurnTextParams)
    table.add("turn/round", turn_round, TurnRoundParams)
    # A forwarded connector tool may wait up to its deadline: its own task, so the host's other
    # calls (other agents' text, acks) don't queue behind it. The host awaits each tool result
    # before the round's next text, so order within a turn holds.
    table.add("turn/tool", turn_tool, TurnToolParams, concurrent=True)
    table.add("turn/close", turn_close, TurnCloseParams)
    table.add("channels/typing", channels_typing, TypingParams)
