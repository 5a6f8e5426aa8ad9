"""docs/errors.md lists every JSON-RPC error code and every refusal reason/kind the daemon emits.

The emitted strings are found in the source: every ``-32xxx`` literal, every module-level
``REASON_*``/``BOUNCE_*``/``KIND_*`` constant whose value is a slug, and every slug passed as
``reason=`` or given as a ``"reason"`` dict value. Add a reason or a code → document it.
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


def _sources() -> list[Path]:
    # The fixture server and test helpers are not the daemon.
    return [path for path in PACKAGE.rglob("*.py") if "testing" not in path.relative_to(PACKAGE).parts]


def emitted() -> tuple[set[str], set[str]]:
    """(error codes, reasons and kinds) the daemon's source can emit."""
    codes: set[str] = set()
    reasons: set[str] = set()
    for path in _sources():
        text = path.read_text()
        codes.update(re.findall(r"-32[0-9]{3}\b", text))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.AnnAssign | ast.Assign):
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


def test_every_code_and_reason_the_daemon_emits_is_in_errors_md() -> None:
    codes, reasons = emitted()
    missing = sorted((codes | reasons) - documented())
    assert not missing, f"docs/errors.md lacks: {', '.join(missing)} (add each with what it means and what to do)"
