"""Finding a running daemon from its config without the daemon's secrets.

The query commands (status, channels, explain, health, reload) read only what locates the
daemon, so they work in a shell that has none of the daemon's secrets: ``${VAR}``s outside those
sections are never substituted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import attrs

from mcpl_router.config.addresses import host_port
from mcpl_router.config.errors import ConfigError, show_value
from mcpl_router.config.file_parsing import read_config_file
from mcpl_router.config.loading import parse_config

#: The sections that say where the daemon listens (host.tokenFile defaults beside the journal).
_LOCATOR_SECTIONS: Final = ("host", "journal", "health")


@attrs.frozen
class DaemonLocation:
    """Where the query commands reach a running daemon, read from its config.

    ``health_url`` is ``http://host:port`` of the ``[health]`` listener (``0.0.0.0``/``::`` are
    asked on loopback), or ``None`` when the config leaves it off or to the OS (port 0).
    """

    source: str
    unix_socket: Path | None
    health_url: str | None
    #: The host token's file (``host.tokenFile`` or its default), for a ``ws://`` query.
    token_file: Path | None = None
    #: ``cluster.node`` as written when the daemon is a cluster's node (a standby forwards hosts to the holder).
    cluster_node: str | None = None


def locate_daemon(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> DaemonLocation:
    """Read ``host``, ``journal`` and ``health`` of the config at ``path``, and nothing else.

    ``${VAR}``s elsewhere (a server's token, an ``env`` table) are never substituted, so their
    variables need not be set; ``host.token`` is not read either (the Unix socket needs none).

    Raises:
        ConfigError: the file can't be read, or those sections are invalid.
    """
    data, source, base_dir = read_config_file(path)
    if not isinstance(data, Mapping):
        raise ConfigError(source, "", f"holds {show_value(data)}, not a table of settings.")
    wanted: dict[str, object] = {name: data[name] for name in _LOCATOR_SECTIONS if name in data}
    host = wanted.get("host")
    if isinstance(host, Mapping) and "token" in host:
        wanted["host"] = {**host, "token": "not-read-by-the-cli"}
    journal = wanted.get("journal")
    if isinstance(journal, Mapping) and "dsn" in journal:
        # The database's DSN may hold a ${VAR} secret: never needed to reach the daemon.
        wanted["journal"] = {**journal, "dsn": "not-read-by-the-cli"}
    config = parse_config(wanted, source=source, base_dir=base_dir, environ=environ)
    health = config.health
    url = None
    if health.enabled and health.port:
        bind = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(health.bind, health.bind)
        url = f"http://{host_port(bind, health.port)}"
    return DaemonLocation(
        source=source,
        unix_socket=config.host.unix_socket,
        health_url=url,
        token_file=config.host.token_file,
        cluster_node=_cluster_node_as_written(data.get("cluster")),
    )


def _cluster_node_as_written(cluster: object) -> str | None:
    """``cluster.node`` as the file has it (``${MCPL_ROUTER_NODE}`` unsubstituted: the variable is
    the node's environment, not the shell's), or None when the daemon is no cluster's node."""
    if not isinstance(cluster, Mapping):
        return None
    node = cluster.get("node")
    return node if isinstance(node, str) else "(unnamed)"
