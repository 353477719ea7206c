"""Benchmarks: `python -m gdn_core.bench <name> [options]`, or `gdn-sweep bench <name> ...`.

`main(argv)` dispatches on the first argument through BENCHMARKS, a registry of
name → "module:function". A benchmark module is imported only when chosen, so one with heavy
or optional dependencies costs nothing to the others. To add one, write a module with
`main(argv: list[str] | None) -> int` and register it here.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

BENCHMARKS: dict[str, str] = {
    "kernel": "gdn_core.bench.kernel:main",
    "cp": "gdn_core.bench.cp:main",
    "cp-gdn": "gdn_core.bench.cp_gdn_kernels:main",
    "kernel-pallas": "gdn_core.bench.kernel_pallas:main",
    "memory": "gdn_core.bench.memory:main",
    "step": "gdn_core.bench.step:main",
    "env": "gdn_core.bench.environment:main",
}
"""Benchmark name → "module:function" taking argv (the options after the name)."""


def _usage() -> str:
    width = max(map(len, BENCHMARKS))
    names = "\n".join(f"  {name:<{width}} {target}" for name, target in BENCHMARKS.items())
    return ("usage: python -m gdn_core.bench <name> [options]   (<name> --help for its options)\n"
            f"benchmarks:\n{names}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark named by argv[0] with the remaining arguments; return an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage(), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in BENCHMARKS:
        print(f"benchmark {name!r} is not one of: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    module_name, func_name = BENCHMARKS[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if not (module_name == missing or module_name.startswith(missing + ".")):
            raise  # the module exists but one of its imports is missing: show the real error
        print(f"benchmark {name!r} is registered as {BENCHMARKS[name]}, but module "
              f"{module_name} does not exist in this installation", file=sys.stderr)
        return 2
    return int(getattr(module, func_name)(rest) or 0)


__all__ = ["BENCHMARKS", "main"]
