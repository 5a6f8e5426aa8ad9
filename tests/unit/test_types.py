"""The type gate (issue 27 item 5): ``mypy --strict`` over the package has nothing to say.
It runs in the README's test command, so ``.ci/run`` holds it on every change."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_mypy_strict_over_the_package_finds_nothing(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(tmp_path / "cache"), "mcpl_router"],
        capture_output=True, text=True, cwd=REPO, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
