"""Reading the daemon's own sections: ``host``, ``journal``, ``logging`` and ``health``.

``host`` gets the most checking because it is where agent hosts connect: a WebSocket listener
that others can reach must be allowed explicitly and needs a token, and a Unix socket path must
fit the operating system's limit. Left out, the journal and the host token file go under the
per-user state directory, and the Unix socket under the per-user runtime directory.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from mcpl_router.config.errors import did_you_mean, dotted_key, show_value
from mcpl_router.config.model import (
    HOST_WEBSOCKET_KEYS,
    JOURNAL_BACKENDS,
    LOG_FORMATS,
    LOG_LEVELS,
    ClusterConfig,
    HealthConfig,
    HostConfig,
    JournalConfig,
    LoggingConfig,
    WebSocketListenConfig,
)
from mcpl_router.config.paths import default_unix_socket_path, resolve_path, state_dir
from mcpl_router.config.section_reader import Section

# sun_path is 108 bytes on Linux and 104 on macOS, each including the terminating NUL.
UNIX_SOCKET_MAX_BYTES: Final = 103 if sys.platform == "darwin" else 107


def parse_journal(section: Section, base_dir: Path, env: Mapping[str, str]) -> JournalConfig:
    """``journal``: a SQLite file (its path defaults under the state directory) or, with
    ``backend = "postgres"``, a database named by ``dsn`` (its password in it, from a
    ``${VAR}``, or in ``passwordFile``)."""
    backend = section.choice("backend", JOURNAL_BACKENDS, "sqlite", "a journal backend")
    text = section.string("path")
    retention = section.number("retention", 24 * 3600.0, above=0)
    path = state_dir(env) / "journal.sqlite3" if text is None else resolve_path(text, base_dir, env)
    dsn = section.string("dsn", secret=True)
    password_text = section.string("passwordFile")
    password_file = None if password_text is None else resolve_path(password_text, base_dir, env)
    if backend == "postgres" and not dsn:
        section.error("dsn", "is needed with backend = \"postgres\".",
                      'Give the database\'s connection string, e.g. dsn = "host=db1,db2 dbname=mcpl target_session_attrs=read-write".')
    if backend == "sqlite":
        for key, given in (("dsn", dsn), ("passwordFile", password_text)):
            if given is not None:
                section.error(key, "is for backend = \"postgres\"; the journal is a SQLite file here.",
                              f'Set backend = "postgres", or remove {key}.')
    return JournalConfig(path=path, retention=retention, backend=backend, dsn=dsn, password_file=password_file)


def parse_host(
    section: Section, base_dir: Path, env: Mapping[str, str], journal: JournalConfig
) -> HostConfig:
    """``host``: the listeners agent hosts connect to, and the token they present.

    ``tokenFile`` defaults beside the journal, so ``journal`` is read first.
    """
    websocket: WebSocketListenConfig | None = WebSocketListenConfig()
    raw_ws = section.raw("websocket")
    if raw_ws is False:
        websocket = None
    elif isinstance(raw_ws, Mapping):
        ws = section.table("websocket", HOST_WEBSOCKET_KEYS, "host.websocket")
        ws_enabled = ws.boolean("enabled", True)
        path = ws.string("path", "/") or "/"
        if not path.startswith("/"):
            ws.error("path", f"{show_value(path)} does not start with /.", f'Write "/{path}".')
            path = "/"
        websocket = WebSocketListenConfig(
            bind=ws.string("bind", "127.0.0.1") or "127.0.0.1",
            port=ws.integer("port", 0, at_least=0, at_most=65535),
            path=path,
        )
        if not ws_enabled:
            websocket = None
    elif section.given("websocket") and raw_ws is not True:
        section.error(
            "websocket",
            f"expected a table or false, got {show_value(raw_ws)}.",
            'Write websocket = { bind = "127.0.0.1", port = 0, path = "/" }, or false to turn '
            "the WebSocket listener off.",
        )

    unix_socket: Path | None = default_unix_socket_path(env)
    raw_unix = section.raw("unixSocket")
    if raw_unix is False:
        unix_socket = None
    elif section.given("unixSocket") and raw_unix is not True:
        text = section.string(
            "unixSocket", fix="Give a path, or false to turn the Unix socket listener off."
        )
        if text is not None:
            unix_socket = resolve_path(text, base_dir, env)
    length = 0 if unix_socket is None else len(os.fsencode(unix_socket))
    if length > UNIX_SOCKET_MAX_BYTES:
        section.error(
            "unixSocket",
            f"{show_value(str(unix_socket))} is {length} bytes long; a Unix socket path may have at "
            f"most {UNIX_SOCKET_MAX_BYTES}.",
            "Give a shorter path.",
        )

    token = section.string("token", secret=True)
    token_file_text = section.string("tokenFile")
    if section.given("token") and section.given("tokenFile"):
        section.error(
            "token",
            "token and tokenFile are both given.",
            "Keep one: tokenFile keeps the secret out of the config file.",
        )
    if token_file_text is not None:
        token_file: Path | None = resolve_path(token_file_text, base_dir, env)
    elif token is None:
        token_file = journal.path.parent / "host-token"
    else:
        token_file = None
    allow_non_loopback = section.boolean("allowNonLoopback", False)
    stall_timeout = section.number("stallTimeout", 30.0, above=0)
    max_connections = section.integer("maxConnections", 256, at_least=1, at_most=1_000_000)
    max_buffered_bytes = section.integer("maxBufferedBytes", 64 * 1024 * 1024, at_least=1, at_most=2**40)
    partial_message_timeout = section.number("partialMessageTimeout", 30.0, above=0)
    hello_timeout = section.number("helloTimeout", 30.0, above=0)

    if websocket is not None and not websocket.loopback:
        bind_key = dotted_key(section.key_of("websocket"), "bind")
        if not allow_non_loopback:
            section.problems.error(
                bind_key,
                f"{show_value(websocket.bind)} is not a loopback address, and "
                "host.allowNonLoopback is false.",
                'Bind "127.0.0.1" (or "::1"), or set host.allowNonLoopback = true and give '
                "host.token or host.tokenFile.",
            )
        elif not (section.given("token") or section.given("tokenFile")):
            section.problems.error(
                bind_key,
                f"{show_value(websocket.bind)} is not a loopback address, and no token is configured.",
                "Give host.token or host.tokenFile: a listener others can reach needs a token "
                "they must present.",
            )
    return HostConfig(
        websocket=websocket,
        unix_socket=unix_socket,
        token_file=token_file,
        token=token,
        allow_non_loopback=allow_non_loopback,
        stall_timeout=stall_timeout,
        max_connections=max_connections,
        max_buffered_bytes=max_buffered_bytes,
        partial_message_timeout=partial_message_timeout,
        hello_timeout=hello_timeout,
    )


def parse_logging(section: Section) -> LoggingConfig:
    """``logging``: level and format, each one of its vocabulary."""
    return LoggingConfig(
        level=section.choice("level", LOG_LEVELS, "info", "a log level"),
        format=section.choice("format", LOG_FORMATS, "auto", "a log format"),
    )


def parse_health(section: Section) -> HealthConfig:
    """``health``: off unless ``port`` or ``enabled`` says otherwise."""
    return HealthConfig(
        bind=section.string("bind", "127.0.0.1") or "127.0.0.1",
        port=section.integer("port", 0, at_least=0, at_most=65535),
        switch=section.boolean("enabled", False) if section.given("enabled") else None,
        status_preview=section.integer("statusPreview", 0, at_least=0, at_most=10_000),
        decisions=section.integer("decisions", 100, at_least=0, at_most=100_000),
    )


#: Node names: what a person types and logs show (letters, digits, ``-``, ``_``, ``.``).
_NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")


#: ``cluster.links``: the router holds every link, or each is leased and spread (docs/cluster.md).
LINK_PLACEMENTS: Final = ("router", "balanced")


def parse_cluster(section: Section, journal: JournalConfig, server_ids: Sequence[str]) -> ClusterConfig:
    """``cluster`` (when given): this node's name and the lease's length. A cluster shares one
    PostgreSQL journal, so ``journal.backend`` must say so."""
    node = section.string("node")
    lease_ttl = section.number("leaseTtl", 5.0, above=0)
    if node is None:
        section.error("node", "is needed in [cluster]: each node has a name of its own.",
                      'Give node = "${MCPL_ROUTER_NODE}" and set that variable on each node (same file everywhere).')
        node = ""
    elif not _NODE_NAME.fullmatch(node):
        section.error("node", f"{show_value(node)} is not a node name.",
                      "Use letters, digits, '-', '_' and '.', up to 63 characters, starting with a letter or digit.")
    if not 1.0 <= lease_ttl <= 300.0:
        section.error("leaseTtl", f"{lease_ttl:g} is outside 1 to 300 seconds.",
                      "Give a lease of a few seconds: a dead node's links are taken over after it (5 is the default).")
    if journal.backend != "postgres":
        section.error("node", "a cluster needs the journal on PostgreSQL: nodes share it.",
                      'Set journal.backend = "postgres" and journal.dsn, or remove [cluster] to run one daemon.')
    links = section.choice("links", LINK_PLACEMENTS, "router", "a way to place the links")
    pin = section.string_map("pin")
    for server_id, pinned_node in pin.items():
        if server_id not in server_ids:
            section.error("pin", f"{show_value(server_id)} is not a configured server.",
                          did_you_mean(server_id, server_ids) + "Pin the ids of mcplServers.")
        if not _NODE_NAME.fullmatch(pinned_node):
            section.error("pin", f"{show_value(pinned_node)} (for {server_id}) is not a node name.",
                          "Use letters, digits, '-', '_' and '.', up to 63 characters.")
    if pin and links != "balanced":
        section.error("pin", 'pins place links on nodes: they need links = "balanced".',
                      'Set links = "balanced", or remove pin (with links = "router" the router holds every link).')
    relay_bind = section.string("relayBind", "127.0.0.1") or "127.0.0.1"
    relay_port = section.integer("relayPort", 0, at_least=0, at_most=65535)
    relay_advertise = section.string("relayAdvertise")
    return ClusterConfig(node=node, lease_ttl=lease_ttl, links=links, pin=pin, relay_bind=relay_bind, relay_port=relay_port,
                         relay_advertise=relay_advertise)
