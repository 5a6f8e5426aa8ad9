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

This package's face is the names below; its modules, one concept each:

- ``model``: the shape of a config, :class:`RouterConfig` and each section's class, with the
  keys each section accepts on disk;
- ``errors``: :class:`ConfigError` and the wording of every problem (key, value, "did you mean");
- ``file_parsing``, ``substitution``, ``section_reader``: reading a file, substituting
  ``${VAR}``, and the typed getters every section reader uses;
- ``read_servers``, ``read_daemon_sections``, ``read_agents``: one reader per section;
- ``loading``: :func:`load_config`, :func:`parse_config` and :func:`check_config`;
- ``locate``, ``preflight``: finding a running daemon, and what ``run`` checks before it starts;
- ``addresses``, ``paths``: how addresses are judged and shown, and where paths point.
"""

from __future__ import annotations

from mcpl_router.config.errors import ConfigError
from mcpl_router.config.loading import check_config, load_config, parse_config
from mcpl_router.config.locate import DaemonLocation, locate_daemon
from mcpl_router.config.model import (
    DEFAULT_ENV_ALLOWLIST,
    AgentConfig,
    HealthConfig,
    HostConfig,
    JournalConfig,
    LoggingConfig,
    ReconnectPolicy,
    RouterConfig,
    ServerConfig,
    WebSocketListenConfig,
)
from mcpl_router.config.paths import default_unix_socket_path
from mcpl_router.config.preflight import Preflight, preflight, runtime_problems

__all__ = [
    "DEFAULT_ENV_ALLOWLIST",
    "AgentConfig",
    "ConfigError",
    "DaemonLocation",
    "HealthConfig",
    "HostConfig",
    "Preflight",
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
    "preflight",
    "runtime_problems",
]
