"""The run package's import graph has no cycle, ``TYPE_CHECKING`` and function-level imports
included: the driver gets narrow services (``run.services``), never the engine that made it."""

from __future__ import annotations

import ast
from pathlib import Path

import agui_adapter

PACKAGE = Path(agui_adapter.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    """Every module of the package, and the package modules it imports (anywhere in it)."""
    modules = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            else:
                continue
            for target in targets:
                if target in modules and target != name and not name.startswith(target + "."):
                    graph[name].add(target)
    return graph


def _cycle_through(graph: dict[str, set[str]], start: str) -> list[str] | None:
    """A path start -> ... -> start, if there is one."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for nxt in sorted(graph[node]):
            if nxt == start:
                return [*path, start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, [*path, nxt]))
    return None


def test_the_graph_sees_type_checking_and_late_imports() -> None:
    graph = _graph()
    assert "agui_adapter.run.services" in graph["agui_adapter.run.driver"]
    assert "agui_adapter.run.detached" in graph["agui_adapter.run.driver"]  # ``from agui_adapter.run import detached``
    assert _cycle_through({"a": {"b"}, "b": {"a"}}, "a") == ["a", "b", "a"]


def test_no_module_of_the_run_package_imports_itself_back() -> None:
    graph = _graph()
    cycles = [
        " -> ".join(cycle)
        for name in sorted(graph)
        if name.startswith("agui_adapter.run.") and (cycle := _cycle_through(graph, name)) is not None
    ]
    assert cycles == []


def test_the_driver_and_adoption_never_see_the_engine() -> None:
    graph = _graph()
    for name in ("agui_adapter.run.driver", "agui_adapter.run.adoption", "agui_adapter.run.detached"):
        assert "agui_adapter.run.engine" not in graph[name], name
