"""The speech tools of prose routing: ``drafts``, ``prose_help``, ``skip_reply``, ``think``, ``sleep``.

A :class:`~mcpl_router.tools.seam.ToolProvider`. Descriptions follow the agent's mode (a named
or disabled agent is told nothing is announced). What a call may touch is its scope's: a call
made outside the open turn (``call.scope.turn is None``) moves no routing, reads none of the
turn's own channels, and its ``sleep`` announces nowhere.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Final

from mcpl_router.logs import get_logger
from mcpl_router.routing import texts
from mcpl_router.routing.drafts import Draft, page
from mcpl_router.routing.modes import ProseMode
from mcpl_router.tools.arguments import DraftsArgs, SleepArgs
from mcpl_router.tools.seam import ToolCall, ToolName, ToolSpec, record_explicit_send, tool_result

if TYPE_CHECKING:
    from mcpl_router.routing.agents import AgentSpec
    from mcpl_router.turns import DraftBook, Speech, TurnRun

__all__ = ["SPEECH_TOOLS", "SpeechTools"]

SPEECH_TOOLS: Final = ("drafts", "prose_help", "skip_reply", "think", "sleep")
_NAMES: Final = tuple(ToolName(name) for name in SPEECH_TOOLS)

# Stable refusal reasons.
REASON_UNKNOWN_DRAFT: Final = "unknown-draft"
REASON_NOT_RESENDABLE: Final = "draft-not-resendable"
REASON_NEEDS_CONFIRMATION: Final = "confirm-duplicate-needed"
REASON_NO_DESTINATION: Final = "no-destination"
REASON_DESTINATION_REFUSED: Final = "destination-refused"
REASON_SENDING: Final = "draft-sending"
REASON_BAD_ACTION: Final = "bad-action"


def _schema(properties: dict[str, object], required: list[str] | None = None) -> dict[str, object]:
    schema: dict[str, object] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


def tool_specs(mode: ProseMode) -> list[dict[str, object]]:
    """The speech tools as an agent in ``mode`` is offered them (descriptions agree with the mode)."""
    sleep_properties: dict[str, object] = {}
    if mode.speaks:
        sleep_properties["announce"] = {"type": "string", "description": "Words to post before resting."}
    return [
        {
            "name": "drafts",
            "description": texts.DRAFTS_DESCRIPTION,
            "inputSchema": _schema(
                {
                    "action": {"type": "string", "enum": ["list", "read", "resend", "dismiss"]},
                    "id": {"type": "string"},
                    "ids": {"type": "array", "items": {"type": "string"}},
                    "channelId": {"type": "string"},
                    "confirmDuplicate": {"type": "boolean"},
                    "page": {"type": "integer", "minimum": 1},
                },
                ["action"],
            ),
        },
        {"name": "prose_help", "description": texts.PROSE_HELP_DESCRIPTION, "inputSchema": _schema({})},
        {"name": "skip_reply", "description": mode.skip_reply_description, "inputSchema": _schema({})},
        {
            "name": "think",
            "description": mode.think_description,
            "inputSchema": _schema({"thought": {"type": "string"}}),
        },
        {"name": "sleep", "description": mode.sleep_description, "inputSchema": _schema(sleep_properties)},
    ]


class SpeechTools:
    """The speech tools, for every agent (its allowed tools still decide what it may call).

    Args:
        speech: speech targets as the turn resolves them, publishing, draft resends.
        drafts: the agents' drafts (read, saved).
    """

    def __init__(self, *, speech: Speech, drafts: DraftBook) -> None:
        self._speech = speech
        self._draft_book = drafts
        # The specs read only the mode's wording: built once per mode, not per turn.
        self._specs: dict[tuple[bool, str, str, str], list[ToolSpec]] = {}
        self._log = get_logger()

    def tool_names(self) -> Iterable[ToolName]:
        return _NAMES

    def tools_for(self, agent: AgentSpec, run: TurnRun) -> list[ToolSpec]:
        mode = run.mode
        key = (mode.speaks, mode.skip_reply_description, mode.think_description, mode.sleep_description)
        specs = self._specs.get(key)
        if specs is None:
            specs = self._specs[key] = tool_specs(mode)
        return specs

    def is_send(self, tool: ToolName, arguments: Mapping[str, object]) -> bool:
        """A drafts ``resend`` posts: its round's plain text is held (send-silencing)."""
        return tool.name == "drafts" and DraftsArgs.read(arguments).action == "resend"

    async def call(self, call: ToolCall) -> dict[str, object]:
        handler = {
            "drafts": self._drafts,
            "prose_help": self._prose_help,
            "skip_reply": self._skip_reply,
            "think": self._think,
            "sleep": self._sleep,
        }[call.name]
        return await handler(call)

    # ------------------------------------------------------------------ small tools

    async def _prose_help(self, call: ToolCall) -> dict[str, object]:
        mode = call.run.mode
        return tool_result(mode.help_text, data={"proseRouting": mode.name})

    async def _skip_reply(self, call: ToolCall) -> dict[str, object]:
        if call.scope.turn is not None:
            call.run.prose.all_private = True
        return tool_result(texts.SKIP_REPLY_DONE, data={"endTurn": True})

    async def _think(self, call: ToolCall) -> dict[str, object]:
        return tool_result(texts.THINK_DONE)

    async def _sleep(self, call: ToolCall) -> dict[str, object]:
        run = call.run
        announce = SleepArgs.read(call.arguments).announce
        turn = call.scope.turn
        log = self._log.bind(agent=run.turn.agent, turn=run.turn.turn_id, call=call.call_id)
        if not run.mode.speaks or turn is None or not announce:
            log.info("sleep.not_announced", mode=run.mode.name, in_turn=turn is not None)
            return tool_result(texts.SLEEP_NOT_ANNOUNCED, data={"sleep": True})
        where = turn.routing.sticky_target or turn.routing.locus
        if where is None:
            log.info("sleep.not_announced", why="no-destination")
            return tool_result(texts.SLEEP_NOT_ANNOUNCED, data={"sleep": True})
        delivery = await self._speech.publish(run, where, announce)
        turn.routing.record(delivery)
        log.info("sleep.announced", server=where.server_id, channel=where.channel_id, outcome=delivery.outcome)
        if delivery.outcome == "failed":
            return tool_result(
                texts.delivery_failed(delivery.shown, where.server_id, delivery.reason or texts.Reason.NOT_DELIVERED),
                data={"sleep": True},
            )
        return tool_result(texts.sleep_announced(delivery.shown), data={"sleep": True, "delivery": delivery.to_wire()})

    # ------------------------------------------------------------------ drafts

    async def _drafts(self, call: ToolCall) -> dict[str, object]:
        args = DraftsArgs.read(call.arguments)
        action = args.action
        if action == "list":
            return self._list(call, args)
        if action == "read":
            return self._read(call, args)
        if action == "resend":
            return await self._resend(call, args)
        if action == "dismiss":
            return self._dismiss(call, args)
        return tool_result(
            f"Unknown action {texts.quoted(str(action))}. Nothing was done. Use list, read, resend or dismiss.",
            error=True,
            reason=REASON_BAD_ACTION,
        )

    def _list(self, call: ToolCall, args: DraftsArgs) -> dict[str, object]:
        drafts = page(self._draft_book.drafts_of(call.run.turn.agent), args.page)
        now = time.time()
        rows = [draft.to_wire(now) for draft in drafts]
        if not rows:
            return tool_result("You have no drafts on this page.", data={"drafts": []})
        lines = [f"{r['id']} {r['state']} {r['ageSeconds']}s {r['reason']} {r['size']} chars: {r['preview']}" for r in rows]
        return tool_result("\n".join(lines), data={"drafts": rows})

    def _read(self, call: ToolCall, args: DraftsArgs) -> dict[str, object]:
        [draft_id, *_] = args.ids or ("",)
        draft = self._draft_book.draft(call.run.turn.agent, draft_id)
        if draft is None:
            return tool_result(texts.draft_unknown(draft_id), error=True, reason=REASON_UNKNOWN_DRAFT)
        attempts = [f"- {a.shown}: {a.outcome}" + (f" ({a.reason})" if a.reason else "") for a in draft.attempts]
        text = f"{draft.draft_id} ({draft.state}, {draft.reason})\n" + ("\n".join(attempts) + "\n" if attempts else "") + draft.text
        return tool_result(text, data={**draft.to_wire(), "text": draft.text, "attempts": [a.to_wire() for a in draft.attempts]})

    def _dismiss(self, call: ToolCall, args: DraftsArgs) -> dict[str, object]:
        drafts: list[Draft] = []
        for draft_id in args.ids:
            draft = self._draft_book.draft(call.run.turn.agent, draft_id)
            if draft is None:
                return tool_result(texts.draft_unknown(draft_id), error=True, reason=REASON_UNKNOWN_DRAFT)
            if draft.sending:
                return tool_result(texts.draft_not_resendable(draft_id, "being sent"), error=True, reason=REASON_SENDING)
            drafts.append(draft)
        for draft in drafts:
            draft.state = "dismissed"
            self._draft_book.save(draft)
        return tool_result(texts.draft_dismissed([d.draft_id for d in drafts]), data={"dismissed": [d.draft_id for d in drafts]})

    async def _resend(self, call: ToolCall, args: DraftsArgs) -> dict[str, object]:
        run = call.run
        agent = run.turn.agent
        named = run.mode.sends_only_where_named
        # Each id once, in the order given: the same draft named twice is sent once.
        ids = list(dict.fromkeys(args.ids))
        for draft_id in ids:
            if self._draft_book.draft(agent, draft_id) is None:
                return tool_result(texts.draft_unknown(draft_id), error=True, reason=REASON_UNKNOWN_DRAFT)
        if not ids:
            return tool_result(texts.draft_unknown(""), error=True, reason=REASON_UNKNOWN_DRAFT)
        channel = args.channel_id
        routing = call.scope.turn.routing if call.scope.turn is not None else None
        if channel is None:
            ref = None if named or routing is None else (routing.sticky_target or routing.locus)
            if ref is None:
                return tool_result(texts.draft_no_destination(named), error=True, reason=REASON_NO_DESTINATION)
        else:
            target = self._speech.resolve_target(channel, routing)
            if target.ref is None:
                why = target.text if not target.skip else texts.bounce_why_unknown(channel)
                lines = "".join(f"\n- {c}" for c in (c[2:] for c in target.candidates))
                return tool_result(
                    f"{texts.DRAFTS_NOTHING_SENT} The destination was refused: {why}{lines}",
                    error=True,
                    reason=REASON_DESTINATION_REFUSED,
                    data={"why": target.why},
                )
            ref = target.ref
        confirm = args.confirm_duplicate
        rows: list[str] = []
        sent: list[dict[str, object]] = []
        for draft_id in ids:
            # Read fresh right before sending: an earlier send (this call's, a concurrent
            # resend's or an {{unsent}}'s) may have moved it. The checks below and the
            # "sending" mark resend_draft journals happen with no await between them.
            draft = self._draft_book.draft(agent, draft_id)
            refusal = None
            if draft is None:
                refusal = (texts.draft_unknown(draft_id), REASON_UNKNOWN_DRAFT)
            elif draft.sending:
                refusal = (texts.draft_not_resendable(draft.draft_id, "being sent"), REASON_SENDING)
            elif draft.state in ("delivered", "dismissed"):
                refusal = (texts.draft_not_resendable(draft.draft_id, draft.state), REASON_NOT_RESENDABLE)
            elif draft.state == "unconfirmed" and not confirm:
                refusal = (texts.draft_needs_confirmation(draft.draft_id), REASON_NEEDS_CONFIRMATION)
            if refusal is not None:
                if not sent:
                    return tool_result(refusal[0], error=True, reason=refusal[1])
                rows.append(refusal[0])
                break
            assert draft is not None  # a missing one is refused above
            delivery = await self._speech.resend_draft(run, draft, ref)
            sent.append({"id": draft.draft_id, **delivery.to_wire()})
            rows.append(f"{draft.draft_id} → {delivery.shown}: {delivery.outcome}")
            self._log.info("drafts.resent", agent=agent, draft=draft.draft_id, server=ref.server_id,
                           channel=ref.channel_id, outcome=delivery.outcome)
            if delivery.outcome != "failed":
                record_explicit_send(call, ref)
            if delivery.outcome != "delivered":
                break  # stop at the first not confirmed
        return tool_result(texts.draft_resent(rows), error=not any(s["outcome"] == "delivered" for s in sent), data={"sent": sent})
