"""The shape of a validated config: :class:`RouterConfig` and one frozen attrs class per section.

This is the one module to read for what a config holds. Each section's keys on disk (camelCase,
as in ``mcpl-servers.json``) are declared at the top, beside the vocabularies their values come
from; the attrs classes below hold the same settings in snake_case, section by section in the
order of :class:`RouterConfig`. The ``read_*`` modules turn a file's tables into these classes,
and the rest of the daemon reads only these classes.
"""

from __future__ import annotations

import fnmatch
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import attrs

from mcpl_router.config.addresses import dsn_without_password, host_port, is_loopback, without_password
from mcpl_router.routing.forks import ConversationsSpec
from mcpl_router.routing.gating import WakeGateSpec
from mcpl_router.routing.modes import DEFAULT_MODE, MODE_NAMES
from mcpl_router.routing.refs import ChannelRef

# --- the values some keys choose from --------------------------------------------------------

TRANSPORTS: Final = ("stdio", "tcp", "websocket")
#: The transport of a tombstone (``{"disabled": true}`` and nothing to reach): never started.
TOMBSTONE: Final = "none"
#: Where a WebSocket token goes: ``header``/``query`` = only that way; ``auto`` = the header,
#: after a refusal (401/403) ``?token=`` once (connectome-host's way), and back to the header for
#: good if the query is refused too. The default is ``header`` (``query`` in connectome-host's
#: own mcpl-servers.json, see :func:`~mcpl_router.config.loading.token_in_default`): a token
#: in a URL lands in access logs.
TOKEN_PLACES: Final = ("auto", "header", "query")
#: ``protocol`` of a stdio server in connectome-host's file: the MCP family it speaks. This daemon
#: speaks ``legacy`` (MCP 2024-11-05 + MCPL), connectome-host's default.
PROTOCOL_FAMILIES: Final = ("legacy", "modern")
LEGACY_MODES: Final = ("auto", "allow", "deny")
#: The modes ``proseRouting`` names (each is a file in ``routing/modes/``).
PROSE_ROUTING_MODES: Final = MODE_NAMES
LOG_LEVELS: Final = ("debug", "info", "warning", "error")
LOG_FORMATS: Final = ("auto", "json", "console")

#: What a spawned server inherits from the daemon's environment unless its config says otherwise.
#: Short on purpose: the daemon's environment may hold other servers' secrets.
DEFAULT_ENV_ALLOWLIST: Final = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "SYSTEMROOT",
    "TMPDIR",
)

# --- keys accepted on disk -------------------------------------------------------------------

TOP_KEYS: Final = ("mcplServers", "host", "journal", "logging", "health", "agents", "cluster")
STDIO_KEYS: Final = ("command", "args", "env", "cwd", "envAllowlist", "inheritEnv", "protocol")
TCP_KEYS: Final = ("host", "port")
WEBSOCKET_KEYS: Final = ("token", "tokenHeader", "tokenIn")
SERVER_KEYS: Final = (
    "transport",
    *STDIO_KEYS,
    "url",
    *TCP_KEYS,
    *WEBSOCKET_KEYS,
    "enabledCapabilities",
    "disabledCapabilities",
    "enabledFeatureSets",
    "disabledFeatureSets",
    "channelPatterns",
    "legacy",
    "requestTimeout",
    "reconnect",
    "ping",
    "enabledTools",
    "disabledTools",
    "toolPrefix",
    "disabled",
    "required",
    "inference",
)
#: ``mcplServers.<id>.inference``: this server may ask for inference (``inference/request``,
#: ``model/info``), served by the host that serves ``agent``'s model.
INFERENCE_KEYS: Final = ("agent", "maxConcurrent", "maxRequestBytes", "perMinute", "timeout")
# Spellings that connectome-host's mcpl-servers.json uses for the same settings, so its files
# load unchanged. Not listed in "valid keys" messages: new files should use the names above.
SERVER_COMPAT_KEYS: Final = ("requestTimeoutMs", "reconnectIntervalMs", "reconnectMaxIntervalMs")
# Host-side settings with no meaning in this daemon: accepted so a host's file loads, and
# reported as ignored (check-config shows the warning) rather than silently dropped.
SERVER_IGNORED_HOST_KEYS: Final = ("channelSubscription", "access", "toolLifecycle")
RECONNECT_KEYS: Final = ("initialDelay", "maxDelay", "multiplier", "jitter", "maxAttempts")
#: ``mcplServers.<id>.ping``: whether a ready link is asked MCP ``ping`` to show it still answers.
PING_KEYS: Final = ("enabled", "interval", "timeout")
HOST_KEYS: Final = (
    "websocket",
    "unixSocket",
    "token",
    "tokenFile",
    "allowNonLoopback",
    "stallTimeout",
    "maxConnections",
    "maxBufferedBytes",
    "partialMessageTimeout",
    "helloTimeout",
)
HOST_WEBSOCKET_KEYS: Final = ("enabled", "bind", "port", "path")
JOURNAL_KEYS: Final = ("backend", "path", "retention", "dsn", "passwordFile")
JOURNAL_BACKENDS: Final = ("sqlite", "postgres")
LOGGING_KEYS: Final = ("level", "format")
HEALTH_KEYS: Final = ("enabled", "bind", "port", "statusPreview", "decisions")
CLUSTER_KEYS: Final = ("node", "leaseTtl", "links", "pin", "relayBind", "relayPort", "relayAdvertise")
AGENT_KEYS: Final = (
    "proseRouting",
    "allowedTools",
    "homeChannel",
    "wakeChannels",
    "wakeServers",
    "wakeTags",
    "wakeGate",
    "subconsciousFor",
    "conversations",
)
CHANNEL_REF_KEYS: Final = ("serverId", "channelId")


# --- the whole config ------------------------------------------------------------------------


@attrs.frozen
class RouterConfig:
    """The whole, validated configuration of one daemon.

    ``servers`` keeps the file's order and includes disabled servers (see
    :meth:`enabled_servers`). ``warnings`` lists settings that were accepted but have no effect
    here (e.g. host-only keys of an ``mcpl-servers.json``), one line each.
    """

    source: str
    servers: dict[str, ServerConfig]
    host: HostConfig
    journal: JournalConfig
    logging: LoggingConfig
    health: HealthConfig
    agents: dict[str, AgentConfig] = attrs.field(factory=dict)
    warnings: tuple[str, ...] = ()
    #: ``[cluster]``, or None: a single daemon, as without it.
    cluster: ClusterConfig | None = None

    def enabled_servers(self) -> list[ServerConfig]:
        """The servers the daemon should connect to, in file order."""
        return [server for server in self.servers.values() if not server.disabled]

    def summary(self) -> str:
        """A few lines for ``check-config``: servers and agents first, then where things live."""
        first = f"OK: {_count(len(self.servers), 'server')}"
        if self.servers:
            servers = ", ".join(
                f"{s.id}: {s.transport}{', disabled' if s.disabled else ''}"
                for s in self.servers.values()
            )
            first += f" ({servers})"
        if self.agents:
            agents = ", ".join(f"{a.name}: {a.prose_routing}" for a in self.agents.values())
            first += f", {_count(len(self.agents), 'agent')} ({agents})"
        listeners = []
        if self.host.websocket is not None:
            ws = self.host.websocket
            listeners.append(f"websocket ws://{host_port(ws.bind, ws.port)}{ws.path}")
        if self.host.unix_socket is not None:
            listeners.append(f"unix socket {self.host.unix_socket}")
        auth = "token set" if self.host.token is not None else f"token file {self.host.token_file}"
        lines = [
            first,
            f"  config: {self.source}",
            *(
                f"  server {s.id}: {s.endpoint}" + (f" (in {s.cwd})" if s.cwd else "")
                for s in self.servers.values()
            ),
            f"  host: {', '.join(listeners) or 'no listener'}; {auth}",
            f"  journal: {self.journal.described}",
            f"  logging: level {self.logging.level}, format {self.logging.format}",
            "  health: "
            + (host_port(self.health.bind, self.health.port) if self.health.enabled else "off"),
            *(
                [f"  cluster: node {self.cluster.node}, lease {self.cluster.lease_ttl:g}s (the journal's database is shared),"
                 f" links {self.cluster.described_links}"]
                if self.cluster is not None else []
            ),
            *(f"  warning: {warning}" for warning in self.warnings),
        ]
        return "\n".join(lines)


# --- mcplServers.<id> ------------------------------------------------------------------------


def _env_repr(env: Mapping[str, str]) -> str:
    # A spawned server's env is where its secrets go (DISCORD_TOKEN=...): show names only.
    return "{" + ", ".join(f"{name!r}: '<set>'" for name in env) + "}"


def _url_repr(url: str | None) -> str:
    # wss://user:password@host/ is legal; the password is as secret as a token.
    return repr(None if url is None else without_password(url))


@attrs.frozen
class ReconnectPolicy:
    """How a link re-dials after its transport ends: exponential backoff with jitter and a cap.

    The n-th retry (from 0) waits ``min(max_delay, initial_delay * multiplier**n)``, spread by
    ``± jitter`` of itself. ``max_attempts`` counts connection attempts in a row, the first one
    included, before the link gives up; 0 means forever, and 1 (on disk also
    ``reconnect = false``) means never retry.
    """

    initial_delay: float = 0.5
    max_delay: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.2
    max_attempts: int = 0

    def to_wire(self) -> dict[str, object]:
        """The policy with its on-disk (camelCase) names, for status output."""
        return {
            "initialDelay": self.initial_delay,
            "maxDelay": self.max_delay,
            "multiplier": self.multiplier,
            "jitter": self.jitter,
            "maxAttempts": self.max_attempts,
        }


@attrs.frozen
class PingPolicy:
    """How a ready link shows it still answers: MCP ``ping`` every ``interval`` seconds, missed
    when nothing (an error answer counts: servers without a ``ping`` handler say -32601) comes
    back within ``timeout``. A link that misses one is ``unresponsive`` until it answers again.
    """

    enabled: bool = True
    interval: float = 30.0
    timeout: float = 10.0

    def to_wire(self) -> dict[str, object]:
        return {"enabled": self.enabled, "interval": self.interval, "timeout": self.timeout}


@attrs.frozen
class InferencePolicy:
    """What a server may ask of inference (``mcplServers.<id>.inference``); absent: nothing.

    ``agent`` names the agent whose model answers: the host that owns it and declared it in
    ``session/hello``'s ``serves`` is asked. The limits bound what one server may spend.
    """

    agent: str
    max_concurrent: int = 4
    max_request_bytes: int = 1_048_576
    per_minute: int = 60
    timeout: float = 120.0

    def to_wire(self) -> dict[str, object]:
        """The policy with its on-disk (camelCase) names, for status output."""
        return {
            "agent": self.agent,
            "maxConcurrent": self.max_concurrent,
            "maxRequestBytes": self.max_request_bytes,
            "perMinute": self.per_minute,
            "timeout": self.timeout,
        }


@attrs.frozen
class ServerConfig:
    """One configured MCPL server: how to reach it and what it may be granted.

    ``enabled_capabilities``/``enabled_feature_sets`` of ``None`` mean "not configured": the
    daemon's default grant applies (an empty tuple grants nothing). ``enabled_tools`` of
    ``None`` offers every tool. ``token`` is a secret: it is left out of ``repr`` and
    :meth:`redacted` shows only whether it is set.
    """

    id: str
    transport: str
    # stdio
    command: str | None = None
    args: tuple[str, ...] = ()
    # Which of ``args`` were written ./ or ../ and so read as paths from the config's
    # directory: check-config and run say when one isn't there.
    path_args: tuple[int, ...] = ()
    env: dict[str, str] = attrs.field(factory=dict, repr=_env_repr)
    cwd: Path | None = None
    env_allowlist: tuple[str, ...] = DEFAULT_ENV_ALLOWLIST
    inherit_env: bool = False
    # tcp (url is kept as written when the endpoint was given as tcp://host:port)
    host: str | None = None
    port: int | None = None
    # websocket
    url: str | None = attrs.field(default=None, repr=_url_repr)
    token: str | None = attrs.field(default=None, repr=False)
    token_header: str = "Authorization"
    token_in: str = "header"
    # grant policy
    enabled_capabilities: tuple[str, ...] | None = None
    disabled_capabilities: tuple[str, ...] = ()
    enabled_feature_sets: tuple[str, ...] | None = None
    disabled_feature_sets: tuple[str, ...] = ()
    channel_patterns: tuple[str, ...] = ()
    legacy: str = "auto"
    # link behaviour
    request_timeout: float = 30.0
    reconnect: ReconnectPolicy = ReconnectPolicy()
    ping: PingPolicy = PingPolicy()
    enabled_tools: tuple[str, ...] | None = None
    disabled_tools: tuple[str, ...] = ()
    tool_prefix: str = ""
    disabled: bool = False
    #: ``/readyz`` (and ``mcpl-router health``) fail while this server is not ready.
    required: bool = False
    #: Server-initiated inference: None = this server may not ask (the grant leaves it out).
    inference: InferencePolicy | None = None

    @property
    def endpoint(self) -> str:
        """Where the server is, for humans: the command, ``host:port`` or the URL.

        Never a secret: arguments (``--token ${TOKEN}`` after substitution) are only counted,
        and a URL's userinfo and query are masked.
        """
        if self.transport == "stdio":
            shown = shlex.quote(self.command or "")
            return f"{shown} (+{len(self.args)} args)" if self.args else shown
        if self.transport == "tcp":
            return f"{self.host}:{self.port}"
        if self.transport == TOMBSTONE:
            return "(none: disabled)"
        return without_password(self.url or "")

    def spawn_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The environment a stdio child gets: the allowlisted part of ``environ``, then ``env``.

        With ``inherit_env`` the child gets all of ``environ`` instead of the allowlisted part.
        """
        if self.inherit_env:
            child = dict(environ)
        else:
            child = {name: environ[name] for name in self.env_allowlist if name in environ}
        child.update(self.env)
        return child

    def channel_permitted(self, channel_id: str) -> bool:
        """Whether this server may register or receive ``channel_id`` (no patterns = any)."""
        if not self.channel_patterns:
            return True
        return any(fnmatch.fnmatchcase(channel_id, pattern) for pattern in self.channel_patterns)

    def tool_offered(self, tool_name: str) -> bool:
        """Whether the server's own tool ``tool_name`` (unprefixed) passes the tool globs."""
        if self.enabled_tools is not None and not any(
            fnmatch.fnmatchcase(tool_name, pattern) for pattern in self.enabled_tools
        ):
            return False
        return not any(fnmatch.fnmatchcase(tool_name, pattern) for pattern in self.disabled_tools)

    def redacted(self) -> dict[str, object]:
        """The config as status output may show it: camelCase keys, no secret values.

        ``token`` appears as ``"set"`` when one is configured and is absent otherwise; ``env``
        values are shown as ``"set"``, since that is where stdio servers take their secrets.
        """
        out: dict[str, object] = {"id": self.id, "transport": self.transport}
        if self.transport == "stdio":
            out["command"] = self.command
            out["args"] = list(self.args)
            out["cwd"] = None if self.cwd is None else str(self.cwd)
            out["env"] = {name: "set" for name in self.env}
            out["envAllowlist"] = list(self.env_allowlist)
            out["inheritEnv"] = self.inherit_env
        elif self.transport == "tcp":
            out["host"] = self.host
            out["port"] = self.port
        elif self.transport != TOMBSTONE:
            out["url"] = without_password(self.url or "")
            if self.token is not None:
                out["token"] = "set"
            out["tokenHeader"] = self.token_header
            out["tokenIn"] = self.token_in
        out.update(
            {
                "enabledCapabilities": _list_or_none(self.enabled_capabilities),
                "disabledCapabilities": list(self.disabled_capabilities),
                "enabledFeatureSets": _list_or_none(self.enabled_feature_sets),
                "disabledFeatureSets": list(self.disabled_feature_sets),
                "channelPatterns": list(self.channel_patterns),
                "legacy": self.legacy,
                "requestTimeout": self.request_timeout,
                "reconnect": self.reconnect.to_wire(),
                "enabledTools": _list_or_none(self.enabled_tools),
                "disabledTools": list(self.disabled_tools),
                "toolPrefix": self.tool_prefix,
                "disabled": self.disabled,
                "required": self.required,
                "inference": None if self.inference is None else self.inference.to_wire(),
            }
        )
        return out


# --- host ------------------------------------------------------------------------------------


@attrs.frozen
class WebSocketListenConfig:
    """Where the host WebSocket listens. ``port == 0`` lets the OS pick a free port."""

    bind: str = "127.0.0.1"
    port: int = 0
    path: str = "/"

    @property
    def loopback(self) -> bool:
        """Whether ``bind`` reaches only this machine."""
        return is_loopback(self.bind)


@attrs.frozen
class HostConfig:
    """The agent-host socket: WebSocket and/or Unix socket, and the token hosts must present.

    ``websocket`` or ``unix_socket`` of ``None`` means that listener is off. When no ``token``
    is configured the listener reads (or creates) ``token_file``. ``token`` is a secret: left
    out of ``repr``.
    """

    websocket: WebSocketListenConfig | None
    unix_socket: Path | None
    token_file: Path | None
    token: str | None = attrs.field(default=None, repr=False)
    allow_non_loopback: bool = False
    #: Seconds a host may leave what it is sent unread before it is disconnected.
    stall_timeout: float = 30.0
    #: Host connections each listener (Unix socket, WebSocket) takes at once; more are refused.
    max_connections: int = 256
    #: Bytes of unfinished messages held across all host connections; over it, new connections
    #: are refused (the connected are served on).
    max_buffered_bytes: int = 64 * 1024 * 1024
    #: Seconds a connection may hold part of a message without finishing it.
    partial_message_timeout: float = 30.0
    #: Seconds a connection that has not said ``session/hello`` may stay silent.
    hello_timeout: float = 30.0

    def redacted(self) -> dict[str, object]:
        """The host section as status output may show it: ``token`` is ``"set"`` or absent."""
        out: dict[str, object] = {
            "websocket": None
            if self.websocket is None
            else {
                "bind": self.websocket.bind,
                "port": self.websocket.port,
                "path": self.websocket.path,
            },
            "unixSocket": None if self.unix_socket is None else str(self.unix_socket),
            "tokenFile": None if self.token_file is None else str(self.token_file),
            "allowNonLoopback": self.allow_non_loopback,
        }
        if self.token is not None:
            out["token"] = "set"
        return out


# --- journal, logging, health ----------------------------------------------------------------


@attrs.frozen
class JournalConfig:
    """Where the journal lives (a SQLite file, or a PostgreSQL database), and how long it keeps
    what is done with."""

    #: The SQLite file (``backend = "sqlite"``); on PostgreSQL, only where the host token goes by default.
    path: Path
    #: Seconds an acked event (and its deliveries) or a settled draft is kept before pruning.
    retention: float = 24 * 3600.0
    #: ``sqlite`` (the embedded default) or ``postgres``.
    backend: str = "sqlite"
    #: libpq's connection string (``backend = "postgres"``); its password is never shown.
    dsn: str | None = attrs.field(default=None, repr=False)
    #: A file holding the database password (instead of one in the DSN).
    password_file: Path | None = None

    @property
    def described(self) -> str:
        """Where the journal is, for ``check-config`` and logs (a DSN without its password)."""
        if self.backend == "postgres" and self.dsn is not None:
            return f"postgres: {dsn_without_password(self.dsn)}"
        return str(self.path)


@attrs.frozen
class ClusterConfig:
    """``[cluster]``: this daemon is one node of several sharing one PostgreSQL journal
    (docs/cluster.md). The same file on every node; ``node`` differs (a ``${VAR}``)."""

    #: This node's name, unique in the cluster.
    node: str
    #: Seconds a holder's lease lasts unrenewed: a dead holder's links are taken over after it.
    lease_ttl: float = 5.0
    #: Where the servers' connections are held: ``router`` (the node holding the router's lease
    #: holds every link) or ``balanced`` (each link under a lease of its own, spread over the
    #: live nodes; the router reaches the others' through their relays).
    links: str = "router"
    #: ``balanced``: server id → the node that holds its link whenever that node is live.
    pin: Mapping[str, str] = attrs.field(factory=dict)
    #: ``balanced``: where this node's relay listens for the router (port 0: any free port; the
    #: address is published in the node's row, so the same file serves every node).
    relay_bind: str = "127.0.0.1"
    relay_port: int = 0
    #: The host the router dials this node's relay at; None: ``relay_bind``, or this machine's
    #: name when that is a wildcard (``0.0.0.0``, ``::``).
    relay_advertise: str | None = None

    @property
    def described_links(self) -> str:
        if self.links != "balanced":
            return "held by the router"
        pins = ", ".join(f"{server} on {node}" for server, node in sorted(self.pin.items()))
        return "balanced over the live nodes" + (f" ({pins} while live)" if pins else "") + f", relay on {host_port(self.relay_bind, self.relay_port)}"


@attrs.frozen
class LoggingConfig:
    """Log level and renderer (``auto``: JSON lines unless stderr is a terminal)."""

    level: str = "info"
    format: str = "auto"


@attrs.frozen
class HealthConfig:
    """The ``/healthz`` + ``/metrics`` HTTP listener; ``port == 0`` turns it off."""

    bind: str = "127.0.0.1"
    port: int = 0
    #: ``health.enabled`` as given; not given: on when ``port`` is set.
    switch: bool | None = None
    #: Characters of a message's words the status page's decisions show (0: none, the default).
    status_preview: int = 0
    #: Routing decisions kept for ``status`` and the status page (the newest).
    decisions: int = 100

    @property
    def enabled(self) -> bool:
        """Whether the health listener runs at all (``enabled = true`` with port 0: the OS
        picks the port)."""
        return self.switch if self.switch is not None else self.port != 0


# --- agents.<name> ---------------------------------------------------------------------------


@attrs.frozen
class AgentConfig:
    """An agent declared in config: prose routing, tools and wake policy (used by later issues).

    ``allowed_tools`` of ``None`` allows every tool; ``home_channel`` is the channel the agent
    calls home, if any. The wake tuples are read by the wake policy.
    """

    name: str
    prose_routing: str = DEFAULT_MODE.name
    allowed_tools: tuple[str, ...] | None = None
    home_channel: ChannelRef | None = None
    wake_channels: tuple[str, ...] = ()
    wake_servers: tuple[str, ...] = ()
    wake_tags: tuple[str, ...] = ()
    #: The primary agent this one is the subconscious of (tune-out summaries, speak_in_channel).
    subconscious_for: str | None = None
    #: When admitted wakes go out (routing/gating.py; docs/wake-policy.md).
    wake_gate: WakeGateSpec = WakeGateSpec()
    #: Conversation forks (routing/forks.py; docs/forks.md), or None: the agent doesn't fork.
    conversations: ConversationsSpec | None = None


# --- shown in summaries and status -----------------------------------------------------------


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _list_or_none(values: tuple[str, ...] | None) -> list[str] | None:
    return None if values is None else list(values)
