"""Connector tool names: model-safe, unique per (server, tool), and never parsed back."""

from __future__ import annotations

import re
import types

from hypothesis import given
from hypothesis import strategies as st

from mcpl_router.config import ServerConfig
from mcpl_router.mcpl.grants import Grant
from mcpl_router.mcpl.link import LinkState
from mcpl_router.events import EventBus
from mcpl_router.routing.router import Router
from mcpl_router.tools import ToolTable
from mcpl_router.tools.connector_tools import SEND_TOOLS, ConnectorTools, exposed_name, is_send_tool

MODEL_SAFE = re.compile(r"[A-Za-z0-9_-]{1,64}")


def test_a_safe_name_is_the_prefix_and_the_tool_as_they_are() -> None:
    assert exposed_name("mcpl--a--", "send_message", "a") == "mcpl--a--send_message"


def test_an_unsafe_name_is_sanitized_with_a_suffix_from_its_exact_pair() -> None:
    dotted = exposed_name("mcpl--discord.main--", "send.later", "discord.main")
    assert MODEL_SAFE.fullmatch(dotted)
    assert dotted.startswith("mcpl--discord_main--send_later-")
    # Two tools that sanitize alike keep different names, whatever else is listed.
    assert exposed_name("p--", "a.b", "s") != exposed_name("p--", "a/b", "s")
    # The same tool on two servers sharing a prefix: different names too.
    assert exposed_name("p--", "a.b", "s1") != exposed_name("p--", "a.b", "s2")
    # Stable: the same pair always gets the same name.
    assert exposed_name("p--", "a.b", "s") == exposed_name("p--", "a.b", "s")


def test_a_long_name_is_cut_to_what_model_apis_take() -> None:
    name = exposed_name("mcpl--a--", "x" * 100, "a")
    assert MODEL_SAFE.fullmatch(name) and len(name) == 64


@given(prefix=st.text(max_size=30), tool=st.text(min_size=1, max_size=80), other=st.text(min_size=1, max_size=80))
def test_every_exposed_name_is_model_safe_and_distinct_tools_get_distinct_names(prefix: str, tool: str, other: str) -> None:
    first = exposed_name(prefix, tool, "s")
    assert MODEL_SAFE.fullmatch(first) or not (prefix + tool)
    if tool != other:
        assert first != exposed_name(prefix, other, "s")


def test_send_tools_are_the_known_names_or_marked_by_the_server() -> None:
    assert all(is_send_tool({"name": name}) for name in SEND_TOOLS)
    assert not is_send_tool({"name": "fetch_history"})
    assert is_send_tool({"name": "post", "_meta": {"mcpl/send": True}})
    assert not is_send_tool({"name": "post", "_meta": {"mcpl/send": "yes"}})


def test_the_offered_list_is_the_same_until_a_link_its_grant_or_its_catalog_changes() -> None:
    granted, ungranted = Grant(effective=frozenset({"tools"})), Grant()
    link = types.SimpleNamespace(server_id="a", state=LinkState.READY, grant=granted, epoch=1,
                                 config=ServerConfig(id="a", transport="stdio", command="true"))
    links = {"a": link}
    connector = ConnectorTools(links, Router(), EventBus(), None)  # type: ignore[arg-type]
    send = {"name": "send_message", "description": "Send.", "inputSchema": {"type": "object"}}
    connector._install(link, 1, [send])  # type: ignore[arg-type]

    def offered() -> list[dict[str, object]]:
        return connector.tools_for(None, None)  # type: ignore[arg-type]

    first = offered()
    assert [spec["name"] for spec in first] == ["send_message"]  # no toolPrefix configured
    assert offered() is first  # nothing changed: the same list (the table's filter is kept)
    link.grant = ungranted  # a featureSets/update narrowed it
    assert offered() == []
    link.grant = granted
    assert offered() == first
    link.state = LinkState.RETRYING  # the state alone (the grant object unchanged)
    assert offered() == []
    link.state = LinkState.READY
    connector._install(link, 1, [send, {"name": "react", "inputSchema": {"type": "object"}}])  # type: ignore[arg-type]
    assert [spec["name"] for spec in offered()] == ["send_message", "react"]
    link.config = ServerConfig(id="a", transport="stdio", command="true", disabled_tools=("react",))  # a reload
    assert [spec["name"] for spec in offered()] == ["send_message"]
    links["b"] = types.SimpleNamespace(server_id="b", state=LinkState.READY, grant=granted, epoch=1, config=link.config)
    connector._install(links["b"], 1, [send])  # type: ignore[arg-type]
    # A server added (a reload): its tools too, each as its server lists it (this provider
    # alone; the name table is what refuses a name two servers share).
    assert [spec["description"] for spec in offered()] == ["[server a] Send.", "[server b] Send."]


def test_the_table_offers_what_the_connector_offers_now_as_its_link_comes_and_goes() -> None:
    # No rebuild between the steps: a link's state changes the connector's list, not the table.
    link = types.SimpleNamespace(server_id="a", state=LinkState.READY, grant=Grant(effective=frozenset({"tools"})), epoch=1,
                                 config=ServerConfig(id="a", transport="stdio", command="true", tool_prefix="mcpl--a--"))
    events = EventBus()
    connector = ConnectorTools({"a": link}, Router(), events, None)  # type: ignore[arg-type]
    table = ToolTable([connector], events=events)
    connector._install(link, 1, [{"name": "send_message", "inputSchema": {"type": "object"}}])  # type: ignore[arg-type]

    def offered() -> list[str]:
        return [spec["name"] for spec in table.offered(None, None)]  # type: ignore[arg-type]

    assert offered() == ["mcpl--a--send_message"]
    link.state = LinkState.RETRYING
    assert offered() == []
    link.state = LinkState.READY
    assert offered() == ["mcpl--a--send_message"]
