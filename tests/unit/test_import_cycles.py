"""No two modules and no two packages of the project import each other, directly or around a loop
(type-checking and function-level imports count: they tie the code as much), and the model that
`services` and `migrations` read is free of pyspark. The layers these leave are drawn in
docs/architecture.md."""

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


def imported_names(path: Path) -> set[str]:
    """Every top-level name `path` imports, wherever in the file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.partition(".")[0])
    return names


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


def package_of(module: str, modules: dict[str, Path]) -> str:
    """The package a module belongs to: itself for a package's `__init__`, else the folder holding it."""
    return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]


def module_graph() -> dict[str, set[str]]:
    modules = module_files()
    return {name: imports_of(path, modules) - {name} for name, path in modules.items()}


def test_no_modules_of_the_project_import_each_other_around_a_loop():
    graph = module_graph()
    assert len(graph) > 100
    assert loops(graph) == []


def test_no_packages_of_the_project_import_each_other_around_a_loop():
    """A package's modules, its `__init__` included, are one node: a package that holds both what its
    subpackages share and what wires them together would loop, so each package is one or the other."""
    modules = module_files()
    packages: dict[str, set[str]] = {}
    for name, imported in module_graph().items():
        packages.setdefault(package_of(name, modules), set()).update(package_of(other, modules) for other in imported)
    graph = {package: found - {package} for package, found in packages.items()}
    assert {"services", "services.capture.connector", "spark_jobs.model", "spark_jobs.sinks.redis"} <= set(graph)
    assert loops(graph) == []


def test_the_model_imports_only_itself_and_no_pyspark():
    """`spark_jobs.model` is what the CLI, the API and the migrations read: importing it starts no JVM."""
    modules = module_files()
    model = {name: path for name, path in modules.items() if name.startswith("spark_jobs.model")}
    assert "spark_jobs.model.config" in model
    for name, path in model.items():
        outside = {other for other in imports_of(path, modules) if not other.startswith("spark_jobs.model")}
        assert not outside, f"{name} imports {outside}"
        assert "pyspark" not in imported_names(path), f"{name} imports pyspark"
