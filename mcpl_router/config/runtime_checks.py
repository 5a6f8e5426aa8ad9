"""What a valid file can't say by itself, checked on this machine for ``check-config``.

A stdio ``command`` must be found on the PATH the server will get, a ``cwd`` must be a
directory, and the host token file must be readable and closed to others. The daemon would fail
on these only when it starts the server or the listener; ``check-config`` says so beforehand.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path

from mcpl_router.config.errors import ConfigError, dotted_key, show_value
from mcpl_router.config.model import RouterConfig, ServerConfig


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
        prefix = dotted_key("mcplServers", server.id)
        if server.cwd is not None and not server.cwd.is_dir():
            what = "is not a directory" if server.cwd.exists() else "does not exist"
            problems.append(
                ConfigError(
                    source,
                    dotted_key(prefix, "cwd"),
                    f"{show_value(str(server.cwd))} {what}, so the server can't be started there.",
                    "Create it, or fix the path (relative paths are read against the config's directory).",
                )
            )
        problem = _command_problem(server, env)
        if problem is not None:
            problems.append(ConfigError(source, dotted_key(prefix, "command"), *problem))
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
            return f"{show_value(command)} does not exist.", "Fix the path, or install the server there."
        if found.is_dir() or not os.access(found, os.X_OK):
            return f"{show_value(command)} is not an executable file.", f"Run: chmod +x {shlex.quote(command)}"
        return None
    # The child is started with its own environment; its PATH is the one searched.
    search = server.spawn_env(env).get("PATH", os.defpath)
    if shutil.which(command, path=search) is not None:
        return None
    return (
        f"{show_value(command)} is not on the PATH the server gets ({search or 'empty'}).",
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
        return f"{show_value(str(path))} can't be read: {exc.strerror}.", "Give the daemon's user read access (chmod 600)."
    if mode & 0o077:
        return (
            f"{show_value(str(path))} is mode {mode:o}; others could read the host token.",
            f"Run: chmod 600 {shlex.quote(str(path))}",
        )
    return None
