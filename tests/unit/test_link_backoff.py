"""The link's reconnect delay: exponential, capped, jittered within its bound."""

from __future__ import annotations

import random

import pytest

from mcpl_router.config import parse_config
from mcpl_router.mcpl.link import LinkState, ServerLink


class _Quiet:
    def link_state_changed(self, link: ServerLink, old: LinkState, new: LinkState) -> None: ...

    def link_epoch_ended(self, link: ServerLink) -> None: ...

    async def handle_server_message(self, link, inbound):  # pragma: no cover - never called
        raise AssertionError


def _link(tmp_path, **reconnect: float) -> ServerLink:
    config = parse_config(
        {"mcplServers": {"s": {"command": "server", "reconnect": reconnect}}, "host": {"unixSocket": False}},
        source="<test>",
        base_dir=tmp_path,
    )
    return ServerLink(config.servers["s"], _Quiet(), rng=random.Random(7))


def test_delay_grows_exponentially_to_its_cap(tmp_path) -> None:
    link = _link(tmp_path, initialDelay=0.5, maxDelay=4, multiplier=2, jitter=0)
    delays = []
    for attempt in range(1, 7):
        link.attempts = attempt
        delays.append(link._backoff_delay())
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]


@pytest.mark.parametrize("attempt", [1, 3, 10])
def test_jitter_stays_within_its_fraction(tmp_path, attempt: int) -> None:
    link = _link(tmp_path, initialDelay=1, maxDelay=8, multiplier=2, jitter=0.25)
    link.attempts = attempt
    base = min(8.0, 2.0 ** (attempt - 1))
    samples = {round(link._backoff_delay(), 9) for _ in range(200)}
    assert len(samples) > 1, "jitter should spread reconnects"
    assert all(base * 0.75 <= s <= base * 1.25 for s in samples)
