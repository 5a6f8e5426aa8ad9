"""Layering: the routing core (``mcpl_router/routing/``) stays pure; the tools don't see the daemon.

(The floors every import goes down, and the absence of import circles, are
``tests/unit/test_floors.py``'s.)

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

from mcpl_router.routing.modes import MODE_NAMES

ROUTING = Path(__file__).resolve().parents[2] / "mcpl_router" / "routing"
PACKAGE = "mcpl_router.routing"
SOURCE = ROUTING.parent
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
    return sorted(ROUTING.rglob("*.py"))


def test_there_are_routing_modules_to_check() -> None:
    names = {path.relative_to(ROUTING).as_posix() for path in routing_modules()}
    assert {"refs.py", "registry.py", "names.py", "texts/agent.py", "modes/base.py", "modes/named.py"} <= names


@pytest.mark.parametrize("path", routing_modules(), ids=lambda p: p.relative_to(ROUTING).as_posix())
def test_routing_module_imports_nothing_impure(path: Path) -> None:
    violations = [
        f"{path.name}:{line}: imports {module}"
        for line, module in imported_modules(path.read_text(encoding="utf-8"), _package_of(path))
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


# ---------------------------------------------------------------------- the daemon is only wired

#: The modules that may build a daemon: the command line and the demo (and the daemon itself),
#: supervision.py, which runs one under signals and systemd for both, and a cluster's node,
#: which builds one for each term it holds the links.
ENTRY_POINTS = frozenset({"cli.py", "demo.py", "daemon.py", "supervision.py", "cluster/node.py"})


def _is_the_daemon(module: str) -> bool:
    return module == DAEMON or module.startswith(DAEMON + ".")


def _package_of(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts if path.name == "__init__.py" else parts[:-1]).removesuffix(".__init__")


def package_modules() -> list[Path]:
    return sorted(SOURCE.rglob("*.py"))


def test_there_are_package_modules_to_check() -> None:
    names = {path.relative_to(SOURCE).as_posix() for path in package_modules()}
    assert {"daemon.py", "cli.py", "tools/seam.py", "tools/table.py", "turns/manager.py", "hosts/sessions.py"} <= names


@pytest.mark.parametrize("path", package_modules(), ids=lambda p: p.relative_to(SOURCE).as_posix())
def test_only_the_entry_points_import_the_daemon(path: Path) -> None:
    if path.relative_to(SOURCE).as_posix() in ENTRY_POINTS:
        return
    violations = [
        f"{path.relative_to(SOURCE)}:{line}: imports {module}"
        for line, module in imported_modules(path.read_text(encoding="utf-8"), _package_of(path))
        if _is_the_daemon(module)
    ]
    assert not violations, "the daemon hands each part its collaborators; only the entry points import it:\n" + "\n".join(violations)


def mode_name_comparisons(source: str) -> list[tuple[int, str]]:
    """Every comparison (``==``, ``!=``, ``in``, ``not in``, ``match`` case) against a mode's name."""
    names = set(MODE_NAMES)

    def mode_names_in(node: ast.AST) -> list[str]:
        if isinstance(node, ast.Constant) and node.value in names:
            return [node.value]
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return [elt.value for elt in node.elts if isinstance(elt, ast.Constant) and elt.value in names]
        return []

    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                found.extend((node.lineno, name) for name in mode_names_in(operand))
        elif isinstance(node, ast.MatchValue):
            found.extend((node.lineno, name) for name in mode_names_in(node.value))
    return found


@pytest.mark.parametrize("path", package_modules(), ids=lambda p: p.relative_to(SOURCE).as_posix())
def test_no_mode_name_is_compared_outside_the_modes(path: Path) -> None:
    relative = path.relative_to(SOURCE).as_posix()
    if relative.startswith("routing/modes/"):
        return
    violations = [f"{relative}:{line}: compares {name!r}" for line, name in mode_name_comparisons(path.read_text(encoding="utf-8"))]
    assert not violations, "ask the agent's ProseMode instead (routing/modes/):\n" + "\n".join(violations)


@pytest.mark.parametrize(
    "source",
    ['mode == "named"', 'run.mode in ("disabled", "named")', '"hybrid" != mode', 'match m:\n    case "explicit":\n        pass'],
)
def test_the_mode_checker_catches_each_form(source: str) -> None:
    assert mode_name_comparisons(source)


@pytest.mark.parametrize("source", ['action == "kept"', 'mode.name', '{"locus": 1}', 'x == "disabledness"'])
def test_the_mode_checker_allows_other_strings(source: str) -> None:
    assert not mode_name_comparisons(source)


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


@pytest.mark.parametrize("source", ["from mcpl_router.turns import TurnManager", "from . import seam", "import mcpl_router.daemonish"])
def test_the_daemon_checker_allows_other_imports(source: str) -> None:
    assert not any(_is_the_daemon(module) for _, module in imported_modules(source, TOOLS_PACKAGE))
