"""Inference lifecycle: ``started`` once per turn, exactly one terminal per ``started``.

``started`` goes out at the turn's first ``turn/context`` or ``turn/round``, shielded and
recorded server by server (with each server's transport epoch), so a host dropping mid-call
can't leave a server told "started" that the turn forgets to end. The terminal goes to exactly
the servers told, after the turn's streams complete, whichever way the turn ends. A turn the
model provider refused also marks the message it answered, on that message's own server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Final

import trio

from mcpl_router.host_notices import HostNotice, InferenceStartedNotice
from mcpl_router.mcpl.session import ACKNOWLEDGE, LifecycleParams, ServerSession
from mcpl_router.logs import get_logger
from mcpl_router.mcpl.context import queue_lifecycle, send_lifecycle, wait_lifecycle
from mcpl_router.turns.run import FINISH_GRACE, TurnRun
from mcpl_router.turns.sends import ACK_INTENT_REFUSED, acknowledge_message
from mcpl_router.turns.streams import OutgoingStreams

__all__ = ["REFUSAL_REACTION", "InferenceLifecycle"]

#: The reaction a turn the model provider refused leaves on the message it answered.
REFUSAL_REACTION: Final = "🚫"
#: The most a refusal reaction's answer is waited for (it goes out after the turn has ended).
REFUSAL_REACTION_TIMEOUT: Final = 5.0

#: ``(agent, event, fields)`` → a trace notification to the agent's host.
NotifyAgent = Callable[[str, HostNotice], Awaitable[bool]]


class InferenceLifecycle:
    """Tells servers when a turn's inference starts and ends (``inference/lifecycle``)."""

    def __init__(self, *, servers: Mapping[str, ServerSession], streams: OutgoingStreams, notify_agent: NotifyAgent) -> None:
        self._servers = servers
        self._streams = streams
        self._notify_agent = notify_agent
        self._log = get_logger()

    async def start(self, run: TurnRun) -> None:
        """``started`` to every server, once per turn (whoever asks first); then the host's trace."""
        if run.started is not None:
            return
        run.started = {}  # set before any await: started goes out once, whoever comes first
        turn = run.turn
        try:
            params = LifecycleParams(inference_id=turn.inference_id, conversation_id=turn.conversation_id,
                                     turn_index=turn.turn_index, phase="started")
            log_fields = {"agent": turn.agent, "turn": turn.turn_id}
            # Recorded server by server, and what must wait for room waits shielded: a host
            # dropping mid-call must not leave a server told "started" that the turn then
            # forgets to end. Queued at once where there is room (no scope to enter).
            waiting = queue_lifecycle(self._servers.values(), params, told=run.started, log_fields=log_fields)
            if waiting:
                with trio.CancelScope(shield=True, deadline=trio.current_time() + FINISH_GRACE):
                    await wait_lifecycle(waiting, params, told=run.started, log_fields=log_fields)
        finally:
            run.started_done.set()
        where = turn.routing.locus or turn.routing.trigger
        trace = InferenceStartedNotice(turn.agent, turn.turn_id, turn.inference_id, where.server_id if where else None,
                                       where.channel_id if where else None)
        try:
            await self._notify_agent(turn.agent, trace)
        except Exception:
            self._log.exception("turn.trace.failed", agent=turn.agent, turn=turn.turn_id)

    async def end(self, run: TurnRun, outcome: str, usage: object) -> None:
        """Complete the turn's streams, then the terminal to exactly the servers told ``started``
        (those :meth:`end_nowait` has not already ended)."""
        await self._streams.complete(run)
        if run.started is None:
            return
        if not run.started_done.is_set():
            await run.started_done.wait()
        turn = run.turn
        await send_lifecycle(list(self._servers.values()), _terminal(run, outcome, usage), only=run.started,
                             log_fields={"agent": turn.agent, "turn": turn.turn_id})

    def end_nowait(self, run: TurnRun, outcome: str, usage: object) -> bool:
        """:meth:`end` without waiting: the streams' completes and the terminal queued where the
        servers' outboxes have room. True when all of it went (or there was nothing to send);
        False when some is left, and :meth:`end` sends only that: a server queued its terminal
        here is taken out of ``run.started`` (told and ended), so none is ended twice."""
        if not self._streams.complete_nowait(run):
            return False
        if run.started is None:
            return True
        if not run.started_done.is_set():
            return False
        turn = run.turn
        ended: dict[str, int] = {}
        waiting = queue_lifecycle(self._servers.values(), _terminal(run, outcome, usage), told=ended, only=run.started,
                                  log_fields={"agent": turn.agent, "turn": turn.turn_id})
        left = {session.server_id for session in waiting}
        # Queued, or never able to leave (gone, not granted): either way not to be sent again.
        run.started = {server: epoch for server, epoch in run.started.items() if server in left}
        return not left

    async def react_to_refusal(self, run: TurnRun, reaction: str) -> None:
        """Mark the turn's latest inbound message (on its own server) with ``reaction``."""
        turn = run.turn
        log = self._log.bind(agent=turn.agent, turn=turn.turn_id)
        ref, message_id = turn.routing.trigger, turn.trigger_message_id
        if not run.mode.reacts_to_refusal or ref is None or message_id is None:
            log.info("refusal.reaction.skipped", why="no-inbound-message" if run.mode.reacts_to_refusal else run.mode.name)
            return
        session = self._servers.get(ref.server_id)
        if session is None or session.unusable(ACKNOWLEDGE) is not None:
            log.info("refusal.reaction.skipped", why="not-permitted", server=ref.server_id)
            return
        reason = await acknowledge_message(
            session, ref, message_id, intent=ACK_INTENT_REFUSED, value=reaction,
            timeout=min(REFUSAL_REACTION_TIMEOUT, session.request_timeout),
        )
        if reason is not None:
            log.info("refusal.reaction.failed", server=ref.server_id, channel=ref.channel_id, reason=reason)
            return
        log.info("refusal.reaction.sent", server=ref.server_id, channel=ref.channel_id, message=message_id)


def _terminal(run: TurnRun, outcome: str, usage: object) -> LifecycleParams:
    """The terminal ``inference/lifecycle`` params of ``run``'s inference (``usage`` only when
    the host gave one)."""
    turn = run.turn
    return LifecycleParams(inference_id=turn.inference_id, conversation_id=turn.conversation_id, turn_index=turn.turn_index,
                           phase=outcome, usage=usage)
