"""Layering: the routing core (``mcpl_router/routing/``) stays pure; the tools don't see the daemon.

The routing core makes decisions over refs and names; it never touches links, host sessions,
the journal, trio or sockets. The tool providers (``mcpl_router/tools/``) are given what they
use at construction and never import :mod:`mcpl_router.daemon`, not even for a type. This walks
every module's imports with :mod:`ast` (so nothing is imported to check, and imports under
``TYPE_CHECKING`` are seen) and fails naming the file, the line and the import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROUTING = Path(__file__).resolve().parents[2] / "mcpl_router" / "routing"
PACKAGE = "mcpl_router.routing"
TOOLS = ROUTING.parent / "tools"
TOOLS_PACKAGE = "mcpl_router.tools"
DAEMON = "mcpl_router.daemon"

FORBIDDEN = (
    "mcpl_router.mcpl",
    "mcpl_router.hosts",
    "mcpl_router.store",
    "trio",
    "trio_websocket",
    "asyncio",
    "socket",
    "socketserver",
    "ssl",
    "selectors",
    "websockets",
)


def _is_forbidden(module: str) -> bool:
    return any(module == bad or module.startswith(bad + ".") for bad in FORBIDDEN)


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The absolute module an ImportFrom names, resolving ``from ..x import y``."""
    if node.level == 0:
        return node.module or ""
    parts = package.split(".")
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imported_modules(source: str, package: str = PACKAGE) -> list[tuple[int, str]]:
    """Every module a source imports, with its line: ``import``, ``from``, and
    ``importlib.import_module("...")`` / ``__import__("...")`` with a literal name."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, package)
            found.append((node.lineno, module))
            # "from mcpl_router import mcpl" imports the subpackage by its attribute name.
            found.extend((node.lineno, f"{module}.{alias.name}") for alias in node.names)
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def routing_modules() -> list[Path]:
    return sorted(ROUTING.glob("*.py"))


def test_there_are_routing_modules_to_check() -> None:
    names = {path.name for path in routing_modules()}
    assert {"refs.py", "registry.py", "names.py", "texts.py"} <= names


@pytest.mark.parametrize("path", routing_modules(), ids=lambda p: p.name)
def test_routing_module_imports_nothing_impure(path: Path) -> None:
    violations = [
        f"{path.name}:{line}: imports {module}"
        for line, module in imported_modules(path.read_text(encoding="utf-8"))
        if _is_forbidden(module)
    ]
    assert not violations, "routing/ must stay pure:\n" + "\n".join(violations)


@pytest.mark.parametrize(
    "source",
    [
        "import trio",
        "import trio.lowlevel",
        "import socket",
        "from mcpl_router.mcpl import link",
        "from mcpl_router import hosts",
        "from ..store import journal",
        "from .. import mcpl",
        "import importlib\nimportlib.import_module('mcpl_router.store.journal')",
        "__import__('trio')",
    ],
)
def test_the_checker_catches_each_form(source: str) -> None:
    assert any(_is_forbidden(module) for _, module in imported_modules(source))


@pytest.mark.parametrize(
    "source",
    ["import attrs", "from mcpl_router.routing.refs import ChannelRef", "from . import texts",
     "import triomphe", "from mcpl_router.mcplx import y"],
)
def test_the_checker_allows_pure_imports(source: str) -> None:
    assert not any(_is_forbidden(module) for _, module in imported_modules(source))


# ---------------------------------------------------------------------- tools/ and the daemon


def _is_the_daemon(module: str) -> bool:
    return module == DAEMON or module.startswith(DAEMON + ".")


def tools_modules() -> list[Path]:
    return sorted(TOOLS.glob("*.py"))


def test_there_are_tools_modules_to_check() -> None:
    names = {path.name for path in tools_modules()}
    assert {"__init__.py", "seam.py", "table.py", "channel_tools.py", "connector_tools.py"} <= names


@pytest.mark.parametrize("path", tools_modules(), ids=lambda p: p.name)
def test_tools_module_does_not_import_the_daemon(path: Path) -> None:
    violations = [
        f"{path.name}:{line}: imports {module}"
        for line, module in imported_modules(path.read_text(encoding="utf-8"), TOOLS_PACKAGE)
        if _is_the_daemon(module)
    ]
    assert not violations, "tools/ gets its collaborators at construction, not the daemon:\n" + "\n".join(violations)


@pytest.mark.parametrize(
    "source",
    [
        "from mcpl_router.daemon import Daemon",
        "import mcpl_router.daemon",
        "from mcpl_router import daemon",
        "from .. import daemon",
        "from ..daemon import Daemon",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mcpl_router.daemon import Daemon",
    ],
)
def test_the_daemon_checker_catches_each_form(source: str) -> None:
    assert any(_is_the_daemon(module) for _, module in imported_modules(source, TOOLS_PACKAGE))


@pytest.mark.parametrize("source", ["from mcpl_router.turn_runner import TurnManager", "from . import seam", "import mcpl_router.daemonish"])
def test_the_daemon_checker_allows_other_imports(source: str) -> None:
    assert not any(_is_the_daemon(module) for _, module in imported_modules(source, TOOLS_PACKAGE))
