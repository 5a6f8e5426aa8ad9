"""The manifest revision digest (§17.2) against the public conformance vectors, plus JCS edges.

The vectors are iterated from ``tests/data/manifest-digest-vectors.json``, never copied here:
each vector and each sort vector is its own test, named after it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpl_router.mcpl.digest import (
    DigestError,
    canonical_json,
    manifest_canonical_json,
    manifest_revision,
    sort_set,
)

VECTORS_FILE = Path(__file__).resolve().parent.parent / "data" / "manifest-digest-vectors.json"
_FILE: dict[str, Any] = json.loads(VECTORS_FILE.read_text(encoding="utf-8"))
VECTORS: list[dict[str, Any]] = _FILE["vectors"]
SORT_VECTORS: list[dict[str, Any]] = _FILE["sortVectors"]
BY_NAME = {vector["name"]: vector for vector in VECTORS}


def test_vector_file_is_the_one_we_expect() -> None:
    # A truncated or swapped file would otherwise pass with fewer parametrized cases.
    assert len(VECTORS) == 25
    assert len(SORT_VECTORS) == 4
    assert len(BY_NAME) == len(VECTORS)
    for vector in VECTORS:
        assert ("digest" in vector) != ("expectError" in vector), vector["name"]


@pytest.mark.parametrize("vector", VECTORS, ids=[vector["name"] for vector in VECTORS])
def test_digest_vector(vector: dict[str, Any]) -> None:
    manifest = vector["input"]
    untouched = copy.deepcopy(manifest)
    if "expectError" in vector:
        with pytest.raises(DigestError) as caught:
            manifest_revision(manifest)
        assert caught.value.code == vector["expectError"]
        if "errorDetail" in vector:
            assert caught.value.detail == vector["errorDetail"]
    else:
        # howToRead: canonicalJson is a JSON string; its UTF-8 bytes are what is hashed.
        expected_bytes = vector["canonicalJson"].encode("utf-8")
        canonical = manifest_canonical_json(manifest)
        assert canonical == vector["canonicalJson"]
        assert hashlib.sha256(canonical.encode("utf-8")).hexdigest() == vector["sha256Hex"]
        assert hashlib.sha256(expected_bytes).hexdigest() == vector["sha256Hex"]
        assert manifest_revision(manifest) == vector["digest"]
    if "sameDigestAs" in vector:
        assert manifest_revision(manifest) == manifest_revision(
            BY_NAME[vector["sameDigestAs"]]["input"]
        )
    if "differentDigestFrom" in vector:
        assert manifest_revision(manifest) != manifest_revision(
            BY_NAME[vector["differentDigestFrom"]]["input"]
        )
    assert manifest == untouched, "the digest must not modify the manifest it was given"


@pytest.mark.parametrize("vector", SORT_VECTORS, ids=[vector["name"] for vector in SORT_VECTORS])
def test_sort_vector(vector: dict[str, Any]) -> None:
    assert sort_set(vector["input"]) == vector["sorted"]


@pytest.mark.parametrize("not_an_object", [None, [], "{}", 1, True])
def test_manifest_not_object(not_an_object: object) -> None:
    with pytest.raises(DigestError) as caught:
        manifest_revision(not_an_object)
    assert caught.value.code == "manifest_not_object"


def test_revision_has_the_documented_shape() -> None:
    revision = manifest_revision({"version": "0.5"})
    assert revision.startswith("sha256:")
    encoded = revision.removeprefix("sha256:")
    assert len(encoded) == 43 and "=" not in encoded  # 32 bytes, unpadded
    assert set(encoded) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, "0"),
        (-0.0, "0"),
        (1.0, "1"),
        (-17, "-17"),
        (0.1, "0.1"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1.5e21, "1.5e+21"),
        (1e-6, "0.000001"),
        (1.2345e-6, "0.0000012345"),
        (1e-7, "1e-7"),
        (1.5e-7, "1.5e-7"),
        (123e-20, "1.23e-18"),
        (2**53 + 1, "9007199254740992"),  # an int JSON can only hold as the nearest double
        (5e-324, "5e-324"),
        (0.1 + 0.2, "0.30000000000000004"),
    ],
    ids=repr,
)
def test_ecmascript_numbers(value: float, expected: str) -> None:
    assert canonical_json(value) == expected


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10**400])
def test_non_finite_numbers_are_refused(value: float) -> None:
    with pytest.raises((ValueError, OverflowError)):
        canonical_json(value)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("\u007f\u2028\u2029", '"\u007f\u2028\u2029"'),  # literal, unlike JS-embedding escapers
        ("\x00\x1f", '"\\u0000\\u001f"'),  # lowercase hex
        ('"\\/', '"\\"\\\\/"'),  # solidus is not escaped
        ("\U0001f642", '"\U0001f642"'),  # astral stays one character
    ],
    ids=["del-ls-ps", "controls", "quote-backslash-solidus", "astral"],
)
def test_string_escapes(value: str, expected: str) -> None:
    assert canonical_json(value) == expected


def test_lone_surrogate_is_refused() -> None:
    with pytest.raises(ValueError):
        canonical_json("\ud800")


def test_member_names_sort_by_utf16_code_units() -> None:
    # U+1F600 is the surrogate pair D83D DE00, which sorts before U+FFFF in UTF-16 (but after
    # it by code point): JCS is defined on code units.
    assert canonical_json({"\uffff": 2, "\U0001f600": 1, "a": 3}) == (
        '{"a":3,"\U0001f600":1,"\uffff":2}'
    )


@pytest.mark.parametrize("value", [{1: "x"}, {"a"}, b"x", object()], ids=repr)
def test_non_json_values_are_refused(value: object) -> None:
    with pytest.raises(TypeError):
        canonical_json(value)


# Lone surrogates are not JSON text (canonical_json refuses them; tested above).
_text = st.text(st.characters(codec="utf-8"))
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
    max_leaves=20,
)


@given(_json)
def test_canonical_json_parses_back_to_the_same_value(value: object) -> None:
    # Every JCS number is a double, and an integer-valued one prints without ".0": read
    # integers back as floats, or 5.564277975606169e+16 ("55642779756061690") looks changed.
    assert json.loads(canonical_json(value), parse_int=float) == value


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_numbers_round_trip(number: float) -> None:
    assert float(canonical_json(number)) == number


@given(st.lists(st.text()))
def test_sort_set_is_sorted_unique_utf8(values: list[str]) -> None:
    result = sort_set(values)
    assert set(result) == set(values)
    encoded = [value.encode("utf-8", "surrogatepass") for value in result]
    assert encoded == sorted(set(encoded))
