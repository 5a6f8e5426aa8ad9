"""What a host author copies type-checks (issue 25 item 9): every docs/client.md example marked
``<!-- checked: mypy --strict -->`` and every program in ``examples/`` pass ``mypy --strict``
against the client as it is (its own modules' errors are the type gate's, not these)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MARK = "<!-- checked: mypy --strict (tests/unit/test_client_docs.py) -->"


def checked_blocks(text: str) -> list[str]:
    return re.findall(re.escape(MARK) + r"\n```python\n(.*?)```", text, re.DOTALL)


def test_the_marked_examples_and_the_example_programs_pass_mypy_strict(tmp_path: Path) -> None:
    if shutil.which("mypy") is None and subprocess.run([sys.executable, "-m", "mypy", "--version"], capture_output=True).returncode:
        pytest.skip("mypy is not installed")
    blocks = checked_blocks((REPO / "docs" / "client.md").read_text())
    assert len(blocks) >= 2, "the marked examples went missing"
    files = []
    for number, block in enumerate(blocks):
        path = tmp_path / f"client_md_example_{number}.py"
        path.write_text(block)
        files.append(str(path))
    files += [str(path) for path in sorted((REPO / "examples").glob("*.py"))]
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-error-summary",
         "--cache-dir", str(tmp_path / "cache"), *files],
        capture_output=True, text=True, cwd=REPO, timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
