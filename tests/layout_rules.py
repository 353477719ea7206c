"""The import graph of a package's source, and the circles in it: what the layout tests share.

Read from the source with ast (every `import`, inside functions too), so a lazy import that
closes a circle counts as much as a top-level one. An edge is an explicit import; the implicit
import of a module's parent packages is not one (else every package `__init__` that
re-exports its modules would close a circle with them).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    """The dotted name of the module at `path` (a package's `__init__.py`: the package), for
    a package directory `root`."""
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_modules(root: Path) -> dict[str, Path]:
    """Every module of the package directory `root`: {dotted name: path}."""
    return {module_name(path, root): path for path in sorted(root.rglob("*.py"))}


def imports(path: Path, module: str) -> Iterator[tuple[str, ast.stmt]]:
    """(imported name, statement) for every import in the file of `module`; a relative import
    is resolved against the module's package, and `from x import y` names x.y (the caller
    decides whether that is a module or a name in x)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package[:len(package) - (node.level - 1)]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                yield f"{base}.{alias.name}", node


def import_graph(root: Path) -> dict[str, set[str]]:
    """{module: the package's modules it imports} for the package directory `root`."""
    modules = package_modules(root)
    graph = {}
    for module, path in modules.items():
        deps = set()
        for name, _ in imports(path, module):
            while name and name not in modules:  # x.y a name, not a module: the edge is to x
                name = name.rpartition(".")[0]
            if name and name != module:
                deps.add(name)
        graph[module] = deps
    return graph


def find_circles(graph: dict[str, set[str]]) -> list[str]:
    """Every import circle a depth-first walk of `graph` meets, as `a → b → a`."""
    state: dict[str, str] = {}
    circles = []

    def visit(module: str, trail: list[str]) -> None:
        state[module] = "open"
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == "open":
                circles.append(" → ".join(trail[trail.index(dep):] + [dep]))
            elif dep in graph and dep not in state:
                visit(dep, trail + [dep])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    return circles
