"""Fold every process's CPTrainReport of a trial into the TrialMetrics of ARCHITECTURE.md.

A torch report covers one rank (one chip); a JAX report covers one process's chips (its
memory figure is already per chip). Per step the slowest process sets the pace, so step_time
is the median over measured steps of the max over processes.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence

from gdn_core import flops, hardware
from gdn_core.train_config import CPTrainReport

from .result import TrialMetrics
from .spec import TrialSpec


@dataclasses.dataclass(frozen=True, slots=True)
class ChipPeak:
    """The MFU denominator of one chip and where it came from."""

    flops_per_s: float
    source: str


def datasheet_peak(accelerator_type: str) -> ChipPeak:
    return ChipPeak(hardware.peak_flops_per_chip(accelerator_type),
                    f"datasheet_bf16_dense:{accelerator_type.lower()}")


def cpu_chip_peak(host_gemm: hardware.PeakMeasurement, chips_on_host: float) -> ChipPeak:
    """A virtual CPU chip's share of its host's measured GEMM peak (host peak / its cpu_chips)."""
    share = max(chips_on_host, 1.0)
    return ChipPeak(host_gemm.flops_per_s / share,
                    f"{host_gemm.source}/{share:g}_cpu_chips_per_host")


def trial_peak(chip_peaks: Sequence[ChipPeak]) -> ChipPeak:
    """Mean per-chip peak over the trial's chips (hosts of one trial may differ)."""
    sources = sorted({p.source for p in chip_peaks})
    return ChipPeak(statistics.fmean(p.flops_per_s for p in chip_peaks), ";".join(sources))


def step_time_s(reports: Sequence[CPTrainReport]) -> float:
    """Median over measured steps of the slowest process's time at that step."""
    steps = min(len(r.step_times_s) for r in reports)
    if steps == 0:
        raise ValueError("reports carry no measured step times (steps must be >= 1)")
    return statistics.median(max(r.step_times_s[i] for r in reports) for i in range(steps))


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def trial_metrics(trial: TrialSpec, reports: Sequence[CPTrainReport], *,
                  peak: ChipPeak | None) -> TrialMetrics:
    """Every metric of a succeeded trial from its processes' reports (in rank order)."""
    if not reports:
        raise ValueError("trial_metrics needs at least one report")
    model_cfg = trial.to_model_config()
    batch, seq_len, chips = trial.batch_size, trial.seq_len, trial.chips
    step = step_time_s(reports)
    model_flops = flops.model_flops_per_step(model_cfg, batch=batch, seq_len=seq_len).total
    hardware_flops = flops.hardware_flops_per_step(model_cfg, mode=trial.mode, chips=chips,
                                                   batch=batch, seq_len=seq_len,
                                                   remat=trial.remat).total
    memory = [r for r in reports if r.peak_memory_bytes is not None]
    top = max(memory, key=lambda r: r.peak_memory_bytes) if memory else None
    losses = reports[0].losses  # the global loss: the same on every process
    measured = losses[trial.warmup_steps:] or losses
    errs = [r.max_rel_err for r in reports if r.max_rel_err is not None]
    return TrialMetrics(
        step_time_s=step,
        tokens_per_s_per_chip=flops.tokens_per_s_per_chip(batch, seq_len, step, chips),
        model_flops_per_step=float(model_flops),
        maxtext_flops_per_step=float(flops.maxtext_model_flops_per_step(
            model_cfg, batch=batch, seq_len=seq_len).total),
        hardware_flops_per_step=float(hardware_flops),
        peak_flops_per_chip=peak.flops_per_s if peak else None,
        peak_flops_source=peak.source if peak else None,
        mfu=flops.mfu(model_flops, step, chips, peak.flops_per_s) if peak else None,
        hfu=flops.mfu(hardware_flops, step, chips, peak.flops_per_s) if peak else None,
        peak_memory_bytes_per_chip=top.peak_memory_bytes if top else None,
        memory_source=top.memory_source if top else None,
        comm_bytes_per_step_per_chip=max(r.comm_bytes_per_step for r in reports),
        cp_comm_bytes_per_step_per_chip=max(r.cp_comm_bytes_per_step for r in reports),
        grad_sync_bytes_per_step_per_chip=max(r.grad_sync_bytes_per_step for r in reports),
        loss_first=_finite(measured[0]),
        loss_last=_finite(measured[-1]),
        max_rel_err=max(errs) if errs else None,
    )


def host_chip_peaks(bundle_nodes: Sequence[str], host_gemm: Mapping[str, hardware.PeakMeasurement],
                    chips_per_host: Mapping[str, float]) -> list[ChipPeak]:
    """Per-chip CPU peaks of a trial's bundles from each host's calibration."""
    return [cpu_chip_peak(host_gemm[node], chips_per_host.get(node, 1.0))
            for node in bundle_nodes]


__all__ = ["ChipPeak", "cpu_chip_peak", "datasheet_peak", "host_chip_peaks", "step_time_s",
           "trial_metrics", "trial_peak"]
