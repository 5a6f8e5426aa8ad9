"""Events, not wiring (issue 27 item 2): the parts are built in floor order with everything
given at construction, and what one must hear of another's doing it hears on the one
dispatcher. The daemon ties no part to another after it is built."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from mcpl_router.config import parse_config
from mcpl_router.daemon import Daemon
from mcpl_router.events import (
    EVENT_TYPES,
    ChannelsChanged,
    EventBus,
    HostClosed,
    HostOpened,
    InboundAccepted,
    RegistrationsAnswered,
    ServerRegranted,
    ServerStateChanged,
    ServerToolsChanged,
    ServerWithdrawn,
    WakeDelivered,
)
from mcpl_router.routing.refs import ChannelRef

DAEMON = Path(__file__).resolve().parents[2] / "mcpl_router" / "daemon.py"


def test_subscribers_hear_their_kind_only_in_subscription_order() -> None:
    bus = EventBus()
    heard: list[str] = []
    bus.subscribe(ChannelsChanged, lambda event: heard.append(f"first {event.server_id}"))
    bus.subscribe(ServerWithdrawn, lambda event: heard.append(f"withdrawn {event.server_id}"))
    bus.subscribe(ChannelsChanged, lambda event: heard.append(f"second {event.server_id}"))
    bus.publish(ChannelsChanged("a", added=(ChannelRef("a", "general"),)))
    assert heard == ["first a", "second a"]


def test_a_failing_subscriber_is_logged_and_counted_and_the_others_still_hear() -> None:
    bus = EventBus()
    heard: list[str] = []

    def broken(event: ServerWithdrawn) -> None:
        raise RuntimeError("a bug in one part")

    bus.subscribe(ServerWithdrawn, broken)
    bus.subscribe(ServerWithdrawn, lambda event: heard.append(event.server_id))
    with capture_logs() as logs:
        bus.publish(ServerWithdrawn("b"))
    assert heard == ["b"]
    assert bus.failures == {"ServerWithdrawn": 1}
    assert [entry["event"] for entry in logs] == ["event.subscriber.crashed"]
    assert logs[0]["subscriber"].endswith("broken")


def test_the_built_daemon_has_a_listener_for_every_event(tmp_path: Path) -> None:
    config = parse_config({"journal": {"path": str(tmp_path / "journal.sqlite3")}}, source="<t>", base_dir=tmp_path,
                          environ={"HOME": str(tmp_path)})
    daemon = Daemon(config)
    try:
        heard = {kind.__name__: daemon.events.subscribers(kind) for kind in EVENT_TYPES}
        # Who listens (docs/architecture.md, "Events"): a count per kind, so a part that stops
        # subscribing (or subscribes twice) is seen here rather than as a lost wake.
        assert heard == {
            ServerStateChanged.__name__: 5,  # channel decisions, servers view, sessions, connector tools, observers
            ServerRegranted.__name__: 1,  # channel decisions (a reload granted the lifecycle)
            ServerWithdrawn.__name__: 2,  # channel tools, the inbound handler (the registry)
            ChannelsChanged.__name__: 4,  # channel decisions, sessions, turns, observers
            RegistrationsAnswered.__name__: 2,  # metrics, servers view
            InboundAccepted.__name__: 3,  # forks, sessions, observers
            WakeDelivered.__name__: 1,  # channel tools (default channel)
            ServerToolsChanged.__name__: 1,  # the name table
            HostOpened.__name__: 1,  # sessions
            HostClosed.__name__: 3,  # sessions, turns, inference
        }
    finally:
        daemon.journal.close()


def _ties_after_construction(source: str) -> list[str]:
    """Assignments to another object's attribute (``self.turns.route_fence = …``) and calls of
    setters (``set_*``, ``install``, ``ask_*``, ``*_with``, ``read_state_from``) in the daemon."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Attribute):
                found.append(f"line {node.lineno}: {ast.unparse(target)} = …")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            if name.startswith(("set_", "ask_")) or name.endswith("_with") or name in ("install", "read_state_from"):
                found.append(f"line {node.lineno}: {ast.unparse(node.func)}(…)")
    return found


def test_the_daemon_ties_no_part_to_another_after_it_is_built() -> None:
    assert _ties_after_construction(DAEMON.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    "tie",
    ["self.turns.route_fence = self.forks", "self.sessions.divert_wakes_with(x)", "self.tools.install([a])",
     "self.turns.speech.set_tuned_out(f)"],
)
def test_the_tie_finder_sees_each_kind_of_tie(tie: str) -> None:
    assert _ties_after_construction(tie) != []
