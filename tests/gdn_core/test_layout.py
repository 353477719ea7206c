"""gdn_core's shape as a package: no import circle, nothing imported beyond the math's own
dependencies, only the benchmarks import the benchmarks, and no source file over the size
limit (gdn_core, workers and service alike: the acceptance criterion of issue 22).

Read from the source (tests/layout_rules.py: every `import`, inside functions too).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import gdn_core
from tests.layout_rules import find_circles, import_graph, imports, package_modules

ROOT = Path(gdn_core.__file__).parent
REPO = ROOT.parent
GRAPH = import_graph(ROOT)

ALLOWED_PACKAGES = {"numpy", "torch", "jax", "optax"}
"""What gdn_core may import besides the standard library and itself (docs/architecture.md)."""
OPTIONAL_PACKAGES = {"fla": "flash-linear-attention: bench kernel's GPU anchor, fused torch GDN",
                     "triton": "fla's kernels on a CPU, under Triton's interpreter",
                     "transformers": "bench kernel's reference rule"}
"""Imported only inside a `try` that handles their absence: what a benchmark compares with."""
MAX_LINES = 450
SIZE_CHECKED = ("gdn_core", "workers", "service")


def test_no_import_circle():
    circles = find_circles(GRAPH)
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_graph_sees_relative_and_lazy_imports():
    """The check above reads relative imports and imports inside functions, and would fail on
    the circle issue 22 removed (attention → layer → params → attention, the last lazy)."""
    assert "gdn_core.jax_gdn.train" in GRAPH["gdn_core.jax_gdn.cp.step"]  # from ..train import
    assert "gdn_core.jax_gdn.virtual_chips" in GRAPH["gdn_core.jax_gdn.plan"]  # inside main()
    assert find_circles({"gdn_core.jax_gdn.attention": {"gdn_core.jax_gdn.layer"},
                         "gdn_core.jax_gdn.layer": {"gdn_core.jax_gdn.params"},
                         "gdn_core.jax_gdn.params": {"gdn_core.jax_gdn.attention"}}) == [
        "gdn_core.jax_gdn.attention → gdn_core.jax_gdn.layer → gdn_core.jax_gdn.params → "
        "gdn_core.jax_gdn.attention"]


def test_only_the_benchmarks_import_the_benchmarks():
    outside = [f"{module} imports {dep}" for module, deps in GRAPH.items() for dep in deps
               if dep.startswith("gdn_core.bench") and not module.startswith("gdn_core.bench")]
    assert not outside, "\n".join(sorted(outside))


def _handles_import_error(node: ast.Try) -> bool:
    names = set()
    for handler in node.handlers:
        kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        names.update(getattr(kind, "id", None) for kind in kinds)
    return bool(names & {"ImportError", "ModuleNotFoundError", "Exception", None})


def _guarded_imports(path: Path) -> set[int]:
    """The lines of the imports inside the body of a `try` that handles an ImportError."""
    tree = ast.parse(path.read_text(), str(path))
    return {node.lineno for guard in ast.walk(tree) if isinstance(guard, ast.Try)
            and _handles_import_error(guard) for statement in guard.body
            for node in ast.walk(statement) if isinstance(node, (ast.Import, ast.ImportFrom))}


def test_imports_nothing_beyond_numpy_torch_jax_optax_and_the_standard_library():
    allowed = ALLOWED_PACKAGES | set(sys.stdlib_module_names) | {"gdn_core"}
    found = []
    for module, path in package_modules(ROOT).items():
        guarded = _guarded_imports(path)
        for name, node in imports(path, module):
            top = name.split(".")[0]
            if top in allowed or (top in OPTIONAL_PACKAGES and node.lineno in guarded):
                continue
            found.append(f"{module}: {name}" + (" (optional: import it inside a try)"
                                                if top in OPTIONAL_PACKAGES else ""))
    assert not found, "imports outside numpy, torch, jax, optax and the stdlib:\n" + "\n".join(
        sorted(found))


def test_no_source_file_over_the_size_limit():
    sizes = {path.relative_to(REPO): len(path.read_text().splitlines())
             for folder in SIZE_CHECKED for path in (REPO / folder).rglob("*.py")}
    over = sorted(f"{path}: {lines} lines" for path, lines in sizes.items() if lines > MAX_LINES)
    assert not over, f"over {MAX_LINES} lines (split by job):\n" + "\n".join(over)
