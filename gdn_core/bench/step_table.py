"""The step table's rendering: an aligned text table, markdown, and the JSON and markdown files
(gdn_core.bench.step's rows, StepRow)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Sequence


def _gib(x: int | None) -> str:
    return "-" if x is None else f"{x / 2**30:.2f}"


def _num(x: float | None, fmt: str, scale: float = 1.0) -> str:
    return "-" if x is None else format(x / scale, fmt)


COLUMNS = ("framework", "kernels", "dtype", "model", "seq", "remat", "status", "step s",
           "tokens/s", "MFU", "peak TFLOP/s", "pred GiB", "mem GiB", "loss first→last",
           "compile s", "wall s")


def _cells(row) -> list[str]:
    loss = f"{row.losses[0]:.3f}→{row.losses[-1]:.3f}" if row.losses else "-"
    return [row.framework, row.kernels, row.dtype, f"{row.preset} x{row.layers}L hybrid",
            str(row.seq_len), row.remat, row.status, _num(row.step_time_s, ".3f"),
            _num(row.tokens_per_s, ",.0f"), _num(row.mfu, ".1%"),
            _num(row.peak_flops_per_s, ".4g", 1e12), _gib(row.predicted_memory_bytes),
            _gib(row.peak_memory_bytes), loss,
            _num(row.compile_time_s or None, ".0f"), _num(row.wall_s, ".0f")]


def _notes(row) -> str:
    label = f"{row.framework} {row.kernels} {row.dtype}"
    if not row.ok:
        return f"{label}: {row.status.upper()}: {row.reason}"
    times = [round(t, 4) for t in row.step_times_s]
    return (f"{label}: GDN {row.gdn_kernel}; attention {row.attention_kernel}; device "
            f"{row.device_name!r}; peak {row.peak_source}; memory {row.memory_source}; "
            f"step times {times}")


def format_table(rows: Sequence) -> str:
    """The rows as an aligned text table, then each row's kernels and sources, or its reason."""
    cells = [list(COLUMNS)] + [_cells(row) for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    text = ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells]
    return "\n".join(text + [_notes(row) for row in rows])


def format_markdown(rows: Sequence) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in rows]
    return "\n".join(lines + [""] + [f"- {_notes(row)}" for row in rows]) + "\n"


def write_outputs(rows: Sequence, out_dir: str) -> list[pathlib.Path]:
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "step-table.json", out / "step-table.md"]
    paths[0].write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1) + "\n")
    paths[1].write_text(format_markdown(rows))
    return paths


__all__ = ["COLUMNS", "format_markdown", "format_table", "write_outputs"]
