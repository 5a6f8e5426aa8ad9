"""Reading ``agents``: each agent's prose routing, allowed tools, home channel and wake policy.

The server ids an agent names are checked against every configured server, so a typo is reported
at load (with a "did you mean") rather than showing up as an agent that is never woken.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Final

from mcpl_router.config.errors import did_you_mean, show_value
from mcpl_router.config.model import AGENT_KEYS, CHANNEL_REF_KEYS, PROSE_ROUTING_MODES, AgentConfig
from mcpl_router.config.read_conversations import parse_conversations
from mcpl_router.config.read_gate import parse_wake_gate
from mcpl_router.config.section_reader import Section
from mcpl_router.routing.modes import DEFAULT_MODE
from mcpl_router.routing.refs import ChannelRef

_HOME_CHANNEL_FIX: Final = 'Write homeChannel = { serverId = "...", channelId = "..." }.'


def parse_agents(section: Section, server_ids: Sequence[str]) -> dict[str, AgentConfig]:
    """``agents``: the valid ones; ``server_ids`` are every id ``mcplServers`` names."""
    agents: dict[str, AgentConfig] = {}
    for name, value in section.data.items():
        key = section.key_of(name)
        if not name or any(char.isspace() for char in name):
            section.problems.error(
                key,
                f"{json.dumps(name)} is not an agent name: a name is a non-empty string "
                "without whitespace.",
                "Rename it.",
            )
        a = Section.of(section.problems, value, key, "agent", AGENT_KEYS)
        if a is None:
            continue
        wake_servers = a.strings("wakeServers", (), item="server id") or ()
        for index, server_id in enumerate(wake_servers):
            _check_server_known(a, "wakeServers", server_id, server_ids, index=index)
        wake_tags = a.strings("wakeTags", (), item="tag") or ()
        for index, tag in enumerate(wake_tags):
            if ":" not in tag:
                a.problems.error(
                    f"{a.key_of('wakeTags')}[{index}]",
                    f"{show_value(tag)} is not a namespace:value tag.",
                    'Write e.g. "chat:addressed" or "chat:*".',
                )
        agents[name] = AgentConfig(
            name=name,
            prose_routing=a.choice(
                "proseRouting", PROSE_ROUTING_MODES, DEFAULT_MODE.name, "a prose routing mode"
            ),
            allowed_tools=a.strings("allowedTools", None, item="tool pattern"),
            home_channel=_home_channel(a, server_ids),
            wake_channels=a.strings("wakeChannels", (), item="channel name") or (),
            wake_servers=wake_servers,
            wake_tags=wake_tags,
            subconscious_for=a.string("subconsciousFor"),
            wake_gate=parse_wake_gate(a, server_ids),
            conversations=parse_conversations(a, name),
        )
    return agents


def _home_channel(a: Section, server_ids: Sequence[str]) -> ChannelRef | None:
    if not isinstance(a.raw("homeChannel"), Mapping):
        if a.given("homeChannel"):
            raw = a.raw("homeChannel")
            a.error("homeChannel", f"expected a table, got {show_value(raw)}.", _HOME_CHANNEL_FIX)
        return None
    ref = a.table("homeChannel", CHANNEL_REF_KEYS, "homeChannel")
    server_id = ref.string("serverId")
    channel_id = ref.string("channelId")
    for field in CHANNEL_REF_KEYS:
        if not ref.has(field):
            problem = "is missing: a home channel is a serverId and a channelId."
            ref.error(field, problem, _HOME_CHANNEL_FIX)
    if server_id is not None:
        _check_server_known(ref, "serverId", server_id, server_ids)
    if server_id is None or channel_id is None:
        return None
    return ChannelRef(server_id, channel_id)


def _check_server_known(
    section: Section,
    name: str,
    server_id: str,
    server_ids: Sequence[str],
    *,
    index: int | None = None,
) -> None:
    if server_id in server_ids:
        return
    where = section.key_of(name) + ("" if index is None else f"[{index}]")
    known = ", ".join(server_ids) or "none yet"
    section.problems.error(
        where,
        f"{json.dumps(server_id)} is not a server in mcplServers.",
        did_you_mean(server_id, server_ids) + f"Configured servers: {known}.",
    )
