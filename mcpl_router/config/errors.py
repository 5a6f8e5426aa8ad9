"""What an operator reads when a config can't be used: file, dotted key, problem and fix.

Validation is one pass that records every problem rather than stopping at the first
(:class:`Problems`), so a file is fixed in one round, and :class:`ConfigError` carries them all,
one line each, in the file's order. The helpers here word those lines alike in every section:
:func:`dotted_key` names the key, :func:`show_value` quotes the offending value (only the type
of a secret) and :func:`did_you_mean` offers the closest valid spelling.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Sequence

import attrs

_PLAIN_KEY_SEGMENT = re.compile(r"[^.\s\"\[\]]+")


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


@attrs.define
class Problems:
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


def dotted_key(prefix: str, name: str) -> str:
    """``prefix.name``, quoting a name that would make the dotted path ambiguous."""
    segment = name if _PLAIN_KEY_SEGMENT.fullmatch(name) else json.dumps(name, ensure_ascii=False)
    return f"{prefix}.{segment}" if prefix else segment


def show_value(value: object, *, secret: bool = False) -> str:
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


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
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
