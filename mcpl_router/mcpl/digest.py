"""The manifest revision digest (§17.2, RFC-003 §3.1) and the RFC 8785 canonical JSON under it.

``revision = "sha256:" + base64url_unpadded(SHA-256(JCS(manifest without root "revision")))``,
after sorting and deduplicating the set-valued arrays and checking identifier positions. The
digest is total over any JSON object: wrong-typed or non-conforming content is hashed verbatim,
and only a bad identifier (or a non-object) refuses. The conformance vectors in
``tests/data/manifest-digest-vectors.json`` are the judge of every rule here.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
from collections.abc import Iterable, Iterator

__all__ = [
    "DigestError",
    "canonical_json",
    "manifest_canonical_json",
    "manifest_revision",
    "sort_set",
]

IDENTIFIER_CHARSET = "identifier_charset"
MANIFEST_NOT_OBJECT = "manifest_not_object"

_IDENTIFIER = re.compile(r"[A-Za-z0-9._:*-]+")
# Root members that are not capability paths, so their names are not identifiers (RFC-003 §3).
_NON_CAPABILITY_MEMBERS = frozenset({"version", "revision", "featureSets"})

# Positions below `featureSets` (only when it is an object), as segment lists:
# "*" = every member value (or array element); "#key" = member names; "[]" = array elements.
_SET_ARRAYS = (
    ("*", "uses"),
    ("*", "tagOntology", "coreTags"),
    ("*", "tagOntology", "tags", "*", "implies"),
)
_IDENTIFIER_POSITIONS = (
    ("#key",),
    ("*", "uses", "[]"),
    ("*", "tagOntology", "coreTags", "[]"),
    ("*", "tagOntology", "tags", "#key"),
    ("*", "tagOntology", "tags", "*", "implies", "[]"),
    ("*", "tagOntology", "keyed", "#key"),
    ("*", "tagOntology", "keyed", "*", "values", "[]"),
    ("*", "tagOntology", "suggestedTreatment", "*", "tagsAny", "[]"),
    ("*", "tagOntology", "suggestedTreatment", "*", "tagsAll", "[]"),
    ("*", "tagOntology", "suggestedTreatment", "*", "tagsNone", "[]"),
    ("*", "tagOntology", "tags", "*", "facet"),
)


class DigestError(ValueError):
    """No revision can be computed for this manifest.

    Attributes:
        code: ``identifier_charset`` or ``manifest_not_object`` (stable strings).
        detail: where, e.g. ``featureSets.demo.messaging.uses[] = 'channels.publish '``.
    """

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


def sort_set(values: Iterable[str]) -> list[str]:
    """Deduplicate and sort by UTF-8 bytes, as set-valued manifest arrays are digested."""
    # Code-point order equals UTF-8 byte order; encoding says so without needing the proof.
    # surrogatepass keeps the function total if a lone surrogate ever gets this far.
    return sorted(set(values), key=lambda value: value.encode("utf-8", "surrogatepass"))


def manifest_revision(manifest: object) -> str:
    """The revision of a manifest as received: ``"sha256:"`` + unpadded base64url.

    Raises:
        DigestError: ``manifest_not_object`` or ``identifier_charset``.
        ValueError: a non-finite number or a lone surrogate (impossible from msgspec-decoded
            JSON, which refuses both).
    """
    digest = hashlib.sha256(manifest_canonical_json(manifest).encode("utf-8")).digest()
    return "sha256:" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")


def manifest_canonical_json(manifest: object) -> str:
    """The exact string :func:`manifest_revision` hashes (as UTF-8): normalized, then JCS.

    Raises the same errors as :func:`manifest_revision`. The caller's object is not modified.
    """
    if not isinstance(manifest, dict):
        raise DigestError(MANIFEST_NOT_OBJECT, f"got {type(manifest).__name__}")
    # Only the root `revision` is stripped: a nested member of that name is content.
    body = {key: value for key, value in manifest.items() if key != "revision"}
    _check_capability_names(body)
    feature_sets = body.get("featureSets")
    if isinstance(feature_sets, dict):
        # The array shape is non-conforming and is hashed verbatim: no sorting, no checks.
        _check_identifiers(feature_sets)
        body["featureSets"] = _normalized_feature_sets(feature_sets)
    return canonical_json(body)


def _check_capability_names(body: dict[str, object]) -> None:
    # Member names in the capability domain are path segments at any depth (§5.4's generic
    # walk); checking only the root would miss exactly where the vocabulary grows.
    def walk(node: dict[str, object], trail: str) -> None:
        for key, value in node.items():
            path = f"{trail}.{key}" if trail else key
            if not trail and key in _NON_CAPABILITY_MEMBERS:
                continue
            _require_identifier(key, path)
            if isinstance(value, dict):
                walk(value, path)

    walk(body, "")


def _check_identifiers(feature_sets: dict[str, object]) -> None:
    for position in _IDENTIFIER_POSITIONS:
        set_valued = position[:-1] in _SET_ARRAYS
        for trail, value in _select(feature_sets, position, "featureSets", set_valued):
            _require_identifier(value, trail)


def _select(
    node: object, position: tuple[str, ...], trail: str, set_valued: bool
) -> Iterator[tuple[str, str]]:
    # Yields (where, value) for the strings at `position`. Values of the wrong type are skipped:
    # the digest is total and hashes them verbatim; validation elsewhere rejects them.
    if not position:
        if isinstance(node, str):
            yield trail, node
        return
    head, rest = position[0], position[1:]
    if head == "#key" and isinstance(node, dict):
        for key in node:
            yield f"{trail}.{key}", key
    elif head == "[]" and isinstance(node, list):
        # A set-declared array holding a non-string is hashed verbatim, unchecked (§17.2).
        if set_valued and not _all_strings(node):
            return
        for element in node:
            if isinstance(element, str):
                yield f"{trail}[]", element
    elif head == "*" and isinstance(node, dict):
        for key, child in node.items():
            yield from _select(child, rest, f"{trail}.{key}", set_valued)
    elif head == "*" and isinstance(node, list):
        for index, child in enumerate(node):
            yield from _select(child, rest, f"{trail}[{index}]", set_valued)
    elif isinstance(node, dict) and head in node:
        yield from _select(node[head], rest, f"{trail}.{head}", set_valued)


def _all_strings(values: list[object]) -> bool:
    return all(isinstance(value, str) for value in values)


def _require_identifier(value: str, where: str) -> None:
    if not _IDENTIFIER.fullmatch(value):
        raise DigestError(IDENTIFIER_CHARSET, f"{where} = {value!r}")


def _normalized_feature_sets(feature_sets: dict[str, object]) -> dict[str, object]:
    # Copy-on-write down each set path, so the caller's manifest is never modified.
    result: object = dict(feature_sets)
    for position in _SET_ARRAYS:
        result = _sort_at(result, position)
    assert isinstance(result, dict)  # a dict stays a dict down any position
    return result


def _sort_at(node: object, position: tuple[str, ...]) -> object:
    if not position:
        # Set semantics apply only to an array of strings; anything else is hashed verbatim.
        if isinstance(node, list) and _all_strings(node):
            return sort_set(node)
        return node
    if not isinstance(node, dict):
        return node
    head, rest = position[0], position[1:]
    if head == "*":
        return {key: _sort_at(child, rest) for key, child in node.items()}
    if head not in node:
        return node
    return {**node, head: _sort_at(node[head], rest)}


def canonical_json(value: object) -> str:
    """RFC 8785 (JCS) serialization of a JSON value.

    Object members are sorted by the UTF-16 code units of their names; strings escape only
    ``"``, ``\\`` and C0 controls; numbers print as ECMAScript ``Number::toString`` prints the
    nearest double (``1``, ``0.1``, ``1e+21``, ``1e-7``; ``-0`` as ``0``).

    Raises:
        ValueError: NaN or an infinity, or a lone surrogate in a string.
        TypeError: a value that is not JSON (a set, bytes, a non-string key…).
    """
    parts: list[str] = []
    _write(value, parts)
    return "".join(parts)


def _write(value: object, out: list[str]) -> None:
    # bool before int: True is an int in Python but `true` in JSON.
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, str):
        out.append(_string(value))
    elif isinstance(value, int | float):
        out.append(_number(value))
    elif isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise TypeError(f"object member name is a {type(key).__name__}, not a string")
        out.append("{")
        for index, key in enumerate(sorted(value, key=_utf16_key)):
            if index:
                out.append(",")
            out.append(_string(key))
            out.append(":")
            _write(value[key], out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for index, element in enumerate(value):
            if index:
                out.append(",")
            _write(element, out)
        out.append("]")
    else:
        raise TypeError(f"{type(value).__name__} is not a JSON value")


def _utf16_key(name: str) -> bytes:
    # Big-endian code units compare bytewise in code-unit order.
    return name.encode("utf-16-be", "surrogatepass")


_SHORT_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
}
_NEEDS_ESCAPE = re.compile(r'["\\\x00-\x1f]')
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _SHORT_ESCAPES.get(char) or f"\\u{ord(char):04x}"


def _string(value: str) -> str:
    if _LONE_SURROGATE.search(value):
        raise ValueError("string holds a lone surrogate, which is not valid JSON text (I-JSON)")
    # Everything else is literal: U+007F, U+2028/9, astral characters — no normalization.
    return '"' + _NEEDS_ESCAPE.sub(_escape, value) + '"'


def _number(value: int | float) -> str:
    if isinstance(value, int) and abs(value) < 2**53:
        return str(value)  # exactly representable: its double prints the same digits
    number = float(value)  # larger ints become the double JSON would have given them
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a finite number; JSON has no spelling for it")
    if number == 0:
        return "0"  # -0 too
    sign = "-" if number < 0 else ""
    digits, exponent = _shortest_digits(abs(number))
    return sign + _ecmascript_layout(digits, exponent)


def _shortest_digits(number: float) -> tuple[str, int]:
    """(digits, n) with number = 0.digits × 10**n, digits the shortest round-trip string."""
    # repr() is the shortest string that round-trips (correctly rounded), as ECMAScript needs.
    mantissa, _, exp_text = repr(number).partition("e")
    whole, _, fraction = mantissa.partition(".")
    exponent = int(exp_text or 0) + len(whole)
    digits = whole + fraction
    stripped = digits.lstrip("0")
    exponent -= len(digits) - len(stripped)
    return stripped.rstrip("0"), exponent


def _ecmascript_layout(digits: str, n: int) -> str:
    # Number::toString(x) steps 6-10, with k = len(digits) and x = digits × 10**(n-k).
    k = len(digits)
    if k <= n <= 21:
        return digits + "0" * (n - k)
    if 0 < n <= 21:
        return digits[:n] + "." + digits[n:]
    if -6 < n <= 0:
        return "0." + "0" * -n + digits
    exponent = n - 1
    sign = "+" if exponent >= 0 else "-"
    mantissa = digits if k == 1 else digits[0] + "." + digits[1:]
    return f"{mantissa}e{sign}{abs(exponent)}"
