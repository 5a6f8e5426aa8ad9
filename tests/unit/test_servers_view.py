"""``servers/list``'s channel counts: right as channels come and go, and not paid for per channel.

Each row's ``channelCount`` is read from the registry's per-server index (kept as channels are
registered and withdrawn), so the answer stays right and costs the same at 100k channels as at
one (issue 30). The cost is checked as work done, not time taken: the Python lines executed to
answer, counted with a trace function, are the same whatever the channels registered.
"""

from __future__ import annotations

import sys
from types import FrameType

from mcpl_router.config import parse_config
from mcpl_router.events import EventBus
from mcpl_router.mcpl.link import LinkState, ServerLink
from mcpl_router.mcpl.liveness import Liveness
from mcpl_router.routing.registry import RegistrationPolicy
from mcpl_router.routing.router import Router
from mcpl_router.servers_view import ServersView


class _Quiet:
    def link_state_changed(self, link: ServerLink, old: LinkState, new: LinkState) -> None: ...

    def link_epoch_ended(self, link: ServerLink) -> None: ...

    async def handle_server_message(self, link, inbound):  # pragma: no cover - never called
        raise AssertionError


def _view(tmp_path, router: Router) -> ServersView:
    config = parse_config(
        {"mcplServers": {"a": {"command": "server"}, "b": {"command": "server"}}, "host": {"unixSocket": False}},
        source="<test>",
        base_dir=tmp_path,
    )
    links = {server_id: ServerLink(server, _Quiet()) for server_id, server in config.servers.items()}
    return ServersView(router=router, links=links, liveness=Liveness(), events=EventBus())


def _channels(*ids: str) -> list[dict[str, object]]:
    return [{"id": channel_id, "type": "channel", "label": channel_id} for channel_id in ids]


def _counts(view: ServersView) -> dict[object, object]:
    return {row["serverId"]: row["channelCount"] for row in view.servers_list()}


def test_counts_follow_registrations_and_withdrawals(tmp_path) -> None:
    router = Router()
    view = _view(tmp_path, router)
    policy = RegistrationPolicy.permissive()
    assert _counts(view) == {"a": 0, "b": 0}

    # Both servers register `general`: one channel each, never one shared between them.
    router.registry.register("a", _channels("general", "random", "dev"), policy)
    router.registry.register("b", _channels("general"), policy)
    assert _counts(view) == {"a": 3, "b": 1}
    assert router.registry.channel_count() == 4

    # Registering again what is registered counts it once.
    router.registry.register("a", _channels("general"), policy)
    assert _counts(view) == {"a": 3, "b": 1}

    # `a` withdraws its `general`: `b`'s stays, and so does its count.
    router.registry.withdraw("a", ["general"])
    assert _counts(view) == {"a": 2, "b": 1}
    # Withdrawing what a server never registered changes nothing.
    router.registry.withdraw("b", ["random", "nowhere"])
    assert _counts(view) == {"a": 2, "b": 1}

    router.registry.withdraw("b", ["general"])
    assert _counts(view) == {"a": 2, "b": 0}
    router.registry.register("b", _channels("general"), policy)
    router.registry.remove_server("a")
    assert _counts(view) == {"a": 0, "b": 1}
    assert router.registry.channel_count() == 1


def _lines_run(call) -> int:
    """How many Python lines ``call()`` executes (every frame it enters, comprehensions too)."""
    lines = 0

    def trace(frame: FrameType, event: str, arg: object):
        nonlocal lines
        if event == "line":
            lines += 1
        return trace

    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
    return lines


def test_the_answer_costs_the_same_at_many_channels(tmp_path) -> None:
    router = Router()
    view = _view(tmp_path, router)
    policy = RegistrationPolicy.permissive()
    router.registry.register("a", _channels("general"), policy)
    router.registry.register("b", _channels("general"), policy)
    view.servers_list()  # first-call work (imports, caches) out of the count
    few = _lines_run(view.servers_list)

    for start in range(0, 5000, 500):
        router.registry.register("a", _channels(*(f"a-{n}" for n in range(start, start + 500))), policy)
        router.registry.register("b", _channels(*(f"b-{n}" for n in range(start, start + 500))), policy)
    assert _counts(view) == {"a": 5001, "b": 5001}
    many = _lines_run(view.servers_list)

    assert many == few, f"servers/list ran {few} lines at 2 channels and {many} at 10,002"
