"""From a config file (or already-parsed data) to a :class:`RouterConfig`, and ``check-config``.

:func:`parse_config` is the one pass over a config: substitute every ``${VAR}``, read each
section with its reader, then raise one :class:`ConfigError` holding every problem found, in the
file's order. :func:`check_config` adds the checks only the running machine can answer (:mod:`.preflight`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from mcpl_router.config.errors import ConfigError, Problems, show_value
from mcpl_router.config.file_parsing import read_config_file
from mcpl_router.config.model import (
    CLUSTER_KEYS,
    HEALTH_KEYS,
    HOST_KEYS,
    JOURNAL_KEYS,
    LOGGING_KEYS,
    TOP_KEYS,
    RouterConfig,
)
from mcpl_router.config.read_agents import parse_agents
from mcpl_router.config.read_daemon_sections import (
    parse_cluster,
    parse_health,
    parse_host,
    parse_journal,
    parse_logging,
)
from mcpl_router.config.read_servers import parse_servers
from mcpl_router.config.preflight import preflight
from mcpl_router.config.section_reader import Section
from mcpl_router.config.substitution import substitute_config


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
    data, source, base_dir = read_config_file(path)
    return parse_config(data, source=source, base_dir=base_dir, environ=environ)


def parse_config(
    data: object,
    *,
    source: str,
    base_dir: Path,
    environ: Mapping[str, str] | None = None,
) -> RouterConfig:
    """Validate an already-parsed config (e.g. the embedded demo config).

    Args:
        data: the config as TOML or JSON would parse it (anything but a table is refused).
        source: what error messages call the config (a path, or e.g. ``"<demo>"``).
        base_dir: the directory relative paths are read against.
        environ: as for :func:`load_config`.

    Raises:
        ConfigError: with every problem found.
    """
    env: Mapping[str, str] = os.environ if environ is None else environ
    base_dir = Path(base_dir).absolute()
    problems = Problems(source)
    if not isinstance(data, Mapping):
        raise ConfigError(source, "", f"holds {show_value(data)}, not a table of settings.")
    substituted = substitute_config(data, env, problems)
    root = Section.of(problems, substituted, "", "top-level", TOP_KEYS)
    assert root is not None  # a mapping, checked above
    servers_section = root.table("mcplServers", None, "mcplServers")
    servers = parse_servers(servers_section, base_dir, env, token_in=token_in_default(data, source))
    journal = parse_journal(root.table("journal", JOURNAL_KEYS, "journal"), base_dir, env)
    host = parse_host(root.table("host", HOST_KEYS, "host"), base_dir, env, journal)
    logging_config = parse_logging(root.table("logging", LOGGING_KEYS, "logging"))
    health = parse_health(root.table("health", HEALTH_KEYS, "health"))
    # Absent: one daemon, as ever. Given (even empty): a node, whose name is needed.
    cluster = parse_cluster(root.table("cluster", CLUSTER_KEYS, "cluster"), journal, tuple(servers_section.data)) if root.given("cluster") else None
    # Agents are checked against every configured id, including servers whose own entry has a
    # problem: that problem is reported once, not again as "no such server" here.
    agents = parse_agents(root.table("agents", None, "agents"), tuple(servers_section.data))
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
        cluster=cluster,
    )


def token_in_default(data: Mapping[str, object], source: str) -> str:
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
    # What run would refuse, and what would fail a server once started: the same checks run makes.
    problems = preflight(config, environ=environ).everything
    if problems:
        return False, str(ConfigError.collect(problems))
    return True, config.summary()
