"""Where the config's paths point, and where things go when the config doesn't say.

``~`` is expanded against the given environment's ``HOME`` and a relative path is read against
the config file's directory, so one file means the same thing whatever directory the daemon
starts in. The defaults (the state directory for the journal and the host token, the host Unix
socket) are per user, so two users' daemons on one machine don't meet.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def expand_user(text: str, env: Mapping[str, str]) -> str:
    """``text`` with a leading ``~`` expanded; ``~`` alone and ``~/`` use ``env``'s ``HOME``."""
    if text == "~" or text.startswith("~/"):
        home = env.get("HOME") or str(Path.home())
        return home + text[1:]
    return os.path.expanduser(text)


def resolve_path(text: str, base_dir: Path, env: Mapping[str, str]) -> Path:
    """``text`` as an absolute path: ``~`` expanded, a relative path read against ``base_dir``."""
    path = Path(expand_user(text, env))
    if not path.is_absolute():
        path = base_dir / path
    return Path(os.path.normpath(path))


def state_dir(env: Mapping[str, str]) -> Path:
    """Where the journal and the host token go by default: ``$MCPL_ROUTER_STATE_DIR``, or
    ``~/.local/state/mcpl-router``."""
    configured = env.get("MCPL_ROUTER_STATE_DIR")
    if configured:
        return Path(os.path.normpath(Path(expand_user(configured, env)).absolute()))
    return Path(expand_user("~/.local/state/mcpl-router", env))


def default_unix_socket_path(environ: Mapping[str, str]) -> Path:
    """Where the host Unix socket is when the config doesn't say: a per-user directory.

    ``$XDG_RUNTIME_DIR/mcpl-router-<uid>/host.sock``, or under ``/tmp`` without that variable.
    """
    runtime = environ.get("XDG_RUNTIME_DIR") or "/tmp"
    user = os.getuid() if hasattr(os, "getuid") else environ.get("USERNAME", "user")
    return Path(runtime) / f"mcpl-router-{user}" / "host.sock"
