"""Network addresses as the config judges and shows them.

Whether a bind address reaches only this machine decides whether a listener needs a token.
Addresses shown to operators (status, ``check-config``, reprs) put an IPv6 host in brackets and
mask whatever in a URL may be a credential.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Final
from urllib.parse import urlsplit, urlunsplit


def is_loopback(bind: str) -> bool:
    """Whether ``bind`` reaches only this machine."""
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        # A host name other than localhost may resolve anywhere.
        return False


def host_port(host: str, port: int) -> str:
    """``host:port``, an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def without_password(url: str) -> str:
    """The URL fit to show: userinfo and query (either may carry a credential) masked."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    query = "***" if parts.query else ""
    return urlunsplit(parts._replace(netloc=netloc, query=query, fragment=""))


_DSN_FIELD: Final = re.compile(r"""(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S*)""")


def dsn_without_password(dsn: str) -> str:
    """A PostgreSQL connection string fit to show: its password left out, in either form
    (``key=value …``, or a ``postgresql://`` URI with the password in its userinfo or query)."""
    if dsn.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(dsn)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hosts = netloc.rpartition("@")
            netloc = f"{userinfo.partition(':')[0]}@{hosts}"
        query = "&".join(item for item in parts.query.split("&") if item and not item.lower().startswith("password="))
        return urlunsplit(parts._replace(netloc=netloc, query=query, fragment=""))
    fields = [match for match in _DSN_FIELD.finditer(dsn) if match.group(1).lower() != "password"]
    return " ".join(f"{match.group(1)}={match.group(2)}" for match in fields)
