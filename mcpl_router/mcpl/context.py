"""``context/beforeInference`` fan-out and ``inference/lifecycle`` (PROTOCOL §3, §4).

Each server granted any ``contextHooks.beforeInference.*`` leaf is asked, in parallel, with
only **its own** channels in the context: ``incoming`` and ``defaultOutgoing`` only where that
channel is this server's, ``candidates`` only this server's open channels. One server's failure
(a timeout, an error answer, a malformed answer, an exception building its context) fails that
server alone and is logged. Every returned injection is authorized by its ``position`` against
the grant current when the answer arrived; an unauthorized one is dropped with a log line.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final, Literal

import attrs
import trio

from mcpl_router.logs import get_logger
from mcpl_router.mcpl.session import (
    HOOKS,
    INFERENCE_LIFECYCLE,
    OBSERVE,
    BeforeInferenceParams,
    ChannelContext,
    HookAnswered,
    HookTimedOut,
    IncomingContext,
    LifecycleParams,
    OutgoingContext,
    Queued,
    ServerSession,
    Unsent,
)
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import ChannelRegistry

__all__ = [
    "BEFORE_INFERENCE_TIMEOUT",
    "HOOK_PREFIX",
    "POSITIONS",
    "ContextResult",
    "HookFacts",
    "before_inference",
    "channel_context_for",
    "queue_lifecycle",
    "send_lifecycle",
    "wait_lifecycle",
]

#: How long one server may take to answer ``context/beforeInference`` before we go on without it.
BEFORE_INFERENCE_TIMEOUT: Final = 5.0
#: One lifecycle notification to one server; past it that server is logged and skipped.
LIFECYCLE_SEND_TIMEOUT: Final = 2.0
HOOK_PREFIX: Final = HOOKS
POSITIONS: Final = ("system", "beforeUser", "afterUser")

ServerOutcome = Literal["ok", "timeout", "error", "skipped"]


@attrs.frozen
class HookFacts:
    """What a turn knows when it asks for context: ids, the user message, and its refs.

    ``incoming`` is the trigger (the channel the turn's message came from) with that message's
    ids; ``default_outgoing`` the locus. Refs, so each server is told only of its own.
    """

    inference_id: str
    conversation_id: str
    turn_index: int
    model: str | None
    user_message: object = None
    incoming: ChannelRef | None = None
    incoming_message_id: str | None = None
    incoming_thread_id: str | None = None
    default_outgoing: ChannelRef | None = None
    #: A conversation fork's home: its turn takes no injection namespaced to another channel.
    fork_home: ChannelRef | None = None


@attrs.define
class ContextResult:
    """Injections grouped by position, each with the server it came from; and each server's
    outcome (``ok``, ``timeout``, ``error``, ``skipped``)."""

    injections: dict[str, list[dict[str, Any]]] = attrs.field(factory=lambda: {p: [] for p in POSITIONS})
    servers: dict[str, ServerOutcome] = attrs.field(factory=dict)
    #: Seconds each asked server took to answer (or to time out / fail).
    elapsed: dict[str, float] = attrs.field(factory=dict)

    def to_wire(self) -> dict[str, Any]:
        """The ``turn/context`` result."""
        return {"injections": self.injections, "servers": dict(self.servers)}


def channel_context_for(server_id: str, facts: HookFacts, registry: ChannelRegistry) -> ChannelContext:
    """The ``channels`` member ``server_id`` is told: its own channels, and nothing else.

    ``incoming`` only when the turn's trigger is this server's; ``defaultOutgoing`` only when
    the locus is; ``candidates`` this server's open channels, by id (ids are unique within one
    server, so a bare id is a whole name here, and only here).
    """
    incoming = facts.incoming
    outgoing = facts.default_outgoing
    return ChannelContext(
        incoming=IncomingContext(channel_id=incoming.channel_id, message_id=facts.incoming_message_id,
                                 thread_id=facts.incoming_thread_id)
        if incoming is not None and incoming.server_id == server_id else None,
        default_outgoing=OutgoingContext(channel_id=outgoing.channel_id)
        if outgoing is not None and outgoing.server_id == server_id else None,
        candidates=[entry.ref.channel_id for entry in registry.channels_for(server_id) if entry.open],
    )


def _hooked(session: ServerSession) -> bool:
    return session.ready and session.allows_any_under(HOOK_PREFIX)


async def before_inference(
    sessions: Iterable[ServerSession],
    facts: HookFacts,
    registry: ChannelRegistry,
    *,
    timeout: float = BEFORE_INFERENCE_TIMEOUT,
    log_fields: Mapping[str, object] | None = None,
) -> ContextResult:
    """Ask every hooked server for context, in parallel; never fails as a whole.

    Servers not ready or granted no ``contextHooks.beforeInference.*`` leaf are ``skipped``.
    """
    result = ContextResult()
    log = _lazy_logger(log_fields)
    answers: dict[str, list[dict[str, Any]]] = {}
    sessions = list(sessions)
    for session in sessions:
        result.servers[session.server_id] = "skipped"

    async def ask(session: ServerSession) -> None:
        server = session.server_id
        started = trio.current_time()
        try:
            await _ask(session, server)
        finally:
            result.elapsed[server] = trio.current_time() - started

    async def _ask(session: ServerSession, server: str) -> None:
        try:
            # Built inside the task, so an exception building one server's context fails that
            # server alone.
            params = BeforeInferenceParams(
                inference_id=facts.inference_id,
                conversation_id=facts.conversation_id,
                turn_index=facts.turn_index,
                user_message=facts.user_message if session.allows(OBSERVE) else None,
                model=facts.model,
                channels=channel_context_for(server, facts, registry),
            )
            outcome = await session.before_inference(params, timeout=timeout)
        except Exception:
            result.servers[server] = "error"
            log().exception("context.before_inference.crashed", server=server)
            return
        if isinstance(outcome, HookTimedOut):
            result.servers[server] = "timeout"
            log().warning("context.before_inference.timeout", server=server, timeout=timeout)
            return
        if not isinstance(outcome, HookAnswered):
            result.servers[server] = "error"
            log().warning("context.before_inference.failed", server=server, error=outcome.error)
            return
        answer = outcome.answer
        injections = answer.get("contextInjections") if isinstance(answer, dict) else None
        if not isinstance(injections, list):
            result.servers[server] = "error"
            log().warning("context.before_inference.malformed", server=server)
            return
        kept: list[dict[str, Any]] = []
        for index, injection in enumerate(injections):
            position = injection.get("position") if isinstance(injection, dict) else None
            if position not in POSITIONS:
                log().warning("context.injection.dropped", server=server, index=index, position=position, reason="unknown-position")
                continue
            capability = f"{HOOK_PREFIX}.inject.{position}"
            # The grant current NOW, at receipt: one narrowed while we waited applies to this answer.
            if not session.allows(capability):
                log().warning("context.injection.dropped", server=server, index=index, position=position, reason="not-granted", capability=capability)
                continue
            if _another_channels(injection.get("namespace"), server, facts.fork_home, registry):
                log().info("context.injection.dropped", server=server, index=index, position=position, reason="fork-other-channel",
                         namespace=injection.get("namespace"))
                continue
            kept.append(
                {
                    "serverId": server,
                    "position": position,
                    "namespace": injection.get("namespace"),
                    "content": injection.get("content"),
                    "metadata": injection.get("metadata"),
                }
            )
        answers[server] = kept
        result.servers[server] = "ok"

    await _each_at_once([session for session in sessions if _hooked(session)], ask)
    # Grouped in the servers' (configuration) order, whatever order the answers came in.
    for session in sessions:
        for injection in answers.get(session.server_id, ()):
            result.injections[injection.pop("position")].append(injection)
    return result


async def send_lifecycle(
    sessions: Iterable[ServerSession],
    params: LifecycleParams,
    *,
    only: dict[str, int] | None = None,
    told: dict[str, int] | None = None,
    log_fields: Mapping[str, object] | None = None,
    per_link_timeout: float = LIFECYCLE_SEND_TIMEOUT,
) -> dict[str, int]:
    """Send ``inference/lifecycle`` to every ready server granted ``inferenceLifecycle``.

    Queued at once to each server whose outbox has room (:func:`queue_lifecycle`); the others
    are waited for all at once, each with its own deadline, so one stuck server can't keep
    the others from hearing (a terminal, above all) (:func:`wait_lifecycle`). When every
    outbox has room this is no cancellation point: what it queues is recorded in ``told``.

    Args:
        params: the inference's ids and the phase (no content, ever).
        only: for a terminal phase, the servers (and their transport epochs) that were told
            ``started``: exactly those get the terminal, and only in that same epoch (a server
            that reconnected since never saw ``started`` on this connection).
        told: filled in as each server is told — *before* its write, so a send interrupted
            halfway still counts: a server that may have seen ``started`` must get a terminal.

    Returns:
        ``told``: the servers told, with their epochs.
    """
    told = {} if told is None else told
    waiting = queue_lifecycle(sessions, params, only=only, told=told, log_fields=log_fields)
    await wait_lifecycle(waiting, params, told=told, log_fields=log_fields, per_link_timeout=per_link_timeout)
    return told


async def wait_lifecycle(
    sessions: list[ServerSession],
    params: LifecycleParams,
    *,
    told: dict[str, int],
    log_fields: Mapping[str, object] | None = None,
    per_link_timeout: float = LIFECYCLE_SEND_TIMEOUT,
) -> None:
    """The part of :func:`send_lifecycle` that waits: ``sessions`` are those
    :func:`queue_lifecycle` found with no room (already in ``told``), each sent to with its own
    deadline, all at once. One that never left is taken out of ``told``."""
    log = _lazy_logger(log_fields)

    async def send_one(session: ServerSession) -> None:
        unsent: Unsent | None = None
        with trio.move_on_after(per_link_timeout) as waited:
            unsent = await session.lifecycle(params)
        if waited.cancelled_caught:
            log().warning("lifecycle.timeout", server=session.server_id, phase=params.phase, timeout=per_link_timeout)
        elif unsent is not None:
            _never_left(told, session, params, unsent, log)

    await _each_at_once(sessions, send_one)


def queue_lifecycle(
    sessions: Iterable[ServerSession],
    params: LifecycleParams,
    *,
    told: dict[str, int],
    only: dict[str, int] | None = None,
    log_fields: Mapping[str, object] | None = None,
) -> list[ServerSession]:
    """The part of :func:`send_lifecycle` that never waits: ``inference/lifecycle`` queued to
    every eligible server whose outbox has room now (each recorded in ``told`` first); the
    servers whose outbox had none, to be waited for (recorded too: their send is under way).
    """
    log = _lazy_logger(log_fields)
    waiting: list[ServerSession] = []
    for session in sessions:
        if (only is not None and only.get(session.server_id) != session.epoch) or not session.ready or not session.allows(INFERENCE_LIFECYCLE):
            continue
        told[session.server_id] = session.epoch
        queued = session.lifecycle_nowait(params)
        if queued is Queued.FULL:
            waiting.append(session)
        elif isinstance(queued, Unsent):
            _never_left(told, session, params, queued, log)
    return waiting


def _never_left(told: dict[str, int], session: ServerSession, params: LifecycleParams, unsent: Unsent, log: Callable[[], Any]) -> None:
    """A lifecycle send that never left: its server is not counted as told (nothing to end there)."""
    told.pop(session.server_id, None)
    log().info("lifecycle.undeliverable", server=session.server_id, phase=params.phase, error=unsent.error)


def _lazy_logger(fields: Mapping[str, object] | None) -> Callable[[], Any]:
    """The logger with ``fields`` bound, bound only when something is logged (most turns log
    nothing here, and binding was a tenth of what a context request costs)."""
    bound: list[Any] = []

    def log() -> Any:
        if not bound:
            bound.append(get_logger(**(fields or {})))
        return bound[0]

    return log


async def _each_at_once(sessions: list[ServerSession], send: Callable[[ServerSession], Awaitable[None]]) -> None:
    """``send`` to every server at once, so one slow server holds up no other; with one, in
    this task (a nursery and a task a turn saved: the common case of one server)."""
    if len(sessions) == 1:
        await send(sessions[0])
        return
    if not sessions:
        return
    async with trio.open_nursery() as nursery:
        for session in sessions:
            nursery.start_soon(send, session)


def _another_channels(namespace: object, server_id: str, home: ChannelRef | None, registry: ChannelRegistry) -> bool:
    """Whether a fork's injection is namespaced to a channel other than its home: the namespace
    is the id of a channel its own server registers (ids mean channels only on their server,
    and only registered ones: a namespace like ``project:state`` names no channel and stays)."""
    if home is None or not isinstance(namespace, str) or not namespace:
        return False
    ref = ChannelRef(server_id, namespace)
    return ref != home and registry.is_registered(ref)
