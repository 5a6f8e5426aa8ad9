"""The one name table: each name offered to a model means exactly one tool.

Every provider's names (:meth:`~mcpl_router.tools.seam.ToolProvider.tool_names`) are put in
one table by :func:`build_names`. Listing (``turn/open``'s tools), dispatch (``turn/tool``) and
send-silencing (``turn/round``: is this call a send?) all read it, so what a model is shown and
what a call reaches can never disagree.

A clash is refused when the table is built, never settled by order at dispatch:

- the daemon's own tool names are **reserved**: a server tool offered under one (an empty or
  short ``toolPrefix``: prefix ``s`` and tool ``leep`` is ``sleep``) is not offered, and the
  name stays the daemon's (kind ``daemon-tool``);
- two server tools offered under one name (two servers given one prefix, or prefixes and
  tools that join alike: ``mcpl--discord--`` + ``eu--send`` and ``mcpl--discord--eu--`` +
  ``send``) are **both** not offered, whichever listed first (kind ``servers``).

A server tool's entry holds its ``(serverId, tool)`` pair as a pair: nothing parses a name
back. A call to a refused name gets the unknown-tool result. Each clash is logged once when it
appears (``tools.name_clash``, a warning naming every side with its server) and counted
(``mcpl_router_tool_name_clashes_total``); ``tools.name_clash_cleared`` when it goes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

import attrs

from mcpl_router.events import EventBus, ServerToolsChanged
from mcpl_router.logs import get_logger
from mcpl_router.routing.agents import agent_may_call
from mcpl_router.tools.seam import ToolName, ToolProvider, ToolSpec, same_objects

if TYPE_CHECKING:
    from mcpl_router.routing.agents import AgentSpec
    from mcpl_router.turns import TurnRun

__all__ = ["CLASH_DAEMON_TOOL", "CLASH_SERVERS", "NameClash", "ToolEntry", "ToolTable", "build_names"]

#: A server tool offered under one of the daemon's own tool names.
CLASH_DAEMON_TOOL: Final = "daemon-tool"
#: Two or more server tools offered under one name.
CLASH_SERVERS: Final = "servers"


@attrs.frozen(eq=False)
class ToolEntry:
    """What one offered name means: the tool, and the provider that lists and runs it."""

    tool: ToolName
    provider: ToolProvider


def _side_order(tool: ToolName) -> tuple[int, str, str]:
    pair = tool.server_tool
    return (0, "", tool.name) if pair is None else (1, pair.server_id, pair.tool)


@attrs.frozen
class NameClash:
    """A name more than one tool would be offered under; none of its server tools is offered.

    ``sides`` are every tool that wanted the name: the daemon's own first (kind
    ``daemon-tool``), then the server tools by server and tool, whoever listed first.
    """

    name: str
    kind: str
    sides: tuple[ToolName, ...]

    def sides_wire(self) -> list[dict[str, str | None]]:
        """The sides as a log shows them: ``{"server": id or None (the daemon's), "tool": name}``."""
        return [
            {"server": None, "tool": side.name}
            if side.server_tool is None
            else {"server": side.server_tool.server_id, "tool": side.server_tool.tool}
            for side in self.sides
        ]


def build_names(offers: Iterable[tuple[ToolProvider, ToolName]]) -> tuple[dict[str, ToolEntry], tuple[NameClash, ...]]:
    """The name table from every provider's names: each name to one entry, and the clashes.

    Raises:
        ValueError: two daemon providers claim one name (a programming error, not config).
    """
    daemon_tools: dict[str, ToolEntry] = {}
    server_tools: dict[str, list[ToolEntry]] = {}
    for provider, tool in offers:
        if tool.server_tool is None:
            taken = daemon_tools.get(tool.name)
            if taken is not None and taken.provider is not provider:
                raise ValueError(f"two tool providers offer the daemon tool {tool.name!r}")
            daemon_tools.setdefault(tool.name, ToolEntry(tool, provider))
            continue
        group = server_tools.setdefault(tool.name, [])
        if all(entry.tool != tool for entry in group):
            group.append(ToolEntry(tool, provider))
    entries = dict(daemon_tools)
    clashes: list[NameClash] = []
    for name, group in server_tools.items():
        reserved = daemon_tools.get(name)
        if reserved is not None:
            sides = (reserved.tool, *sorted((entry.tool for entry in group), key=_side_order))
            clashes.append(NameClash(name, CLASH_DAEMON_TOOL, sides))
        elif len(group) > 1:
            clashes.append(NameClash(name, CLASH_SERVERS, tuple(sorted((entry.tool for entry in group), key=_side_order))))
        else:
            entries[name] = group[0]
    return entries, tuple(clashes)


#: Agents whose offered tools are kept filtered; past this the memory starts again.
OFFERED_KEPT: Final = 1024


@attrs.frozen
class _Offered:
    """One agent's offered tools, and what they were filtered from (compared by identity)."""

    agent: object
    entries: dict[str, ToolEntry]
    listed: list[list[ToolSpec]]
    specs: list[ToolSpec]


class ToolTable:
    """The table every listing and dispatch reads; ``daemon.tools`` (and ``turns.tools``).

    Built last among the tool parts, with every provider (their order is the listing's order);
    rebuilt whenever a server's tool list changes (:class:`ServerToolsChanged`).

    Args:
        providers: the tool providers, in listing order.
        on_clash: called once for each clash as it appears (the daemon counts it).
        events: where the connector tools say a server's list changed.
    """

    def __init__(self, providers: Sequence[ToolProvider] = (), *, on_clash: Callable[[NameClash], None] | None = None,
                 events: EventBus | None = None) -> None:
        self._providers: tuple[ToolProvider, ...] = tuple(providers)
        self._entries: dict[str, ToolEntry] = {}
        self._clashes: dict[str, NameClash] = {}
        self._on_clash = on_clash
        #: Each agent's offered tools as last filtered (see :meth:`offered`), by agent name.
        self._offered: dict[str | None, _Offered] = {}
        self._log = get_logger()
        self.rebuild()
        if events is not None:
            events.subscribe(ServerToolsChanged, lambda _changed: self.rebuild())

    def rebuild(self) -> None:
        """Build the table again from every provider's names; log and count new clashes."""
        entries, clashes = build_names((provider, tool) for provider in self._providers for tool in provider.tool_names())
        current = {clash.name: clash for clash in clashes}
        for name, clash in current.items():
            if self._clashes.get(name) == clash:
                continue  # the same clash as before: logged when it appeared
            self._log.warning(
                "tools.name_clash", name=name, kind=clash.kind, sides=clash.sides_wire(),
                hint="no server tool is offered under this name; give the server(s) another toolPrefix",
            )
            if self._on_clash is not None:
                self._on_clash(clash)
        for name, clash in self._clashes.items():
            if name not in current:
                self._log.info("tools.name_clash_cleared", name=name, kind=clash.kind)
        self._entries, self._clashes = entries, current

    # ------------------------------------------------------------------ reading

    def entry(self, name: str) -> ToolEntry | None:
        """What ``name`` means; None for a name no tool is offered under (unknown or refused)."""
        return self._entries.get(name)

    @property
    def clashes(self) -> tuple[NameClash, ...]:
        """The names refused now."""
        return tuple(self._clashes.values())

    def offered(self, agent: AgentSpec, run: TurnRun) -> list[ToolSpec]:
        """The tools ``turn/open`` offers: each provider's, in provider order, that the table
        gives to that provider and the agent's allowed tools admit.

        Filtered once per agent while the table and every provider's list are the same objects
        (providers keep their lists while nothing they are made of changes). Each caller gets a
        list of its own; the specs in it are shared, as the providers share them.
        """
        listed = [provider.tools_for(agent, run) for provider in self._providers]
        key = None if agent is None else agent.name
        kept = self._offered.get(key)
        if kept is not None and kept.agent is agent and kept.entries is self._entries and same_objects(kept.listed, listed):
            return list(kept.specs)
        specs: list[ToolSpec] = []
        for provider, provided in zip(self._providers, listed, strict=True):
            for spec in provided:
                name = spec.get("name")
                entry = self._entries.get(name) if isinstance(name, str) else None
                if entry is None or entry.provider is not provider or not agent_may_call(agent, entry.tool.name):
                    continue
                specs.append(spec)
        if len(self._offered) >= OFFERED_KEPT:
            self._offered.clear()  # hosts name agents freely: the memory stays bounded
        self._offered[key] = _Offered(agent, self._entries, listed, specs)
        return list(specs)

    def is_send(self, name: str, arguments: Mapping[str, object]) -> bool:
        """Whether a call by ``name`` posts somewhere (its round's plain text is then held)."""
        entry = self._entries.get(name)
        return entry is not None and entry.provider.is_send(entry.tool, arguments)
