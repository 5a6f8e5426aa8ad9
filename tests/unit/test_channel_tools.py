"""The default channel's rules (``mcpl_router.routing.defaults``), pure, over a real registry.

Issue 6 items 1 and 8: a publish with no ``channelId`` goes to the default on the server whose
message set it, or with a ``serverId`` to the default's id on that server; refused where that
channel isn't registered, naming no other channel. A server's removal clears the default's
message and thread and keeps its ref; a message admitted after its server left sets none.
Both registration orders, so "first registered" can't pass for the right answer.
"""

from __future__ import annotations

import pytest

from mcpl_router.tools.channel_tools import CHANNEL_TOOLS
from mcpl_router.routing.defaults import (
    KIND_CHANNEL_REQUIRED,
    KIND_DEFAULT_GONE,
    KIND_DEFAULT_NOT_ON_SERVER,
    KIND_NO_DEFAULT,
    DefaultChannels,
    DefaultTarget,
)
from mcpl_router.routing.names import ChannelNames, Refusal
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import ChannelRegistry, RegistrationPolicy

A = ChannelRef("a", "general")
B = ChannelRef("b", "general")
ORDERS = pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])


def registry_with(*servers: str) -> ChannelNames:
    registry = ChannelRegistry()
    for server in servers:
        registry.register(server, [{"id": "general"}], RegistrationPolicy.permissive())
    return ChannelNames(registry)


@ORDERS
def test_the_default_is_on_the_server_whose_message_set_it(order: tuple[str, str]) -> None:
    names = registry_with(*order)
    defaults = DefaultChannels()
    assert defaults.woke("ann", B, message_id="m-1", thread_id="th", registered=True)
    assert defaults.target("ann", names) == DefaultTarget(B, "th")
    # serverId alone: the default's id on that server (another channel, no thread of its own).
    assert defaults.target("ann", names, server_id="a") == DefaultTarget(A, None)
    assert defaults.target("ann", names, server_id="b") == DefaultTarget(B, "th")
    # An empty serverId is not given.
    assert defaults.target("ann", names, server_id="") == DefaultTarget(B, "th")


@ORDERS
def test_server_removal_keeps_the_ref_and_clears_message_and_thread(order: tuple[str, str]) -> None:
    names = registry_with(*order)
    defaults = DefaultChannels()
    defaults.woke("ann", B, message_id="m-1", thread_id="th", registered=True)
    defaults.woke("bob", A, message_id="m-2", thread_id=None, registered=True)
    names.registry.remove_server("b")
    assert defaults.server_removed("b") == ["ann"]
    assert defaults.get("ann").ref == B and defaults.get("ann").message_id is None and defaults.get("ann").thread_id is None
    assert defaults.get("bob").message_id == "m-2"  # another server's default is untouched
    gone = defaults.target("ann", names)
    assert isinstance(gone, Refusal) and gone.kind == KIND_DEFAULT_GONE
    assert gone.candidates == (B,)
    # Named by its qualified name (a's general now answers to "general"), with its server.
    assert "b:general" in gone.text and '"b"' in gone.text
    assert "channel_list" not in gone.text and "a:general" not in gone.text


@ORDERS
def test_a_message_admitted_after_its_server_left_sets_no_default(order: tuple[str, str]) -> None:
    names = registry_with(*order)
    defaults = DefaultChannels()
    defaults.woke("ann", A, message_id="m-1", thread_id=None, registered=True)
    names.registry.remove_server("b")
    assert not defaults.woke("ann", B, message_id="m-late", thread_id=None, registered=names.registry.is_registered(B))
    assert defaults.get("ann").ref == A and defaults.get("ann").message_id == "m-1"


def test_a_server_without_the_defaults_id_is_refused_naming_no_other_channel() -> None:
    names = registry_with("a", "b")
    names.registry.register("c", [{"id": "other"}], RegistrationPolicy.permissive())
    defaults = DefaultChannels()
    defaults.woke("ann", B, message_id="m-1", thread_id=None, registered=True)
    refused = defaults.target("ann", names, server_id="c", not_done="Nothing was sent.")
    assert isinstance(refused, Refusal) and refused.kind == KIND_DEFAULT_NOT_ON_SERVER
    assert refused.candidates == () and "a:general" not in refused.text and "Nothing was sent." in refused.text


def test_no_default_and_named_mode() -> None:
    names = registry_with("a", "b")
    defaults = DefaultChannels()
    none = defaults.target("ann", names, not_done="Nothing was sent.")
    assert isinstance(none, Refusal) and none.kind == KIND_NO_DEFAULT and "Nothing was sent." in none.text
    defaults.woke("ann", B, message_id="m-1", thread_id=None, registered=True)
    for server_id in (None, "", "b"):
        named = defaults.target("ann", names, server_id=server_id, named_mode=True)
        assert isinstance(named, Refusal) and named.kind == KIND_CHANNEL_REQUIRED
        assert named.text.startswith("Nothing was posted: channel_publish needs a channelId")


def test_the_channel_tools_are_five() -> None:
    assert CHANNEL_TOOLS == ("channel_list", "channel_open", "channel_close", "channel_decline", "channel_publish")
