"""``[cluster]`` as the config reader takes it and refuses it (docs/config.md#cluster)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mcpl_router.config import ConfigError, RouterConfig, parse_config

POSTGRES = {"backend": "postgres", "dsn": "host=127.0.0.1 dbname=mcpl"}
SERVERS = {"discord": {"url": "tcp://127.0.0.1:9"}, "slack": {"url": "tcp://127.0.0.1:9"}}


def parse(cluster: dict[str, Any], journal: dict[str, Any] | None = None) -> RouterConfig:
    return parse_config({"mcplServers": SERVERS, "journal": journal or POSTGRES, "cluster": cluster},
                        source="conf.toml", base_dir=Path("/etc/mcpl"), environ={"MCPL_ROUTER_NODE": "a"})


def refused(cluster: dict[str, Any], journal: dict[str, Any] | None = None) -> str:
    with pytest.raises(ConfigError) as caught:
        parse(cluster, journal)
    return str(caught.value)


def test_a_node_holds_every_link_by_default_and_balanced_links_take_pins_and_a_relay() -> None:
    default = parse({"node": "${MCPL_ROUTER_NODE}"}).cluster
    assert default is not None and (default.node, default.lease_ttl, default.links, dict(default.pin)) == ("a", 5.0, "router", {})
    assert default.described_links == "held by the router"
    spread = parse({"node": "a", "links": "balanced", "pin": {"discord": "b"}, "relayBind": "10.0.0.5", "relayPort": 7600,
                    "relayAdvertise": "router-a.internal"}).cluster
    assert spread is not None
    assert (spread.links, dict(spread.pin), spread.relay_bind, spread.relay_port, spread.relay_advertise) == (
        "balanced", {"discord": "b"}, "10.0.0.5", 7600, "router-a.internal")
    assert spread.described_links == "balanced over the live nodes (discord on b while live), relay on 10.0.0.5:7600"


@pytest.mark.parametrize(
    ("cluster", "said"),
    [
        ({}, "cluster.node: is needed in [cluster]"),
        ({"node": "a b"}, "is not a node name"),
        ({"node": "a", "leaseTtl": 0.5}, "0.5 is outside 1 to 300 seconds"),
        ({"node": "a", "links": "spread"}, "is not a way to place the links"),
        ({"node": "a", "links": "balanced", "pin": {"discrod": "b"}}, "is not a configured server"),
        ({"node": "a", "links": "balanced", "pin": {"discord": "no such"}}, "(for discord) is not a node name"),
        ({"node": "a", "pin": {"discord": "b"}}, 'pins place links on nodes: they need links = "balanced"'),
        ({"node": "a", "relayPort": 70000}, "cluster.relayPort"),
    ],
)
def test_what_is_wrong_in_cluster_is_said_with_its_key(cluster: dict[str, Any], said: str) -> None:
    assert said in refused(cluster)


def test_a_cluster_needs_the_journal_on_postgresql() -> None:
    assert "a cluster needs the journal on PostgreSQL" in refused({"node": "a"}, {"path": "/tmp/j.sqlite3"})


def test_a_misspelt_pin_names_the_server_it_may_mean() -> None:
    assert "discord" in refused({"node": "a", "links": "balanced", "pin": {"discrod": "b"}}).split("is not a configured server")[1]
