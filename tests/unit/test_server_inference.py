"""Server-initiated inference, the parts without processes: the ``inference`` config table, the
grant it allows, the per-server budget, and who serves an agent's model."""

from __future__ import annotations

from typing import Any

import pytest

from mcpl_router.config import ServerConfig
from mcpl_router.config.model import InferencePolicy
from mcpl_router.inference import Serving
from mcpl_router.inference.budget import RATE_WINDOW, InferenceBudget
from mcpl_router.jsonrpc import RpcError
from mcpl_router.mcpl.grants import compute_grant
from mcpl_router.mcpl.manifest import parse_manifest
from mcpl_router.mcpl.regrant import policy_for

from .test_config import server, server_error

LEAVES = {"inferenceRequest", "inferenceRequest.streaming", "modelInfo"}
MANIFEST = parse_manifest({"version": "0.5", "pushEvents": True, "inferenceRequest": True, "modelInfo": True})


# --- config ------------------------------------------------------------------------------------


def test_inference_table_defaults_and_values() -> None:
    assert server({"command": "x"}).inference is None
    assert server({"command": "x", "inference": {"agent": "kai"}}).inference == InferencePolicy(
        agent="kai", max_concurrent=4, max_request_bytes=1_048_576, per_minute=60, timeout=120.0
    )
    given = server({"command": "x", "inference": {"agent": "kai", "maxConcurrent": 2, "maxRequestBytes": 10, "perMinute": 5, "timeout": 1.5}})
    assert given.inference == InferencePolicy("kai", 2, 10, 5, 1.5)
    assert given.redacted()["inference"] == {"agent": "kai", "maxConcurrent": 2, "maxRequestBytes": 10, "perMinute": 5, "timeout": 1.5}


@pytest.mark.parametrize(
    ("inference", "key", "words"),
    [
        ({}, "mcplServers.s.inference.agent", "is missing"),
        ({"agent": "two words"}, "mcplServers.s.inference.agent", "not an agent name"),
        ({"agent": "kai", "maxConcurrent": 0}, "mcplServers.s.inference.maxConcurrent", "out of range"),
        ({"agent": "kai", "timeout": -1}, "mcplServers.s.inference.timeout", "out of range"),
        ({"agent": "kai", "perMinut": 5}, "mcplServers.s.inference.perMinut", "not a server's inference key"),
        ("kai", "mcplServers.s.inference", "expected a table"),
    ],
)
def test_a_bad_inference_table_names_the_key_and_the_fix(inference: Any, key: str, words: str) -> None:
    error = server_error({"command": "x", "inference": inference})
    assert error.key == key
    assert words in str(error)


def test_enabling_an_inference_leaf_without_the_table_is_an_error() -> None:
    error = server_error({"command": "x", "enabledCapabilities": ["tools", "modelInfo"]})
    assert error.key == "mcplServers.s.enabledCapabilities[1]"
    assert 'inference = { agent = "kai" }' in str(error)


# --- the grant ---------------------------------------------------------------------------------


@pytest.mark.parametrize("enabled", [None, ("*",), ("pushEvents", "inferenceRequest.*", "*")])
def test_without_the_table_no_pattern_grants_inference(enabled: tuple[str, ...] | None) -> None:
    config = ServerConfig(id="s", transport="stdio", enabled_capabilities=enabled)
    grant = compute_grant(MANIFEST, policy_for(config))
    assert not grant.effective & LEAVES
    assert "pushEvents" in grant.effective


@pytest.mark.parametrize("enabled", [None, ("pushEvents",)])
def test_the_table_grants_the_advertised_inference_leaves(enabled: tuple[str, ...] | None) -> None:
    config = ServerConfig(id="s", transport="stdio", enabled_capabilities=enabled, inference=InferencePolicy("kai"))
    assert LEAVES <= compute_grant(MANIFEST, policy_for(config)).effective


def test_disabled_capabilities_still_subtract_from_the_table() -> None:
    config = ServerConfig(
        id="s", transport="stdio", disabled_capabilities=("inferenceRequest.streaming",), inference=InferencePolicy("kai")
    )
    effective = compute_grant(MANIFEST, policy_for(config)).effective
    assert {"inferenceRequest", "modelInfo"} <= effective and "inferenceRequest.streaming" not in effective


# --- the budget --------------------------------------------------------------------------------


def test_budget_counts_in_flight_per_server() -> None:
    budget = InferenceBudget()
    budget.start("a", 60, 0.0)
    budget.start("a", 60, 0.0)
    assert (budget.in_flight("a"), budget.in_flight("b")) == (2, 0)
    budget.finish("a")
    budget.finish("a")
    budget.finish("a")  # never below zero
    assert budget.in_flight("a") == 0


def test_budget_rate_window_slides() -> None:
    budget = InferenceBudget()
    assert budget.retry_after("a", 2, 0.0) is None
    budget.start("a", 2, 0.0)
    budget.start("a", 2, 10.0)
    assert budget.retry_after("a", 2, 20.0) == pytest.approx(RATE_WINDOW - 20.0)
    assert budget.retry_after("b", 2, 20.0) is None
    assert budget.retry_after("a", 2, RATE_WINDOW + 0.1) is None  # the first start left the window


# --- who serves ----------------------------------------------------------------------------------


class _Connection:
    """Stands in for a HostConnection: Serving only keys by it."""


def test_serving_follows_ownership_and_ends_with_the_connection() -> None:
    first, second = _Connection(), _Connection()
    owners: dict[str, Any] = {"kai": first}
    serving = Serving(owners.get)
    assert serving.declare(first, {"inference": ["kai"]}) == {"inference": ["kai"], "modelInfo": []}  # type: ignore[arg-type]
    assert serving.host_for("kai", "inference") is first
    assert serving.host_for("kai", "modelInfo") is None
    owners["kai"] = second  # taken over by a newer connection that declared nothing
    assert serving.host_for("kai", "inference") is None
    owners["kai"] = first
    serving.forget(first)  # type: ignore[arg-type]
    assert serving.host_for("kai", "inference") is None


def test_serving_check_names_the_agent_not_claimable() -> None:
    Serving.check({"inference": ["kai"]}, {"kai"})
    with pytest.raises(RpcError) as refused:
        Serving.check({"inference": ["kai"], "modelInfo": ["zed"]}, {"kai"})
    assert refused.value.code == -32602
    assert refused.value.data == {"field": "serves.modelInfo", "agent": "zed"}


# --- chunks before the answer: a lane drains -----------------------------------------------------


async def test_wait_lane_drained_returns_once_the_lane_s_earlier_messages_are_handled() -> None:
    import trio
    import trio.testing

    from mcpl_router.jsonrpc import Inbound, NdjsonStream, Peer

    left, right = trio.testing.memory_stream_pair()
    gate = trio.Event()
    handled: list[str] = []

    async def handler(inbound: Inbound) -> None:
        await gate.wait()
        handled.append(inbound.method)

    peer = Peer(NdjsonStream(left, left), handler, lane_of=lambda inbound: ("chunks", 1))
    drained = trio.Event()
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(peer.run)
            await right.send_all(b'{"jsonrpc":"2.0","method":"one"}\n{"jsonrpc":"2.0","method":"two"}\n')
            await trio.testing.wait_all_tasks_blocked()

            async def wait() -> None:
                await peer.wait_lane_drained(("chunks", 1))
                drained.set()

            nursery.start_soon(wait)
            await trio.testing.wait_all_tasks_blocked()
            assert not drained.is_set()
            gate.set()
            await drained.wait()
            assert handled == ["one", "two"]
            await peer.wait_lane_drained(("chunks", 1))  # no such lane now: returns at once
            with pytest.raises(ValueError):
                await peer.wait_lane_drained(None)
            nursery.cancel_scope.cancel()
