"""Reading ``mcplServers``: each server's transport and endpoint, grant policy, tools, reconnect.

The map has the shape of connectome-host's ``mcpl-servers.json``, and that file's own spellings
load unchanged (``requestTimeoutMs``, ``reconnect = false``, an entry that only says
``disabled``). When an entry doesn't name its transport, its keys say which it is; a key of
another transport is an error, since it would be silently ignored.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Final, TypedDict
from urllib.parse import urlsplit

from mcpl_router.config.errors import show_value
from mcpl_router.config.model import (
    DEFAULT_ENV_ALLOWLIST,
    LEGACY_MODES,
    PING_KEYS,
    PROTOCOL_FAMILIES,
    RECONNECT_KEYS,
    SERVER_COMPAT_KEYS,
    SERVER_IGNORED_HOST_KEYS,
    SERVER_KEYS,
    STDIO_KEYS,
    TCP_KEYS,
    TOKEN_PLACES,
    TOMBSTONE,
    TRANSPORTS,
    WEBSOCKET_KEYS,
    InferencePolicy,
    PingPolicy,
    ReconnectPolicy,
    ServerConfig,
)
from mcpl_router.config.paths import resolve_path
from mcpl_router.config.read_inference import parse_inference
from mcpl_router.config.section_reader import Section

# What the link's grant policy accepts as one segment of a capability path or feature-set name
# (mcpl/grants.py); checked here too so a bad pattern is reported at load, with its key.
_GRANT_SEGMENT = re.compile(r"[A-Za-z0-9_:*-]+")
# An HTTP header name is an RFC 9110 token; anything else would be refused by the dialler.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")



class _Endpoint(TypedDict, total=False):
    """A transport's fields of :class:`ServerConfig` (stdio, tcp or websocket), as read."""

    command: str
    args: tuple[str, ...]
    path_args: tuple[int, ...]
    env: dict[str, str]
    cwd: Path | None
    env_allowlist: tuple[str, ...]
    inherit_env: bool
    host: str
    port: int
    url: str | None
    token: str | None
    token_header: str
    token_in: str


class _Policy(TypedDict):
    """The policy fields of :class:`ServerConfig`, each checked as it was read."""

    enabled_capabilities: tuple[str, ...] | None
    disabled_capabilities: tuple[str, ...]
    enabled_feature_sets: tuple[str, ...] | None
    disabled_feature_sets: tuple[str, ...]
    channel_patterns: tuple[str, ...]
    legacy: str
    request_timeout: float
    reconnect: ReconnectPolicy
    ping: PingPolicy
    enabled_tools: tuple[str, ...] | None
    disabled_tools: tuple[str, ...]
    tool_prefix: str
    disabled: bool
    required: bool
    inference: InferencePolicy | None

def parse_servers(
    section: Section, base_dir: Path, env: Mapping[str, str], *, token_in: str
) -> dict[str, ServerConfig]:
    """``mcplServers``: the servers whose entries are valid, in file order."""
    servers: dict[str, ServerConfig] = {}
    for server_id, value in section.data.items():
        key = section.key_of(server_id)
        if not server_id or any(char.isspace() for char in server_id):
            section.problems.error(
                key,
                f"{json.dumps(server_id)} is not a server id: an id is a non-empty string "
                "without whitespace.",
                'Rename it, e.g. "discord" or "discord:acme".',
            )
        server = Section.of(
            section.problems,
            value,
            key,
            "server",
            SERVER_KEYS,
            SERVER_COMPAT_KEYS + SERVER_IGNORED_HOST_KEYS,
        )
        if server is None:
            continue
        parsed = _parse_server(server_id, server, base_dir, env, token_in=token_in)
        if parsed is not None:
            servers[server_id] = parsed
    return servers


def _parse_server(
    server_id: str, s: Section, base_dir: Path, env: Mapping[str, str], *, token_in: str
) -> ServerConfig | None:
    for name in SERVER_IGNORED_HOST_KEYS:
        if s.has(name):
            s.problems.warn(s.key_of(name), f'"{name}" is a host setting this daemon ignores.')
    disabled = s.boolean("disabled", False)
    if disabled and not any(s.has(name) for name in ("transport", "command", "url", "host", "port")):
        # connectome-host's tombstone: an entry that only switches a server off (an agent
        # unloaded it). Nothing to start, nothing to check beyond the policy keys.
        transport_and_endpoint: tuple[str, _Endpoint] | None = (TOMBSTONE, {})
    else:
        transport_and_endpoint = _parse_transport(s, base_dir, env, token_in=token_in)

    enabled_capabilities = _grant_patterns(s, "enabledCapabilities", "capability path")
    disabled_capabilities = _grant_patterns(s, "disabledCapabilities", "capability path") or ()
    _check_allow_deny(
        s,
        ("enabledCapabilities", enabled_capabilities),
        ("disabledCapabilities", disabled_capabilities),
    )
    enabled_feature_sets = _grant_patterns(s, "enabledFeatureSets", "feature set")
    disabled_feature_sets = _grant_patterns(s, "disabledFeatureSets", "feature set") or ()
    _check_allow_deny(
        s,
        ("enabledFeatureSets", enabled_feature_sets),
        ("disabledFeatureSets", disabled_feature_sets),
    )

    enabled_tools = s.strings("enabledTools", None, item="tool pattern")
    request_timeout = _seconds_or_ms(s, "requestTimeout", "requestTimeoutMs", 30.0)
    # Checked field by field above; ServerConfig's own types say what each must be.
    config_fields: _Policy = {
        "enabled_capabilities": enabled_capabilities,
        "disabled_capabilities": disabled_capabilities,
        "enabled_feature_sets": enabled_feature_sets,
        "disabled_feature_sets": disabled_feature_sets,
        "channel_patterns": s.strings("channelPatterns", (), item="channel pattern") or (),
        "legacy": s.choice("legacy", LEGACY_MODES, "auto", "a legacy mode"),
        "request_timeout": request_timeout,
        "reconnect": _parse_reconnect(s),
        "ping": _parse_ping(s),
        # Hosts read an empty enabledTools as "every tool"; keep that meaning for their files.
        # Offering none is disabledTools = ["*"].
        "enabled_tools": enabled_tools or None,
        "disabled_tools": s.strings("disabledTools", (), item="tool pattern") or (),
        "tool_prefix": s.string("toolPrefix", f"mcpl--{server_id}--") or "",
        "disabled": disabled,
        "required": s.boolean("required", False),
        "inference": parse_inference(s, enabled_capabilities),
    }
    if transport_and_endpoint is None:
        return None
    transport, endpoint = transport_and_endpoint
    return ServerConfig(id=server_id, transport=transport, **endpoint, **config_fields)


def _parse_transport(
    s: Section, base_dir: Path, env: Mapping[str, str], *, token_in: str
) -> tuple[str, _Endpoint] | None:
    """Which transport the server uses, and its endpoint fields; ``None`` when that is unclear.

    An explicit ``transport`` wins; otherwise ``command`` means stdio, a ws:// or wss:// url
    means websocket, a tcp:// url or host/port means tcp. Keys that belong to another transport
    are errors, since they would be silently ignored.
    """
    if s.unresolved("transport", "command", "url"):
        return None
    if s.has("transport"):
        transport = s.choice("transport", TRANSPORTS, "", "a transport")
        if not transport:
            return None
        reason = f'transport = "{transport}"'
    else:
        has_hostport = s.has("host") or s.has("port")
        if s.has("command") and (s.has("url") or has_hostport):
            other = "url" if s.has("url") else ("host" if s.has("host") else "port")
            s.error(
                "command",
                f'"command" and "{other}" are both given: a server is spawned over stdio '
                f'(command) or dialled ({other}), not both.',
                'Remove one, or set "transport" to say which.',
            )
            return None
        if s.has("command"):
            transport, reason = "stdio", '"command" is given'
        elif s.has("url"):
            scheme = _scheme(s.raw("url"))
            if scheme in ("ws", "wss"):
                transport, reason = "websocket", f'"url" is a {scheme}:// URL'
            elif scheme == "tcp":
                transport, reason = "tcp", '"url" is a tcp:// URL'
            else:
                s.error(
                    "url",
                    f"{show_value(s.raw('url'))} is not a URL this daemon can dial.",
                    "Use ws:// or wss:// (WebSocket) or tcp://host:port (TCP).",
                )
                return None
        elif has_hostport:
            transport, reason = "tcp", '"host"/"port" are given'
        else:
            s.problems.error(
                s.key,
                "nothing says how to reach this server.",
                'Give "command" (spawned over stdio), "url" (ws://, wss:// or tcp://), or '
                '"host" and "port" (TCP).',
            )
            return None

    belongs_to = {
        **{name: ("stdio",) for name in STDIO_KEYS},
        **{name: ("tcp",) for name in TCP_KEYS},
        **{name: ("websocket",) for name in WEBSOCKET_KEYS},
        "url": ("tcp", "websocket"),
    }
    misplaced = False
    for name, transports in belongs_to.items():
        if s.has(name) and transport not in transports:
            misplaced = True
            s.error(
                name,
                f'"{name}" does not apply to a {transport} server ({reason}).',
                f"Remove it: it is for {' and '.join(transports)} servers.",
            )
    if transport == "stdio":
        endpoint = _stdio_endpoint(s, base_dir, env, reason)
    elif transport == "tcp":
        endpoint = _tcp_endpoint(s)
    else:
        endpoint = _websocket_endpoint(s, token_in)
    if endpoint is None or misplaced:
        return None
    return transport, endpoint


def _url(s: Section) -> str | None:
    """``url`` once checked (a string by then)."""
    url = s.raw("url")
    return url if isinstance(url, str) else None


def _scheme(url: object) -> str | None:
    if not isinstance(url, str) or "://" not in url:
        return None
    return url.split("://", 1)[0].lower()


def _stdio_endpoint(
    s: Section, base_dir: Path, env: Mapping[str, str], reason: str
) -> _Endpoint | None:
    command = s.string("command", fix='Give the program to spawn, e.g. command = "node".')
    if command is None:
        if not s.has("command"):
            s.error(
                "command",
                f"is missing: a stdio server ({reason}) needs the program to spawn.",
                'Add command = "..." (and args = [...]).',
            )
        return None
    # A bare name is looked up on PATH; only something written as a path is read against the
    # config's directory.
    if "/" in command or os.sep in command or command.startswith("~"):
        command = str(resolve_path(command, base_dir, env))
    cwd_text = s.string("cwd")
    allowlist = s.strings("envAllowlist", DEFAULT_ENV_ALLOWLIST, item="variable name")
    for index, name in enumerate(allowlist or ()):
        if "=" in name:
            s.problems.error(
                f"{s.key_of('envAllowlist')}[{index}]",
                f"{json.dumps(name)} is not a variable name.",
                'Give names only, without "=".',
            )
    protocol = s.choice("protocol", PROTOCOL_FAMILIES, "legacy", "a protocol family")
    if protocol == "modern":
        s.error(
            "protocol",
            '"modern" (MCP 2026-07-28) is not a protocol this daemon speaks: it speaks MCP '
            '2024-11-05 with MCPL ("legacy", connectome-host\'s default).',
            'Remove "protocol" (or set it to "legacy") for an MCPL server; serve a modern MCP '
            "server from the host itself.",
        )
    # An empty argument is a real argument (--name ""), unlike an empty pattern.
    args = s.strings("args", (), item="argument", allow_empty=True) or ()
    return {
        "command": command,
        # As connectome-host reads mcpl-servers.json (src/mcpl-config.ts:66): an argument that
        # starts with ./ or ../ is a path relative to the config file, wherever the daemon runs.
        "args": tuple(_relative_arg(arg, base_dir) for arg in args),
        "path_args": tuple(index for index, arg in enumerate(args) if arg.startswith(("./", "../"))),
        "env": s.string_map("env"),
        # No default: the child starts where the daemon runs, as `python -m pkg` commands
        # (the demo's, the tests') need when the package is importable from there.
        "cwd": None if cwd_text is None else resolve_path(cwd_text, base_dir, env),
        "env_allowlist": allowlist if allowlist is not None else DEFAULT_ENV_ALLOWLIST,
        "inherit_env": s.boolean("inheritEnv", False),
    }


def _relative_arg(arg: str, base_dir: Path) -> str:
    if arg.startswith(("./", "../")):
        return os.path.normpath(base_dir / arg)
    return arg


def _tcp_endpoint(s: Section) -> _Endpoint | None:
    if s.given("url"):
        if s.has("host") or s.has("port"):
            s.error(
                "url",
                '"url" and "host"/"port" are both given: a tcp endpoint is one or the other, '
                "not both.",
                'Keep url = "tcp://host:port", or host and port.',
            )
            return None
        parsed = _split_url(s, ("tcp",), need_port=True)
        if parsed is None:
            return None
        host, port = parsed
        return {"host": host, "port": port, "url": _url(s)}
    given_host = s.string("host", fix='Give the address to dial, e.g. host = "127.0.0.1".')
    given_port = s.integer("port", 0, at_least=1, at_most=65535)
    for name in ("host", "port"):
        if not s.has(name):
            s.error(
                name,
                "is missing: a tcp server needs host and port.",
                f'Add {name}, or give url = "tcp://host:port".',
            )
    if given_host is None or not given_port:
        return None
    return {"host": given_host, "port": given_port}


def _websocket_endpoint(s: Section, token_in_default: str) -> _Endpoint | None:
    token = s.string("token", secret=True)
    header = s.string("tokenHeader", "Authorization") or "Authorization"
    if not _HEADER_NAME.fullmatch(header):
        s.error(
            "tokenHeader",
            f"{show_value(header)} is not an HTTP header name.",
            'Use letters, digits and "-", e.g. "Authorization" or "X-Api-Key".',
        )
    if not s.has("url"):
        s.error(
            "url",
            "is missing: a websocket server needs the URL to dial.",
            'Add url = "ws://host:port/mcpl" (or wss://).',
        )
        return None
    if _split_url(s, ("ws", "wss"), need_port=False) is None:
        return None
    # Without a token there is nothing to place: such an entry keeps the daemon's default.
    default = token_in_default if token else "header"
    token_in = s.choice("tokenIn", TOKEN_PLACES, default, "a place for the token")
    return {"url": _url(s), "token": token, "token_header": header, "token_in": token_in}


_URL_EXAMPLES: Final = {
    "tcp": "tcp://127.0.0.1:7400",
    "ws": "ws://127.0.0.1:8080/mcpl",
    "wss": "wss://example.org/mcpl",
}


def _split_url(
    s: Section, schemes: tuple[str, ...], *, need_port: bool
) -> tuple[str, int] | None:
    """Check ``url`` against ``schemes``; return its host and port (0 when it has none)."""
    url = s.string("url")
    if url is None:
        return None
    fix = "Write it like " + " or ".join(_URL_EXAMPLES[scheme] for scheme in schemes) + "."
    parts = urlsplit(url)
    if parts.scheme.lower() not in schemes:
        wanted = " or ".join(f"{scheme}://" for scheme in schemes)
        s.error("url", f"{show_value(url)} is not a {wanted} URL.", fix)
        return None
    try:
        port = parts.port
    except ValueError:
        s.error("url", f"{show_value(url)} has a port that is not a number from 1 to 65535.", fix)
        return None
    if not parts.hostname:
        s.error("url", f"{show_value(url)} names no host.", fix)
        return None
    if need_port and port is None:
        s.error("url", f"{show_value(url)} names no port.", fix)
        return None
    if need_port and parts.path not in ("", "/"):
        s.error("url", f"{show_value(url)} has a path; a TCP endpoint is only host and port.", fix)
        return None
    return parts.hostname, port or 0


def _grant_patterns(s: Section, name: str, item: str) -> tuple[str, ...] | None:
    """A list of dotted grant patterns, where ``*`` stands for exactly one whole segment."""
    patterns = s.strings(name, None, item=item)
    if patterns is None:
        return None
    for index, pattern in enumerate(patterns):
        segments = pattern.split(".")
        where = f"{s.key_of(name)}[{index}]"
        if not all(_GRANT_SEGMENT.fullmatch(segment) for segment in segments):
            s.problems.error(
                where,
                f"{show_value(pattern)} is not a dotted {item}.",
                "Join non-empty segments of letters, digits, _ : - or * with dots, e.g. "
                '"channels.publish".',
            )
        elif any("*" in segment and segment != "*" for segment in segments):
            s.problems.error(
                where,
                f'{show_value(pattern)}: "*" stands for exactly one whole segment.',
                'Write "*" as a segment of its own (e.g. "channels.*"), or list the names.',
            )
    return patterns


def _check_allow_deny(
    s: Section,
    allow: tuple[str, tuple[str, ...] | None],
    deny: tuple[str, tuple[str, ...]],
) -> None:
    (allow_name, allowed), (deny_name, denied) = allow, deny
    for pattern in dict.fromkeys(allowed or ()):
        if pattern in denied:
            s.error(
                allow_name,
                f"{show_value(pattern)} is in both {allow_name} and {deny_name} "
                f"({s.key_of(deny_name)}): allow+deny of one path is malformed, and the "
                "server's grant would fail closed.",
                "Remove it from one of the two lists.",
            )


def _seconds_or_ms(s: Section, name: str, ms_name: str, default: float) -> float:
    """A duration in seconds, or in milliseconds under the host-compatible ``*Ms`` name."""
    if s.has(name) and s.has(ms_name):
        s.error(ms_name, f'"{name}" and "{ms_name}" are both given.', f'Keep "{name}" (seconds).')
    if s.given(ms_name) and not s.has(name):
        return s.number(ms_name, default * 1000, above=0) / 1000
    return s.number(name, default, above=0)


def _parse_ping(s: Section) -> PingPolicy:
    defaults = PingPolicy()
    raw = s.raw("ping")
    if isinstance(raw, bool):
        return PingPolicy(enabled=raw)
    if s.given("ping") and not isinstance(raw, Mapping):
        s.error("ping", f"expected a table or true/false, got {show_value(raw)}.", "Write ping = { interval = 30, timeout = 10 }, or false.")
        return defaults
    table = s.table("ping", PING_KEYS, "ping") if isinstance(raw, Mapping) else Section.empty(s.problems, s.key_of("ping"))
    return PingPolicy(
        enabled=table.boolean("enabled", defaults.enabled),
        interval=table.number("interval", defaults.interval, above=0),
        timeout=table.number("timeout", defaults.timeout, above=0),
    )


def _parse_reconnect(s: Section) -> ReconnectPolicy:
    raw = s.raw("reconnect")
    retry = True
    table = Section.empty(s.problems, s.key_of("reconnect"))
    if isinstance(raw, bool):
        # connectome-host writes reconnect = true/false; the table form tunes the backoff.
        retry = raw
    elif isinstance(raw, Mapping):
        table = s.table("reconnect", RECONNECT_KEYS, "reconnect")
    elif s.given("reconnect"):
        s.error(
            "reconnect",
            f"expected a table or true/false, got {show_value(raw)}.",
            "Write reconnect = { initialDelay = 0.5, maxDelay = 30 }, or false.",
        )
    for compat, name in (
        ("reconnectIntervalMs", "initialDelay"),
        ("reconnectMaxIntervalMs", "maxDelay"),
    ):
        if s.has(compat) and table.has(name):
            s.error(
                compat,
                f'"{compat}" and "reconnect.{name}" are both given.',
                f'Keep "reconnect.{name}" (seconds).',
            )
    defaults = ReconnectPolicy()
    initial_delay = table.number("initialDelay", defaults.initial_delay, above=0)
    if s.given("reconnectIntervalMs") and not table.has("initialDelay"):
        initial_delay = s.number("reconnectIntervalMs", initial_delay * 1000, above=0) / 1000
    # Unless configured, the cap follows a long initial delay instead of contradicting it.
    max_delay = table.number("maxDelay", max(defaults.max_delay, initial_delay), above=0)
    if s.given("reconnectMaxIntervalMs") and not table.has("maxDelay"):
        max_delay = s.number("reconnectMaxIntervalMs", max_delay * 1000, above=0) / 1000
    if max_delay < initial_delay:
        problem = (
            f"the maximum delay ({max_delay:g} s) is less than the initial delay "
            f"({initial_delay:g} s)."
        )
        if table.has("maxDelay"):
            table.error("maxDelay", problem, "Make maxDelay at least initialDelay.")
        else:
            s.error("reconnectMaxIntervalMs", problem, "Make it at least reconnectIntervalMs.")
    return ReconnectPolicy(
        initial_delay=initial_delay,
        max_delay=max_delay,
        multiplier=table.number("multiplier", defaults.multiplier, at_least=1),
        jitter=table.number("jitter", defaults.jitter, at_least=0, at_most=1),
        # One attempt in a row is the first connection alone: never retry.
        max_attempts=table.integer(
            "maxAttempts", defaults.max_attempts, at_least=0, at_most=2**31 - 1
        )
        if retry
        else 1,
    )
