"""Capability grants (§5.4): what a server may do, computed from its manifest and our policy.

This module is the security boundary. The grant is the server's advertisement intersected with
the host policy, minus the policy's denials; a leaf the host does not know is never granted,
because the host cannot enforce what it does not understand. Everything here is pure.

Patterns match paths segment by segment: ``*`` is exactly one segment and segment counts must
be equal, so ``channels.*`` grants ``channels.publish`` and ``contextHooks.*`` grants none of
the depth-4 ``contextHooks.beforeInference.inject.*`` leaves. A bare parent grants nothing.
"""

from __future__ import annotations

import re
import types
from collections.abc import Iterable, Mapping

import attrs

from mcpl_router.mcpl.manifest import KNOWN_LEAVES, Manifest

__all__ = [
    "DEFAULT_ENABLED_CAPABILITIES",
    "KNOWN_LEAVES",
    "Grant",
    "GrantPolicy",
    "PolicyError",
    "compute_grant",
    "narrow_on_manifest_change",
    "path_matches",
]

# Server-initiated inference is granted only to a server the operator configured it for
# (``mcplServers.<id>.inference``, mcpl/regrant.py), so the default policy leaves out the three
# leaves that would let a server ask for it.
_SERVER_INFERENCE_LEAVES = frozenset(
    {"inferenceRequest", "inferenceRequest.streaming", "modelInfo"}
)
DEFAULT_ENABLED_CAPABILITIES: tuple[str, ...] = tuple(
    sorted(KNOWN_LEAVES - _SERVER_INFERENCE_LEAVES)
)

# Feature-set reasons, as they appear in Grant.disabled_feature_sets and in logs.
INVALID_USES = "invalid_uses"
MISSING_CAPABILITIES = "missing_capabilities"
DISABLED_BY_POLICY = "disabled_by_policy"
ADDED_SINCE_GRANT = "added_since_grant"

_SEGMENT = re.compile(r"[A-Za-z0-9_:*-]+")


class PolicyError(ValueError):
    """The grant policy is malformed; nothing may be granted from it (fail closed)."""


def path_matches(pattern: str, path: str) -> bool:
    """True when ``pattern`` names ``path``: equal segment counts, ``*`` matching any one segment.

    No suffix or multi-segment wildcard: ``chan*`` is a literal segment, and an empty segment
    (``a..b``, a trailing dot) matches nothing.
    """
    return _segments_match(pattern.split("."), path.split("."))


def _segments_match(pattern: list[str], path: list[str]) -> bool:
    # The generic recursive walk §5.4 asks for: no table of nestable keys to fall out of date.
    if not pattern or not path:
        return not pattern and not path
    head, segment = pattern[0], path[0]
    if not segment or not (head == "*" or head == segment):
        return False
    return _segments_match(pattern[1:], path[1:])


def _matches_any(patterns: Iterable[str], path: str) -> bool:
    return any(path_matches(pattern, path) for pattern in patterns)


def _as_tuple(values: Iterable[str]) -> tuple[str, ...]:
    if isinstance(values, str):
        # A lone string would otherwise become a tuple of characters.
        return (values,)
    return tuple(values)


def _as_optional_tuple(values: Iterable[str] | None) -> tuple[str, ...] | None:
    return None if values is None else _as_tuple(values)


@attrs.frozen
class GrantPolicy:
    """The host's side of a grant, for one server: patterns to enable and to disable.

    Capabilities are allowlisted (``enabled_capabilities``) and then denied
    (``disabled_capabilities``; deny wins). Feature-set names follow the same rules;
    ``enabled_feature_sets=None`` puts no constraint on them. Call :meth:`validate` where the
    policy is built (config load) so a mistake is reported there, not at the first handshake.
    """

    enabled_capabilities: tuple[str, ...] = attrs.field(
        default=DEFAULT_ENABLED_CAPABILITIES, converter=_as_tuple
    )
    disabled_capabilities: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)
    enabled_feature_sets: tuple[str, ...] | None = attrs.field(
        default=None, converter=_as_optional_tuple
    )
    disabled_feature_sets: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple)

    @classmethod
    def from_config(
        cls,
        *,
        enabled_capabilities: Iterable[str] | None = None,
        disabled_capabilities: Iterable[str] = (),
        enabled_feature_sets: Iterable[str] | None = None,
        disabled_feature_sets: Iterable[str] = (),
    ) -> GrantPolicy:
        """Build and validate the policy an operator wrote in a server's config.

        Omitted ``enabled_capabilities`` means :data:`DEFAULT_ENABLED_CAPABILITIES`. With the
        defaults, a leaf the operator disables by its exact name is left out of the
        allowlist instead of being reported as allow+deny: the operator wrote one list only,
        so there is no contradiction to refuse, and the grant is the same either way.

        Raises:
            PolicyError: as :meth:`validate`.
        """
        disabled = _as_tuple(disabled_capabilities)
        if enabled_capabilities is None:
            enabled = tuple(p for p in DEFAULT_ENABLED_CAPABILITIES if p not in disabled)
        else:
            enabled = _as_tuple(enabled_capabilities)
        policy = cls(enabled, disabled, enabled_feature_sets, disabled_feature_sets)
        policy.validate()
        return policy

    def validate(self) -> None:
        """Check every pattern, and that no path is both enabled and disabled.

        Raises:
            PolicyError: naming each offending pattern. A path in both lists is malformed
                rather than "deny wins": the two lists disagree and the author meant one of
                them, so we refuse to guess (fail closed).
        """
        lists = {
            "enabled_capabilities": self.enabled_capabilities,
            "disabled_capabilities": self.disabled_capabilities,
            "enabled_feature_sets": self.enabled_feature_sets or (),
            "disabled_feature_sets": self.disabled_feature_sets,
        }
        bad = [
            f"{field}: {pattern!r}"
            for field, patterns in lists.items()
            for pattern in patterns
            if not _is_pattern(pattern)
        ]
        if bad:
            raise PolicyError(
                "malformed patterns (want dot-separated [A-Za-z0-9_:*-] segments): "
                + ", ".join(bad)
            )
        both = sorted(set(self.enabled_capabilities) & set(self.disabled_capabilities))
        if both:
            raise PolicyError(f"capabilities both enabled and disabled: {', '.join(both)}")
        both = sorted(set(self.enabled_feature_sets or ()) & set(self.disabled_feature_sets))
        if both:
            raise PolicyError(f"feature sets both enabled and disabled: {', '.join(both)}")

    def allows_capability(self, path: str) -> bool:
        """Whether this policy alone would grant ``path`` (advertisement not considered)."""
        return (
            path in KNOWN_LEAVES
            and _matches_any(self.enabled_capabilities, path)
            and not _matches_any(self.disabled_capabilities, path)
        )

    def allows_feature_set(self, name: str) -> bool:
        """Whether this policy alone would enable a feature set called ``name``."""
        if self.enabled_feature_sets is not None and not _matches_any(
            self.enabled_feature_sets, name
        ):
            return False
        return not _matches_any(self.disabled_feature_sets, name)


def _is_pattern(pattern: object) -> bool:
    return isinstance(pattern, str) and all(
        _SEGMENT.fullmatch(segment) for segment in pattern.split(".")
    )


def _freeze_reasons(reasons: Mapping[str, str]) -> Mapping[str, str]:
    return types.MappingProxyType(dict(reasons))


@attrs.frozen
class Grant:
    """What one server may do in the current transport epoch.

    Attributes:
        effective: granted leaves. Only these authorize anything.
        denied: advertised but not granted (diagnostic; sent as ``deniedCapabilities``).
        enabled_feature_sets: feature sets whose every ``uses`` leaf is granted and which the
            policy enables.
        disabled_feature_sets: name -> reason (``invalid_uses``, ``missing_capabilities``,
            ``disabled_by_policy``, ``added_since_grant``). Read-only.
        legacy: the server is handled in legacy mode (acts before or without the policy).
    """

    effective: frozenset[str] = frozenset()
    denied: frozenset[str] = frozenset()
    enabled_feature_sets: frozenset[str] = frozenset()
    disabled_feature_sets: Mapping[str, str] = attrs.field(
        factory=dict, converter=_freeze_reasons, hash=False
    )
    legacy: bool = False
    #: :meth:`allows_any_under`'s answers by prefix: a grant never changes, so neither do they
    #: (the prefixes are the daemon's own capability names, a handful).
    _below: dict[str, bool] = attrs.field(factory=dict, init=False, eq=False, hash=False, repr=False)

    @classmethod
    def nothing(cls, *, legacy: bool = False) -> Grant:
        """The grant of nothing: every new transport epoch starts here until the policy is sent."""
        return cls(legacy=legacy)

    def allows(self, path: str) -> bool:
        """True when the leaf ``path`` is granted. A bare parent (``channels``) never is."""
        return path in self.effective

    def allows_any_under(self, prefix: str) -> bool:
        """True when some granted leaf lies strictly beneath ``prefix``.

        For methods gated on "any ``contextHooks.beforeInference.*`` leaf": a server granted
        only inject leaves is still called.
        """
        answer = self._below.get(prefix)
        if answer is None:
            below = prefix + "."
            answer = self._below[prefix] = any(leaf.startswith(below) for leaf in self.effective)
        return answer

    def allows_feature_set(self, name: str) -> bool:
        """True when the feature set ``name`` is enabled."""
        return name in self.enabled_feature_sets

    def to_update_params(self) -> dict[str, list[str]]:
        """The ``featureSets/update`` params (§5.3).

        ``effectiveCapabilities`` is always present, even empty: absent would also mean "grant
        of nothing", but an explicit empty list can't be misread by a lenient server.
        """
        return {
            "effectiveCapabilities": sorted(self.effective),
            "deniedCapabilities": sorted(self.denied),
            "enabled": sorted(self.enabled_feature_sets),
            "disabled": sorted(self.disabled_feature_sets),
        }

    def summary(self) -> dict[str, object]:
        """A short description for a log line or ``status``."""
        return {
            "granted": sorted(self.effective),
            "denied_count": len(self.denied),
            "feature_sets_enabled": sorted(self.enabled_feature_sets),
            "feature_sets_disabled": dict(sorted(self.disabled_feature_sets.items())),
            "legacy": self.legacy,
        }


def compute_grant(manifest: Manifest, policy: GrantPolicy, *, legacy: bool = False) -> Grant:
    """The grant for ``manifest`` under ``policy``: advertised ∩ enabled − disabled.

    Feature sets are derived from the result: a set whose ``uses`` is absent, empty or names a
    leaf outside :data:`KNOWN_LEAVES` is ``invalid_uses``; one using a leaf not granted is
    ``missing_capabilities``; one the policy's feature-set patterns exclude is
    ``disabled_by_policy``.

    Raises:
        PolicyError: the policy is malformed; nothing is granted.
    """
    policy.validate()
    effective = frozenset(path for path in manifest.advertised if policy.allows_capability(path))
    enabled, disabled = _derive_feature_sets(manifest, policy, effective)
    return Grant(
        effective=effective,
        denied=manifest.advertised - effective,
        enabled_feature_sets=enabled,
        disabled_feature_sets=disabled,
        legacy=legacy,
    )


def _derive_feature_sets(
    manifest: Manifest, policy: GrantPolicy, effective: frozenset[str]
) -> tuple[frozenset[str], dict[str, str]]:
    enabled: set[str] = set()
    disabled: dict[str, str] = {}
    for fs in manifest.feature_sets:
        if not fs.uses or not all(path in KNOWN_LEAVES for path in fs.uses):
            disabled[fs.name] = INVALID_USES
        elif not effective.issuperset(fs.uses):
            disabled[fs.name] = MISSING_CAPABILITIES
        elif not policy.allows_feature_set(fs.name):
            disabled[fs.name] = DISABLED_BY_POLICY
        else:
            enabled.add(fs.name)
    return frozenset(enabled), disabled


def narrow_on_manifest_change(
    old_grant: Grant, new_manifest: Manifest, policy: GrantPolicy
) -> Grant:
    """The grant after a manifest change (§17): removals applied, additions never granted.

    The new effective set is ``old ∩ newly advertised ∩ policy``. A feature set the old grant
    did not enable stays disabled (``added_since_grant`` when it is otherwise grantable): new
    authority waits for a fresh grant (a new transport epoch), never arrives by announcement.

    Raises:
        PolicyError: the policy is malformed.
    """
    fresh = compute_grant(new_manifest, policy, legacy=old_grant.legacy)
    effective = old_grant.effective & fresh.effective
    enabled, disabled = _derive_feature_sets(new_manifest, policy, effective)
    for name in enabled - old_grant.enabled_feature_sets:
        disabled[name] = ADDED_SINCE_GRANT
    return Grant(
        effective=effective,
        denied=new_manifest.advertised - effective,
        enabled_feature_sets=enabled & old_grant.enabled_feature_sets,
        disabled_feature_sets=disabled,
        legacy=old_grant.legacy,
    )
