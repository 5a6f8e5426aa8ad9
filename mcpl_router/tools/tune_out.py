"""Tune-out and the subconscious tools: ``tune_out``, ``cancel_tuneout``, ``speak_in_channel``,
``deliver_summary`` (a :class:`~mcpl_router.tools.seam.ToolProvider`; ``daemon.tune_outs``).

The rules live in :mod:`mcpl_router.routing.tuneout` (pure); this module runs them:

- **Diversion.** The sessions' diversion (``hosts/diversion.py``, in the order
  :mod:`mcpl_router.routing.held` decides) asks :attr:`TuneOuts.table` of every wake as it is
  sent (``SessionManager.accepted``): a wake from a channel its agent tuned out is *held* (it stays
  a durable, unacked delivery in the journal) instead of sent. Wakes re-sent at a
  ``session/hello`` are not diverted: a host that reconnects gets its backlog.
- **Summary wakes.** :meth:`TuneOuts.run` sends, at each tune-out's cadence while anything is
  held, one ``wake`` notification with ``reason: "tuneout-summary"``, ``seq`` = the newest held
  seq (0 when only a delivered summary is handed over), ``held`` (the seqs, oldest first — the
  host may open a turn on them and acks them as usual), ``dropped``, ``summary`` (from
  ``deliver_summary``), ``final`` and ``text``.
- **Durable.** Each tune-out is saved in the journal (its ``tune_outs`` row: settings, start,
  end, summary count, the newest seq it handed over, a delivered summary), written behind by
  the journal's writer; cancelling or ending it deletes the row. :meth:`TuneOuts.run` reloads
  them before it reports started, which the daemon awaits before any host listens or server
  dials, so after a restart a tuned-out channel's wakes are held as before, the wakes held
  before the restart are held again, and summaries keep their cadence. One whose server the
  daemon no longer runs is dropped (``tuneout.dropped``), as is one whose end passed while the
  daemon was stopped (``tuneout.ended``): what they held is the agent's backlog at its host's
  next ``session/hello``.
- **Whose tune-outs.** A tool acts on the calling agent's tune-outs; a *subconscious* agent's
  (an agent whose spec has ``subconsciousFor: <primary>``) act on its primary's.
  ``cancel_tuneout``, ``speak_in_channel`` and ``deliver_summary`` are offered only to a
  subconscious agent, and refused at dispatch for any other.
- **Names.** Every ``channelId`` is read as every tool reads one: inside the turn, the id of one
  of the turn's own channels first (:func:`~mcpl_router.routing.turns.own_channel_named`, refused
  once its server withdrew it), then the one resolver, which refuses a name several channels
  answer to. Texts name channels by ``name_shown``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Final, Protocol

import trio

from mcpl_router.host_notices import HostNotice, WakeNotice
from mcpl_router.logs import get_logger
from mcpl_router.routing import texts
from mcpl_router.routing.names import Refusal, Resolved
from mcpl_router.store.records import JournalFailure
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.tuneout import Summary, TuneOut, TuneOutSettings, TuneOutTable
from mcpl_router.routing.turns import own_channel_named
from mcpl_router.store.records import SavedTuneOut
from mcpl_router.tools.arguments import SpeakArgs, SummaryArgs, TuneOutArgs
from mcpl_router.tools.seam import ToolCall, ToolName, ToolSpec, record_explicit_send, tool_result
from mcpl_router.turns import publish_text
from mcpl_router.mcpl.session import LIFECYCLE, OpenParams, ServerSession
from mcpl_router.turns.sends import LIFECYCLE_TIMEOUT

if TYPE_CHECKING:
    from mcpl_router.routing.agents import AgentSpec
    from mcpl_router.routing.router import Router
    from mcpl_router.turns import TurnRun, TurnTimings

#: Queue a notification to the connection owning an agent: ``(agent, method, params)``; False
#: when no connection owns it (``SessionManager.notify_agent``).
NotifyAgent = Callable[[str, HostNotice], Awaitable[bool]]

__all__ = ["SUBCONSCIOUS_TOOLS", "TUNE_OUT_TOOLS", "TuneOutJournal", "TuneOuts", "tune_out_owner"]


class TuneOutJournal(Protocol):
    """What the tune-outs keep durable (the journal's ``tune_outs`` table; writes go behind)."""

    def last_seq(self) -> int: ...

    def save_tune_out(self, saved: SavedTuneOut) -> None: ...

    def save_tune_out_progress(
        self, agent: str, server_id: str, channel_id: str, *, wakes: int, handed_through: int, summary: str | None
    ) -> None: ...

    def save_tune_out_summary(self, agent: str, server_id: str, channel_id: str, summary: str | None) -> None: ...

    def forget_tune_out(self, agent: str, server_id: str, channel_id: str) -> None: ...

    async def saved_tune_outs(self) -> list[SavedTuneOut]: ...

    async def flush(self) -> None: ...


REASON_SUMMARY: Final = "tuneout-summary"

_CHANNEL_ID = {"type": "string", "description": "The channel: its id, or serverId:channelId where the id is on more than one server."}

TUNE_OUT_SPEC: Final[ToolSpec] = {
    "name": "tune_out",
    "description": (
        "Tune a channel out: it stays open, but its messages stop waking you one by one and come"
        " as one summary wake every `cadence` seconds, until `duration` seconds or `maxWakes`"
        " summary wakes have passed. op \"cancel\" ends a tune-out at once."
    ),
    "inputSchema": {
        "type": "object",
        "properties": {
            "channelId": _CHANNEL_ID,
            "op": {"type": "string", "enum": ["enter", "cancel"], "default": "enter"},
            "cadence": {"type": "number", "description": "Seconds between summary wakes (default 300)."},
            "backlogCap": {"type": "integer", "description": "Held messages kept; older ones are dropped (default 50)."},
            "maxWakes": {"type": "integer", "description": "End after this many summary wakes."},
            "duration": {"type": "number", "description": "End after this many seconds."},
        },
        "required": ["channelId"],
    },
}
CANCEL_SPEC: Final[ToolSpec] = {
    "name": "cancel_tuneout",
    "description": "End your primary agent's tune-out of a channel: its messages wake it again.",
    "inputSchema": {"type": "object", "properties": {"channelId": _CHANNEL_ID}, "required": ["channelId"]},
}
SPEAK_SPEC: Final[ToolSpec] = {
    "name": "speak_in_channel",
    "description": "Post a message in a channel.",
    "inputSchema": {
        "type": "object",
        "properties": {"channelId": _CHANNEL_ID, "text": {"type": "string"}},
        "required": ["channelId", "text"],
    },
}
DELIVER_SPEC: Final[ToolSpec] = {
    "name": "deliver_summary",
    "description": "Hand your primary agent a summary of a tuned-out channel; it comes with that channel's next summary wake.",
    "inputSchema": {
        "type": "object",
        "properties": {"channelId": _CHANNEL_ID, "summary": {"type": "string"}},
        "required": ["channelId", "summary"],
    },
}
TUNE_OUT_TOOLS: Final = ("tune_out",)
SUBCONSCIOUS_TOOLS: Final = ("cancel_tuneout", "speak_in_channel", "deliver_summary")
_NAMES: Final = tuple(ToolName(name) for name in (*TUNE_OUT_TOOLS, *SUBCONSCIOUS_TOOLS))
_AGENT_SPECS: Final[list[ToolSpec]] = [TUNE_OUT_SPEC]
_SUBCONSCIOUS_SPECS: Final[list[ToolSpec]] = [TUNE_OUT_SPEC, CANCEL_SPEC, SPEAK_SPEC, DELIVER_SPEC]


def tune_out_owner(agent: AgentSpec) -> str:
    """Whose tune-outs an agent's tools act on: its primary's for a subconscious agent, else its own."""
    return agent.subconscious_for or agent.name


def is_subconscious(agent: AgentSpec) -> bool:
    return bool(agent.subconscious_for)


class TuneOuts:
    """The tune-out coordinator and tool provider. Run :meth:`run` in the daemon's nursery.

    Args:
        router: the registry (a tuned-out channel is marked open) and the one resolver.
        servers: each server's session by server id (a live view of the daemon's links: a reload changes it).
        timings: ``speak_in_channel``'s publish deadline.
        notify_agent: how a summary wake reaches the agent's host (the sessions', wired by the
            daemon; the sessions in turn ask :meth:`divert` and :meth:`holds` of every wake).
        journal: where each tune-out is saved, and read back from at :meth:`run`'s start.
    """

    def __init__(
        self,
        router: Router,
        servers: Mapping[str, ServerSession],
        timings: TurnTimings,
        notify_agent: NotifyAgent,
        *,
        journal: TuneOutJournal,
    ) -> None:
        self._router = router
        self._servers = servers
        self._timings = timings
        self._notify_agent = notify_agent
        self._journal = journal
        self.table = TuneOutTable()
        self._changed = trio.Event()
        # Final summaries of cancelled tune-outs, sent by the loop rather than inside a tool call.
        self._finals: list[Summary] = []
        self._log = get_logger()

    # ------------------------------------------------------------------ queries (other tools)

    def tuned_out(self, agent: str) -> frozenset[ChannelRef]:
        """The channels ``agent`` has tuned out (channel_open/close/decline refuse these)."""
        return self.table.tuned_out(agent)

    def kept_open(self) -> frozenset[ChannelRef]:
        """Every channel some agent has tuned out: each stays open while its tune-out lasts, so
        the channel decisions hold its server to that (tools/channel_lifecycle.py)."""
        return frozenset(tune_out.ref for tune_out in self.table.all())

    def end_text(self, agent: str, ref: ChannelRef) -> str | None:
        """How ``agent``'s tune-out of ``ref`` ends, in the daemon's words; None if not tuned out."""
        tune_out = self.table.get(agent, ref)
        if tune_out is None:
            return None
        settings = tune_out.settings
        return texts.tuneout_ends(settings.duration, settings.max_wakes, self._shown(ref))

    # ------------------------------------------------------------------ summary wakes

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Resume the saved tune-outs, then send summary wakes as they fall due, until cancelled.

        Started (``task_status``) only once they are resumed: the daemon starts this before its
        host listeners and links, so no wake is sent before its tune-out could hold it.
        """
        await self._resume_saved()
        task_status.started()
        while True:
            deadline = self.table.next_deadline()
            with trio.move_on_at(deadline if deadline is not None else math.inf):
                await self._changed.wait()
            self._changed = trio.Event()
            finals, self._finals = self._finals, []
            due = self.table.due(trio.current_time())
            # Saved before the sends await anything: the rows match the table right after due().
            for summary in due:
                self._save_progress(summary)
            for summary in [*finals, *due]:
                await self._send(summary)

    async def _resume_saved(self) -> None:
        saved_rows = await self._journal.saved_tune_outs()
        now, wall = trio.current_time(), time.time()
        for saved in saved_rows:
            ref = ChannelRef(saved.server_id, saved.channel_id)
            fields = {"agent": saved.agent, "server": saved.server_id, "channel": saved.channel_id, "held": len(saved.held)}
            if saved.server_id not in self._servers:
                # Nothing could reach it again: no traffic to hold, and cancel_tuneout can't name
                # a channel no server registers. What it held goes to the host as its backlog.
                self._journal.forget_tune_out(saved.agent, saved.server_id, saved.channel_id)
                self._log.warning("tuneout.dropped", reason="server-not-configured", **fields)
                continue
            if saved.ends_at is not None and saved.ends_at <= wall:
                self._journal.forget_tune_out(saved.agent, saved.server_id, saved.channel_id)
                self._log.info("tuneout.ended", why="ended-while-stopped", **fields)
                continue
            settings = TuneOutSettings(cadence=saved.cadence, backlog_cap=saved.backlog_cap, max_wakes=saved.max_wakes,
                                       duration=saved.duration)
            # Its start on trio's clock: as long ago as the wall clock says (never in the future).
            started = now - max(0.0, wall - saved.started_at)
            tune_out = self.table.resume(saved.agent, ref, settings, started=started, now=now, wakes=saved.wakes,
                                         handed_through=saved.handed_through, summary=saved.summary, held=saved.held)
            self._log.info("tuneout.resumed", dropped=tune_out.dropped, wakes=tune_out.wakes, cadence=settings.cadence, **fields)

    def _save(self, tune_out: TuneOut) -> None:
        """Save a tune-out just entered (wall-clock start now)."""
        started_at = time.time()
        settings = tune_out.settings
        self._journal.save_tune_out(SavedTuneOut(
            tune_out.agent, tune_out.ref.server_id, tune_out.ref.channel_id, settings.cadence, settings.backlog_cap,
            settings.max_wakes, settings.duration, started_at,
            None if settings.duration is None else started_at + settings.duration,
            wakes=tune_out.wakes, handed_through=tune_out.handed_through, summary=tune_out.summary,
        ))

    def _save_progress(self, summary: Summary) -> None:
        ref = summary.ref
        tune_out = None if summary.final else self.table.get(summary.agent, ref)
        if tune_out is None:
            self._journal.forget_tune_out(summary.agent, ref.server_id, ref.channel_id)
            return
        self._journal.save_tune_out_progress(summary.agent, ref.server_id, ref.channel_id, wakes=tune_out.wakes,
                                             handed_through=tune_out.handed_through, summary=tune_out.summary)

    async def _send(self, summary: Summary) -> None:
        if not summary.held and summary.summary is None:
            self._log.info("tuneout.ended", agent=summary.agent, server=summary.ref.server_id, channel=summary.ref.channel_id)
            return
        shown = self._shown(summary.ref)
        params = {
            "seq": summary.held[-1] if summary.held else 0,
            "agent": summary.agent,
            "reason": REASON_SUMMARY,
            "channel": {**summary.ref.to_wire(), "shown": shown},
            "tags": [],
            "addressed": False,
            "held": list(summary.held),
            "dropped": summary.dropped,
            "summary": summary.summary,
            "final": summary.final,
            "text": texts.tuneout_summary_text(shown, len(summary.held), summary.dropped, summary.summary),
        }
        sent = await self._notify_agent(summary.agent, WakeNotice(params))
        self._log.info(
            "tuneout.summary", agent=summary.agent, server=summary.ref.server_id, channel=summary.ref.channel_id,
            held=len(summary.held), dropped=summary.dropped, final=summary.final, sent=sent,
        )

    def _poke(self) -> None:
        self._changed.set()

    # ------------------------------------------------------------------ ToolProvider

    def tool_names(self) -> Iterable[ToolName]:
        """Every agent's ``tune_out`` and the subconscious tools: reserved for every agent."""
        return _NAMES

    def tools_for(self, agent: AgentSpec, run: TurnRun) -> list[ToolSpec]:
        # Two lists, made once: the table keeps its filtered answer while a provider's list is
        # the same object (tools/table.py).
        return _SUBCONSCIOUS_SPECS if is_subconscious(agent) else _AGENT_SPECS

    def is_send(self, tool: ToolName, arguments: Mapping[str, object]) -> bool:
        """``speak_in_channel`` posts: its round's plain text is held (send-silencing)."""
        return tool.name == "speak_in_channel"

    async def _recorded(self, result: dict[str, object]) -> dict[str, object]:
        """``result``, once the tune-out it entered or ended is in the journal: what the agent
        is told survives a crash or a takeover. A journal that can't commit now keeps the write
        queued (retried): said, and the tune-out stands in memory."""
        try:
            await self._journal.flush()
        except JournalFailure as exc:
            self._log.warning("tuneout.not_yet_recorded", error=str(exc), effect="in force; written when the journal recovers")
        return result

    async def call(self, call: ToolCall) -> dict[str, object]:
        await trio.lowlevel.checkpoint()
        if call.name in SUBCONSCIOUS_TOOLS and not is_subconscious(call.agent):
            not_done = _NOT_DONE[call.name]
            return tool_result(texts.not_subconscious(call.name, not_done), error=True, reason=texts.Reason.NOT_SUBCONSCIOUS)
        if call.name == "tune_out":
            args = TuneOutArgs.read(call.arguments)
            if args.op == "cancel":
                return await self._recorded(self._cancel(call, args.channel_name))
            if args.op != "enter":
                text = texts.tuneout_bad_argument("op", 'must be "enter" or "cancel"', texts.NOTHING_TUNED)
                return tool_result(text, error=True, reason=texts.Reason.BAD_ARGUMENT)
            return await self._recorded(await self._enter(call, args))
        if call.name == "cancel_tuneout":
            return await self._recorded(self._cancel(call, TuneOutArgs.read(call.arguments).channel_name))
        if call.name == "speak_in_channel":
            return await self._speak(call)
        return self._deliver(call)

    # ------------------------------------------------------------------ the tools

    def _channel(self, call: ToolCall, name: str, not_done: str) -> ChannelRef | dict[str, object]:
        """The channel ``name`` (the call's ``channelId``) names, read as every tool reads one;
        else the refusal."""
        router = self._router
        resolved: Resolved | Refusal | None = None
        if call.scope.turn is not None:
            resolved = own_channel_named(call.scope.turn.routing, name, router.registry, not_done=not_done)
        if resolved is None:
            resolved = router.names.channel_named(name, not_done=not_done, server_id_accepted=False)
        if isinstance(resolved, Resolved):
            return resolved.ref
        data = {"kind": resolved.kind, "candidates": [ref.to_wire() for ref in resolved.candidates]}
        if resolved.server_id:
            data["serverId"] = resolved.server_id
        return tool_result(resolved.text, error=True, reason=resolved.kind, data=data)

    async def _enter(self, call: ToolCall, args: TuneOutArgs) -> dict[str, object]:
        settings = args.settings
        if isinstance(settings, tuple):
            field, problem = settings
            return tool_result(texts.tuneout_bad_argument(field, problem, texts.NOTHING_TUNED), error=True, reason=texts.Reason.BAD_ARGUMENT)
        ref = self._channel(call, args.channel_name, texts.NOTHING_TUNED)
        if isinstance(ref, dict):
            return ref
        owner = tune_out_owner(call.agent)
        registry = self._router.registry
        # A tuned-out channel stays open: its traffic keeps coming, to be summarized. A closed
        # one is opened on its own server first (where the server lets the daemon open it), so
        # its transport actually brings that traffic in.
        entry = registry.get(ref)
        session = self._servers.get(ref.server_id)
        if entry is not None and not entry.open and session is not None and session.unusable(LIFECYCLE) is None:
            reason = await session.open_channel(OpenParams(channel_id=ref.channel_id), timeout=LIFECYCLE_TIMEOUT)
            if reason is not None:
                self._log.info("tuneout.open_failed", agent=owner, server=ref.server_id, channel=ref.channel_id, reason=reason)
                return tool_result(texts.lifecycle_failed("open", self._shown(ref), reason, texts.NOTHING_TUNED),
                                   error=True, reason=reason, data=ref.to_wire())
        opened = registry.set_open(ref, True)
        # Every wake committed so far was offered before this tune-out: it holds only later ones.
        self._save(self.table.enter(owner, ref, settings, trio.current_time(), handed_through=self._journal.last_seq()))
        self._poke()
        shown = self._shown(ref)  # read after opening: what picks it now
        ends = texts.tuneout_ends(settings.duration, settings.max_wakes, shown)
        self._log.info(
            "tuneout.entered", agent=owner, by=call.agent.name, server=ref.server_id, channel=ref.channel_id,
            cadence=settings.cadence, backlog_cap=settings.backlog_cap, max_wakes=settings.max_wakes,
            duration=settings.duration, opened=opened,
        )
        data = {**ref.to_wire(), "shown": shown, "agent": owner, "cadence": settings.cadence,
                "backlogCap": settings.backlog_cap, "maxWakes": settings.max_wakes, "duration": settings.duration}
        return tool_result(texts.tuneout_entered(shown, settings.cadence, settings.backlog_cap, ends), data=data)

    def _cancel(self, call: ToolCall, channel_name: str) -> dict[str, object]:
        ref = self._channel(call, channel_name, texts.NOTHING_CANCELLED)
        if isinstance(ref, dict):
            return ref
        owner = tune_out_owner(call.agent)
        shown = self._shown(ref)
        if self.table.get(owner, ref) is None:
            text = texts.tuneout_not_tuned_out(shown, texts.NOTHING_CANCELLED)
            return tool_result(text, error=True, reason=texts.Reason.NOT_TUNED_OUT, data={**ref.to_wire(), "shown": shown})
        summary = self.table.end(owner, ref)
        self._journal.forget_tune_out(owner, ref.server_id, ref.channel_id)
        held = len(summary.held) if summary else 0
        if summary is not None and (summary.held or summary.summary):
            self._finals.append(summary)
        self._poke()
        self._log.info("tuneout.cancelled", agent=owner, by=call.agent.name, server=ref.server_id, channel=ref.channel_id, held=held)
        return tool_result(texts.tuneout_cancelled(shown, held), data={**ref.to_wire(), "shown": shown, "agent": owner, "held": held})

    async def _speak(self, call: ToolCall) -> dict[str, object]:
        args = SpeakArgs.read(call.arguments)
        text = args.text
        if not text.strip():
            return tool_result(texts.tuneout_bad_argument("text", "is empty", texts.NOTHING_POSTED), error=True, reason=texts.Reason.BAD_ARGUMENT)
        ref = self._channel(call, args.channel_name, texts.NOTHING_POSTED)
        if isinstance(ref, dict):
            return ref
        shown = self._shown(ref)
        delivery = await publish_text(
            self._servers, ref, shown, text,
            conversation_id=call.run.turn.conversation_id, round_=call.run.turn.round,
            registered=self._router.registry.is_registered(ref),
            timeout=self._timings.publish_timeout,
            decisions=self._router.names.decisions, via="subconscious", agent=call.run.turn.agent,
        )
        if delivery.outcome != "failed":
            record_explicit_send(call, ref)
        self._log.info("tuneout.spoke", agent=call.agent.name, server=ref.server_id, channel=ref.channel_id, outcome=delivery.outcome)
        data = delivery.to_wire()
        shown = self._shown(ref)  # read once the answer came: a registration meanwhile renames it
        if delivery.outcome == "delivered":
            return tool_result(texts.spoke_in(shown), data=data)
        if delivery.outcome == "unknown":
            return tool_result(texts.receipt([], 0, [], [shown]), reason=texts.Reason.UNCONFIRMED, data=data)
        return tool_result(texts.receipt([], 0, [shown], []), error=True, reason=delivery.reason, data=data)

    def _deliver(self, call: ToolCall) -> dict[str, object]:
        args = SummaryArgs.read(call.arguments)
        summary = args.summary
        if not summary:
            return tool_result(texts.tuneout_bad_argument("summary", "is empty", texts.NOTHING_DELIVERED), error=True, reason=texts.Reason.BAD_ARGUMENT)
        # A gone own channel or a shared name is refused here, never stored as a bare id.
        ref = self._channel(call, args.channel_name, texts.NOTHING_DELIVERED)
        if isinstance(ref, dict):
            return ref
        owner = tune_out_owner(call.agent)
        shown = self._shown(ref)
        tune_out = self.table.get(owner, ref)
        if tune_out is None:
            text = texts.tuneout_not_tuned_out(shown, texts.NOTHING_DELIVERED)
            return tool_result(text, error=True, reason=texts.Reason.NOT_TUNED_OUT, data={**ref.to_wire(), "shown": shown})
        tune_out.summary = summary
        self._journal.save_tune_out_summary(owner, ref.server_id, ref.channel_id, summary)
        self._log.info("tuneout.summary_delivered", agent=owner, by=call.agent.name, server=ref.server_id, channel=ref.channel_id)
        return tool_result(texts.summary_delivered(shown, owner), data={**ref.to_wire(), "shown": shown, "agent": owner})

    def _shown(self, ref: ChannelRef) -> str:
        return self._router.names.name_shown(ref)


_NOT_DONE: Final[Mapping[str, str]] = {
    "cancel_tuneout": texts.NOTHING_CANCELLED,
    "speak_in_channel": texts.NOTHING_POSTED,
    "deliver_summary": texts.NOTHING_DELIVERED,
}
