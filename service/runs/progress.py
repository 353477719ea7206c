"""What a foreground sweep shows: a progress bar while it runs, a summary table at the end
(one line per trial: status, tokens/s/chip, MFU, memory per chip), then why each trial that
did not succeed did not (skipped, failed, oom, timeout, cancelled: its stored reason).
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path
from typing import TextIO

from sqlalchemy import select

from gdn_core.kernels import DEFAULT_KERNELS
from gdn_core.packing import SINGLE_DOCUMENT
from service.db.interpreted import ran_interpreted
from service.db.models import Result, Trial
from workers.events import TrialFinished
from workers.result import TrialResult
from workers.result_sink import read_jsonl
from workers.grid import TrialSpec


class ProgressBar:
    """One line redrawn in place on a terminal; one line per finished trial otherwise.
    Silent once `stopped` is set (the driver then reports trials it never finished)."""

    def __init__(self, out: TextIO, *, enabled: bool = True, width: int = 30) -> None:
        self.out, self.enabled, self.width = out, enabled, width
        self.tty = enabled and hasattr(out, "isatty") and out.isatty()
        self.counts: dict[str, int] = {}
        self.stopped = threading.Event()

    def on_event(self, event) -> None:
        if not self.enabled or self.stopped.is_set() or not isinstance(event, TrialFinished):
            return
        status = event.result.status
        self.counts[status] = self.counts.get(status, 0) + 1
        filled = int(self.width * event.done / max(event.total, 1))
        counts = " ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {event.done}/{event.total} "
                f"{counts} | {event.result.trial.key} {status}")
        if self.tty:
            self.out.write("\r\x1b[2K" + line)
            if event.done == event.total:
                self.out.write("\n")
        else:
            self.out.write(line + "\n")
        self.out.flush()


@dataclasses.dataclass(frozen=True)
class SummaryRow:
    framework: str
    mode: str
    chips: int
    seq_len: int
    settings: str
    """What else tells trials of one (framework, mode, chips, seq_len) apart (_settings_text)."""
    status: str
    tokens_per_s_per_chip: float | None
    mfu: float | None
    peak_memory_bytes_per_chip: int | None
    interpreted: bool = False
    """Its kernels ran through their interpreters: tokens/s/chip and MFU are no speed."""
    reason: str | None = None
    """Why it did not succeed (a skip reason, a failure's error), where it did not."""
    dp: int = 1


NO_CP = "none"
"""The mode of a trial whose mesh has no CP group (one chip, or one chip per replica)."""


def mode_label(mode: str, chips: int, dp: int = 1) -> str:
    """A trial's mode as the CLI prints it: a CP mode by name; no CP as what it is (`1 chip
    (no CP)`, or `dp 2 (no CP)`), never `none`, which reads as "no answer"."""
    if mode != NO_CP:
        return mode
    return "1 chip (no CP)" if chips == 1 else f"dp {dp} (no CP)"


def _settings_text(t) -> str:
    """The settings column of one trial: `t` is a TrialSpec or a trials row (the same names).
    dtype, sharding and remat always; every other dimension only where it differs from the
    default, so no two points of a sweep read alike."""
    parts = ([f"dp {t.dp}"] if t.dp > 1 else []) + [t.dtype, t.param_sharding, t.remat]
    parts += [t.layers] if t.layers != "gdn_only" else []
    parts += [f"attn_cp {t.attn_cp}"] if t.attn_cp is not None else []
    parts += [t.layout] if t.layout != "contiguous" else []
    parts += [f"kernels {t.kernels}"] if t.kernels != DEFAULT_KERNELS else []
    parts += [f"documents {t.documents}"] if t.documents != SINGLE_DOCUMENT else []
    parts += [f"repeat {t.repeat}"] if t.repeat else []
    return " ".join(parts + (["plan"] if t.kind == "plan" else []))


def db_rows(session, sweep_id: int) -> list[SummaryRow]:
    """The summary of a sweep in the database: each trial row and its result."""
    found = session.execute(
        select(Trial.framework, Trial.mode, Trial.chips, Trial.seq_len, Trial.kind, Trial.dtype,
               Trial.param_sharding, Trial.remat, Trial.repeat, Trial.dp, Trial.layers,
               Trial.attn_cp, Trial.layout, Trial.kernels, Trial.documents, Trial.status,
               Result.tokens_per_s_per_chip, Result.mfu, Result.peak_memory_bytes_per_chip,
               Result.gdn_kernel, Result.attention_kernel, Result.error, Trial.skip_reason)
        .outerjoin(Result, Result.trial_id == Trial.id).where(Trial.sweep_id == sweep_id))
    return [SummaryRow(r.framework, r.mode, r.chips, r.seq_len, _settings_text(r), r.status,
                       r.tokens_per_s_per_chip, r.mfu, r.peak_memory_bytes_per_chip,
                       ran_interpreted(r.gdn_kernel, r.attention_kernel),
                       r.error or r.skip_reason, r.dp)
            for r in found]


def _result_rows(trials: list[TrialSpec], results: dict[str, TrialResult]) -> list[SummaryRow]:
    rows = []
    for trial in trials:
        result = results.get(trial.key)
        metrics = result.metrics if result is not None else None
        rows.append(SummaryRow(
            trial.framework, trial.mode, trial.chips, trial.seq_len, _settings_text(trial),
            result.status if result is not None else "pending",
            metrics and metrics.tokens_per_s_per_chip, metrics and metrics.mfu,
            metrics and metrics.peak_memory_bytes_per_chip,
            metrics is not None and ran_interpreted(metrics.gdn_kernel,
                                                    metrics.attention_kernel),
            (result.error if result is not None else None) or trial.skip_reason, trial.dp))
    return rows


def _bytes(value: int | None) -> str:
    if value is None:
        return "-"
    for scale, unit in ((2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


def summary_table(rows: list[SummaryRow]) -> str:
    """One line per trial, sorted by framework, mode, chips, seq_len: status, tokens/s/chip,
    MFU (`interpreted` for a run through the kernels' interpreters: no speed), peak memory
    per chip. A settings column only when the sweep varies a setting beyond framework, mode,
    chips and seq_len (it then tells rows of one grid point apart)."""
    rows = sorted(rows, key=lambda r: (r.framework, r.mode, r.chips, r.seq_len, r.settings))
    with_settings = len({r.settings for r in rows}) > 1
    header = ["framework", "mode", "chips", "seq_len", *(["settings"] if with_settings else []),
              "status", "tok/s/chip", "MFU", "mem/chip"]
    table = [header] + [
        [r.framework, mode_label(r.mode, r.chips, r.dp), str(r.chips), str(r.seq_len),
         *([r.settings] if with_settings else []), r.status,
         *(["interpreted"] * 2 if r.interpreted else [
             "-" if r.tokens_per_s_per_chip is None else f"{r.tokens_per_s_per_chip:.4g}",
             "-" if r.mfu is None else f"{r.mfu:.2%}"]), _bytes(r.peak_memory_bytes_per_chip)]
        for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    numeric = {"chips", "seq_len", "tok/s/chip", "MFU", "mem/chip"}
    return "\n".join("  ".join(cell.rjust(w) if name in numeric else cell.ljust(w)
                               for cell, w, name in zip(line, widths, header)).rstrip()
                     for line in table) + "\n"


def reasons_text(rows: list[SummaryRow]) -> str:
    """One line per trial that did not succeed, with its stored reason (in the table's order);
    empty when every trial succeeded (or none has finished)."""
    shown = [r for r in sorted(rows, key=lambda r: (r.framework, r.mode, r.chips, r.seq_len,
                                                    r.settings))
             if r.status not in ("succeeded", "pending", "running")]
    with_settings = len({r.settings for r in rows}) > 1  # as the table shows them
    return "".join(f"  {r.framework} {mode_label(r.mode, r.chips, r.dp)} chips={r.chips} "
                   f"seq_len={r.seq_len}{' ' + r.settings if with_settings else ''}: "
                   f"{r.status}: {r.reason or 'no reason recorded'}\n" for r in shown)


def status_counts_text(rows: list[SummaryRow]) -> str:
    """`3 succeeded, 1 skipped of 4 trial(s)`: the rows' statuses, most common first."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return f"{', '.join(f'{n} {s}' for s, n in ordered)} of {len(rows)} trial(s)"


def print_summary(out: TextIO, sweep: int | str, name: str, status: str,
                  rows: list[SummaryRow]) -> None:
    print(f"sweep {sweep} {name!r}: {status}", file=out)
    out.write(summary_table(rows))
    reasons = reasons_text(rows)
    if reasons:
        out.write("trials that did not succeed, and why:\n" + reasons)
    out.flush()


def file_rows(path: Path, trials: list[TrialSpec]) -> list[SummaryRow]:
    """The summary of a JSON-lines results file for the sweep's `trials`: the last outcome of
    each trial in the file (a resumed run retries cancelled ones), `pending` for the rest."""
    if not path.exists():
        return _result_rows(trials, {})
    return _result_rows(trials, {r.trial.key: r for _, r in read_jsonl(path).results})
