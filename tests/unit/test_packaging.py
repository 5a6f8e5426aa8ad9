"""What a packager and a container platform check (issue 25 item 7): the project's metadata,
the Dockerfile's lint and user, and the systemd unit."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _needed_tool(name: str) -> str:
    """The path of ``name``; CI must have it (it installs it from the repo's files), a
    developer's machine may skip."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed; .ci/run installs it")
        pytest.skip(f"{name} is not installed")
    return path


def test_the_license_is_an_spdx_expression_with_its_file() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["license"] == "MIT"
    assert project["project"]["license-files"] == ["LICENSE"]
    assert "MIT License" in (REPO / "LICENSE").read_text()
    # A license classifier beside an SPDX expression is refused by setuptools ≥ 77.
    classifiers = project["project"]["classifiers"]
    assert "Typing :: Typed" in classifiers and not any(c.startswith("License ::") for c in classifiers)
    assert project["project"]["urls"]
    # The range in which `license = "MIT"` builds (77.0.3 reads it; the table form goes away).
    assert project["build-system"]["requires"] == ["setuptools>=77.0.3,<86"]


def test_the_dockerfile_is_hadolint_clean_and_runs_as_a_numeric_user() -> None:
    dockerfile = REPO / "Dockerfile"
    users = re.findall(r"^USER\s+(\S+)\s*$", dockerfile.read_text(), re.MULTILINE)
    # Kubernetes' runAsNonRoot can verify only a numeric user.
    assert users == ["10001:10001"]
    hadolint = _needed_tool("hadolint")
    lint = subprocess.run([hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_systemd_unit_is_type_notify_and_verifies(tmp_path: Path) -> None:
    unit_text = (REPO / "deploy" / "mcpl-router.service").read_text()
    settings = dict(line.split("=", 1) for line in unit_text.splitlines() if re.match(r"^[A-Z]\w*=", line))
    assert settings["Type"] == "notify" and settings["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert settings["ExecStart"].endswith("mcpl-router run --config /etc/mcpl-router/config.toml")
    # Exit 2 is a refused start (docs/operations.md): a restart loop would not fix it.
    assert settings["RestartPreventExitStatus"] == "2"
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    # The unit as it is, its ExecStart pointed at a program this machine has.
    unit = tmp_path / "mcpl-router.service"
    unit.write_text(unit_text.replace("/usr/local/bin/mcpl-router", "/bin/true"))
    verify = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    problems = [line for line in (verify.stdout + verify.stderr).splitlines() if "mcpl-router.service" in line]
    assert verify.returncode == 0 and not problems, verify.stdout + verify.stderr
