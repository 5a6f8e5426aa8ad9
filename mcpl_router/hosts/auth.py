"""The host WebSocket's bearer token: where it comes from and how it is checked.

The token is ``host.token`` when configured, else the contents of ``host.tokenFile``, else a new
random token written to that file (mode 0600, its directory 0700) for hosts on this machine to
read. A listener reachable from other machines never starts without a token. A token is never
logged: neither ours nor what a client offered.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path

from mcpl_router.config import HostConfig, WebSocketListenConfig
from mcpl_router.logs import get_logger


class HostAuthError(Exception):
    """The host listener can't be secured as configured; the message says what to fix."""


def resolve_token(host: HostConfig, websocket: WebSocketListenConfig) -> str:
    """The token hosts must present, reading or creating ``host.tokenFile`` as needed.

    Raises:
        HostAuthError: no token source (a non-loopback bind gets its own message), or the token
            file can't be read or created safely.
    """
    if host.token:
        return host.token
    if host.token_file is None:
        if not websocket.loopback:
            raise HostAuthError(
                f"host.websocket.bind {websocket.bind!r} is not a loopback address and no token is "
                "configured: refusing to listen. Give host.token or host.tokenFile, or bind 127.0.0.1."
            )
        raise HostAuthError("the host WebSocket needs a token: give host.token or host.tokenFile.")
    return _token_from_file(host.token_file)


def _token_from_file(path: Path) -> str:
    log = get_logger()
    try:
        text = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        text = ""
    except OSError as exc:
        raise HostAuthError(f"can't read the host token file {path}: {exc.strerror}") from None
    if text:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise HostAuthError(f"the host token file {path} is mode {mode:o}; others could read it. Run: chmod 600 {path}")
        return text
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Created 0600 from the first byte, via a temporary name so a reader never sees it half-written.
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, (token + "\n").encode())
    finally:
        os.close(fd)
    os.replace(temporary, path)
    log.info("host.token.generated", path=str(path))
    return token


def bearer_matches(headers: list[tuple[bytes, bytes]], token: str) -> bool:
    """Whether an ``Authorization: Bearer <token>`` header carries ``token`` (constant time)."""
    expected = f"Bearer {token}".encode()
    ok = False
    for name, value in headers:
        if name.lower() == b"authorization":
            # Compare every such header so the time taken doesn't say which one matched.
            ok = hmac.compare_digest(value.strip(), expected) or ok
    return ok
