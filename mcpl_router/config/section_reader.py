"""Reading one table of a config: typed getters that record a problem and go on, never raise.

Every section's reader gets its values through :class:`Section`, so an unknown key, a wrong
type, an empty string or a number out of range is worded the same way in every section, and one
pass over the file finds every problem in it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence

import attrs

from mcpl_router.config.errors import Problems, did_you_mean, dotted_key, show_value
from mcpl_router.config.substitution import UNRESOLVED


@attrs.define
class Section:
    """One table of the config being read, with getters that record problems, never raise.

    A getter returns its default when the key is absent, unresolved (its ``${VAR}`` problem is
    already recorded) or invalid (recorded here), so the pass goes on and finds the next problem.
    """

    problems: Problems
    key: str
    data: dict[str, object]

    @classmethod
    def of(
        cls,
        problems: Problems,
        value: object,
        key: str,
        what: str,
        allowed: Sequence[str] | None,
        accepted_too: Sequence[str] = (),
    ) -> Section | None:
        """``value`` as a section, after checking it is a table whose keys are all known."""
        if value is UNRESOLVED:
            return None
        if not isinstance(value, Mapping):
            problems.error(key, f"expected a table, got {show_value(value)}.", "")
            return None
        if allowed is not None:
            for name in value:
                if name not in allowed and name not in accepted_too:
                    problems.error(
                        dotted_key(key, name),
                        f'"{name}" is not a {what} key.',
                        did_you_mean(name, allowed) + f"Valid keys: {', '.join(allowed)}.",
                    )
        return cls(problems, key, dict(value))

    @classmethod
    def empty(cls, problems: Problems, key: str) -> Section:
        return cls(problems, key, {})

    def key_of(self, name: str) -> str:
        return dotted_key(self.key, name)

    def error(self, name: str, problem: str, fix: str = "") -> None:
        self.problems.error(self.key_of(name), problem, fix)

    def has(self, name: str) -> bool:
        return name in self.data

    def given(self, name: str) -> bool:
        """Present with a usable (substituted) value."""
        return name in self.data and self.data[name] is not UNRESOLVED

    def unresolved(self, *names: str) -> bool:
        return any(self.data.get(name) is UNRESOLVED for name in names)

    def raw(self, name: str) -> object:
        return self.data.get(name)

    def table(
        self, name: str, allowed: Sequence[str] | None, what: str, accepted_too: Sequence[str] = ()
    ) -> Section:
        """The sub-table ``name``; an empty section when absent or invalid (defaults apply)."""
        if name not in self.data:
            return Section.empty(self.problems, self.key_of(name))
        section = Section.of(
            self.problems, self.data[name], self.key_of(name), what, allowed, accepted_too
        )
        return section or Section.empty(self.problems, self.key_of(name))

    def string(
        self, name: str, default: str | None = None, *, secret: bool = False, fix: str = ""
    ) -> str | None:
        if not self.given(name):
            return default
        value = self.data[name]
        if not isinstance(value, str):
            self.error(name, f"expected a string, got {show_value(value, secret=secret)}.", fix)
            return default
        if not value:
            self.error(name, "is empty.", fix or "Give a value, or remove the key.")
            return default
        return value

    def boolean(self, name: str, default: bool) -> bool:
        if not self.given(name):
            return default
        value = self.data[name]
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        self.error(name, f"expected true or false, got {show_value(value)}.", "")
        return default

    def number(
        self,
        name: str,
        default: float,
        *,
        above: float | None = None,
        at_least: float | None = None,
        at_most: float | None = None,
    ) -> float:
        if not self.given(name):
            return default
        value = self.data[name]
        number = _as_number(value)
        rule = _range_rule(above, at_least, at_most)
        if number is None or not math.isfinite(number):
            self.error(
                name,
                f"expected a number, got {show_value(value)}.",
                f"Use a number{' ' + rule if rule else ''} (default {default:g}).",
            )
            return default
        if _out_of_range(number, above, at_least, at_most):
            self.error(name, f"{number:g} is out of range.", f"Use a number {rule}.")
            return default
        return float(number)

    def integer(self, name: str, default: int, *, at_least: int, at_most: int) -> int:
        if not self.given(name):
            return default
        value = self.data[name]
        number = _as_number(value)
        rule = _range_rule(None, at_least, at_most)
        if not isinstance(number, int):
            self.error(
                name,
                f"expected a whole number, got {show_value(value)}.",
                f"Use a whole number {rule}.",
            )
            return default
        if _out_of_range(number, None, at_least, at_most):
            self.error(name, f"{number} is out of range.", f"Use a whole number {rule}.")
            return default
        return number

    def choice(self, name: str, choices: Sequence[str], default: str, noun: str) -> str:
        if not self.given(name):
            return default
        value = self.data[name]
        if value not in choices:
            self.error(
                name,
                f"{show_value(value)} is not {noun}.",
                (did_you_mean(value, choices) if isinstance(value, str) else "")
                + f"Use one of: {', '.join(choices)}.",
            )
            return default
        return str(value)

    def strings(
        self,
        name: str,
        default: tuple[str, ...] | None,
        *,
        item: str = "string",
        allow_empty: bool = False,
    ) -> tuple[str, ...] | None:
        """A list of strings (non-empty unless ``allow_empty``); unresolved items are dropped."""
        if not self.given(name):
            return default
        value = self.data[name]
        if not isinstance(value, list):
            example = f"[{json.dumps(value)}]" if isinstance(value, str) else '["..."]'
            self.error(
                name,
                f"expected a list of {item}s, got {show_value(value)}.",
                f"Write it as a list: {example}.",
            )
            return default
        out = []
        for index, entry in enumerate(value):
            where = f"{self.key_of(name)}[{index}]"
            if entry is UNRESOLVED:
                continue
            if not isinstance(entry, str):
                self.problems.error(
                    where,
                    f"expected a {item}, got {show_value(entry)}.",
                    f"Write it as a string: {json.dumps(str(entry))}."
                    if isinstance(entry, int | float) and not isinstance(entry, bool)
                    else "",
                )
            elif not entry and not allow_empty:
                self.problems.error(where, f"is an empty {item}.", "Remove it.")
            else:
                out.append(entry)
        return tuple(out)

    def string_map(self, name: str) -> dict[str, str]:
        """A table of string values with non-empty keys (an ``env``)."""
        if not self.given(name):
            return {}
        value = self.data[name]
        if not isinstance(value, Mapping):
            self.error(name, f"expected a table of strings, got {show_value(value)}.", "")
            return {}
        out = {}
        for entry_name, entry in value.items():
            where = dotted_key(self.key_of(name), entry_name)
            if not entry_name or "=" in entry_name or "\0" in entry_name:
                self.problems.error(
                    where,
                    f"{json.dumps(entry_name)} is not an environment variable name.",
                    'Use a non-empty name without "=".',
                )
            elif entry is UNRESOLVED:
                continue
            elif not isinstance(entry, str):
                # The value may be a secret: say what it is, never what it holds.
                self.problems.error(
                    where,
                    f"expected a string, got {show_value(entry, secret=True)}.",
                    "Quote the value: environment values are strings.",
                )
            else:
                out[entry_name] = entry
        return out


def _as_number(value: object) -> int | float | None:
    # Strings are accepted because ${PORT} substitution always yields one.
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        for kind in (int, float):
            try:
                return kind(value.strip())
            except ValueError:
                continue
    return None


def _range_rule(above: float | None, at_least: float | None, at_most: float | None) -> str:
    """The allowed range in words: "greater than 0", "from 0 to 1", ..."""
    if at_least is not None and at_most is not None:
        return f"from {at_least:g} to {at_most:g}"
    rules = []
    if above is not None:
        rules.append(f"greater than {above:g}")
    if at_least is not None:
        rules.append(f"at least {at_least:g}")
    if at_most is not None:
        rules.append(f"at most {at_most:g}")
    return " and ".join(rules)


def _out_of_range(
    number: float, above: float | None, at_least: float | None, at_most: float | None
) -> bool:
    return (
        (above is not None and not number > above)
        or (at_least is not None and number < at_least)
        or (at_most is not None and number > at_most)
    )
