"""One agent's turn as an async context manager: ``async with client.turn(agent, …) as turn``.

    async with client.turn("kai", wakes=[wake.seq]) as turn:
        # turn.tools, turn.system, turn.shown: what to hand the model
        await turn.context(user_message={"text": "hi"}, model="my-model")
        await turn.text("Let me look.")                    # round 0's text
        await turn.end_round(tool_calls=[{"name": "channel_list", "arguments": {}}])
        listing = await turn.tool("channel_list", {})      # runs the call; round 1 now
        await turn.text("Done.")
    print(turn.receipt.text)                               # the block closed it: completed

Leaving the block normally closes the turn ``completed`` (every round not routed yet is routed
then). An exception closes it ``aborted`` — its unfinished words are kept as a draft, nothing
more is posted — and is re-raised. ``await turn.close("failed" | "refused" | …)`` closes it
early; the block then closes nothing more. :attr:`Turn.closed` is ``turn/close``'s whole answer,
:attr:`Turn.receipt` its receipt.

Rounds are numbered for the host: :attr:`Turn.round_number` starts at 0; :meth:`Turn.text`
sends to the current round; :meth:`Turn.end_round` routes it (``turn/round``, naming the round's
tool calls, which the host runs afterwards with :meth:`Turn.tool`) and starts the next.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Final, Literal, Protocol, TypeVar

import trio

from mcpl_router.client.results import (
    ContextResult,
    Receipt,
    RoundResult,
    ShownChannel,
    ToolResult,
    ToolSpec,
    TurnClosed,
    TurnContinued,
    TurnOpened,
    TurnShown,
)
from mcpl_router.jsonrpc import PeerClosed, RequestTimeout, RpcError

_Result = TypeVar("_Result")


class TurnCaller(Protocol):
    """What a turn needs of its connection (the client's :class:`RouterClient` is one): the
    turn module sits below the connection that makes turns, so it names only this."""

    async def request(
        self, method: str, params: Any, result_type: type[_Result], *, timeout: float | None = None
    ) -> _Result: ...

    async def notify(self, method: str, params: Any = None) -> None: ...

__all__ = ["Outcome", "Turn", "TurnAlreadyClosed", "turn_block"]

Outcome = Literal["completed", "aborted", "failed", "refused"]

#: How long an abort on the way out of a failing block may take (shielded from cancellation).
ABORT_TIMEOUT: Final = 5.0


class TurnAlreadyClosed(RuntimeError):
    """The turn was closed here already: nothing more can be sent about it."""


class Turn:
    """An open turn (``turn/open``'s answer) and the calls about it. Made by ``client.turn()``."""

    def __init__(self, client: TurnCaller, agent: str, opened: TurnOpened) -> None:
        self._client = client
        self.agent = agent
        self.opened = opened
        #: The round that :meth:`text` writes to; :meth:`end_round` moves it on.
        self.round_number = 0
        #: ``turn/close``'s answer, once closed.
        self.closed: TurnClosed | None = None
        self._call_ids = itertools.count(1)

    # -- what turn/open said ---------------------------------------------------------------------

    @property
    def turn_id(self) -> str:
        return self.opened.turn_id

    @property
    def inference_id(self) -> str:
        return self.opened.inference_id

    @property
    def channel(self) -> ShownChannel | None:
        """The turn's trigger channel (null for a turn with no channel)."""
        return self.opened.channel

    @property
    def tools(self) -> list[ToolSpec]:
        """The tools the agent may call: give them to the model."""
        return self.opened.tools

    @property
    def system(self) -> list[str]:
        """Lines for the system position of every request of this turn."""
        return self.opened.system

    @property
    def shown(self) -> TurnShown:
        """Names the agent can be shown: channel, locus and the ``[routing]`` line."""
        return self.opened.shown

    @property
    def notices(self) -> list[str]:
        return self.opened.notices

    @property
    def is_closed(self) -> bool:
        return self.closed is not None

    @property
    def receipt(self) -> Receipt | None:
        """The close's receipt (``text``: what was delivered where), once closed."""
        return None if self.closed is None else self.closed.receipt

    # -- during the turn -------------------------------------------------------------------------

    async def continue_on(self, wakes: Sequence[int] = ()) -> TurnContinued:
        """``turn/continue``: another start of this turn (not a new turn): on ``wakes`` that
        arrived while it ran (the turn re-pins on their channel, on its server), or with none
        for a budget restart (nothing moves)."""
        self._check_open()
        return await self._client.request("turn/continue", {"turnId": self.turn_id, "wakes": list(wakes)}, TurnContinued)

    async def context(self, *, user_message: Any = None, model: str | None = None) -> ContextResult:
        """``turn/context``: the servers' injections for the model's request (starts inference)."""
        self._check_open()
        params: dict[str, object] = {"turnId": self.turn_id}
        if user_message is not None:
            params["userMessage"] = user_message
        if model is not None:
            params["model"] = model
        return await self._client.request("turn/context", params, ContextResult)

    async def text(self, delta: str) -> None:
        """``turn/text``: the model's words for the current round (nothing posts until it ends)."""
        self._check_open()
        await self._client.notify("turn/text", {"turnId": self.turn_id, "round": self.round_number, "delta": delta})

    async def end_round(self, tool_calls: Sequence[Mapping[str, Any]] = ()) -> RoundResult:
        """``turn/round``: the round ended with ``tool_calls`` (``{name, arguments}``, run after
        this with :meth:`tool`); its text is routed now. The next round starts."""
        self._check_open()
        calls = [{"name": call["name"], "arguments": dict(call.get("arguments") or {})} for call in tool_calls]
        params = {"turnId": self.turn_id, "round": self.round_number, "toolCalls": calls}
        result = await self._client.request("turn/round", params, RoundResult)
        self.round_number += 1
        return result

    #: ``await turn.round(tool_calls=...)``: the same as :meth:`end_round`.
    round = end_round

    async def tool(
        self, name: str, arguments: Mapping[str, Any] | None = None, *, call_id: str | None = None, caller_turn_id: str | None = None
    ) -> ToolResult:
        """``turn/tool``: run one tool call of the model's. ``call_id`` defaults to a fresh one."""
        self._check_open()
        params: dict[str, object] = {
            "turnId": self.turn_id,
            "callId": call_id if call_id is not None else f"{self.turn_id}-call-{next(self._call_ids)}",
            "name": name,
            "arguments": dict(arguments or {}),
        }
        if caller_turn_id is not None:
            params["callerTurnId"] = caller_turn_id
        return await self._client.request("turn/tool", params, ToolResult)

    async def close(self, outcome: Outcome = "completed", *, usage: Any = None) -> TurnClosed:
        """``turn/close``: end the turn with ``outcome``; returns (and keeps) the answer."""
        self._check_open()
        params: dict[str, object] = {"turnId": self.turn_id, "outcome": outcome}
        if usage is not None:
            params["usage"] = usage
        self.closed = await self._client.request("turn/close", params, TurnClosed)
        return self.closed

    # -- the block -------------------------------------------------------------------------------

    async def abort_quietly(self) -> None:
        """Close ``aborted`` on the way out of a failing block, never masking its exception.

        Shielded (the block may be failing because it was cancelled) and bounded. If the turn
        is gone already (superseded, lease expired, connection lost) there is nothing to do:
        the daemon aborts a turn whose connection closes.
        """
        if self.closed is not None:
            return
        with trio.CancelScope(shield=True), trio.move_on_after(ABORT_TIMEOUT):
            try:
                await self.close("aborted")
            except (RpcError, PeerClosed, RequestTimeout, trio.BrokenResourceError, trio.ClosedResourceError):
                pass

    def _check_open(self) -> None:
        if self.closed is not None:
            raise TurnAlreadyClosed(f"turn {self.turn_id} is closed")

    def __repr__(self) -> str:
        state = "closed" if self.closed is not None else f"round {self.round_number}"
        return f"<Turn {self.turn_id} agent={self.agent!r} {state}>"


@contextlib.asynccontextmanager
async def turn_block(turn: Turn) -> AsyncIterator[Turn]:
    """The ``async with client.turn(...)`` block around an opened turn: closed ``completed``
    when it ends, ``aborted`` (and the exception re-raised) when it raises, unless
    :meth:`Turn.close` closed it first."""
    try:
        yield turn
    except BaseException:
        await turn.abort_quietly()
        raise
    if not turn.is_closed:
        await turn.close("completed")
