"""Typed answers of the host API's methods (docs/host-api.md), as msgspec Structs.

Each Struct reads the method's JSON result (``rename="camel"``: ``turnId`` is ``turn_id``).
Unknown fields are ignored, so a daemon that adds a field doesn't break an older client; a
field the docs make optional has a default. Nested values whose shape belongs to someone else
(a tool's ``inputSchema``, a server's receipt, a message as received) stay plain JSON values.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = [
    "AckResult",
    "AgentRow",
    "ChannelRef",
    "ChannelRow",
    "ChannelsPage",
    "ContextResult",
    "Delivery",
    "DraftRow",
    "Explanation",
    "ExplainCandidate",
    "Grant",
    "HelloAgent",
    "HelloResult",
    "Injection",
    "Injections",
    "PublishResult",
    "Readiness",
    "Receipt",
    "ReloadResult",
    "Refusal",
    "RoundResult",
    "ServerStatus",
    "Serves",
    "ServersList",
    "ShownChannel",
    "Status",
    "ToolResult",
    "ToolSpec",
    "TurnClosed",
    "TurnContinued",
    "TurnOpened",
    "TurnShown",
    "TypingResult",
    "TypingRow",
]


class _Result(msgspec.Struct, rename="camel", kw_only=True):
    """Every result type: camelCase on the wire, unknown fields ignored."""

    def to_dict(self) -> dict[str, object]:
        """The value as the daemon wrote it (camelCase keys, plain JSON values)."""
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


class _FrozenResult(msgspec.Struct, rename="camel", kw_only=True, frozen=True):
    """A result that is a value (hashable, a dict key): frozen from its base up, as a frozen
    struct may not inherit from a mutable one."""

    def to_dict(self) -> dict[str, object]:
        """The value as the daemon wrote it (camelCase keys, plain JSON values)."""
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]


# ------------------------------------------------------------------ channels


class ChannelRef(_FrozenResult, frozen=True):
    """A channel's exact pair: which server, which of its channels."""

    server_id: str
    channel_id: str


class ShownChannel(_FrozenResult, frozen=True):
    """A channel's pair and the name the agent is shown (the id, or ``serverId:channelId``)."""

    server_id: str
    channel_id: str
    shown: str


class ChannelRow(_Result):
    """One row of ``channels/list``; ``name`` only where the id names another channel too."""

    server_id: str
    channel_id: str
    label: str | None = None
    type: str | None = None
    direction: str | None = None
    open: bool = False
    lazy: bool = False
    shown: str = ""
    name: str | None = None


class ChannelsPage(_Result):
    """``channels/list``: one page; pass ``next_cursor`` back as ``cursor`` while it is set."""

    channels: list[ChannelRow] = []
    next_cursor: str | None = None


class Refusal(_Result):
    """The resolver's refusal: ``kind`` (``ambiguous``, ``unknown``, …), its text, the refs."""

    kind: str
    text: str
    candidates: list[ChannelRef] = []


class ExplainCandidate(_Result):
    server_id: str
    channel_id: str
    matched_by: list[str] = []
    shown: str = ""
    picks_alone: str | None = None


class Explanation(_Result):
    """``explain``: how a name resolves, the rule that picked or refused, and the candidates."""

    name: str
    server_id: str | None = None
    rule: str = ""
    rule_text: str = ""
    resolved: ChannelRef | None = None
    refusal: Refusal | None = None
    candidates: list[ExplainCandidate] = []


# ------------------------------------------------------------------ servers and status


class Grant(_Result):
    granted: list[str] = []
    denied_count: int = 0
    feature_sets_enabled: list[str] = []
    feature_sets_disabled: dict[str, object] = {}
    legacy: bool = False


class ServerStatus(_Result):
    """One server's row in ``servers/list`` and ``status``."""

    server_id: str
    state: str
    transport: str = ""
    endpoint: str | None = None
    epoch: int = 0
    attempts: int = 0
    legacy: bool = False
    legacy_mapping: dict[str, str] = {}
    manifest_version: str | None = None
    grant: Grant | None = None
    receipt: Any = None
    last_error: str | None = None
    exit_code: int | None = None
    stderr: list[str] = []
    required: bool = False
    channel_count: int = 0
    registrations_refused: int = 0
    refusal_reasons: dict[str, int] = {}
    serving: bool = False
    problem: str | None = None
    #: Whether the server answers ping (``state``: answering, unresponsive, unknown, not-checked).
    liveness: dict[str, object] = {}


class ServersList(_Result):
    servers: list[ServerStatus] = []


class AgentRow(_Result):
    """An agent in ``status``: who owns it now (``host``/``connection`` null when none)."""

    name: str
    prose_routing: str = "locus"
    host: str | None = None
    connection: int | None = None
    unacked_wakes: int = 0


class Readiness(_Result):
    ready: bool
    problems: list[str] = []


class Status(_Result):
    """``status``: the daemon's summary. ``hosts`` and ``journal`` are counters (plain JSON)."""

    version: str
    servers: list[ServerStatus] = []
    ready: int = 0
    channels: int = 0
    last_seq: int = 0
    agents: list[AgentRow] = []
    open_turns: int = 0
    hosts: dict[str, object] = {}
    journal: dict[str, object] = {}
    readiness: Readiness | None = None
    last_reload: Any = None


# ------------------------------------------------------------------ sessions


class HelloAgent(_Result):
    """An agent the connection owns, as ``session/hello`` answers it (an AgentSpec)."""

    name: str
    prose_routing: str = "locus"
    allowed_tools: list[str] | None = None
    wake: dict[str, object] = {}
    home_channel: ChannelRef | None = None
    configured: bool = False
    subconscious_for: str | None = None
    wake_gate: dict[str, object] | None = None
    conversations: dict[str, object] | None = None


class Serves(_Result):
    """The agents whose model this connection serves, per kind (``session/hello``'s ``serves``)."""

    inference: list[str] = []
    model_info: list[str] = []


class HelloResult(_Result):
    daemon_version: str
    servers: list[ServerStatus] = []
    agents: list[HelloAgent] = []
    wake_seq: int = 0
    serves: Serves = msgspec.field(default_factory=Serves)


class AckResult(_Result):
    acked: int


# ------------------------------------------------------------------ turns


class ToolSpec(_Result):
    """A tool the turn's agent may call: hand it to the model as is."""

    name: str
    description: str = ""
    input_schema: dict[str, object] = {}


class TurnShown(_Result):
    """What the agent can be shown: the channel, the locus, and the ``[routing]`` line."""

    channel: str | None = None
    locus: str | None = None
    routing: str | None = None


class TurnOpened(_Result):
    """``turn/open``. ``system`` goes at the system position of every request of the turn."""

    turn_id: str
    inference_id: str
    channel: ShownChannel | None = None
    tools: list[ToolSpec] = []
    system: list[str] = []
    prose_routing: str = "locus"
    notices: list[str] = []
    shown: TurnShown = msgspec.field(default_factory=TurnShown)


class TurnContinued(_Result):
    """``turn/continue``: the turn's channel now, every channel it has been in, the notice."""

    turn_id: str
    start: int
    channel: ShownChannel | None = None
    was_in: list[ShownChannel] = []
    notices: list[str] = []
    shown: TurnShown = msgspec.field(default_factory=TurnShown)


class Injection(_Result):
    server_id: str
    namespace: str | None = None
    content: Any = None
    metadata: Any = None


class Injections(_Result):
    system: list[Injection] = []
    before_user: list[Injection] = []
    after_user: list[Injection] = []


class ContextResult(_Result):
    """``turn/context``: injections by position; each server's ``ok|timeout|error|skipped``."""

    injections: Injections = msgspec.field(default_factory=Injections)
    servers: dict[str, str] = {}


class Delivery(_Result):
    """One place a round's text went: ``outcome`` ``delivered | failed | unknown``."""

    server_id: str
    channel_id: str
    shown: str = ""
    outcome: str = "unknown"
    round: int = 0
    message_id: str | None = None
    reason: str | None = None


class RoundResult(_Result):
    """``turn/round``: what the round's text did, and the ``[routing]`` notices to show."""

    deliveries: list[Delivery] = []
    notices: list[str] = []


class ToolResult(_Result):
    """``turn/tool``: an MCP-shaped tool result (``reason`` on refusals)."""

    content: list[Any] = []
    is_error: bool = False
    structured_content: Any = None
    reason: str | None = None
    meta: dict[str, object] | None = msgspec.field(default=None, name="_meta")

    @property
    def text(self) -> str:
        """The text blocks of ``content``, joined (what most hosts hand back to the model)."""
        return "".join(
            block["text"] for block in self.content if isinstance(block, dict) and isinstance(block.get("text"), str)
        )


class Receipt(_Result):
    """The turn's receipt: ``text`` (null in explicit mode) and its counts."""

    text: str | None = None
    delivered: list[Delivery] = []
    held: int = 0
    private: int = 0
    suppressed: int = 0
    kept: int = 0


class DraftRow(_Result):
    id: str
    state: str = "held"
    reason: str = ""
    size: int = 0
    preview: str = ""
    created_at: float = 0.0
    age_seconds: int | None = None
    target: str | None = None
    detail: str | None = None


class TurnClosed(_Result):
    """``turn/close``: the receipt, every delivery, the drafts made, and ``again``."""

    receipt: Receipt = msgspec.field(default_factory=Receipt)
    deliveries: list[Delivery] = []
    drafts: list[DraftRow] = []
    notices: list[str] = []
    again: bool = False


# ------------------------------------------------------------------ publish and typing


class PublishResult(_Result):
    """``channels/publish``: ``delivered``, or a ``reason`` and ``text`` saying why not."""

    delivered: bool
    message_id: str | None = None
    reason: str | None = None
    text: str | None = None
    detail: str | None = None
    server_id: str | None = None
    channel_id: str | None = None
    shown: str | None = None
    candidates: list[ChannelRef] = []


class TypingRow(_Result):
    server_id: str
    channel_id: str
    shown: str = ""
    sent: bool = False
    reason: str | None = None


class TypingResult(_Result):
    typing: list[TypingRow] = []


# ------------------------------------------------------------------ operations


class ReloadResult(_Result):
    """``daemon/reload``: what the reload did (``outcome`` ``applied``), or why it changed
    nothing (``refused``, with ``errors``)."""

    outcome: str
    added: list[str] = []
    removed: list[str] = []
    reconnected: list[str] = []
    regranted: list[str] = []
    updated: list[str] = []
    agents_added: list[str] = []
    agents_changed: list[str] = []
    restart_needed: list[str] = []
    policy_pending: list[str] = []
    errors: list[str] = []
    at: float = 0.0
    config: str | None = None
