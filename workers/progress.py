"""One line of text per sweep event, for `gdn-sweep run` and logs."""

from __future__ import annotations

from .events import SweepEvent, SweepFinished, TrialFinished, TrialRetrying, TrialStarted


def _si(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{prefix}{unit}"
    return f"{value:.3g}{unit}"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def format_event(event: SweepEvent) -> str | None:
    """A progress line for `event` (None for events not worth a line)."""
    if isinstance(event, TrialStarted):
        where = ", ".join(f"{w.hostname}:{w.pid}" for w in event.workers)
        warm = " (warm)" if event.reused_workers else ""
        return f"  start {event.trial.key} attempt {event.attempt}{warm} on {where}"
    if isinstance(event, TrialRetrying):
        first = event.error.strip().splitlines()[0] if event.error.strip() else ""
        return f"  retry {event.trial.key} after attempt {event.attempt}: {first[:160]}"
    if isinstance(event, TrialFinished):
        result, m = event.result, event.result.metrics
        head = f"[{event.done}/{event.total}] {result.trial.key} {result.status}"
        if result.status == "succeeded":
            return (f"{head} step={m.step_time_s:.4g}s tok/s/chip={m.tokens_per_s_per_chip:.4g} "
                    f"mfu={_num(m.mfu)} mem/chip={_si(m.peak_memory_bytes_per_chip, 'B')} "
                    f"cp comm/chip={_si(m.cp_comm_bytes_per_step_per_chip, 'B')} "
                    f"weight sync/chip={_si(m.grad_sync_bytes_per_step_per_chip, 'B')} "
                    f"loss={_num(m.loss_first)}->{_num(m.loss_last)}")
        first = (result.error or "").strip().splitlines()
        return f"{head}: {first[-1][:200] if first else ''}"
    if isinstance(event, SweepFinished):
        counts = ", ".join(f"{k}={v}" for k, v in sorted(event.counts.items()))
        return (f"sweep {event.name!r} done: {counts or 'nothing to run'}"
                f" ({event.already_finished} already finished before)")
    return None


__all__ = ["format_event"]
