"""The service's folders import downwards only, and no module imports itself through others.

Read from the source (every `import`, inside functions too), so a lazy import that closes a
circle is caught as well as a top-level one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import service
from tests.layout_rules import find_circles

ROOT = Path(service.__file__).parent

# Top to bottom: a module may import its own folder and the folders below it, never above.
# runs sits above planner: the planner reads stored results and never runs or records a sweep
# (recording `plan --fit`'s compiles is runs/fit_record.py's job). schemas, the API's models,
# sit below everything that builds them (routes, CLI, planner, regressions report) and above the
# database, whose rows they are built from: the database never imports an API model.
LAYERS = ["cli", "bench", "demo", "main", "api", "dashboard", "runs", "planner", "regressions",
          "schemas", "db", "core"]


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The service modules `path` imports (a `from service.x import name` counts service.x.name
    when that is a module, else service.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import (the service imports absolutely)"
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            found.update(n if n in MODULES else node.module for n in names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name == "service" or name.startswith("service.")}


MODULES = {_module_name(p): p for p in ROOT.rglob("*.py")}
GRAPH = {name: _imports(path) - {name} for name, path in MODULES.items()}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_every_service_module_belongs_to_a_layer():
    loose = [m for m in MODULES if m != "service" and _layer(m) is None]
    assert not loose, f"modules outside the layers {LAYERS}: {loose}"


def test_imports_point_down_the_layers():
    upward = [f"{m} imports {dep}" for m, deps in GRAPH.items() for dep in deps
              if _layer(m) is not None and _layer(dep) is not None and _layer(dep) < _layer(m)]
    assert not upward, "imports against the layer order:\n" + "\n".join(sorted(upward))


def test_no_import_circle():
    circles = find_circles(GRAPH)
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_checks_see_a_circle_and_an_upward_import():
    """The checks above would fail on a real circle (the foreground → sink → sweep_run → foreground
    kind that issue 11 found) and read lazy imports."""
    assert find_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a → b → c → a"]
    assert find_circles({"a": {"b"}, "b": set()}) == []
    assert "service.runs.run_command" in GRAPH["service.cli.main"]  # imported inside a function
    assert _layer("service.db.crud") > _layer("service.api.routes.sweeps")
    assert _layer("service.planner.capacity") > _layer("service.runs.sweep_run")  # issue 38
    assert _layer("service.api.routes.sweeps") < _layer("service.schemas.sweeps") \
        < _layer("service.db.crud")  # issue 38: the API models' own floor


def test_api_models_live_in_schemas_and_the_database_imports_none():
    """Every pydantic model of the service is in service/schemas (API models) or outside the
    database layer; crud and the queries return rows, never an API model."""
    db_models = [f"{m}.{node.name}" for m, path in MODULES.items()
                 if _layer(m) == LAYERS.index("db")
                 for node in ast.walk(ast.parse(path.read_text()))
                 if isinstance(node, ast.ClassDef)
                 and any(getattr(b, "id", getattr(b, "attr", "")) == "BaseModel"
                         for b in node.bases)]
    assert not db_models, f"pydantic models in service/db (API models: service/schemas): " \
                          f"{db_models}"
    assert not [dep for m, deps in GRAPH.items() if m.startswith("service.db")
                for dep in deps if dep.startswith("service.schemas")]
