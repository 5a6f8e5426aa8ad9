"""Reading manifests in every shape real servers send (PROTOCOL §2, §3, §8), and diffing them."""

from __future__ import annotations

from typing import Any

import pytest

from mcpl_router.mcpl.manifest import (
    KNOWN_LEAVES,
    FeatureSet,
    Manifest,
    ManifestDiff,
    ManifestError,
    diff_manifests,
    map_legacy_vocabulary,
    parse_manifest,
)

CHANNEL_LEAVES = frozenset(leaf for leaf in KNOWN_LEAVES if leaf.startswith("channels."))
INJECT_LEAVES = frozenset(
    {
        "contextHooks.beforeInference.inject.system",
        "contextHooks.beforeInference.inject.beforeUser",
        "contextHooks.beforeInference.inject.afterUser",
    }
)
HOOK_LEAVES = INJECT_LEAVES | {"contextHooks.beforeInference.observe"}


def test_known_leaves_are_the_0_5_vocabulary() -> None:
    assert len(KNOWN_LEAVES) == 17
    assert len(CHANNEL_LEAVES) == 7


@pytest.mark.parametrize(
    ("raw", "advertised"),
    [
        pytest.param({"channels": True}, CHANNEL_LEAVES, id="channels-true-shorthand"),
        pytest.param({"contextHooks": True}, HOOK_LEAVES, id="contextHooks-true"),
        pytest.param(
            {"contextHooks": {"beforeInference": True}}, HOOK_LEAVES, id="beforeInference-true"
        ),
        pytest.param(
            {"contextHooks": {"beforeInference": {"inject": True}}},
            INJECT_LEAVES,
            id="inject-true",
        ),
        pytest.param(
            {"inferenceRequest": True},
            {"inferenceRequest", "inferenceRequest.streaming"},
            id="leaf-and-parent-true",
        ),
        pytest.param(
            {"inferenceRequest": {"streaming": True}},
            {"inferenceRequest.streaming"},
            id="object-form-advertises-only-its-true-leaves",
        ),
        pytest.param(
            {"channels": {"register": True, "publish": True, "typing": False}},
            {"channels.register", "channels.publish"},
            id="object-with-true-and-false-leaves",
        ),
        pytest.param(
            {"pushEvents": False, "modelInfo": None, "tools": 1, "inferenceLifecycle": "yes"},
            set(),
            id="non-bool-non-object-ignored",
        ),
        pytest.param(
            {"editor": {"selection": True}, "pushEvents": True},
            {"editor.selection", "pushEvents"},
            id="unknown-leaf-kept-verbatim",
        ),
        pytest.param({"channels": {}}, set(), id="empty-object-advertises-nothing"),
        pytest.param(
            {"version": "0.5", "revision": "sha256:x", "featureSets": {}},
            set(),
            id="non-capability-members-ignored",
        ),
    ],
)
def test_advertised_leaves(raw: dict[str, Any], advertised: set[str]) -> None:
    assert parse_manifest(raw).advertised == frozenset(advertised)


DISCORD_LIKE: dict[str, Any] = {
    "version": "0.4",
    "pushEvents": True,
    "channels": True,
    "featureSets": [
        {"name": "discord.messaging", "description": "Chat", "uses": ["channels.publish"]},
        {"name": "discord.events", "uses": ["pushEvents"]},
    ],
}
SPEC_LIKE: dict[str, Any] = {
    "version": "0.5",
    "pushEvents": True,
    "channels": True,
    "featureSets": {
        "discord.messaging": {"description": "Chat", "uses": ["channels.publish"]},
        "discord.events": {"uses": ["pushEvents"]},
    },
}


@pytest.mark.parametrize("raw", [SPEC_LIKE, DISCORD_LIKE], ids=["record", "array"])
def test_feature_sets_as_record_or_array(raw: dict[str, Any]) -> None:
    manifest = parse_manifest(raw)
    assert manifest.feature_set_names == {"discord.messaging", "discord.events"}
    messaging = manifest.feature_set("discord.messaging")
    assert messaging == FeatureSet("discord.messaging", ("channels.publish",), "Chat")
    assert [fs.name for fs in manifest.feature_sets] == ["discord.events", "discord.messaging"]
    assert manifest.problems == ()


def test_record_and_array_shapes_read_the_same() -> None:
    assert diff_manifests(parse_manifest(SPEC_LIKE), parse_manifest(DISCORD_LIKE)).to_receipt() == (
        ManifestDiff().to_receipt()
    )


@pytest.mark.parametrize(
    ("body", "uses"),
    [
        pytest.param({}, None, id="absent"),
        pytest.param({"uses": "tools"}, None, id="not-a-list"),
        pytest.param({"uses": ["tools", 1]}, None, id="non-string-member"),
        pytest.param({"uses": []}, (), id="empty"),
        pytest.param({"uses": ["b", "a"]}, ("b", "a"), id="kept-as-given"),
    ],
)
def test_feature_set_uses(body: dict[str, Any], uses: tuple[str, ...] | None) -> None:
    manifest = parse_manifest({"featureSets": {"f": body}})
    feature_set = manifest.feature_set("f")
    assert feature_set is not None
    assert feature_set.uses == uses


def test_odd_feature_set_entries_are_noted_not_fatal() -> None:
    manifest = parse_manifest(
        {
            "featureSets": [
                {"name": "a", "uses": ["tools"]},
                {"uses": ["tools"]},
                "junk",
                {"name": "a", "uses": ["pushEvents"]},
            ]
        }
    )
    assert manifest.feature_set("a") == FeatureSet("a", ("tools",))
    assert len(manifest.problems) == 3
    assert parse_manifest({"featureSets": "x"}).feature_sets == ()
    assert parse_manifest({"featureSets": {"a": 1}}).feature_sets == ()


@pytest.mark.parametrize(
    ("version", "legacy"),
    [
        ("0.5", False),
        ("0.5.0", False),
        ("0.5.0-draft", False),
        ("0.6", False),
        ("1.0", False),
        ("0.4", True),
        ("0.3", True),
        ("0.4.9", True),
        (None, False),
        ("draft", False),
    ],
)
def test_legacy_version(version: str | None, legacy: bool) -> None:
    raw = {} if version is None else {"version": version}
    assert parse_manifest(raw).is_legacy_version is legacy


def test_plain_mcp_server() -> None:
    assert parse_manifest(None) == Manifest.empty()
    assert parse_manifest(None).advertised == frozenset()
    assert not parse_manifest(None).is_mcpl
    assert parse_manifest(None, mcp_tools=True).advertised == {"tools"}
    assert parse_manifest({"version": "0.5"}, mcp_tools=True).advertised == {"tools"}
    assert parse_manifest({"version": "0.5"}).is_mcpl


@pytest.mark.parametrize("raw", [[], "mcpl", 5, True], ids=repr)
def test_non_object_manifest(raw: object) -> None:
    with pytest.raises(ManifestError):
        parse_manifest(raw)


def test_version_and_revision_of_wrong_type_are_noted() -> None:
    manifest = parse_manifest({"version": 0.5, "revision": 7})
    assert manifest.version is None and manifest.revision is None
    assert len(manifest.problems) == 2


def test_raw_is_kept_but_not_compared() -> None:
    one = parse_manifest({"version": "0.5", "x": "a"})
    other = parse_manifest({"version": "0.5", "x": "b"})
    assert one.raw == {"version": "0.5", "x": "a"}
    assert one == other and hash(one) == hash(other)


def test_diff() -> None:
    old = parse_manifest(
        {
            "channels": {"register": True, "publish": True},
            "featureSets": {
                "kept": {"uses": ["channels.publish"]},
                "gone": {"uses": ["channels.register"]},
                "changed": {"uses": ["channels.publish"]},
                "retagged": {"uses": ["tools"], "tagOntology": {"coreTags": ["chat:dm"]}},
            },
        }
    )
    new = parse_manifest(
        {
            "channels": {"publish": True, "typing": True},
            "featureSets": {
                "kept": {"uses": ["channels.publish"]},
                "changed": {"uses": ["channels.publish", "channels.typing"]},
                "retagged": {"uses": ["tools"], "tagOntology": {"coreTags": ["chat:reply"]}},
                "new": {"uses": ["channels.typing"]},
            },
        }
    )
    diff = diff_manifests(old, new)
    assert diff == ManifestDiff(
        removed_capabilities=("channels.register",),
        added_capabilities=("channels.typing",),
        removed_feature_sets=("gone",),
        added_feature_sets=("new",),
        changed_feature_sets=("changed", "retagged"),
    )
    assert not diff.is_empty
    assert diff.to_receipt()["removed_capabilities"] == ["channels.register"]
    assert diff_manifests(new, new).is_empty


# -- the 0.4 vocabulary (issue 11: mcpl-editor) -------------------------------------------------

EDITOR = {
    "version": "0.5",
    "pushEvents": True,
    "stateUpdate": True,
    "channels": {"register": True, "publish": True, "observe": True},
    "featureSets": {
        "editor.chat": {"uses": ["channels.publish", "channels.observe"]},
        "editor.observe": {"uses": ["pushEvents", "stateUpdate"]},
    },
}


def test_a_manifest_using_04_names_says_so_whatever_its_version() -> None:
    manifest = parse_manifest(EDITOR)
    assert manifest.legacy_names == ("channels.observe",)
    assert not manifest.is_legacy_version
    assert parse_manifest({"version": "0.5", "channels": True}).legacy_names == ()


def test_04_names_map_to_their_05_leaves_in_the_advertisement_and_in_uses() -> None:
    mapped, applied = map_legacy_vocabulary(parse_manifest(EDITOR))
    assert applied == {"channels.observe": "channels.incoming"}
    assert mapped.advertised == {"pushEvents", "stateUpdate", "channels.register", "channels.publish", "channels.incoming"}
    assert mapped.feature_set("editor.chat").uses == ("channels.publish", "channels.incoming")
    # Not a 0.4 name: left as it is (and the grant never grants it).
    assert mapped.feature_set("editor.observe").uses == ("pushEvents", "stateUpdate")
    assert mapped.raw == EDITOR and mapped.legacy_names == ()


def test_mapping_a_manifest_without_04_names_changes_nothing() -> None:
    manifest = parse_manifest({"version": "0.5", "channels": {"incoming": True}, "featureSets": {"a": {"uses": ["channels.incoming", "channels.incoming"]}}})
    assert map_legacy_vocabulary(manifest) == (manifest, {})
