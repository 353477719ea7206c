"""Utilisation metrics of a measured step: mfu and tokens_per_s_per_chip (docs/architecture.md,
Metrics: one definition for code, database and dashboard)."""

from __future__ import annotations

from .conventions import check_positive, check_positive_number


def mfu(model_flops_per_step: float, step_time_s: float, chips: int,
        peak_flops_per_chip: float) -> float:
    """Model FLOP utilisation: model_flops_per_step / (step_time_s·chips·peak_flops_per_chip)."""
    check_positive_number(model_flops_per_step=model_flops_per_step, step_time_s=step_time_s,
                          peak_flops_per_chip=peak_flops_per_chip)
    check_positive(chips=chips)
    return model_flops_per_step / (step_time_s * chips * peak_flops_per_chip)


def tokens_per_s_per_chip(batch: int, seq_len: int, step_time_s: float, chips: int) -> float:
    """Training throughput per chip: batch × seq_len / step_time_s / chips."""
    check_positive(batch=batch, seq_len=seq_len, chips=chips)
    check_positive_number(step_time_s=step_time_s)
    return batch * seq_len / step_time_s / chips


__all__ = ["mfu", "tokens_per_s_per_chip"]
