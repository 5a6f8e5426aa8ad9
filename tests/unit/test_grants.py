"""Capability grants (§5.4): one table row per rule, a property test for the pattern walk."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpl_router.mcpl.grants import (
    DEFAULT_ENABLED_CAPABILITIES,
    KNOWN_LEAVES,
    Grant,
    GrantPolicy,
    PolicyError,
    compute_grant,
    narrow_on_manifest_change,
    path_matches,
)
from mcpl_router.mcpl.manifest import Manifest, map_legacy_vocabulary, parse_manifest

INJECT = frozenset(
    {
        "contextHooks.beforeInference.inject.system",
        "contextHooks.beforeInference.inject.beforeUser",
        "contextHooks.beforeInference.inject.afterUser",
    }
)
CHANNELS = frozenset(leaf for leaf in KNOWN_LEAVES if leaf.startswith("channels."))
EVERYTHING: dict[str, Any] = {
    "version": "0.5",
    "pushEvents": True,
    "tools": True,
    "modelInfo": True,
    "inferenceRequest": True,
    "inferenceLifecycle": True,
    "contextHooks": True,
    "channels": True,
}


def grant_for(
    enabled: tuple[str, ...],
    disabled: tuple[str, ...] = (),
    advertised: dict[str, Any] = EVERYTHING,
) -> frozenset[str]:
    policy = GrantPolicy(enabled_capabilities=enabled, disabled_capabilities=disabled)
    return compute_grant(parse_manifest(advertised), policy).effective


# --- path_matches -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "path", "matches"),
    [
        ("channels.*", "channels.publish", True),
        ("channels.*", "contextHooks.beforeInference.inject.system", False),
        ("channels.*", "channels", False),
        ("contextHooks.*", "contextHooks.beforeInference.inject.system", False),
        ("contextHooks.*", "contextHooks.beforeInference", True),  # a parent, never a leaf
        ("contextHooks.*.*.*", "contextHooks.beforeInference.inject.system", True),
        (
            "contextHooks.beforeInference.inject.*",
            "contextHooks.beforeInference.inject.afterUser",
            True,
        ),
        ("contextHooks.beforeInference.*", "contextHooks.beforeInference.observe", True),
        ("contextHooks.beforeInference.*", "contextHooks.beforeInference.inject.system", False),
        ("*", "pushEvents", True),
        ("*", "channels.publish", False),
        ("*.publish", "channels.publish", True),
        ("chan*", "channels", False),  # no suffix wildcard: a literal segment
        ("channels.pub*", "channels.publish", False),
        ("channels", "channels.publish", False),
        ("channels.publish", "channels.publish", True),
        ("inferenceRequest", "inferenceRequest.streaming", False),
        ("inferenceRequest.*", "inferenceRequest", False),
        ("a..b", "a..b", False),  # an empty segment matches nothing
        ("", "", False),
        ("*", "", False),
    ],
)
def test_path_matches(pattern: str, path: str, matches: bool) -> None:
    assert path_matches(pattern, path) is matches


_segment = st.text(alphabet="abcXYZ019_:-", min_size=1, max_size=6)
_path = st.lists(_segment, min_size=1, max_size=5).map(".".join)


@given(_path, _path)
def test_a_pattern_without_star_matches_only_itself(pattern: str, path: str) -> None:
    assert path_matches(pattern, path) is (pattern == path)


@given(st.lists(_segment, min_size=1, max_size=5), st.data())
def test_star_matches_any_one_segment(segments: list[str], data: st.DataObject) -> None:
    starred = data.draw(st.lists(st.booleans(), min_size=len(segments), max_size=len(segments)))
    pattern = ".".join("*" if star else seg for seg, star in zip(segments, starred, strict=True))
    path = ".".join(segments)
    assert path_matches(pattern, path)
    # Equal segment counts or nothing: one segment more or less never matches.
    assert not path_matches(pattern + ".*", path)
    assert not path_matches(pattern, path + ".x")


@given(_path, _path)
def test_star_pattern_requires_the_literal_segments(pattern: str, path: str) -> None:
    starred = pattern.split(".")
    starred[0] = "*"
    wanted = path.split(".")
    expected = len(starred) == len(wanted) and starred[1:] == wanted[1:]
    assert path_matches(".".join(starred), path) is expected


# --- the §5.4 rules, one row each ---------------------------------------------------------


@pytest.mark.parametrize(
    ("enabled", "disabled", "advertised", "granted"),
    [
        pytest.param(("channels.*",), (), EVERYTHING, CHANNELS, id="star-is-one-segment"),
        pytest.param(
            ("contextHooks.*",), (), EVERYTHING, frozenset(),
            id="contextHooks.*-grants-no-inject-leaf",
        ),
        pytest.param(
            ("contextHooks.beforeInference.inject.*",), (), EVERYTHING, INJECT,
            id="inject.*-grants-all-three-inject-leaves",
        ),
        pytest.param(
            ("contextHooks.beforeInference.*",), (), EVERYTHING,
            {"contextHooks.beforeInference.observe"},
            id="beforeInference.*-grants-observe-only",
        ),
        pytest.param(("channels",), (), EVERYTHING, frozenset(), id="bare-parent-grants-nothing"),
        pytest.param(
            ("contextHooks.beforeInference",), (), EVERYTHING, frozenset(),
            id="bare-deeper-parent-grants-nothing",
        ),
        pytest.param(
            ("channels.*",), ("channels.publish",), EVERYTHING, CHANNELS - {"channels.publish"},
            id="deny-wins-over-glob-allow",
        ),
        pytest.param(
            ("channels.publish",), ("channels.*",), EVERYTHING, frozenset(),
            id="glob-deny-wins-over-exact-allow",
        ),
        pytest.param(
            ("channels.*", "pushEvents"), (), {"channels": {"publish": True}},
            {"channels.publish"},
            id="policy-enabled-but-not-advertised-is-not-granted",
        ),
        pytest.param(
            ("channels.*",), (), {"channels": True}, CHANNELS, id="channels-true-shorthand",
        ),
        pytest.param(
            ("inferenceRequest",), (), {"inferenceRequest": True}, {"inferenceRequest"},
            id="leaf-that-is-also-a-parent",
        ),
        pytest.param(
            ("*", "*.*", "editor.*"), (), {"editor": {"selection": True}, "tools": True},
            {"tools"},
            id="unknown-leaf-never-granted",
        ),
        pytest.param(
            ("channels.*",), (), {"channels": False, "pushEvents": True}, frozenset(),
            id="false-advertises-nothing",
        ),
        pytest.param(
            DEFAULT_ENABLED_CAPABILITIES, (), {}, frozenset(), id="empty-manifest-grants-nothing"
        ),
    ],
)
def test_grant_rules(
    enabled: tuple[str, ...],
    disabled: tuple[str, ...],
    advertised: dict[str, Any],
    granted: frozenset[str],
) -> None:
    assert grant_for(enabled, disabled, advertised) == frozenset(granted)


def test_default_policy_refuses_server_initiated_inference() -> None:
    grant = compute_grant(parse_manifest(EVERYTHING), GrantPolicy())
    server_inference = {"inferenceRequest", "inferenceRequest.streaming", "modelInfo"}
    assert grant.effective == KNOWN_LEAVES - server_inference
    assert grant.denied == server_inference
    assert set(DEFAULT_ENABLED_CAPABILITIES) == grant.effective


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param(GrantPolicy(("channels.*",), ("channels.*",)), id="same-capability-glob"),
        pytest.param(
            GrantPolicy(("pushEvents", "channels.publish"), ("channels.publish",)),
            id="same-capability-leaf",
        ),
        pytest.param(
            GrantPolicy(enabled_feature_sets=("a.b",), disabled_feature_sets=("a.b",)),
            id="same-feature-set",
        ),
        pytest.param(GrantPolicy(("channels..publish",)), id="empty-segment"),
        pytest.param(GrantPolicy(("",)), id="empty-pattern"),
        pytest.param(GrantPolicy(("channels publish",)), id="bad-charset"),
        pytest.param(
            GrantPolicy(disabled_capabilities=(3,)),  # type: ignore[arg-type]
            id="not-a-string",
        ),
    ],
)
def test_malformed_policy_fails_closed(policy: GrantPolicy) -> None:
    with pytest.raises(PolicyError):
        policy.validate()
    with pytest.raises(PolicyError):
        compute_grant(parse_manifest(EVERYTHING), policy)


def test_policy_error_names_the_offending_paths() -> None:
    with pytest.raises(PolicyError, match=r"channels\.publish.*pushEvents"):
        GrantPolicy(
            ("channels.publish", "pushEvents"), ("pushEvents", "channels.publish")
        ).validate()


def test_from_config_defaults_minus_exact_denials_is_not_malformed() -> None:
    # Against the defaults, an exact denial is the operator's only list: nothing contradicts.
    with pytest.raises(PolicyError):
        GrantPolicy(disabled_capabilities=("channels.typing",)).validate()
    policy = GrantPolicy.from_config(disabled_capabilities=["channels.typing", "channels.*"])
    assert "channels.typing" not in policy.enabled_capabilities
    assert "channels.publish" in policy.enabled_capabilities  # only exact names are removed
    assert compute_grant(parse_manifest(EVERYTHING), policy).effective.isdisjoint(CHANNELS)
    # An operator who writes both lists can contradict themselves, and is told so.
    with pytest.raises(PolicyError, match="channels.typing"):
        GrantPolicy.from_config(
            enabled_capabilities=["channels.typing"], disabled_capabilities=["channels.typing"]
        )


def test_policy_accepts_lists_from_config() -> None:
    policy = GrantPolicy(
        ["channels.*"], ["channels.typing"], ["x.*"], ["x.y"]  # type: ignore[arg-type]
    )
    assert policy.enabled_capabilities == ("channels.*",)
    assert policy.enabled_feature_sets == ("x.*",)
    lone = GrantPolicy("pushEvents")  # type: ignore[arg-type]
    assert lone.enabled_capabilities == ("pushEvents",)
    policy.validate()


# --- the Grant value ----------------------------------------------------------------------


def test_allows_exact_leaves_only() -> None:
    policy = GrantPolicy(("contextHooks.beforeInference.inject.*",))
    grant = compute_grant(parse_manifest(EVERYTHING), policy)
    assert grant.allows("contextHooks.beforeInference.inject.system")
    assert not grant.allows("contextHooks.beforeInference")
    assert not grant.allows("contextHooks")
    assert not grant.allows("contextHooks.beforeInference.inject.*")
    # A server granted only inject leaves is still called for context/beforeInference.
    assert grant.allows_any_under("contextHooks.beforeInference")
    assert not grant.allows_any_under("channels")
    assert not grant.allows_any_under("contextHooks.beforeInference.inject.system")


def test_any_under_is_kept_per_grant_and_a_new_grant_asks_afresh() -> None:
    """The answers are kept on the grant (it never changes); a grant made from it (a regrant
    evolves the old one) keeps none of them."""
    policy = GrantPolicy(("contextHooks.beforeInference.inject.*",))
    grant = compute_grant(parse_manifest(EVERYTHING), policy)
    assert grant.allows_any_under("contextHooks.beforeInference")
    assert grant.allows_any_under("contextHooks.beforeInference")  # the kept answer
    narrowed = attrs.evolve(grant, effective=frozenset({"channels.publish"}))
    assert not narrowed.allows_any_under("contextHooks.beforeInference")
    assert grant.allows_any_under("contextHooks.beforeInference")
    assert narrowed == attrs.evolve(narrowed)  # what is kept is no part of the value


def test_nothing_grants_nothing_and_still_sends_the_allowlist() -> None:
    grant = Grant.nothing()
    assert not grant.allows("pushEvents")
    assert grant.to_update_params() == {
        "effectiveCapabilities": [],
        "deniedCapabilities": [],
        "enabled": [],
        "disabled": [],
    }
    params = compute_grant(Manifest.empty(), GrantPolicy()).to_update_params()
    assert params["effectiveCapabilities"] == []


def test_update_params_are_sorted() -> None:
    manifest = parse_manifest(
        {
            "channels": True,
            "modelInfo": True,
            "featureSets": {
                "z.chat": {"uses": ["channels.publish"]},
                "a.chat": {"uses": ["channels.incoming"]},
                "m.model": {"uses": ["modelInfo"]},
            },
        }
    )
    params = compute_grant(manifest, GrantPolicy()).to_update_params()
    assert params == {
        "effectiveCapabilities": sorted(CHANNELS),
        "deniedCapabilities": ["modelInfo"],
        "enabled": ["a.chat", "z.chat"],
        "disabled": ["m.model"],
    }


def test_grant_is_a_frozen_hashable_value() -> None:
    raw = {"channels": True, "featureSets": {"f": {}}}
    grant = compute_grant(parse_manifest(raw), GrantPolicy())
    assert grant == compute_grant(parse_manifest(raw), GrantPolicy())
    assert hash(grant) == hash(compute_grant(parse_manifest({"channels": True}), GrantPolicy()))
    with pytest.raises(TypeError):
        grant.disabled_feature_sets["f"] = "x"  # type: ignore[index]
    summary = grant.summary()
    assert summary["feature_sets_disabled"] == {"f": "invalid_uses"}
    assert summary["legacy"] is False


# --- feature sets -------------------------------------------------------------------------

PUBLISHES: dict[str, Any] = {"uses": ["channels.publish"]}


@pytest.mark.parametrize(
    ("feature_sets", "policy", "enabled", "disabled"),
    [
        pytest.param(
            {"f": {"description": "no uses"}}, GrantPolicy(), set(), {"f": "invalid_uses"},
            id="uses-absent",
        ),
        pytest.param(
            {"f": {"uses": []}}, GrantPolicy(), set(), {"f": "invalid_uses"}, id="uses-empty"
        ),
        pytest.param(
            {"f": {"uses": ["channels.publish", "channels.teleport"]}}, GrantPolicy(), set(),
            {"f": "invalid_uses"}, id="uses-unknown-path",
        ),
        pytest.param(
            {"f": {"uses": ["channels"]}}, GrantPolicy(), set(), {"f": "invalid_uses"},
            id="uses-a-bare-parent",
        ),
        pytest.param(
            {"f": {"uses": "channels.publish"}}, GrantPolicy(), set(), {"f": "invalid_uses"},
            id="uses-not-a-list",
        ),
        pytest.param(
            {"f": {"uses": ["channels.publish", "modelInfo"]}}, GrantPolicy(), set(),
            {"f": "missing_capabilities"}, id="uses-a-leaf-not-granted",
        ),
        pytest.param(
            {"f": {"uses": ["channels.publish"]}}, GrantPolicy(), {"f"}, {}, id="all-uses-granted",
        ),
        pytest.param(
            {"chat.main": PUBLISHES, "chat.extra": PUBLISHES},
            GrantPolicy(enabled_feature_sets=("chat.main",)),
            {"chat.main"},
            {"chat.extra": "disabled_by_policy"},
            id="enabled-allowlist-by-whole-name",
        ),
        pytest.param(
            {"chat.main": PUBLISHES, "chat.main.x": PUBLISHES},
            GrantPolicy(enabled_feature_sets=("chat.*",)),
            {"chat.main"}, {"chat.main.x": "disabled_by_policy"}, id="enabled-glob-is-segment-wise",
        ),
        pytest.param(
            {"chat.main": {"uses": ["channels.publish"]}},
            GrantPolicy(enabled_feature_sets=()),
            set(), {"chat.main": "disabled_by_policy"}, id="empty-allowlist-enables-none",
        ),
        pytest.param(
            {"chat.main": PUBLISHES, "chat.other": PUBLISHES},
            GrantPolicy(disabled_feature_sets=("chat.*",), enabled_feature_sets=("chat.main",)),
            set(), {"chat.main": "disabled_by_policy", "chat.other": "disabled_by_policy"},
            id="disabled-always-subtracts",
        ),
    ],
)
def test_feature_sets(
    feature_sets: dict[str, Any], policy: GrantPolicy, enabled: set[str], disabled: dict[str, str]
) -> None:
    manifest = parse_manifest({"channels": True, "modelInfo": True, "featureSets": feature_sets})
    grant = compute_grant(manifest, policy)
    assert grant.enabled_feature_sets == enabled
    assert dict(grant.disabled_feature_sets) == disabled


@pytest.mark.parametrize(
    "feature_sets",
    [
        {"discord.messaging": {"uses": ["channels.publish"]}, "broken": {"uses": []}},
        [
            {"name": "discord.messaging", "uses": ["channels.publish"]},
            {"name": "broken", "uses": []},
        ],
    ],
    ids=["record", "array"],
)
def test_feature_sets_as_record_and_as_array(feature_sets: object) -> None:
    manifest = parse_manifest({"channels": True, "featureSets": feature_sets})
    grant = compute_grant(manifest, GrantPolicy())
    assert grant.enabled_feature_sets == {"discord.messaging"}
    assert dict(grant.disabled_feature_sets) == {"broken": "invalid_uses"}


def test_legacy_flag_is_recorded() -> None:
    assert compute_grant(parse_manifest({"version": "0.4"}), GrantPolicy(), legacy=True).legacy


# --- §17 manifest change: narrow, never widen -----------------------------------------------


BEFORE: dict[str, Any] = {
    "channels": {"register": True, "publish": True, "incoming": True},
    "featureSets": {
        "chat": {"uses": ["channels.publish", "channels.incoming"]},
        "registry": {"uses": ["channels.register"]},
    },
}


@pytest.mark.parametrize(
    ("after", "effective", "enabled", "disabled"),
    [
        pytest.param(
            {
                "channels": {"register": True, "publish": True, "incoming": True, "typing": True},
                "pushEvents": True,
                "featureSets": BEFORE["featureSets"],
            },
            {"channels.register", "channels.publish", "channels.incoming"},
            {"chat", "registry"},
            {},
            id="added-capabilities-not-granted",
        ),
        pytest.param(
            {"channels": {"publish": True, "incoming": True}, "featureSets": BEFORE["featureSets"]},
            {"channels.publish", "channels.incoming"},
            {"chat"},
            {"registry": "missing_capabilities"},
            id="removed-capability-dropped",
        ),
        pytest.param(
            {
                "channels": {"register": True, "publish": True, "incoming": True, "typing": True},
                "featureSets": {
                    **BEFORE["featureSets"],
                    "typing": {"uses": ["channels.typing"]},
                    "more-chat": {"uses": ["channels.publish"]},
                },
            },
            {"channels.register", "channels.publish", "channels.incoming"},
            {"chat", "registry"},
            {"typing": "missing_capabilities", "more-chat": "added_since_grant"},
            id="added-feature-sets-not-enabled",
        ),
        pytest.param(
            {"channels": {"publish": True, "incoming": True}},
            {"channels.publish", "channels.incoming"},
            set(),
            {},
            id="removed-feature-sets-dropped",
        ),
    ],
)
def test_narrow_on_manifest_change(
    after: dict[str, Any], effective: set[str], enabled: set[str], disabled: dict[str, str]
) -> None:
    policy = GrantPolicy()
    old = compute_grant(parse_manifest(BEFORE), policy)
    assert old.enabled_feature_sets == {"chat", "registry"}
    new = narrow_on_manifest_change(old, parse_manifest(after), policy)
    assert new.effective == effective
    assert new.effective <= old.effective
    assert new.enabled_feature_sets == enabled
    assert dict(new.disabled_feature_sets) == disabled
    # What a fresh handshake would grant is only ever wider: narrowing never adds.
    assert new.effective <= compute_grant(parse_manifest(after), policy).effective


def test_narrow_applies_a_tightened_policy_and_keeps_legacy() -> None:
    old = compute_grant(parse_manifest(BEFORE), GrantPolicy(), legacy=True)
    tighter = GrantPolicy.from_config(disabled_capabilities=["channels.register"])
    new = narrow_on_manifest_change(old, parse_manifest(BEFORE), tighter)
    assert new.effective == {"channels.publish", "channels.incoming"}
    assert new.legacy


def test_narrow_from_nothing_stays_nothing() -> None:
    new = narrow_on_manifest_change(Grant.nothing(), parse_manifest(EVERYTHING), GrantPolicy())
    assert new.effective == frozenset()
    assert new.denied == parse_manifest(EVERYTHING).advertised


def test_a_legacy_servers_04_feature_set_is_granted_once_mapped() -> None:
    # mcpl-editor's chat set uses channels.observe: invalid as written, enabled once mapped.
    raw = {"version": "0.5", "channels": {"register": True, "publish": True, "observe": True},
           "featureSets": {"editor.chat": {"uses": ["channels.publish", "channels.observe"]}}}
    as_written = compute_grant(parse_manifest(raw), GrantPolicy())
    assert as_written.disabled_feature_sets == {"editor.chat": "invalid_uses"}
    assert not as_written.allows("channels.incoming")
    mapped, _ = map_legacy_vocabulary(parse_manifest(raw))
    granted = compute_grant(mapped, GrantPolicy())
    assert granted.enabled_feature_sets == {"editor.chat"} and granted.allows("channels.incoming")
