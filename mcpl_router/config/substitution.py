"""``${VAR}`` and ``${VAR:-default}`` in every string value; ``$${`` is a literal ``${``.

Substitution is the first pass over a config, before any section is read, so it is also the walk
that records where each key sits in the file (problems found later are reported in the file's
order) and reports keys a JSON file gives twice. A value whose variable can't be substituted is
replaced by :data:`UNRESOLVED`: its problem is recorded once here, and the readers treat it as no
value. In a disabled server, a variable that is not set is only a warning.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from typing import Final

from mcpl_router.config.errors import Problems, dotted_key, show_value
from mcpl_router.config.file_parsing import JsonObject

_REFERENCE = re.compile(r"\$\$\{|\$\{")
_REFERENCE_BODY = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?", re.DOTALL)


class Unresolved(enum.Enum):
    """A string whose ``${VAR}`` could not be substituted: its problem is already recorded.

    Readers treat it as "no value" so one missing variable doesn't cascade into more errors.
    """

    VALUE = "unresolved"


UNRESOLVED: Final = Unresolved.VALUE


def substitute_config(
    data: Mapping[str, object], env: Mapping[str, str], problems: Problems
) -> dict[str, object]:
    """``data`` with every string substituted, each key recorded in ``problems`` in file order."""
    _check_duplicates(data, "", problems)
    out: dict[str, object] = {}
    for name, value in data.items():
        problems.saw(name)
        if name == "mcplServers" and isinstance(value, Mapping):
            _check_duplicates(value, name, problems)
            servers: dict[str, object] = {}
            for server_id, entry in value.items():
                problems.saw(dotted_key(name, server_id))
                # A disabled server's secrets may well be absent from this environment: a
                # missing variable there is a warning, not a reason to refuse the whole config.
                lenient = isinstance(entry, Mapping) and entry.get("disabled") is True
                servers[server_id] = _substitute_tree(
                    entry, dotted_key(name, server_id), env, problems, lenient=lenient
                )
            problems.done(name)
            out[name] = servers
        else:
            out[name] = _substitute_tree(value, dotted_key("", name), env, problems, lenient=False)
    return out


def _check_duplicates(value: object, key: str, problems: Problems) -> None:
    """Report the keys a JSON object gave twice (TOML refuses them when parsing)."""
    if not isinstance(value, JsonObject):
        return
    for name in value.duplicates:
        problems.error(
            dotted_key(key, name),
            f'"{name}" is given more than once; JSON would keep only the last.',
            "Remove all but one.",
        )


def _substitute_tree(
    value: object, key: str, env: Mapping[str, str], problems: Problems, *, lenient: bool
) -> object:
    problems.saw(key)
    if isinstance(value, str):
        return _substitute(value, key, env, problems, lenient=lenient)
    out: object = value
    if isinstance(value, Mapping):
        _check_duplicates(value, key, problems)
        out = {
            name: _substitute_tree(item, dotted_key(key, name), env, problems, lenient=lenient)
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
    text: str, key: str, env: Mapping[str, str], problems: Problems, *, lenient: bool
) -> str | Unresolved:
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
                f"{show_value(text[match.start():])} opens a ${{ without a closing }}.",
                "Close it: ${NAME} or ${NAME:-default}; write $${ for a literal ${.",
            )
            return UNRESOLVED
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
    return "".join(parts) if resolved else UNRESOLVED
