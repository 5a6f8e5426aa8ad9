"""The server's MCPL manifest, read tolerantly into a frozen value (PROTOCOL §2, §3, §7).

A manifest is what a server *says* it can do. It is input to the grant (:mod:`.grants`), never
authority. :func:`parse_manifest` accepts every shape real servers send (``featureSets`` as a
record or as an array, ``true`` shorthand at any level) and never raises for odd content: odd
members are ignored and noted in :attr:`Manifest.problems` for the link to log.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

# The one copy of the 0.5 vocabulary; grants.py re-exports it. It lives here because expanding
# `true` shorthand needs it and grants.py already depends on this module, not the reverse.
KNOWN_LEAVES: frozenset[str] = frozenset(
    {
        "pushEvents",
        "tools",
        "modelInfo",
        "inferenceRequest",
        "inferenceRequest.streaming",
        "inferenceLifecycle",
        "contextHooks.beforeInference.observe",
        "contextHooks.beforeInference.inject.system",
        "contextHooks.beforeInference.inject.beforeUser",
        "contextHooks.beforeInference.inject.afterUser",
        "channels.register",
        "channels.lifecycle",
        "channels.publish",
        "channels.incoming",
        "channels.streaming",
        "channels.acknowledge",
        "channels.typing",
    }
)

#: 0.4 names a legacy server may advertise, each with the 0.5 leaf that means the same. Applied
#: only to a server in legacy mode (:func:`map_legacy_vocabulary`); a 0.5 server is held to 0.5.
#: mcpl-editor advertises ``channels.observe`` (and feature sets using it) for the inbound chat
#: it then delivers with ``channels/incoming`` (src/mcpl.ts:143, src/feature-sets.ts:32).
LEGACY_ALIASES: Mapping[str, str] = {"channels.observe": "channels.incoming"}

CURRENT_VERSION = "0.5"
_CURRENT_VERSION_TUPLE = (0, 5)

# Root members that describe the manifest rather than advertise a capability (RFC-003 §3).
_NON_CAPABILITY_MEMBERS = frozenset({"version", "revision", "featureSets"})


class ManifestError(ValueError):
    """The manifest is not a JSON object (and not absent either)."""


@attrs.frozen
class FeatureSet:
    """One declared feature set (§6).

    ``uses`` is None when the member is absent or is not a list of strings; either way the grant
    disables the set as ``invalid_uses``. ``raw`` is the declaration as received (tag ontology
    and all), kept for whoever needs more than routing does; it takes no part in equality.
    """

    name: str
    uses: tuple[str, ...] | None
    description: str | None = None
    raw: Mapping[str, object] = attrs.field(factory=dict, eq=False, hash=False, repr=False)


@attrs.frozen
class Manifest:
    """What one server advertised, as leaf paths and feature sets.

    Attributes:
        version: the ``version`` member when it is a string, else None.
        advertised: leaf paths, with ``true`` shorthand expanded over :data:`KNOWN_LEAVES`.
            Leaves the host does not know are kept verbatim (the grant never grants them).
        feature_sets: declared sets, sorted by name, names unique (first declaration wins).
        revision: the ``revision`` the server claimed, unverified (see :mod:`.digest`).
        is_mcpl: False for a plain MCP server (no ``experimental.mcpl`` member).
        problems: short notes about members that were ignored, for one log line.
        raw: the manifest object as received; excluded from equality and hashing.
    """

    version: str | None
    advertised: frozenset[str]
    feature_sets: tuple[FeatureSet, ...] = ()
    revision: str | None = None
    is_mcpl: bool = True
    problems: tuple[str, ...] = ()
    raw: Mapping[str, object] = attrs.field(factory=dict, eq=False, hash=False, repr=False)

    @classmethod
    def empty(cls, *, mcp_tools: bool = False) -> Manifest:
        """The manifest of a plain MCP server: no MCPL member, so nothing but (maybe) tools."""
        return cls(
            version=None,
            advertised=frozenset({"tools"}) if mcp_tools else frozenset(),
            is_mcpl=False,
        )

    @property
    def is_legacy_version(self) -> bool:
        """True when ``version`` is an older protocol than 0.5 (``"0.4"``, ``"0.3"``, …).

        A missing or unparsable version is *not* legacy by version: the link still learns of
        legacy behaviour when ``featureSets/update`` is answered with -32601.
        """
        parsed = _version_tuple(self.version)
        return parsed is not None and parsed < _CURRENT_VERSION_TUPLE

    @property
    def legacy_names(self) -> tuple[str, ...]:
        """The 0.4 names (:data:`LEGACY_ALIASES`) this manifest uses, advertised or in a set's
        ``uses``, sorted. Non-empty means the server speaks the 0.4 vocabulary, whatever its
        ``version`` says."""
        used = set(self.advertised)
        for fs in self.feature_sets:
            used.update(fs.uses or ())
        return tuple(sorted(used & LEGACY_ALIASES.keys()))

    @property
    def feature_set_names(self) -> frozenset[str]:
        """The declared feature-set names."""
        return frozenset(fs.name for fs in self.feature_sets)

    def feature_set(self, name: str) -> FeatureSet | None:
        """The declared set called ``name``, or None."""
        for fs in self.feature_sets:
            if fs.name == name:
                return fs
        return None


def map_legacy_vocabulary(manifest: Manifest) -> tuple[Manifest, dict[str, str]]:
    """``manifest`` with each 0.4 name replaced by its 0.5 leaf; and the mapping applied.

    Only for a server the link handles in legacy mode: the grant then treats ``channels.observe``
    as ``channels.incoming`` in the advertisement and in every feature set's ``uses``. ``raw``
    stays as received (the digest and diffs are of what the server sent).
    """
    applied = {old: LEGACY_ALIASES[old] for old in manifest.legacy_names}
    if not applied:
        return manifest, {}

    def mapped(paths: Iterable[str]) -> list[str]:
        # Order kept, duplicates dropped: a set using both names uses the leaf once.
        return list(dict.fromkeys(applied.get(path, path) for path in paths))

    feature_sets = tuple(
        attrs.evolve(fs, uses=tuple(mapped(fs.uses))) if fs.uses is not None else fs for fs in manifest.feature_sets
    )
    return attrs.evolve(manifest, advertised=frozenset(mapped(manifest.advertised)), feature_sets=feature_sets), applied


def _version_tuple(version: str | None) -> tuple[int, ...] | None:
    # "0.4" -> (0, 4); "0.5.0-draft" -> (0, 5, 0); anything without a leading number -> None.
    if version is None:
        return None
    parts: list[int] = []
    for piece in version.split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    if not parts:
        return None
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()  # so "0.5.0" equals "0.5"
    return tuple(parts)


def parse_manifest(raw: object, *, mcp_tools: bool = False) -> Manifest:
    """Read ``capabilities.experimental.mcpl`` from an ``initialize`` answer or ``mcpl/manifest``.

    Args:
        raw: the decoded member. None means a plain MCP server (:meth:`Manifest.empty`).
        mcp_tools: the server's MCP ``capabilities`` include ``tools``. MCPL servers rarely
            repeat ``tools`` in their manifest, so the MCP capability counts as advertising it.

    Raises:
        ManifestError: ``raw`` is neither None nor a JSON object.
    """
    if raw is None:
        return Manifest.empty(mcp_tools=mcp_tools)
    if not isinstance(raw, dict):
        raise ManifestError(f"manifest is a {type(raw).__name__}, not an object")
    problems: list[str] = []
    advertised: set[str] = set()
    for key, value in raw.items():
        if key in _NON_CAPABILITY_MEMBERS:
            continue
        _collect(str(key), value, advertised)
    if mcp_tools:
        advertised.add("tools")
    version = raw.get("version")
    if version is not None and not isinstance(version, str):
        problems.append(f"version is a {type(version).__name__}, ignored")
        version = None
    revision = raw.get("revision")
    if revision is not None and not isinstance(revision, str):
        problems.append("revision is not a string, ignored")
        revision = None
    feature_sets = _parse_feature_sets(raw.get("featureSets"), problems)
    return Manifest(
        version=version,
        advertised=frozenset(advertised),
        feature_sets=feature_sets,
        revision=revision,
        is_mcpl=True,
        problems=tuple(problems),
        raw=raw,
    )


def _collect(path: str, value: object, into: set[str]) -> None:
    # A generic recursive walk (§5.4): no hardcoded list of nestable keys. `false`, null,
    # numbers and strings advertise nothing.
    if value is True:
        beneath = _leaves_at_or_under(path)
        into.update(beneath or {path})
    elif isinstance(value, dict):
        for key, child in value.items():
            _collect(f"{path}.{key}", child, into)


def _leaves_at_or_under(path: str) -> frozenset[str]:
    # `true` means every leaf beneath; `inferenceRequest` is both a leaf and a parent.
    prefix = path + "."
    return frozenset(leaf for leaf in KNOWN_LEAVES if leaf == path or leaf.startswith(prefix))


def _parse_feature_sets(value: object, problems: list[str]) -> tuple[FeatureSet, ...]:
    entries: Iterable[tuple[str, object]]
    if value is None:
        return ()
    if isinstance(value, dict):
        # The spec's shape: a record keyed by name.
        entries = ((str(name), body) for name, body in value.items())
    elif isinstance(value, list):
        # discord-mcpl and heartbeat-mcpl send an array of {name, ...}.
        entries = _named_entries(value, problems)
    else:
        problems.append(f"featureSets is a {type(value).__name__}, ignored")
        return ()
    found: dict[str, FeatureSet] = {}
    for name, body in entries:
        if not isinstance(body, dict):
            problems.append(f"featureSets.{name} is not an object, ignored")
            continue
        if name in found:
            # A repeated name is ambiguous; the first declaration stands, so a later one can't
            # quietly change what an already-read name uses.
            problems.append(f"featureSets.{name} declared twice, first kept")
            continue
        found[name] = _feature_set(name, body)
    return tuple(found[name] for name in sorted(found))


def _named_entries(items: list[object], problems: list[str]) -> Iterable[tuple[str, object]]:
    for index, item in enumerate(items):
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(item, dict) or not isinstance(name, str) or not name:
            problems.append(f"featureSets[{index}] has no name, ignored")
            continue
        # Drop `name` so a set reads the same whichever shape declared it (diffs compare raw).
        yield name, {key: value for key, value in item.items() if key != "name"}


def _feature_set(name: str, body: dict[str, object]) -> FeatureSet:
    uses_raw = body.get("uses")
    uses: tuple[str, ...] | None = None
    if isinstance(uses_raw, list) and all(isinstance(u, str) for u in uses_raw):
        uses = tuple(uses_raw)
    description = body.get("description")
    return FeatureSet(
        name=name,
        uses=uses,
        description=description if isinstance(description, str) else None,
        raw=body,
    )


@attrs.frozen
class ManifestDiff:
    """What changed between two manifests of one server (§17), each field sorted."""

    removed_capabilities: tuple[str, ...] = ()
    added_capabilities: tuple[str, ...] = ()
    removed_feature_sets: tuple[str, ...] = ()
    added_feature_sets: tuple[str, ...] = ()
    changed_feature_sets: tuple[str, ...] = ()

    @property
    def is_empty(self) -> bool:
        """True when nothing the grant depends on changed."""
        return not (
            self.removed_capabilities
            or self.added_capabilities
            or self.removed_feature_sets
            or self.added_feature_sets
            or self.changed_feature_sets
        )

    def to_receipt(self) -> dict[str, list[str]]:
        """The fields of the one ``manifest.changed`` log line."""
        return {
            "removed_capabilities": list(self.removed_capabilities),
            "added_capabilities": list(self.added_capabilities),
            "removed_feature_sets": list(self.removed_feature_sets),
            "added_feature_sets": list(self.added_feature_sets),
            "changed_feature_sets": list(self.changed_feature_sets),
        }


def diff_manifests(old: Manifest, new: Manifest) -> ManifestDiff:
    """Compare two manifests: capabilities by leaf, feature sets by name and declaration.

    A feature set counts as changed when its ``uses``, its description or any other member of
    its declaration (a tag ontology, say) differs.
    """
    old_sets = {fs.name: fs for fs in old.feature_sets}
    new_sets = {fs.name: fs for fs in new.feature_sets}
    changed = [
        name
        for name in old_sets.keys() & new_sets.keys()
        if old_sets[name] != new_sets[name] or old_sets[name].raw != new_sets[name].raw
    ]
    return ManifestDiff(
        removed_capabilities=tuple(sorted(old.advertised - new.advertised)),
        added_capabilities=tuple(sorted(new.advertised - old.advertised)),
        removed_feature_sets=tuple(sorted(old_sets.keys() - new_sets.keys())),
        added_feature_sets=tuple(sorted(new_sets.keys() - old_sets.keys())),
        changed_feature_sets=tuple(sorted(changed)),
    )
