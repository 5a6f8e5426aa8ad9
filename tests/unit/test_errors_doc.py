"""docs/errors.md lists every JSON-RPC error code and every refusal reason/kind the daemon emits.

The emitted strings are found in the source: every ``-32xxx`` literal, every module-level
``REASON_*``/``BOUNCE_*``/``KIND_*`` constant whose value is a slug, every member of a string
enum (``enum.StrEnum``: the reasons kept beside their sentences), and every slug passed as
``reason=`` or given as a ``"reason"`` dict value. Add a reason or a code → document it. A
string enum whose values only label ``/metrics`` (a server reads its sentence) is listed in
docs/operations.md's metrics table instead.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "mcpl_router"
DOC = REPO / "docs" / "errors.md"
_SLUG = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
_CONSTANT = re.compile(r"(?:REASON|BOUNCE|KIND)_[A-Z_]+")
#: Metric labels and internal markers that never reach a host, server or agent.
_NOT_EMITTED = {"before-policy"}
#: String enums whose values only label ``/metrics``: what reaches the server is the sentence.
_METRIC_LABELS_ONLY = {"RegistrationRefusal"}
OPERATIONS = REPO / "docs" / "operations.md"


def _sources() -> list[Path]:
    # The fixture server and test helpers are not the daemon.
    return [path for path in PACKAGE.rglob("*.py") if "testing" not in path.relative_to(PACKAGE).parts]


def _is_str_enum(node: ast.ClassDef) -> bool:
    return any(isinstance(base, ast.Name | ast.Attribute) and ast.unparse(base) in {"StrEnum", "enum.StrEnum"} for base in node.bases)


def _enum_values(node: ast.ClassDef) -> set[str]:
    """The slug values of a string enum's members."""
    return {
        statement.value.value
        for statement in node.body
        if isinstance(statement, ast.Assign) and isinstance(statement.value, ast.Constant)
        and isinstance(statement.value.value, str) and _SLUG.fullmatch(statement.value.value)
    }


def metric_label_enums() -> dict[str, set[str]]:
    """The values of each string enum that only labels ``/metrics``, by class name."""
    found: dict[str, set[str]] = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and _is_str_enum(node) and node.name in _METRIC_LABELS_ONLY:
                found[node.name] = _enum_values(node)
    return found


def emitted() -> tuple[set[str], set[str]]:
    """(error codes, reasons and kinds) the daemon's source can emit."""
    codes: set[str] = set()
    reasons: set[str] = set()
    for path in _sources():
        text = path.read_text()
        codes.update(re.findall(r"-32[0-9]{3}\b", text))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and _is_str_enum(node) and node.name not in _METRIC_LABELS_ONLY:
                reasons.update(_enum_values(node))
            elif isinstance(node, ast.AnnAssign | ast.Assign):
                targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                value = node.value
                if any(_CONSTANT.fullmatch(name) for name in names) and isinstance(value, ast.Constant):
                    if isinstance(value.value, str) and _SLUG.fullmatch(value.value):
                        reasons.add(value.value)
            elif isinstance(node, ast.keyword) and node.arg == "reason":
                if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str) and _SLUG.fullmatch(node.value.value):
                    reasons.add(node.value.value)
            elif isinstance(node, ast.Dict):
                for key, value in zip(node.keys, node.values, strict=True):
                    if isinstance(key, ast.Constant) and key.value == "reason" and isinstance(value, ast.Constant):
                        if isinstance(value.value, str) and _SLUG.fullmatch(value.value):
                            reasons.add(value.value)
    return codes, reasons - _NOT_EMITTED


def documented() -> set[str]:
    return set(re.findall(r"`([^`\s]+)`", DOC.read_text()))


def test_the_scan_finds_what_it_should() -> None:
    """A scan that found nothing would pass vacuously."""
    codes, reasons = emitted()
    assert {"-32002", "-32010", "-32017", "-32023", "-32050", "-32052"} <= codes
    assert {"not-granted", "unknown-position", "takes-no-posts", "unknown-target", "no-target",
            "ambiguous-target", "unsent-unavailable", "bad-action", "shared-id", "ambiguous"} <= reasons
    # The string enums' members: a delivery's, an inference refusal's, a dropped chunk's, a
    # host connection refused or timed out.
    assert {"server-unavailable", "unconfirmed", "no-host", "unknown-request", "too-many-connections", "no-hello"} <= reasons
    assert {"outside-patterns", "duplicate-in-call", "malformed"} <= metric_label_enums()["RegistrationRefusal"]


def test_every_code_and_reason_the_daemon_emits_is_in_errors_md() -> None:
    codes, reasons = emitted()
    missing = sorted((codes | reasons) - documented())
    assert not missing, f"docs/errors.md lacks: {', '.join(missing)} (add each with what it means and what to do)"


def test_every_metric_only_reason_is_in_operations_md() -> None:
    """A reason that only labels ``/metrics`` is named in docs/operations.md's metrics table."""
    listed = set(re.findall(r"`([^`\s]+)`", OPERATIONS.read_text()))
    missing = sorted(value for values in metric_label_enums().values() for value in values if value not in listed)
    assert not missing, f"docs/operations.md lacks the metric labels: {', '.join(missing)}"
