"""The floors (issue 27 item 1): every import goes down, and no import makes a circle.

The package is built in floors, each importing only floors below it (docs/architecture.md):

    foundation   logs, errors, exit_codes  <  jsonrpc
    the core     routing (pure; the package face re-exports its refs)
    reading      config  <  store, client
    events       the domain events and their one dispatcher; what a host is told (host_notices)
    links        mcpl, testing (the fixture servers)
    the shell    inference, turns  <  tools  <  hosts
    application  health, reload_plan, query  <  metrics  <  servers_view  <  read_model  <  daemon  <  cluster  <  supervision  <  demo  <  cli  <  __main__

What a lower floor needs of a higher one is a small protocol in the lower floor (turns/ports.py,
inference/ports.py, HostLink, WakeCounts, MetricsPage), which the higher one implements. Every
import counts, those under ``if TYPE_CHECKING:`` and inside functions included: a circle a
type checker sees is a circle a reader has to hold in their head. Walked with :mod:`ast`; the
failures name the file, the line and the import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "mcpl_router"

#: Each unit (a subpackage, or a top-level module) in floor order: a unit imports only units
#: before it. Units on one line of the docstring are listed in the order their imports need.
ORDER: tuple[str, ...] = (
    "logs", "errors", "exit_codes",
    "jsonrpc",
    "routing", "__init__",
    "config",
    "store", "client",
    "events", "host_notices",
    "mcpl", "testing",
    "inference", "turns",
    "tools",
    "hosts",
    "status_model", "status_page", "health", "reload_plan", "query",
    "metrics",
    "servers_view",
    "read_model",
    "daemon",
    "cluster",
    "supervision",
    "demo",
    "cli",
    "__main__",
)  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(source: str, module: str, is_package: bool, known: Iterable[str]) -> list[tuple[int, str]]:
    """Every module of the package ``source`` imports (resolved to the module it names:
    ``from mcpl_router.routing import texts`` is ``mcpl_router.routing.texts``), with its line."""
    known = set(known)

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            names = [f"{base}.{alias.name}" for alias in node.names]
        for name in names:
            if name.startswith("mcpl_router"):
                target = resolve(name)
                if target is not None and target != module:
                    found.append((node.lineno, target))
    return found


def import_graph() -> tuple[dict[str, list[tuple[int, str]]], dict[str, Path]]:
    paths = {module_name(path): path for path in sorted(SOURCE.rglob("*.py"))}
    graph = {
        module: imports_of(path.read_text(encoding="utf-8"), module, path.name == "__init__.py", paths)
        for module, path in paths.items()
    }
    return graph, paths


def upward_imports(graph: Mapping[str, list[tuple[int, str]]], order: tuple[str, ...] = ORDER) -> list[str]:
    """Each import of a unit by a unit not above it in ``order`` (or of a unit with no floor)."""
    rank = {unit: index for index, unit in enumerate(order)}
    found = []
    for module, imports in graph.items():
        here = unit_of(module)
        for line, target in imports:
            there = unit_of(target)
            if here == there:
                continue
            if here not in rank or there not in rank:
                found.append(f"{module}:{line}: {target} ({here if here not in rank else there} has no floor: add it to ORDER)")
            elif rank[there] >= rank[here]:
                found.append(f"{module}:{line}: imports {target}, a floor above or beside {here}")
    return found


def circles(graph: Mapping[str, list[tuple[int, str]]]) -> list[list[str]]:
    """The import circles (Tarjan's strongly connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep chain of imports can't hit the recursion limit.
        work = [(start, iter([target for _, target in graph.get(start, [])]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter([t for _, t in graph.get(target, [])])))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for module in graph:
        if module not in index:
            visit(module)
    return found


def test_every_unit_has_a_floor() -> None:
    graph, _ = import_graph()
    units = {unit_of(module) for module in graph}
    assert not units - set(ORDER), f"units with no floor: {sorted(units - set(ORDER))}"
    assert not set(ORDER) - units, f"floors for units that are gone: {sorted(set(ORDER) - units)}"


def test_every_import_goes_down_the_floors() -> None:
    graph, _ = import_graph()
    found = upward_imports(graph)
    assert not found, "imports against the floors (a lower floor asks through a protocol of its own):\n" + "\n".join(found)


def test_no_import_makes_a_circle() -> None:
    graph, _ = import_graph()
    assert not circles(graph), f"import circles: {circles(graph)}"


# -- the checkers catch what they are for ---------------------------------------------------------


def test_the_floor_checker_catches_an_upward_import_even_a_type_only_one() -> None:
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mcpl_router.hosts.sessions import SessionManager\n"
    known = ["mcpl_router.hosts.sessions", "mcpl_router.turns.manager"]
    graph = {"mcpl_router.turns.manager": imports_of(source, "mcpl_router.turns.manager", False, known)}
    assert upward_imports(graph) == [
        "mcpl_router.turns.manager:3: imports mcpl_router.hosts.sessions, a floor above or beside turns"
    ]


def test_the_floor_checker_reads_relative_and_attribute_imports() -> None:
    known = ["mcpl_router.tools", "mcpl_router.tools.table", "mcpl_router.turns.manager", "mcpl_router.turns"]
    relative = imports_of("from ..tools import table\n", "mcpl_router.turns.manager", False, known)
    assert relative == [(1, "mcpl_router.tools.table")]
    assert upward_imports({"mcpl_router.turns.manager": relative})
    # A sibling inside the unit is no floor crossing.
    assert upward_imports({"mcpl_router.turns.manager": [(1, "mcpl_router.turns")]}) == []


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": [(1, "b")], "b": [(1, "a")]}, [["a", "b"]]),
        ({"a": [(1, "b")], "b": [(1, "c")], "c": [(1, "a")], "d": [(1, "a")]}, [["a", "b", "c"]]),
        ({"a": [(1, "b")], "b": [(1, "c")], "c": []}, []),
    ],
)
def test_the_circle_checker_finds_each_circle(graph: dict[str, list[tuple[int, str]]], expected: list[list[str]]) -> None:
    assert circles(graph) == expected
