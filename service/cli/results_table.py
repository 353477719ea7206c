"""`gdn-sweep results`' terminal table: one format per column, memory in GiB, and a trial's
CP mode in the CLI's words (service.runs.progress.mode_label: `1 chip (no CP)`, not `none`).

A column's numbers share one format (fixed decimals, never `%g`: `2.119e+04` beside `9738`
cannot be compared by eye); an interpreted run's speeds read `interpreted` (a correctness run,
service/db/interpreted.py) and its kernels `fused (interpreted)`; an empty cell is a figure
the trial did not record.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gdn_core.interpreted_kernels import INTERPRETED_SUFFIX
from service.db.interpreted import SPEED_FIELDS
from service.runs.progress import mode_label

GIB = 2 ** 30


def _fixed(decimals: int, scale: float = 1.0) -> Callable[[float], str]:
    return lambda value: f"{value / scale:.{decimals}f}"


def _plain(value) -> str:
    return str(value)


COLUMNS: tuple[tuple[str, str, Callable], ...] = (
    ("id", "trial", _plain), ("sweep_id", "sweep", _plain), ("kind", "kind", _plain),
    ("preset", "preset", _plain), ("framework", "framework", _plain),
    ("mode", "mode", _plain), ("chips", "chips", _plain), ("dp", "dp", _plain),
    ("seq_len", "seq_len", _plain), ("batch_size", "batch", _plain),
    ("global_batch_size", "global_batch", _plain), ("dtype", "dtype", _plain),
    ("param_sharding", "params", _plain), ("remat", "remat", _plain),
    ("layers", "layers", _plain), ("attn_cp", "attn_cp", _plain), ("layout", "layout", _plain),
    ("kernels", "kernels", _plain), ("documents", "documents", _plain),
    ("accelerator", "accel", _plain), ("repeat", "rep", _plain),
    ("tokens_per_s_per_chip", "tok/s/chip", _fixed(1)),
    ("scaling_efficiency", "vs_1chip", _fixed(3)),
    ("step_time_s", "step_s", _fixed(4)), ("step_time_min_s", "min_s", _fixed(4)),
    ("step_time_max_s", "max_s", _fixed(4)), ("measured_steps", "n", _plain),
    ("mfu", "mfu%", _fixed(3, 0.01)),
    ("peak_memory_bytes_per_chip", "peak_GiB/chip", _fixed(3, GIB)),
    ("memory_source", "measured_by", _plain),
    ("estimated_memory_bytes_per_chip", "xla_est_GiB/chip", _fixed(3, GIB)))
"""(TrialPublic field, column title, the column's one format)."""


def _cell(row, name: str, fmt: Callable) -> str:
    if row.interpreted and name in SPEED_FIELDS:  # a correctness run: no speed to show
        return "interpreted"
    if row.interpreted and name == "kernels":
        return f"{row.kernels}{INTERPRETED_SUFFIX}"
    if name == "mode":
        return mode_label(row.mode, row.chips, row.dp)
    value = getattr(row, name)
    return "" if value is None else fmt(value)


def results_table(rows: Sequence, count: int) -> str:
    """A fixed-width table of TrialPublic rows (cells right-aligned under their titles), then
    a line saying how many rows matched."""
    grid = [[title for _, title, _ in COLUMNS]]
    grid += [[_cell(row, name, fmt) for name, _, fmt in COLUMNS] for row in rows]
    widths = [max(len(line[i]) for line in grid) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in grid]
    lines.append(f"{len(rows)} of {count} succeeded trial(s) matching")
    return "\n".join(lines) + "\n"
