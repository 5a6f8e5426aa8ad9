"""Reading a wake gate (``agents.<name>.wakeGate``, or ``wakeGate`` in a hello's agent spec).

One reader for both: the config's problems carry the file and key; a hello's carry
``session/hello`` and the agent's index. Every problem has its key, what is wrong and a fix,
with a "did you mean" where a name is close to a known one. See docs/wake-policy.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Final

from mcpl_router.config.errors import did_you_mean, show_value
from mcpl_router.config.section_reader import Section
from mcpl_router.routing.gating import (
    ALWAYS,
    BEHAVIOURS,
    DEBOUNCE,
    DEFAULT_MAX_HELD,
    DEFER,
    KINDS,
    RATE_LIMIT,
    Behaviour,
    ChannelMatch,
    GateRule,
    WakeGateSpec,
    is_glob,
)
from mcpl_router.routing.refs import ChannelRef

GATE_KEYS: Final = ("rules", "default", "maxHeld")
RULE_KEYS: Final = ("tagsAny", "tagsAll", "tagsNone", "servers", "channels", "kinds", "behaviour")
MAX_DEBOUNCE_MS: Final = 3_600_000
MAX_HELD_LIMIT: Final = 100_000
_BEHAVIOUR_FIX: Final = (
    'Write "always", "defer", { debounce = { ms = 500 } } or { rate_limit = { per = 3, seconds = 60 } }.'
)
_CHANNEL_FIX: Final = (
    'Write a qualified name "server:channel", a glob over qualified names such as "a:*", '
    'or a ref { serverId = "...", channelId = "..." }.'
)


def parse_wake_gate(agent: Section, server_ids: Sequence[str] | None) -> WakeGateSpec:
    """``wakeGate`` of one agent's section (absent: a gate that holds nothing).

    ``server_ids``: the configured servers (a rule's ``servers`` and refs are checked against
    them); None where they aren't known (a hello's spec).
    """
    if not agent.given("wakeGate"):
        return WakeGateSpec()
    gate = agent.table("wakeGate", GATE_KEYS, "wakeGate")
    default = _behaviour(gate, "default") if gate.given("default") else Behaviour(ALWAYS)
    max_held = gate.integer("maxHeld", DEFAULT_MAX_HELD, at_least=1, at_most=MAX_HELD_LIMIT)
    rules: list[GateRule] = []
    raw_rules = gate.raw("rules") if gate.given("rules") else []
    if not isinstance(raw_rules, list):
        gate.error("rules", f"expected a list of rules, got {show_value(raw_rules)}.",
                   'Write [[agents.<name>.wakeGate.rules]] tables, or rules = [{ behaviour = "defer" }].')
        raw_rules = []
    for index, raw in enumerate(raw_rules):
        rule = Section.of(gate.problems, raw, f"{gate.key_of('rules')}[{index}]", "wake gate rule", RULE_KEYS)
        if rule is None:
            continue
        parsed = _rule(rule, server_ids)
        if parsed is not None:
            rules.append(parsed)
    return WakeGateSpec(tuple(rules), default, max_held)


def _rule(rule: Section, server_ids: Sequence[str] | None) -> GateRule | None:
    if not rule.has("behaviour"):
        rule.error("behaviour", "is missing: a rule says what it does with the wakes it matches.", _BEHAVIOUR_FIX)
        return None
    behaviour = _behaviour(rule, "behaviour")
    tags: dict[str, tuple[str, ...]] = {}
    for field in ("tagsAny", "tagsAll", "tagsNone"):
        tags[field] = rule.strings(field, (), item="tag pattern") or ()
        for index, tag in enumerate(tags[field]):
            if ":" not in tag and not is_glob(tag):
                rule.problems.error(f"{rule.key_of(field)}[{index}]", f"{show_value(tag)} is not a namespace:value tag.",
                                    'Write e.g. "chat:ambient", "chat:*" or a glob such as "chat:a*".')
    servers = rule.strings("servers", (), item="server id") or ()
    for index, server_id in enumerate(servers):
        _check_server(rule, f"{rule.key_of('servers')}[{index}]", server_id, server_ids)
    kinds = rule.strings("kinds", (), item="event kind") or ()
    for index, kind in enumerate(kinds):
        if kind not in KINDS:
            rule.problems.error(f"{rule.key_of('kinds')}[{index}]", f"{show_value(kind)} is not an event kind.",
                                did_you_mean(kind, KINDS) + f"Use one of: {', '.join(KINDS)}.")
    return GateRule(
        behaviour=behaviour,
        tags_any=tags["tagsAny"],
        tags_all=tags["tagsAll"],
        tags_none=tags["tagsNone"],
        servers=servers,
        channels=_channels(rule, server_ids),
        kinds=kinds,
    )


def _channels(rule: Section, server_ids: Sequence[str] | None) -> tuple[ChannelMatch, ...]:
    if not rule.given("channels"):
        return ()
    raw = rule.raw("channels")
    if not isinstance(raw, list):
        rule.error("channels", f"expected a list of channels, got {show_value(raw)}.", _CHANNEL_FIX)
        return ()
    out: list[ChannelMatch] = []
    for index, entry in enumerate(raw):
        where = f"{rule.key_of('channels')}[{index}]"
        if isinstance(entry, str):
            if is_glob(entry):
                out.append(ChannelMatch(pattern=entry))
            elif ":" not in entry.strip(":"):
                rule.problems.error(
                    where,
                    f"{json.dumps(entry)} names no server: a bare channel id would mean any server's channel with that id.",
                    f'Write it with its server, e.g. "{server_ids[0] if server_ids else "server"}:{entry}", '
                    'or as a ref { serverId = "...", channelId = "..." }.',
                )
            elif server_ids is not None and not _begins_with_a_server(entry, server_ids):
                # Read only as serverId:channelId (never as a bare id, which a discord id
                # such as "discord:123:456" is, colons and all), this entry could never match.
                known = ", ".join(server_ids) or "none yet"
                rule.problems.error(
                    where,
                    f"{json.dumps(entry)} is no configured server's qualified name: an entry is read as"
                    " serverId:channelId, never as a bare channel id, and it begins with no server in mcplServers.",
                    f'Write it with its server, e.g. "{server_ids[0] if server_ids else "server"}:{entry}", '
                    f'or as a ref {{ serverId = "...", channelId = "..." }}. Configured servers: {known}.',
                )
            else:
                out.append(ChannelMatch(name=entry))
        elif isinstance(entry, Mapping):
            ref = Section.of(rule.problems, entry, where, "channel ref", ("serverId", "channelId"))
            if ref is None:
                continue
            server_id, channel_id = ref.string("serverId"), ref.string("channelId")
            for field, value in (("serverId", server_id), ("channelId", channel_id)):
                if not value:
                    ref.error(field, "is missing: a channel ref is a serverId and a channelId.", _CHANNEL_FIX)
            if server_id:
                _check_server(ref, ref.key_of("serverId"), server_id, server_ids)
            if server_id and channel_id:
                out.append(ChannelMatch(ref=ChannelRef(server_id, channel_id)))
        else:
            rule.problems.error(where, f"expected a channel, got {show_value(entry)}.", _CHANNEL_FIX)
    return tuple(out)


def _begins_with_a_server(entry: str, server_ids: Sequence[str]) -> bool:
    """Whether some configured server's pairs could have ``entry`` as ``serverId:channelId``.

    Any configured server the entry begins with, followed by a colon, counts: not only the part
    before its first colon, since server ids hold colons too (``a:b``'s ``room`` and ``a``'s
    ``b:room`` are both ``a:b:room``). At runtime the entry is matched against the registered
    pairs, never split, as the resolver matches qualified names.
    """
    return any(entry.startswith(f"{server_id}:") and len(entry) > len(server_id) + 1 for server_id in server_ids)


def _behaviour(section: Section, name: str) -> Behaviour:
    raw: object = section.raw(name)
    if isinstance(raw, str):
        if raw in (ALWAYS, DEFER):
            return Behaviour(raw)
        if raw in (DEBOUNCE, RATE_LIMIT):
            example = "{ debounce = { ms = 500 } }" if raw == DEBOUNCE else "{ rate_limit = { per = 3, seconds = 60 } }"
            section.error(name, f"{json.dumps(raw)} needs its settings.", f"Write {name} = {example}.")
        else:
            section.error(name, f"{json.dumps(raw)} is not a wake gate behaviour.", did_you_mean(raw, BEHAVIOURS) + _BEHAVIOUR_FIX)
        return Behaviour(ALWAYS)
    table = Section.of(section.problems, raw, section.key_of(name), "behaviour", (DEBOUNCE, RATE_LIMIT), (ALWAYS, DEFER))
    if table is None:
        return Behaviour(ALWAYS)
    if len(table.data) != 1:
        section.error(name, f"names {len(table.data)} behaviours; a rule has one.", _BEHAVIOUR_FIX)
        return Behaviour(ALWAYS)
    kind = next(iter(table.data))
    if kind in (ALWAYS, DEFER):
        return Behaviour(kind)
    if kind == DEBOUNCE:
        settings = table.table(DEBOUNCE, ("ms",), "debounce")
        if not settings.has("ms"):
            settings.error("ms", "is missing: how long the source must be quiet, in milliseconds.", "Write e.g. ms = 500.")
        return Behaviour(DEBOUNCE, ms=settings.integer("ms", 1000, at_least=1, at_most=MAX_DEBOUNCE_MS))
    if kind == RATE_LIMIT:
        settings = table.table(RATE_LIMIT, ("per", "seconds"), "rate_limit")
        for field in ("per", "seconds"):
            if not settings.has(field):
                settings.error(field, "is missing: a rate limit is per wakes every seconds.", "Write e.g. { per = 3, seconds = 60 }.")
        per = settings.integer("per", 1, at_least=1, at_most=MAX_HELD_LIMIT)
        return Behaviour(RATE_LIMIT, per=per, seconds=settings.number("seconds", 60.0, above=0, at_most=86_400))
    return Behaviour(ALWAYS)  # an unknown key: Section.of reported it


def _check_server(section: Section, where: str, server_id: str, server_ids: Sequence[str] | None) -> None:
    if server_ids is None or server_id in server_ids:
        return
    known = ", ".join(server_ids) or "none yet"
    section.problems.error(where, f"{json.dumps(server_id)} is not a server in mcplServers.",
                           did_you_mean(server_id, server_ids) + f"Configured servers: {known}.")
