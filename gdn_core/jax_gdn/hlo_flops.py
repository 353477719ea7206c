"""Matmul FLOPs one chip runs per execution of a compiled XLA program, read from its HLO text.

XLA's own `compiled.cost_analysis()["flops"]` counts a while loop's body once, whatever its
trip count, so for a model whose layers and chunks run under `lax.scan` it undercounts by the
depth times the chunks. Here every `dot` and `convolution` is counted as often as its
computation runs (hlo_comm's call graph: a while body once per known trip, fusions and calls
as their call sites), with

    dot          2 · (result elements) · (product of the lhs contracting dimensions)
    convolution  2 · (result elements) · (kernel elements ÷ output features)

Elementwise work (exp, the gates, norms) is left out: it is a small share of a GDN step and
its cost depends on what the backend fuses. The program of an SPMD partitioned step is one
chip's, so the figure is per chip.
"""

from __future__ import annotations

import math
import re

from .hlo_comm import _ARRAY, _multipliers, _operands, _parse

_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,\s]*)\}")
_DIM_LABELS = re.compile(r"dim_labels=\w+_(\w+)->\w+")


def _dims(shape_text: str) -> list[int]:
    """Dimensions of the first array of an HLO shape."""
    array = _ARRAY.search(shape_text or "")
    if array is None:
        return []
    return [int(d.strip().lstrip("<=")) for d in array[2].split(",") if d.strip()]


def _dot_flops(result: list[int], lhs: list[int], attrs: str) -> int:
    contracting = _CONTRACTING.search(attrs)
    axes = [int(a) for a in contracting[1].split(",") if a.strip()] if contracting else []
    return 2 * math.prod(result) * math.prod(lhs[a] for a in axes)


def _conv_flops(result: list[int], kernel: list[int], attrs: str) -> int:
    labels = _DIM_LABELS.search(attrs)
    if labels is None or "o" not in labels[1] or len(labels[1]) != len(kernel):
        raise ValueError(f"convolution without readable dim_labels: {attrs[:200]}")
    out_features = kernel[labels[1].index("o")]
    return 2 * math.prod(result) * (math.prod(kernel) // max(out_features, 1))


def matmul_flops_per_chip(compiled_or_hlo_text) -> dict:
    """FLOPs of the program's dots and convolutions per execution, loop trips counted.

    Returns {"flops": int, "ops": int (instructions counted), "trip_count_unknown": bool (a
    while loop without XLA's known_trip_count was counted once)}.
    """
    text = compiled_or_hlo_text if isinstance(compiled_or_hlo_text, str) else (
        compiled_or_hlo_text.as_text())
    instructions, calls = _parse(text)
    if not instructions:
        return {"flops": 0, "ops": 0, "trip_count_unknown": False}
    shapes = {(comp, name): shape for comp, name, shape, *_ in instructions}
    entry = re.search(r"^\s*ENTRY\s+%?([\w.\-]+)", text, re.M)
    times, unknown = _multipliers(calls, entry[1] if entry else instructions[0][0])
    flops, ops, guessed = 0, 0, False
    for computation, name, shape, op, attrs in instructions:
        if op not in ("dot", "convolution"):
            continue
        operands = _operands(attrs)
        if len(operands) < 2:
            raise ValueError(f"{op} %{name} has {len(operands)} operand(s)")
        lhs, rhs = ((printed or shapes.get((computation, ref), "")) for ref, printed in
                    operands[:2])
        result = _dims(shape)
        count = (_dot_flops(result, _dims(lhs), attrs) if op == "dot"
                 else _conv_flops(result, _dims(rhs), attrs))
        flops += count * times.get(computation, 0)
        ops += 1
        guessed |= unknown.get(computation, False)
    return {"flops": int(flops), "ops": ops, "trip_count_unknown": guessed}


__all__ = ["matmul_flops_per_chip"]
