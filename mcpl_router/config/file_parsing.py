"""From a config file's path to its parsed, not yet validated, data: TOML or JSON by suffix.

A file that can't be read or parsed is one :class:`ConfigError` about the whole file. JSON keeps
the last of a key given twice without a word, so JSON objects are read as :class:`JsonObject`,
which remembers such keys; substitution reports them with their dotted key.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

from mcpl_router.config.errors import ConfigError


def read_config_file(path: str | os.PathLike[str]) -> tuple[object, str, Path]:
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
    data: object
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


class JsonObject(dict[str, object]):
    """A JSON object that remembers which keys it saw twice (JSON keeps the last one silently)."""

    duplicates: tuple[str, ...] = ()


def _json_object(pairs: list[tuple[str, object]]) -> JsonObject:
    obj = JsonObject()
    duplicates = []
    for name, value in pairs:
        if name in obj:
            duplicates.append(name)
        obj[name] = value
    obj.duplicates = tuple(duplicates)
    return obj
