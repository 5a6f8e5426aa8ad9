"""Configuration: a TOML or JSON file read into a validated, frozen :class:`RouterConfig`.

The server map has the ``mcpl-servers.json`` shape hosts already use
(``{"mcplServers": {"<id>": {...}}}``, in TOML ``[mcplServers.<id>]``), beside the daemon's own
sections ``[host]``, ``[journal]``, ``[logging]``, ``[health]`` and ``[agents.<name>]``.
Keys are camelCase on disk, as in ``mcpl-servers.json``; the attrs fields are snake_case.

Every string value may use ``${VAR}`` and ``${VAR:-default}``; ``$${`` is a literal ``${``.
Relative paths are read against the config file's directory, so one file means the same thing
whatever directory the daemon starts in.

Validation collects every problem it finds in one pass and raises one :class:`ConfigError`; each
of its lines names the file, the dotted key, what is wrong and what would be valid.
``docs/config.md`` documents every key.
"""

from __future__ import annotations

import difflib
import enum
import fnmatch
import ipaddress
import json
import math
import os
import re
import shlex
import shutil
import stat
import sys
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

import attrs

from mcpl_router.routing.refs import ChannelRef

__all__ = [
    "DEFAULT_ENV_ALLOWLIST",
    "AgentConfig",
    "ConfigError",
    "DaemonLocation",
    "HealthConfig",
    "HostConfig",
    "JournalConfig",
    "LoggingConfig",
    "ReconnectPolicy",
    "RouterConfig",
    "ServerConfig",
    "WebSocketListenConfig",
    "check_config",
    "default_unix_socket_path",
    "load_config",
    "locate_daemon",
    "parse_config",
    "runtime_problems",
]

TRANSPORTS: Final = ("stdio", "tcp", "websocket")
#: The transport of a tombstone (``{"disabled": true}`` and nothing to reach): never started.
TOMBSTONE: Final = "none"
LEGACY_MODES: Final = ("auto", "allow", "deny")
PROSE_ROUTING_MODES: Final = ("disabled", "locus", "hybrid", "explicit", "named")
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

_TOP_KEYS: Final = ("mcplServers", "host", "journal", "logging", "health", "agents")
_STDIO_KEYS: Final = ("command", "args", "env", "cwd", "envAllowlist", "inheritEnv", "protocol")
_TCP_KEYS: Final = ("host", "port")
_WEBSOCKET_KEYS: Final = ("token", "tokenHeader", "tokenIn")
#: Where a WebSocket token goes: ``header``/``query`` = only that way; ``auto`` = the header,
#: after a refusal (401/403) ``?token=`` once (connectome-host's way), and back to the header for
#: good if the query is refused too. The default is ``header`` (``query`` in connectome-host's
#: own mcpl-servers.json, see :func:`token_in_default`): a token in a URL lands in access logs.
TOKEN_PLACES: Final = ("auto", "header", "query")
#: ``protocol`` of a stdio server in connectome-host's file: the MCP family it speaks. This daemon
#: speaks ``legacy`` (MCP 2024-11-05 + MCPL), connectome-host's default.
PROTOCOL_FAMILIES: Final = ("legacy", "modern")
_SERVER_KEYS: Final = (
    "transport",
    *_STDIO_KEYS,
    "url",
    *_TCP_KEYS,
    *_WEBSOCKET_KEYS,
    "enabledCapabilities",
    "disabledCapabilities",
    "enabledFeatureSets",
    "disabledFeatureSets",
    "channelPatterns",
    "legacy",
    "requestTimeout",
    "reconnect",
    "enabledTools",
    "disabledTools",
    "toolPrefix",
    "disabled",
    "required",
)
# Spellings that connectome-host's mcpl-servers.json uses for the same settings, so its files
# load unchanged. Not listed in "valid keys" messages: new files should use the names above.
_SERVER_COMPAT_KEYS: Final = ("requestTimeoutMs", "reconnectIntervalMs", "reconnectMaxIntervalMs")
# Host-side settings with no meaning in this daemon: accepted so a host's file loads, and
# reported as ignored (check-config shows the warning) rather than silently dropped.
_SERVER_IGNORED_HOST_KEYS: Final = ("channelSubscription", "access", "toolLifecycle")
_RECONNECT_KEYS: Final = ("initialDelay", "maxDelay", "multiplier", "jitter", "maxAttempts")
_HOST_KEYS: Final = ("websocket", "unixSocket", "token", "tokenFile", "allowNonLoopback", "stallTimeout")
_HOST_WEBSOCKET_KEYS: Final = ("enabled", "bind", "port", "path")
_JOURNAL_KEYS: Final = ("path", "retention")
_LOGGING_KEYS: Final = ("level", "format")
_HEALTH_KEYS: Final = ("enabled", "bind", "port")
_AGENT_KEYS: Final = (
    "proseRouting",
    "allowedTools",
    "homeChannel",
    "wakeChannels",
    "wakeServers",
    "wakeTags",
    "subconsciousFor",
)
_CHANNEL_REF_KEYS: Final = ("serverId", "channelId")

# What the link's grant policy accepts as one segment of a capability path or feature-set name
# (mcpl/grants.py); checked here too so a bad pattern is reported at load, with its key.
_GRANT_SEGMENT = re.compile(r"[A-Za-z0-9_:*-]+")
# An HTTP header name is an RFC 9110 token; anything else would be refused by the dialler.
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_REFERENCE = re.compile(r"\$\$\{|\$\{")
_REFERENCE_BODY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)
_PLAIN_KEY_SEGMENT = re.compile(r"[^.\s\"\[\]]+")
# sun_path is 108 bytes on Linux and 104 on macOS, each including the terminating NUL.
_UNIX_SOCKET_MAX_BYTES: Final = 103 if sys.platform == "darwin" else 107


# --- errors ----------------------------------------------------------------------------------


class ConfigError(Exception):
    """A config that can't be used: which file, which key, what is wrong and what would work.

    One pass over a config collects every problem it can find; the raised error carries them all
    in :attr:`errors` (itself included, first) and ``str()`` gives one line per problem::

        config/example.toml: mcplServers.discord.transport: "smtp" is not a transport. Use one \
of: stdio, tcp, websocket.

    Attributes:
        file: the config's source (the path as given, or the name passed to :func:`parse_config`).
        key: the dotted key, e.g. ``mcplServers.discord.transport``; ``""`` for the whole file.
        problem: what is wrong, as a sentence.
        fix: what would be valid, as a sentence (may be ``""``).
        errors: every problem found, each a :class:`ConfigError` with one problem.
    """

    def __init__(
        self,
        file: str,
        key: str,
        problem: str,
        fix: str = "",
        *,
        errors: Sequence[ConfigError] | None = None,
    ) -> None:
        self.file = file
        self.key = key
        self.problem = problem
        self.fix = fix
        self.errors: list[ConfigError] = list(errors) if errors else [self]
        super().__init__(self._line())

    @classmethod
    def collect(cls, errors: Sequence[ConfigError]) -> ConfigError:
        """One error carrying ``errors`` (non-empty), with the first one's file, key and text."""
        if len(errors) == 1:
            return errors[0]
        first = errors[0]
        return cls(first.file, first.key, first.problem, first.fix, errors=errors)

    def _line(self) -> str:
        where = f"{self.file}: {self.key}: " if self.key else f"{self.file}: "
        return where + " ".join(part for part in (self.problem, self.fix) if part)

    def __str__(self) -> str:
        return "\n".join(error._line() for error in self.errors)


# --- values ----------------------------------------------------------------------------------


def _env_repr(env: Mapping[str, str]) -> str:
    # A spawned server's env is where its secrets go (DISCORD_TOKEN=...): show names only.
    return "{" + ", ".join(f"{name!r}: '<set>'" for name in env) + "}"


def _url_repr(url: str | None) -> str:
    # wss://user:password@host/ is legal; the password is as secret as a token.
    return repr(None if url is None else _without_password(url))


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

    def to_wire(self) -> dict[str, Any]:
        """The policy with its on-disk (camelCase) names, for status output."""
        return {
            "initialDelay": self.initial_delay,
            "maxDelay": self.max_delay,
            "multiplier": self.multiplier,
            "jitter": self.jitter,
            "maxAttempts": self.max_attempts,
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
    enabled_tools: tuple[str, ...] | None = None
    disabled_tools: tuple[str, ...] = ()
    tool_prefix: str = ""
    disabled: bool = False
    #: ``/readyz`` (and ``mcpl-router health``) fail while this server is not ready.
    required: bool = False

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
        return _without_password(self.url or "")

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

    def redacted(self) -> dict[str, Any]:
        """The config as status output may show it: camelCase keys, no secret values.

        ``token`` appears as ``"set"`` when one is configured and is absent otherwise; ``env``
        values are shown as ``"set"``, since that is where stdio servers take their secrets.
        """
        out: dict[str, Any] = {"id": self.id, "transport": self.transport}
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
            out["url"] = _without_password(self.url or "")
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
            }
        )
        return out


@attrs.frozen
class WebSocketListenConfig:
    """Where the host WebSocket listens. ``port == 0`` lets the OS pick a free port."""

    bind: str = "127.0.0.1"
    port: int = 0
    path: str = "/"

    @property
    def loopback(self) -> bool:
        """Whether ``bind`` reaches only this machine."""
        return _is_loopback(self.bind)


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

    def redacted(self) -> dict[str, Any]:
        """The host section as status output may show it: ``token`` is ``"set"`` or absent."""
        out: dict[str, Any] = {
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


@attrs.frozen
class JournalConfig:
    """Where the SQLite journal lives, and how long it keeps what is done with."""

    path: Path
    #: Seconds an acked event (and its deliveries) or a settled draft is kept before pruning.
    retention: float = 24 * 3600.0


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

    @property
    def enabled(self) -> bool:
        """Whether the health listener runs at all (``enabled = true`` with port 0: the OS
        picks the port)."""
        return self.switch if self.switch is not None else self.port != 0


@attrs.frozen
class AgentConfig:
    """An agent declared in config: prose routing, tools and wake policy (used by later issues).

    ``allowed_tools`` of ``None`` allows every tool; ``home_channel`` is the channel the agent
    calls home, if any. The wake tuples are read by the wake policy.
    """

    name: str
    prose_routing: str = "locus"
    allowed_tools: tuple[str, ...] | None = None
    home_channel: ChannelRef | None = None
    wake_channels: tuple[str, ...] = ()
    wake_servers: tuple[str, ...] = ()
    wake_tags: tuple[str, ...] = ()
    #: The primary agent this one is the subconscious of (tune-out summaries, speak_in_channel).
    subconscious_for: str | None = None


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
            listeners.append(f"websocket ws://{_host_port(ws.bind, ws.port)}{ws.path}")
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
            f"  journal: {self.journal.path}",
            f"  logging: level {self.logging.level}, format {self.logging.format}",
            "  health: "
            + (_host_port(self.health.bind, self.health.port) if self.health.enabled else "off"),
            *(f"  warning: {warning}" for warning in self.warnings),
        ]
        return "\n".join(lines)


# --- public entry points ---------------------------------------------------------------------


def load_config(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> RouterConfig:
    """Read, substitute and validate the config file at ``path`` (``.toml`` or ``.json``).

    Args:
        path: the file. Relative paths inside it are read against its directory.
        environ: the variables ``${VAR}`` reads and the default state directory comes from;
            default ``os.environ``.

    Raises:
        ConfigError: the file can't be read or parsed, or any value is invalid (all problems
            found are in its ``errors``).
    """
    data, source, base_dir = _read_config_file(path)
    return parse_config(data, source=source, base_dir=base_dir, environ=environ)


def _read_config_file(path: str | os.PathLike[str]) -> tuple[Any, str, Path]:
    """The parsed (not yet validated) contents, the source name and the base directory."""
    source = os.fspath(path)
    file = Path(source)
    suffix = file.suffix.lower()
    if suffix not in (".toml", ".json"):
        raise ConfigError(
            source,
            "",
            "ends neither in .toml nor in .json, so its format is unknown.",
            "Name the file *.toml (TOML) or *.json (JSON).",
        )
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(source, "", "does not exist.", "Check the path.") from None
    except IsADirectoryError:
        raise ConfigError(source, "", "is a directory.", "Give the config file itself.") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            source, "", f"is not UTF-8 text (byte {exc.start}).", "Save it as UTF-8."
        ) from None
    except OSError as exc:
        raise ConfigError(source, "", f"can't be read: {exc.strerror}.", "") from None
    data: Any
    if suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(
                source, "", f"is not valid TOML: {exc}.", "Fix the syntax there."
            ) from None
    else:
        try:
            data = json.loads(text, object_pairs_hook=_json_object)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                source,
                "",
                f"is not valid JSON: {exc.msg} at line {exc.lineno}, column {exc.colno}.",
                "Fix the syntax there (JSON allows no comments and no trailing commas).",
            ) from None
    return data, source, file.absolute().parent


def parse_config(
    data: Mapping[str, Any],
    *,
    source: str,
    base_dir: Path,
    environ: Mapping[str, str] | None = None,
) -> RouterConfig:
    """Validate an already-parsed config (e.g. the embedded demo config).

    Args:
        data: the config as TOML or JSON would parse it.
        source: what error messages call the config (a path, or e.g. ``"<demo>"``).
        base_dir: the directory relative paths are read against.
        environ: as for :func:`load_config`.

    Raises:
        ConfigError: with every problem found.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    base_dir = Path(base_dir).absolute()
    problems = _Problems(source)
    if not isinstance(data, Mapping):
        raise ConfigError(source, "", f"holds {_show(data)}, not a table of settings.")
    substituted = _substitute_config(data, env, problems)
    root = _Section.of(problems, substituted, "", "top-level", _TOP_KEYS)
    assert root is not None  # a mapping, checked above
    servers_section = root.table("mcplServers", None, "mcplServers")
    servers = _parse_servers(servers_section, base_dir, env, token_in=token_in_default(data, source))
    journal = _parse_journal(root.table("journal", _JOURNAL_KEYS, "journal"), base_dir, env)
    host = _parse_host(root.table("host", _HOST_KEYS, "host"), base_dir, env, journal)
    logging_config = _parse_logging(root.table("logging", _LOGGING_KEYS, "logging"))
    health = _parse_health(root.table("health", _HEALTH_KEYS, "health"))
    # Agents are checked against every configured id, including servers whose own entry has a
    # problem: that problem is reported once, not again as "no such server" here.
    agents = _parse_agents(root.table("agents", None, "agents"), tuple(servers_section.data))
    problems.raise_if_any()
    return RouterConfig(
        source=source,
        servers=servers,
        host=host,
        journal=journal,
        logging=logging_config,
        health=health,
        agents=agents,
        warnings=tuple(problems.warnings),
    )


def token_in_default(data: Mapping[str, Any], source: str) -> str:
    """Where a WebSocket server's token goes when its entry has no ``tokenIn``.

    ``query`` in connectome-host's own file shape, a ``.json`` file holding nothing but
    ``mcplServers`` (its mcpl-servers.json): connectome-host sends ``?token=`` and the servers
    written for it read it there, so that file runs unchanged. ``header`` everywhere else.
    """
    if source.lower().endswith(".json") and set(data) == {"mcplServers"}:
        return "query"
    return "header"


def check_config(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> tuple[bool, str]:
    """What ``mcpl-router check-config FILE`` prints: ``(True, summary)`` or ``(False, errors)``."""
    try:
        config = load_config(path, environ=environ)
    except ConfigError as exc:
        return False, str(exc)
    problems = runtime_problems(config, environ=environ)
    if problems:
        return False, str(ConfigError.collect(problems))
    return True, config.summary()


def default_unix_socket_path(environ: Mapping[str, str]) -> Path:
    """Where the host Unix socket is when the config doesn't say: a per-user directory.

    ``$XDG_RUNTIME_DIR/mcpl-router-<uid>/host.sock``, or under ``/tmp`` without that variable.
    """
    runtime = environ.get("XDG_RUNTIME_DIR") or "/tmp"
    user = os.getuid() if hasattr(os, "getuid") else environ.get("USERNAME", "user")
    return Path(runtime) / f"mcpl-router-{user}" / "host.sock"


# --- reading helpers -------------------------------------------------------------------------


class _Unresolved(enum.Enum):
    """A string whose ``${VAR}`` could not be substituted: its problem is already recorded.

    Readers treat it as "no value" so one missing variable doesn't cascade into more errors.
    """

    VALUE = "unresolved"


_UNRESOLVED: Final = _Unresolved.VALUE


class _JsonObject(dict[str, Any]):
    """A JSON object that remembers which keys it saw twice (JSON keeps the last one silently)."""

    duplicates: tuple[str, ...] = ()


def _json_object(pairs: list[tuple[str, Any]]) -> _JsonObject:
    obj = _JsonObject()
    duplicates = []
    for name, value in pairs:
        if name in obj:
            duplicates.append(name)
        obj[name] = value
    obj.duplicates = tuple(duplicates)
    return obj


@attrs.define
class _Problems:
    """Every problem and warning found in one pass over a config, in document order."""

    file: str
    errors: list[ConfigError] = attrs.Factory(list)
    warnings: list[str] = attrs.Factory(list)
    # Where each key path sits in the file (a walk in document order), so problems found by
    # different passes (substitution, then each section) are reported in the file's order.
    order: dict[str, int] = attrs.Factory(dict)
    ends: dict[str, int] = attrs.Factory(dict)

    def saw(self, key: str) -> None:
        self.order.setdefault(key, len(self.order))

    def done(self, key: str) -> None:
        self.ends[key] = len(self.order)

    def error(self, key: str, problem: str, fix: str = "") -> None:
        self.errors.append(ConfigError(self.file, key, problem, fix))

    def warn(self, key: str, text: str) -> None:
        self.warnings.append(f"{self.file}: {key}: {text}")

    def raise_if_any(self) -> None:
        if self.errors:
            raise ConfigError.collect(sorted(self.errors, key=lambda e: self._position(e.key)))

    def _position(self, key: str) -> float:
        # A problem with a value sits where the value is. A problem with a table as a whole
        # (or with a key missing from it) reads best after the problems inside the table.
        table = key not in self.order
        while key and key not in self.order:
            key = key[: max(key.rfind("."), key.rfind("["), 0)]
        if key not in self.order:
            return -1
        start = self.order[key]
        end = self.ends.get(key, start + 1)
        return end - 0.5 if table or end > start + 1 else start


def _key(prefix: str, name: str) -> str:
    """``prefix.name``, quoting a name that would make the dotted path ambiguous."""
    segment = name if _PLAIN_KEY_SEGMENT.fullmatch(name) else json.dumps(name, ensure_ascii=False)
    return f"{prefix}.{segment}" if prefix else segment


def _show(value: Any, *, secret: bool = False) -> str:
    """A value as an error message quotes it; a secret's type only."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return "a string" if secret else json.dumps(value, ensure_ascii=False)
    if isinstance(value, int | float):
        return "a number" if secret else repr(value)
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a table"
    if value is None:
        return "null"
    return f"a {type(value).__name__}"


def _suggest(name: str, candidates: Iterable[str]) -> str:
    """``Did you mean "x"? `` for the closest candidate, or ``""``."""
    candidates = list(candidates)

    # snake_case or kebab-case of a camelCase key is the commonest slip (the attrs fields are
    # snake_case), and difflib scores it poorly, so compare folded forms first.
    def fold(text: str) -> str:
        return text.lower().replace("_", "").replace("-", "")

    folded = {fold(candidate): candidate for candidate in candidates}
    match = folded.get(fold(name))
    if match is None:
        close = difflib.get_close_matches(fold(name), list(folded), n=1, cutoff=0.6)
        match = folded[close[0]] if close else None
    return f'Did you mean "{match}"? ' if match else ""


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _list_or_none(values: tuple[str, ...] | None) -> list[str] | None:
    return None if values is None else list(values)


def _without_password(url: str) -> str:
    """The URL fit to show: userinfo and query (either may carry a credential) masked."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query = "***" if parts.query else ""
    return urlunsplit(parts._replace(netloc=netloc, query=query, fragment=""))


def _is_loopback(bind: str) -> bool:
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        # A host name other than localhost may resolve anywhere.
        return False


def _as_number(value: Any) -> int | float | None:
    # Strings are accepted because ${PORT} substitution always yields one.
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value.strip())
            except ValueError:
                continue
    return None


def _expand_user(text: str, env: Mapping[str, str]) -> str:
    if text == "~" or text.startswith("~/"):
        home = env.get("HOME") or str(Path.home())
        return home + text[1:]
    return os.path.expanduser(text)


def _resolve_path(text: str, base_dir: Path, env: Mapping[str, str]) -> Path:
    """``text`` as an absolute path: ``~`` expanded, a relative path read against ``base_dir``."""
    path = Path(_expand_user(text, env))
    if not path.is_absolute():
        path = base_dir / path
    return Path(os.path.normpath(path))


def _state_dir(env: Mapping[str, str]) -> Path:
    configured = env.get("MCPL_ROUTER_STATE_DIR")
    if configured:
        return Path(os.path.normpath(Path(_expand_user(configured, env)).absolute()))
    return Path(_expand_user("~/.local/state/mcpl-router", env))


# --- ${VAR} substitution ---------------------------------------------------------------------


def _substitute_config(
    data: Mapping[str, Any], env: Mapping[str, str], problems: _Problems
) -> dict[str, Any]:
    _check_duplicates(data, "", problems)
    out: dict[str, Any] = {}
    for name, value in data.items():
        problems.saw(name)
        if name == "mcplServers" and isinstance(value, Mapping):
            _check_duplicates(value, name, problems)
            servers: dict[str, Any] = {}
            for server_id, entry in value.items():
                problems.saw(_key(name, server_id))
                # A disabled server's secrets may well be absent from this environment: a
                # missing variable there is a warning, not a reason to refuse the whole config.
                lenient = isinstance(entry, Mapping) and entry.get("disabled") is True
                servers[server_id] = _substitute_tree(
                    entry, _key(name, server_id), env, problems, lenient=lenient
                )
            problems.done(name)
            out[name] = servers
        else:
            out[name] = _substitute_tree(value, _key("", name), env, problems, lenient=False)
    return out


def _check_duplicates(value: Any, key: str, problems: _Problems) -> None:
    for name in getattr(value, "duplicates", ()):
        problems.error(
            _key(key, name),
            f'"{name}" is given more than once; JSON would keep only the last.',
            "Remove all but one.",
        )


def _substitute_tree(
    value: Any, key: str, env: Mapping[str, str], problems: _Problems, *, lenient: bool
) -> Any:
    problems.saw(key)
    if isinstance(value, str):
        return _substitute(value, key, env, problems, lenient=lenient)
    out: Any = value
    if isinstance(value, Mapping):
        _check_duplicates(value, key, problems)
        out = {
            name: _substitute_tree(item, _key(key, name), env, problems, lenient=lenient)
            for name, item in value.items()
        }
    elif isinstance(value, list):
        out = [
            _substitute_tree(item, f"{key}[{index}]", env, problems, lenient=lenient)
            for index, item in enumerate(value)
        ]
    problems.done(key)
    return out


def _substitute(
    text: str, key: str, env: Mapping[str, str], problems: _Problems, *, lenient: bool
) -> str | _Unresolved:
    """``text`` with each ``${VAR}``/``${VAR:-default}`` replaced and ``$${`` made ``${``."""
    if "${" not in text:
        return text
    parts: list[str] = []
    resolved = True
    position = 0
    while (match := _REFERENCE.search(text, position)) is not None:
        parts.append(text[position : match.start()])
        if match.group() == "$${":
            parts.append("${")
            position = match.end()
            continue
        end = text.find("}", match.end())
        if end < 0:
            problems.error(
                key,
                f"{_show(text[match.start():])} opens a ${{ without a closing }}.",
                "Close it: ${NAME} or ${NAME:-default}; write $${ for a literal ${.",
            )
            return _UNRESOLVED
        reference = text[match.start() : end + 1]
        body = _REFERENCE_BODY.fullmatch(text[match.end() : end])
        position = end + 1
        if body is None or (body.group(2) is not None and "${" in body.group(2)):
            problems.error(
                key,
                f"{reference} is not a variable reference this config understands.",
                "Write ${NAME} or ${NAME:-default} (NAME: letters, digits, _; defaults don't "
                "nest); write $${ for a literal ${.",
            )
            resolved = False
            continue
        name, default = body.group(1), body.group(2)
        value = env.get(name)
        # As in the shell, ${NAME:-default} also replaces a variable that is set but empty.
        if default is not None and not value:
            value = default
        if value is None:
            if lenient:
                problems.warn(
                    key,
                    f"the environment variable {name} is not set (used as {reference}); "
                    "ignored because this server is disabled.",
                )
            else:
                problems.error(
                    key,
                    f"the environment variable {name} is not set (used as {reference}).",
                    f"Set {name}, or give a default: ${{{name}:-value}}.",
                )
            resolved = False
            continue
        parts.append(value)
    parts.append(text[position:])
    return "".join(parts) if resolved else _UNRESOLVED


# --- typed readers ---------------------------------------------------------------------------


@attrs.define
class _Section:
    """One table of the config being read, with getters that record problems, never raise.

    A getter returns its default when the key is absent, unresolved (its ``${VAR}`` problem is
    already recorded) or invalid (recorded here), so the pass goes on and finds the next problem.
    """

    problems: _Problems
    key: str
    data: dict[str, Any]

    @classmethod
    def of(
        cls,
        problems: _Problems,
        value: Any,
        key: str,
        what: str,
        allowed: Sequence[str] | None,
        accepted_too: Sequence[str] = (),
    ) -> _Section | None:
        """``value`` as a section, after checking it is a table whose keys are all known."""
        if value is _UNRESOLVED:
            return None
        if not isinstance(value, Mapping):
            problems.error(key, f"expected a table, got {_show(value)}.", "")
            return None
        if allowed is not None:
            for name in value:
                if name not in allowed and name not in accepted_too:
                    problems.error(
                        _key(key, name),
                        f'"{name}" is not a {what} key.',
                        _suggest(name, allowed) + f"Valid keys: {', '.join(allowed)}.",
                    )
        return cls(problems, key, dict(value))

    @classmethod
    def empty(cls, problems: _Problems, key: str) -> _Section:
        return cls(problems, key, {})

    def key_of(self, name: str) -> str:
        return _key(self.key, name)

    def error(self, name: str, problem: str, fix: str = "") -> None:
        self.problems.error(self.key_of(name), problem, fix)

    def has(self, name: str) -> bool:
        return name in self.data

    def given(self, name: str) -> bool:
        """Present with a usable (substituted) value."""
        return name in self.data and self.data[name] is not _UNRESOLVED

    def unresolved(self, *names: str) -> bool:
        return any(self.data.get(name) is _UNRESOLVED for name in names)

    def raw(self, name: str) -> Any:
        return self.data.get(name)

    def table(
        self, name: str, allowed: Sequence[str] | None, what: str, accepted_too: Sequence[str] = ()
    ) -> _Section:
        """The sub-table ``name``; an empty section when absent or invalid (defaults apply)."""
        if name not in self.data:
            return _Section.empty(self.problems, self.key_of(name))
        section = _Section.of(
            self.problems, self.data[name], self.key_of(name), what, allowed, accepted_too
        )
        return section or _Section.empty(self.problems, self.key_of(name))

    def string(
        self, name: str, default: str | None = None, *, secret: bool = False, fix: str = ""
    ) -> str | None:
        if not self.given(name):
            return default
        value = self.data[name]
        if not isinstance(value, str):
            self.error(name, f"expected a string, got {_show(value, secret=secret)}.", fix)
            return default
        if not value:
            self.error(name, "is empty.", fix or "Give a value, or remove the key.")
            return default
        return value

    def boolean(self, name: str, default: bool) -> bool:
        if not self.given(name):
            return default
        value = self.data[name]
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        self.error(name, f"expected true or false, got {_show(value)}.", "")
        return default

    def number(
        self,
        name: str,
        default: float,
        *,
        above: float | None = None,
        at_least: float | None = None,
        at_most: float | None = None,
    ) -> float:
        if not self.given(name):
            return default
        value = self.data[name]
        number = _as_number(value)
        rule = _range_rule(above, at_least, at_most)
        if number is None or not math.isfinite(number):
            self.error(
                name,
                f"expected a number, got {_show(value)}.",
                f"Use a number{' ' + rule if rule else ''} (default {default:g}).",
            )
            return default
        if _out_of_range(number, above, at_least, at_most):
            self.error(name, f"{number:g} is out of range.", f"Use a number {rule}.")
            return default
        return float(number)

    def integer(self, name: str, default: int, *, at_least: int, at_most: int) -> int:
        if not self.given(name):
            return default
        value = self.data[name]
        number = _as_number(value)
        rule = _range_rule(None, at_least, at_most)
        if not isinstance(number, int):
            self.error(
                name,
                f"expected a whole number, got {_show(value)}.",
                f"Use a whole number {rule}.",
            )
            return default
        if _out_of_range(number, None, at_least, at_most):
            self.error(name, f"{number} is out of range.", f"Use a whole number {rule}.")
            return default
        return number

    def choice(self, name: str, choices: Sequence[str], default: str, noun: str) -> str:
        if not self.given(name):
            return default
        value = self.data[name]
        if value not in choices:
            self.error(
                name,
                f"{_show(value)} is not {noun}.",
                (_suggest(value, choices) if isinstance(value, str) else "")
                + f"Use one of: {', '.join(choices)}.",
            )
            return default
        return str(value)

    def strings(
        self,
        name: str,
        default: tuple[str, ...] | None,
        *,
        item: str = "string",
        allow_empty: bool = False,
    ) -> tuple[str, ...] | None:
        """A list of strings (non-empty unless ``allow_empty``); unresolved items are dropped."""
        if not self.given(name):
            return default
        value = self.data[name]
        if not isinstance(value, list):
            example = f"[{json.dumps(value)}]" if isinstance(value, str) else '["..."]'
            self.error(
                name,
                f"expected a list of {item}s, got {_show(value)}.",
                f"Write it as a list: {example}.",
            )
            return default
        out = []
        for index, entry in enumerate(value):
            where = f"{self.key_of(name)}[{index}]"
            if entry is _UNRESOLVED:
                continue
            if not isinstance(entry, str):
                self.problems.error(
                    where,
                    f"expected a {item}, got {_show(entry)}.",
                    f"Write it as a string: {json.dumps(str(entry))}."
                    if isinstance(entry, int | float) and not isinstance(entry, bool)
                    else "",
                )
            elif not entry and not allow_empty:
                self.problems.error(where, f"is an empty {item}.", "Remove it.")
            else:
                out.append(entry)
        return tuple(out)

    def string_map(self, name: str) -> dict[str, str]:
        """A table of string values with non-empty keys (an ``env``)."""
        if not self.given(name):
            return {}
        value = self.data[name]
        if not isinstance(value, Mapping):
            self.error(name, f"expected a table of strings, got {_show(value)}.", "")
            return {}
        out = {}
        for entry_name, entry in value.items():
            where = _key(self.key_of(name), entry_name)
            if not entry_name or "=" in entry_name or "\0" in entry_name:
                self.problems.error(
                    where,
                    f"{json.dumps(entry_name)} is not an environment variable name.",
                    'Use a non-empty name without "=".',
                )
            elif entry is _UNRESOLVED:
                continue
            elif not isinstance(entry, str):
                # The value may be a secret: say what it is, never what it holds.
                self.problems.error(
                    where,
                    f"expected a string, got {_show(entry, secret=True)}.",
                    "Quote the value: environment values are strings.",
                )
            else:
                out[entry_name] = entry
        return out


def _range_rule(above: float | None, at_least: float | None, at_most: float | None) -> str:
    """The allowed range in words: "greater than 0", "from 0 to 1", ..."""
    if at_least is not None and at_most is not None:
        return f"from {at_least:g} to {at_most:g}"
    rules = []
    if above is not None:
        rules.append(f"greater than {above:g}")
    if at_least is not None:
        rules.append(f"at least {at_least:g}")
    if at_most is not None:
        rules.append(f"at most {at_most:g}")
    return " and ".join(rules)


def _out_of_range(
    number: float, above: float | None, at_least: float | None, at_most: float | None
) -> bool:
    return (
        (above is not None and not number > above)
        or (at_least is not None and number < at_least)
        or (at_most is not None and number > at_most)
    )


# --- sections --------------------------------------------------------------------------------


def _parse_journal(section: _Section, base_dir: Path, env: Mapping[str, str]) -> JournalConfig:
    path = section.string("path")
    retention = section.number("retention", 24 * 3600.0, above=0)
    if path is None:
        return JournalConfig(path=_state_dir(env) / "journal.sqlite3", retention=retention)
    return JournalConfig(path=_resolve_path(path, base_dir, env), retention=retention)


def _parse_host(
    section: _Section, base_dir: Path, env: Mapping[str, str], journal: JournalConfig
) -> HostConfig:
    websocket: WebSocketListenConfig | None = WebSocketListenConfig()
    raw_ws = section.raw("websocket")
    if raw_ws is False:
        websocket = None
    elif isinstance(raw_ws, Mapping):
        ws = section.table("websocket", _HOST_WEBSOCKET_KEYS, "host.websocket")
        ws_enabled = ws.boolean("enabled", True)
        path = ws.string("path", "/") or "/"
        if not path.startswith("/"):
            ws.error("path", f"{_show(path)} does not start with /.", f'Write "/{path}".')
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
            f"expected a table or false, got {_show(raw_ws)}.",
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
            unix_socket = _resolve_path(text, base_dir, env)
    length = 0 if unix_socket is None else len(os.fsencode(unix_socket))
    if length > _UNIX_SOCKET_MAX_BYTES:
        section.error(
            "unixSocket",
            f"{_show(str(unix_socket))} is {length} bytes long; a Unix socket path may have at "
            f"most {_UNIX_SOCKET_MAX_BYTES}.",
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
        token_file: Path | None = _resolve_path(token_file_text, base_dir, env)
    elif token is None:
        token_file = journal.path.parent / "host-token"
    else:
        token_file = None
    allow_non_loopback = section.boolean("allowNonLoopback", False)
    stall_timeout = section.number("stallTimeout", 30.0, above=0)

    if websocket is not None and not websocket.loopback:
        bind_key = _key(section.key_of("websocket"), "bind")
        if not allow_non_loopback:
            section.problems.error(
                bind_key,
                f"{_show(websocket.bind)} is not a loopback address, and "
                "host.allowNonLoopback is false.",
                'Bind "127.0.0.1" (or "::1"), or set host.allowNonLoopback = true and give '
                "host.token or host.tokenFile.",
            )
        elif not (section.given("token") or section.given("tokenFile")):
            section.problems.error(
                bind_key,
                f"{_show(websocket.bind)} is not a loopback address, and no token is configured.",
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
    )


def _parse_logging(section: _Section) -> LoggingConfig:
    return LoggingConfig(
        level=section.choice("level", LOG_LEVELS, "info", "a log level"),
        format=section.choice("format", LOG_FORMATS, "auto", "a log format"),
    )


def _parse_health(section: _Section) -> HealthConfig:
    return HealthConfig(
        bind=section.string("bind", "127.0.0.1") or "127.0.0.1",
        port=section.integer("port", 0, at_least=0, at_most=65535),
        switch=section.boolean("enabled", False) if section.given("enabled") else None,
    )


def _parse_servers(
    section: _Section, base_dir: Path, env: Mapping[str, str], *, token_in: str
) -> dict[str, ServerConfig]:
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
        server = _Section.of(
            section.problems,
            value,
            key,
            "server",
            _SERVER_KEYS,
            _SERVER_COMPAT_KEYS + _SERVER_IGNORED_HOST_KEYS,
        )
        if server is None:
            continue
        parsed = _parse_server(server_id, server, base_dir, env, token_in=token_in)
        if parsed is not None:
            servers[server_id] = parsed
    return servers


def _parse_server(
    server_id: str, s: _Section, base_dir: Path, env: Mapping[str, str], *, token_in: str
) -> ServerConfig | None:
    for name in _SERVER_IGNORED_HOST_KEYS:
        if s.has(name):
            s.problems.warn(s.key_of(name), f'"{name}" is a host setting this daemon ignores.')
    disabled = s.boolean("disabled", False)
    if disabled and not any(s.has(name) for name in ("transport", "command", "url", "host", "port")):
        # connectome-host's tombstone: an entry that only switches a server off (an agent
        # unloaded it). Nothing to start, nothing to check beyond the policy keys.
        transport_and_endpoint: tuple[str, dict[str, Any]] | None = (TOMBSTONE, {})
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
    config_fields = {
        "enabled_capabilities": enabled_capabilities,
        "disabled_capabilities": disabled_capabilities,
        "enabled_feature_sets": enabled_feature_sets,
        "disabled_feature_sets": disabled_feature_sets,
        "channel_patterns": s.strings("channelPatterns", (), item="channel pattern") or (),
        "legacy": s.choice("legacy", LEGACY_MODES, "auto", "a legacy mode"),
        "request_timeout": request_timeout,
        "reconnect": _parse_reconnect(s),
        # Hosts read an empty enabledTools as "every tool"; keep that meaning for their files.
        # Offering none is disabledTools = ["*"].
        "enabled_tools": enabled_tools or None,
        "disabled_tools": s.strings("disabledTools", (), item="tool pattern") or (),
        "tool_prefix": s.string("toolPrefix", f"mcpl--{server_id}--") or "",
        "disabled": disabled,
        "required": s.boolean("required", False),
    }
    if transport_and_endpoint is None:
        return None
    transport, endpoint = transport_and_endpoint
    return ServerConfig(id=server_id, transport=transport, **endpoint, **config_fields)


def _parse_transport(
    s: _Section, base_dir: Path, env: Mapping[str, str], *, token_in: str
) -> tuple[str, dict[str, Any]] | None:
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
                    f"{_show(s.raw('url'))} is not a URL this daemon can dial.",
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
        **{name: ("stdio",) for name in _STDIO_KEYS},
        **{name: ("tcp",) for name in _TCP_KEYS},
        **{name: ("websocket",) for name in _WEBSOCKET_KEYS},
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


def _scheme(url: Any) -> str | None:
    if not isinstance(url, str) or "://" not in url:
        return None
    return url.split("://", 1)[0].lower()


def _stdio_endpoint(
    s: _Section, base_dir: Path, env: Mapping[str, str], reason: str
) -> dict[str, Any] | None:
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
        command = str(_resolve_path(command, base_dir, env))
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
        "env": s.string_map("env"),
        # No default: the child starts where the daemon runs, as `python -m pkg` commands
        # (the demo's, the tests') need when the package is importable from there.
        "cwd": None if cwd_text is None else _resolve_path(cwd_text, base_dir, env),
        "env_allowlist": allowlist if allowlist is not None else DEFAULT_ENV_ALLOWLIST,
        "inherit_env": s.boolean("inheritEnv", False),
    }


def _relative_arg(arg: str, base_dir: Path) -> str:
    if arg.startswith(("./", "../")):
        return os.path.normpath(base_dir / arg)
    return arg


def _tcp_endpoint(s: _Section) -> dict[str, Any] | None:
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
        return {"host": host, "port": port, "url": s.raw("url")}
    host = s.string("host", fix='Give the address to dial, e.g. host = "127.0.0.1".')
    port = s.integer("port", 0, at_least=1, at_most=65535)
    for name in ("host", "port"):
        if not s.has(name):
            s.error(
                name,
                "is missing: a tcp server needs host and port.",
                f'Add {name}, or give url = "tcp://host:port".',
            )
    if host is None or not port:
        return None
    return {"host": host, "port": port}


def _websocket_endpoint(s: _Section, token_in_default: str) -> dict[str, Any] | None:
    token = s.string("token", secret=True)
    header = s.string("tokenHeader", "Authorization") or "Authorization"
    if not _HEADER_NAME.fullmatch(header):
        s.error(
            "tokenHeader",
            f"{_show(header)} is not an HTTP header name.",
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
    return {"url": s.raw("url"), "token": token, "token_header": header, "token_in": token_in}


_URL_EXAMPLES: Final = {
    "tcp": "tcp://127.0.0.1:7400",
    "ws": "ws://127.0.0.1:8080/mcpl",
    "wss": "wss://example.org/mcpl",
}


def _split_url(
    s: _Section, schemes: tuple[str, ...], *, need_port: bool
) -> tuple[str, int] | None:
    """Check ``url`` against ``schemes``; return its host and port (0 when it has none)."""
    url = s.string("url")
    if url is None:
        return None
    fix = "Write it like " + " or ".join(_URL_EXAMPLES[scheme] for scheme in schemes) + "."
    parts = urlsplit(url)
    if parts.scheme.lower() not in schemes:
        wanted = " or ".join(f"{scheme}://" for scheme in schemes)
        s.error("url", f"{_show(url)} is not a {wanted} URL.", fix)
        return None
    try:
        port = parts.port
    except ValueError:
        s.error("url", f"{_show(url)} has a port that is not a number from 1 to 65535.", fix)
        return None
    if not parts.hostname:
        s.error("url", f"{_show(url)} names no host.", fix)
        return None
    if need_port and port is None:
        s.error("url", f"{_show(url)} names no port.", fix)
        return None
    if need_port and parts.path not in ("", "/"):
        s.error("url", f"{_show(url)} has a path; a TCP endpoint is only host and port.", fix)
        return None
    return parts.hostname, port or 0


def _grant_patterns(s: _Section, name: str, item: str) -> tuple[str, ...] | None:
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
                f"{_show(pattern)} is not a dotted {item}.",
                "Join non-empty segments of letters, digits, _ : - or * with dots, e.g. "
                '"channels.publish".',
            )
        elif any("*" in segment and segment != "*" for segment in segments):
            s.problems.error(
                where,
                f'{_show(pattern)}: "*" stands for exactly one whole segment.',
                'Write "*" as a segment of its own (e.g. "channels.*"), or list the names.',
            )
    return patterns


def _check_allow_deny(
    s: _Section,
    allow: tuple[str, tuple[str, ...] | None],
    deny: tuple[str, tuple[str, ...]],
) -> None:
    (allow_name, allowed), (deny_name, denied) = allow, deny
    for pattern in dict.fromkeys(allowed or ()):
        if pattern in denied:
            s.error(
                allow_name,
                f"{_show(pattern)} is in both {allow_name} and {deny_name} "
                f"({s.key_of(deny_name)}): allow+deny of one path is malformed, and the "
                "server's grant would fail closed.",
                "Remove it from one of the two lists.",
            )


def _seconds_or_ms(s: _Section, name: str, ms_name: str, default: float) -> float:
    """A duration in seconds, or in milliseconds under the host-compatible ``*Ms`` name."""
    if s.has(name) and s.has(ms_name):
        s.error(ms_name, f'"{name}" and "{ms_name}" are both given.', f'Keep "{name}" (seconds).')
    if s.given(ms_name) and not s.has(name):
        return s.number(ms_name, default * 1000, above=0) / 1000
    return s.number(name, default, above=0)


def _parse_reconnect(s: _Section) -> ReconnectPolicy:
    raw = s.raw("reconnect")
    retry = True
    table = _Section.empty(s.problems, s.key_of("reconnect"))
    if isinstance(raw, bool):
        # connectome-host writes reconnect = true/false; the table form tunes the backoff.
        retry = raw
    elif isinstance(raw, Mapping):
        table = s.table("reconnect", _RECONNECT_KEYS, "reconnect")
    elif s.given("reconnect"):
        s.error(
            "reconnect",
            f"expected a table or true/false, got {_show(raw)}.",
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


_HOME_CHANNEL_FIX: Final = 'Write homeChannel = { serverId = "...", channelId = "..." }.'


def _parse_agents(section: _Section, server_ids: Sequence[str]) -> dict[str, AgentConfig]:
    agents: dict[str, AgentConfig] = {}
    for name, value in section.data.items():
        key = section.key_of(name)
        if not name or any(char.isspace() for char in name):
            section.problems.error(
                key,
                f"{json.dumps(name)} is not an agent name: a name is a non-empty string "
                "without whitespace.",
                "Rename it.",
            )
        a = _Section.of(section.problems, value, key, "agent", _AGENT_KEYS)
        if a is None:
            continue
        wake_servers = a.strings("wakeServers", (), item="server id") or ()
        for index, server_id in enumerate(wake_servers):
            _check_server_known(a, "wakeServers", server_id, server_ids, index=index)
        wake_tags = a.strings("wakeTags", (), item="tag") or ()
        for index, tag in enumerate(wake_tags):
            if ":" not in tag:
                a.problems.error(
                    f"{a.key_of('wakeTags')}[{index}]",
                    f"{_show(tag)} is not a namespace:value tag.",
                    'Write e.g. "chat:addressed" or "chat:*".',
                )
        agents[name] = AgentConfig(
            name=name,
            prose_routing=a.choice(
                "proseRouting", PROSE_ROUTING_MODES, "locus", "a prose routing mode"
            ),
            allowed_tools=a.strings("allowedTools", None, item="tool pattern"),
            home_channel=_home_channel(a, server_ids),
            wake_channels=a.strings("wakeChannels", (), item="channel name") or (),
            wake_servers=wake_servers,
            wake_tags=wake_tags,
            subconscious_for=a.string("subconsciousFor"),
        )
    return agents


def _home_channel(a: _Section, server_ids: Sequence[str]) -> ChannelRef | None:
    if not isinstance(a.raw("homeChannel"), Mapping):
        if a.given("homeChannel"):
            raw = a.raw("homeChannel")
            a.error("homeChannel", f"expected a table, got {_show(raw)}.", _HOME_CHANNEL_FIX)
        return None
    ref = a.table("homeChannel", _CHANNEL_REF_KEYS, "homeChannel")
    server_id = ref.string("serverId")
    channel_id = ref.string("channelId")
    for field in _CHANNEL_REF_KEYS:
        if not ref.has(field):
            problem = "is missing: a home channel is a serverId and a channelId."
            ref.error(field, problem, _HOME_CHANNEL_FIX)
    if server_id is not None:
        _check_server_known(ref, "serverId", server_id, server_ids)
    if server_id is None or channel_id is None:
        return None
    return ChannelRef(server_id, channel_id)


def _check_server_known(
    section: _Section,
    name: str,
    server_id: str,
    server_ids: Sequence[str],
    *,
    index: int | None = None,
) -> None:
    if server_id in server_ids:
        return
    where = section.key_of(name) + ("" if index is None else f"[{index}]")
    known = ", ".join(server_ids) or "none yet"
    section.problems.error(
        where,
        f"{json.dumps(server_id)} is not a server in mcplServers.",
        _suggest(server_id, server_ids) + f"Configured servers: {known}.",
    )


# --- operations: finding the daemon, and checks beyond the file ---------------------------------
#
# The query commands (status, channels, explain, health, reload) read only what locates the
# daemon, so they work in a shell that has none of the daemon's secrets. check-config also
# checks what the file can't say by itself: programs on PATH, directories, token files.

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


def locate_daemon(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> DaemonLocation:
    """Read ``host``, ``journal`` and ``health`` of the config at ``path``, and nothing else.

    ``${VAR}``s elsewhere (a server's token, an ``env`` table) are never substituted, so their
    variables need not be set; ``host.token`` is not read either (the Unix socket needs none).

    Raises:
        ConfigError: the file can't be read, or those sections are invalid.
    """
    data, source, base_dir = _read_config_file(path)
    if not isinstance(data, Mapping):
        raise ConfigError(source, "", f"holds {_show(data)}, not a table of settings.")
    wanted: dict[str, Any] = {name: data[name] for name in _LOCATOR_SECTIONS if name in data}
    host = wanted.get("host")
    if isinstance(host, Mapping) and "token" in host:
        wanted["host"] = {**host, "token": "not-read-by-the-cli"}
    config = parse_config(wanted, source=source, base_dir=base_dir, environ=environ)
    health = config.health
    url = None
    if health.enabled and health.port:
        bind = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(health.bind, health.bind)
        url = f"http://{_host_port(bind, health.port)}"
    return DaemonLocation(source=source, unix_socket=config.host.unix_socket, health_url=url, token_file=config.host.token_file)


def runtime_problems(
    config: RouterConfig, *, environ: Mapping[str, str] | None = None
) -> list[ConfigError]:
    """What would fail at run time though the file is valid: a stdio ``command`` not found,
    a ``cwd`` that isn't a directory, a host token file that can't be read or is too open.

    Disabled servers are skipped (their programs need not exist here).
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    source = config.source
    problems: list[ConfigError] = []
    for server in config.enabled_servers():
        if server.transport != "stdio" or server.command is None:
            continue
        prefix = _key("mcplServers", server.id)
        if server.cwd is not None and not server.cwd.is_dir():
            what = "is not a directory" if server.cwd.exists() else "does not exist"
            problems.append(
                ConfigError(
                    source,
                    _key(prefix, "cwd"),
                    f"{_show(str(server.cwd))} {what}, so the server can't be started there.",
                    "Create it, or fix the path (relative paths are read against the config's directory).",
                )
            )
        problem = _command_problem(server, env)
        if problem is not None:
            problems.append(ConfigError(source, _key(prefix, "command"), *problem))
    token_file = config.host.token_file
    if config.host.websocket is not None and config.host.token is None and token_file is not None:
        problem = _token_file_problem(token_file)
        if problem is not None:
            problems.append(ConfigError(source, "host.tokenFile", *problem))
    return problems


def _command_problem(server: ServerConfig, env: Mapping[str, str]) -> tuple[str, str] | None:
    command = server.command or ""
    if "/" in command:
        found = Path(command)
        if not found.exists():
            return f"{_show(command)} does not exist.", "Fix the path, or install the server there."
        if found.is_dir() or not os.access(found, os.X_OK):
            return f"{_show(command)} is not an executable file.", f"Run: chmod +x {shlex.quote(command)}"
        return None
    # The child is started with its own environment; its PATH is the one searched.
    search = server.spawn_env(env).get("PATH", os.defpath)
    if shutil.which(command, path=search) is not None:
        return None
    return (
        f"{_show(command)} is not on the PATH the server gets ({search or 'empty'}).",
        "Install it, give its full path, or add its directory to PATH.",
    )


def _token_file_problem(path: Path) -> tuple[str, str] | None:
    if not path.exists():
        return None  # the daemon creates it (mode 0600) at start
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        with path.open("rb"):
            pass
    except OSError as exc:
        return f"{_show(str(path))} can't be read: {exc.strerror}.", "Give the daemon's user read access (chmod 600)."
    if mode & 0o077:
        return (
            f"{_show(str(path))} is mode {mode:o}; others could read the host token.",
            f"Run: chmod 600 {shlex.quote(str(path))}",
        )
    return None
