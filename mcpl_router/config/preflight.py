"""What ``run`` checks before it starts, checked without starting: one list for ``run`` and
``check-config``.

Only what needs no secret and no network is checked here, so ``check-config`` can say it on
any machine the file will run on. Two kinds:

- *refusals*: ``run`` does not start (the host socket's directory others could reach, a path
  in the way of the socket, a journal or token directory that can't be made, a token file too
  open to trust). ``check-config`` says them; ``run`` prints them and exits 2 before anything
  listens or dials.
- *problems*: ``run`` starts, and that server fails when it is started (a ``command`` not
  found, a ``cwd`` or a ``./`` argument that does not exist). ``check-config`` says them; ``run``
  logs each once, up front (a program may be installed, a directory mounted, later; the link
  retries).

The listener asks :func:`socket_directory_problem` too, so the check and the refusal are one
text.
"""

from __future__ import annotations

import os
import shlex
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path

import attrs

from mcpl_router.config.errors import ConfigError, dotted_key, show_value
from mcpl_router.config.model import RouterConfig, ServerConfig


@attrs.frozen
class Preflight:
    """What :func:`preflight` found: ``refusals`` stop ``run``; ``problems`` fail a server later."""

    refusals: tuple[ConfigError, ...]
    problems: tuple[ConfigError, ...]

    @property
    def everything(self) -> tuple[ConfigError, ...]:
        return self.refusals + self.problems


def preflight(config: RouterConfig, *, environ: Mapping[str, str] | None = None) -> Preflight:
    """Every check ``run`` makes before it starts that needs no secret and no network."""
    return Preflight(refusals=tuple(start_refusals(config)), problems=tuple(runtime_problems(config, environ=environ)))


def start_refusals(config: RouterConfig) -> list[ConfigError]:
    """What makes ``run`` refuse to start, found without starting."""
    source = config.source
    refusals: list[ConfigError] = []
    if config.host.unix_socket is not None:
        problem = socket_directory_problem(config.host.unix_socket)
        if problem is not None:
            refusals.append(ConfigError(source, "host.unixSocket", *problem))
    problem = _creatable_directory_problem(config.journal.path.parent)
    if problem is not None:
        refusals.append(ConfigError(source, "journal.path", *problem))
    token_file = config.host.token_file
    if config.host.websocket is not None and config.host.token is None and token_file is not None:
        problem = _token_file_problem(token_file)
        if problem is not None:
            refusals.append(ConfigError(source, "host.tokenFile", *problem))
    return refusals


def socket_directory_problem(socket_path: Path) -> tuple[str, str] | None:
    """Why the host socket can't safely live at ``socket_path``, as ``(problem, fix)``; None if
    it can (its directory is ours and closed to others, or can be made so).

    A live socket of another daemon is not a problem here: that is the listener's to find when
    it starts (the daemon being checked may well be the one running).
    """
    directory = socket_path.parent
    if not directory.exists():
        return _creatable_directory_problem(directory)
    if not directory.is_dir():
        return f"{show_value(str(directory))} is not a directory.", "Choose another host.unixSocket path."
    info = directory.stat()
    if info.st_uid != os.getuid():
        return (
            f"its directory {directory} belongs to uid {info.st_uid}, not us ({os.getuid()}).",
            "Choose another host.unixSocket path.",
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        return (
            f"its directory {directory} is mode {mode:o}; others could reach the host socket.",
            f"Run: chmod 700 {shlex.quote(str(directory))}",
        )
    if (socket_path.exists() or socket_path.is_symlink()) and not stat.S_ISSOCK(socket_path.lstat().st_mode):
        return f"{socket_path} exists and is not a socket.", "Remove it, or choose another host.unixSocket path."
    return None


def _creatable_directory_problem(directory: Path) -> tuple[str, str] | None:
    """Why ``directory`` can't be used or made for our files; None if it can."""
    existing = directory
    while not existing.exists():
        if existing.is_symlink():  # dangling: mkdir would fail on it
            return f"{existing} is a broken symbolic link, so {directory} can't be made.", "Fix or remove the link."
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory, so {directory} can't be made there.", "Fix the path."
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is not writable by us" if existing == directory else f"can't be made: {existing} is not writable by us"
        return f"{directory} {what}.", "Fix the directory's permissions, or choose another path."
    return None


def runtime_problems(
    config: RouterConfig, *, environ: Mapping[str, str] | None = None
) -> list[ConfigError]:
    """What makes a server fail when it is started, though the file is valid: a stdio
    ``command`` not found, a ``cwd`` that isn't a directory, a ``./`` argument that isn't there.

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
        problems.extend(_argument_problems(server, source, prefix))
    return problems


def _argument_problems(server: ServerConfig, source: str, prefix: str) -> list[ConfigError]:
    """An argument written ``./x`` or ``../x`` (a path from the config's directory) that isn't
    there: the program would start and fail on it, after the daemon said it started.

    Only those forms are checked: any other word may be a name the program looks up itself, or
    a file it creates.
    """
    problems: list[ConfigError] = []
    for index in server.path_args:
        path = server.args[index]
        if not os.path.exists(path):
            problems.append(
                ConfigError(
                    source,
                    f"{prefix}.args[{index}]",
                    f"{show_value(path)} does not exist (an argument starting ./ or ../ is read against the config's directory).",
                    "Fix the path, or create the file.",
                )
            )
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
        # The daemon creates it (mode 0600) at start, and its directory if need be.
        return _creatable_directory_problem(path.parent)
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
