"""The one name table: each offered name means one tool; a clash is refused when it is built."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import pytest
from structlog.testing import capture_logs

from mcpl_router.tools import NameClash, ServerTool, ToolCall, ToolName, ToolTable
from mcpl_router.tools.table import CLASH_DAEMON_TOOL, CLASH_SERVERS, build_names


class Provider:
    """A provider offering fixed names; its specs are every name it has."""

    def __init__(self, *names: ToolName, sends: frozenset[str] = frozenset()) -> None:
        self.names = list(names)
        self.sends = sends

    def tool_names(self) -> Iterable[ToolName]:
        return self.names

    def tools_for(self, agent: Any, run: Any) -> list[dict[str, Any]]:
        return [{"name": tool.name} for tool in self.names]

    def is_send(self, tool: ToolName, arguments: Mapping[str, Any]) -> bool:
        return tool.name in self.sends

    async def call(self, call: ToolCall) -> dict[str, Any]:
        raise NotImplementedError


def server(server_id: str, tool: str, name: str | None = None) -> ToolName:
    return ToolName(name or f"mcpl--{server_id}--{tool}", ServerTool(server_id, tool))


def test_a_server_tool_under_a_daemon_tools_name_is_refused_and_the_name_stays_the_daemons() -> None:
    daemon, servers = Provider(ToolName("sleep")), Provider(server("a", "leep", "sleep"), server("a", "send"))
    entries, clashes = build_names([(daemon, t) for t in daemon.names] + [(servers, t) for t in servers.names])
    assert entries["sleep"].provider is daemon and entries["sleep"].tool == ToolName("sleep")
    assert entries["mcpl--a--send"].tool.server_tool == ServerTool("a", "send")
    assert clashes == (NameClash("sleep", CLASH_DAEMON_TOOL, (ToolName("sleep"), server("a", "leep", "sleep"))),)


@pytest.mark.parametrize("reverse", [False, True])
def test_server_tools_joined_into_one_name_are_all_refused_in_either_order(reverse: bool) -> None:
    one, two = server("discord", "eu--send"), server("discord--eu", "send")
    assert one.name == two.name
    tools = Provider(*([two, one] if reverse else [one, two]), server("discord", "react"))
    entries, clashes = build_names((tools, t) for t in tools.names)
    assert one.name not in entries and "mcpl--discord--react" in entries
    # The sides come in one order whoever listed first, so a clash reads (and compares) alike.
    assert clashes == (NameClash(one.name, CLASH_SERVERS, (one, two)),)
    assert clashes[0].sides_wire() == [{"server": "discord", "tool": "eu--send"}, {"server": "discord--eu", "tool": "send"}]


def test_two_daemon_providers_claiming_one_name_is_a_programming_error() -> None:
    first, second = Provider(ToolName("think")), Provider(ToolName("think"))
    with pytest.raises(ValueError, match="think"):
        build_names([(first, ToolName("think")), (second, ToolName("think"))])


def test_the_table_logs_and_counts_a_clash_once_and_says_when_it_clears() -> None:
    counted: list[NameClash] = []
    daemon = Provider(ToolName("sleep"), sends=frozenset({"sleep"}))
    servers = Provider(server("a", "leep", "sleep"))
    with capture_logs() as logs:
        table = ToolTable([daemon, servers], on_clash=counted.append)
        table.rebuild()
        table.rebuild()
        servers.names = []
        table.rebuild()
    events = [entry["event"] for entry in logs]
    assert events == ["tools.name_clash", "tools.name_clash_cleared"]
    assert logs[0]["sides"] == [{"server": None, "tool": "sleep"}, {"server": "a", "tool": "leep"}]
    assert [clash.kind for clash in counted] == [CLASH_DAEMON_TOOL]
    assert table.clashes == ()


def test_listing_and_dispatch_read_one_table() -> None:
    daemon = Provider(ToolName("sleep"), ToolName("channel_publish"), sends=frozenset({"channel_publish"}))
    servers = Provider(server("a", "leep", "sleep"), server("a", "x", "shared"), server("b", "y", "shared"), server("a", "send"))
    table = ToolTable([daemon, servers])
    offered = [spec["name"] for spec in table.offered(None, None)]  # type: ignore[arg-type]
    assert offered == ["sleep", "channel_publish", "mcpl--a--send"]
    assert [table.entry(name) is not None for name in ("sleep", "shared", "mcpl--a--send", "nope")] == [True, False, True, False]
    entry = table.entry("sleep")
    assert entry is not None and entry.provider is daemon
    assert table.is_send("channel_publish", {}) and not table.is_send("shared", {}) and not table.is_send("nope", {})


# -- the offered tools, filtered once while nothing they come from has changed --------------


class KeptProvider(Provider):
    """Keeps its list object while its names are the same (as the daemon's providers do); a
    ``reserved`` name is in the table but never offered (as tune_out's subconscious tools)."""

    def __init__(self, *names: ToolName, reserved: Iterable[ToolName] = ()) -> None:
        super().__init__(*names)
        self.reserved = list(reserved)
        self._kept: list[dict[str, Any]] = []
        self._kept_for: list[str] | None = None

    def tool_names(self) -> Iterable[ToolName]:
        return [*self.names, *self.reserved]

    def tools_for(self, agent: Any, run: Any) -> list[dict[str, Any]]:
        now = [tool.name for tool in self.names]
        if now != self._kept_for:
            self._kept, self._kept_for = [{"name": name} for name in now], now
        return self._kept


@attrs.frozen
class Agent:
    name: str
    allowed_tools: tuple[str, ...] | None = None


def _names(specs: list[dict[str, Any]]) -> list[str]:
    return [spec["name"] for spec in specs]


def test_the_offered_tools_are_each_callers_own_and_follow_every_change_they_come_from() -> None:
    daemon, servers = KeptProvider(ToolName("sleep")), KeptProvider(server("a", "send"), server("a", "react"))
    table = ToolTable([daemon, servers])
    ann = Agent("ann")
    first = table.offered(ann, None)
    assert _names(first) == ["sleep", "mcpl--a--send", "mcpl--a--react"]
    first.clear()  # a caller's list is its own: the next turn is offered the same tools
    assert _names(table.offered(ann, None)) == ["sleep", "mcpl--a--send", "mcpl--a--react"]
    # The table alone changes (the providers' lists are the very same objects): a daemon name
    # now reserves a server tool's offered name, so that tool is refused.
    daemon.reserved = [ToolName("mcpl--a--react")]
    table.rebuild()
    assert _names(table.offered(ann, None)) == ["sleep", "mcpl--a--send"]
    # A provider's tools change (a catalog listed again: the table is rebuilt, the list is new).
    servers.names = [server("a", "send"), server("a", "pin")]
    table.rebuild()
    assert _names(table.offered(ann, None)) == ["sleep", "mcpl--a--send", "mcpl--a--pin"]
    # The agent changes (a reload: another spec under the same name), and another agent.
    assert _names(table.offered(Agent("ann", ("sleep",)), None)) == ["sleep"]
    assert _names(table.offered(Agent("bob", ("mcpl--a--*",)), None)) == ["mcpl--a--send", "mcpl--a--pin"]
