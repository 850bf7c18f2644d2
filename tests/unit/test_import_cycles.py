"""No two modules of the project import each other, directly or around a loop (type-checking and
function-level imports count: they tie the modules as much). Package-level loops between `services`
packages and `migrations` are not held here yet (issue 36; docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

from services.versions import PROJECT_ROOT

PACKAGES = ("services", "spark_jobs", "migrations")


def module_files() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (PROJECT_ROOT / package).rglob("*.py"):
            parts = path.relative_to(PROJECT_ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `path` imports: `from a import b` names the module a.b when there is one."""
    named = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            named |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            named |= {f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                      for alias in node.names}
    return {name for name in named if name in modules}


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))
    return found


def test_loops_finds_a_loop_and_only_that_one():
    assert loops({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert loops({"a": {"b"}, "b": set()}) == []


def test_no_modules_of_the_project_import_each_other_around_a_loop():
    modules = module_files()
    graph = {name: imports_of(path, modules) - {name} for name, path in modules.items()}
    assert len(graph) > 100
    assert loops(graph) == []
