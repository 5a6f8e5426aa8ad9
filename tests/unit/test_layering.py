"""Layering: the routing core (``mcpl_router/routing/``) stays pure.

It makes decisions over refs and names; it never touches links, host sessions, the journal,
trio or sockets. This walks every module's imports with :mod:`ast` (so nothing is imported to
check) and fails naming the file, the line and the import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROUTING = Path(__file__).resolve().parents[2] / "mcpl_router" / "routing"
PACKAGE = "mcpl_router.routing"

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
