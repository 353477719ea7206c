"""Fold every process's CPTrainReport of a trial into the TrialMetrics of docs/architecture.md.

A torch report covers one rank (one chip); a JAX report covers one process's chips (its
memory figure is already per chip). Per step the slowest process sets the pace, so step_time
is the median over measured steps of the max over processes.

Model FLOPs (MFU's numerator) count attention per packed document when the trial packs its
sequences (trial_documents: the boundaries its step drew from its seed), since the step never
computes attention between documents; counting T² pairs would inflate MFU.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

from gdn_core import datasheets
from gdn_core.calibration import PeakMeasurement
from gdn_core.flops.executed import hardware_flops_per_step
from gdn_core.flops.maxtext import maxtext_model_flops_per_step
from gdn_core.flops.model import model_flops_per_step
from gdn_core.flops.utilisation import mfu, tokens_per_s_per_chip
from gdn_core.memory.step import predict_step_memory
from gdn_core.packing import document_boundaries
from gdn_core.train_config import CPTrainReport

from .grid import TrialSpec
from .result import TrialMetrics


@dataclasses.dataclass(frozen=True, slots=True)
class ChipPeak:
    """The MFU denominator of one chip, the dtype it is for, and where it came from."""

    flops_per_s: float
    source: str
    dtype: str
    """The dtype the figure is for: the trial's (float32 or bfloat16), except a float32 run
    on a TPU, divided by the bf16 peak (datasheets.peak_dtype)."""


class UtilisationAboveOneError(ValueError):
    """MFU or HFU came out above 1: the peak (or the FLOP count) is wrong, not the chip fast."""


def datasheet_peak(accelerator_type: str, dtype: str = "bfloat16") -> ChipPeak:
    """The datasheet peak of a GPU / TPU chip for a run in the trial's compute dtype (its dtype
    is the one the figure is for: bf16 for a float32 run on a TPU)."""
    return ChipPeak(datasheets.peak_flops_per_chip(accelerator_type, dtype),
                    datasheets.peak_source(accelerator_type, dtype),
                    datasheets.peak_dtype(accelerator_type, dtype))


def cpu_chip_peak(process_gemm: PeakMeasurement, chips: int, dtype: str) -> ChipPeak:
    """A virtual CPU chip's peak: its process's GEMM rate (measured under the process's own
    affinity, in the trial's dtype) / the chips that process drives (1 for a torch rank)."""
    if chips < 1:
        raise ValueError(f"chips={chips!r} driven by the process must be >= 1")
    return ChipPeak(process_gemm.flops_per_s / chips, process_gemm.source, dtype)


def cpu_chip_peaks(process_gemm: Sequence[PeakMeasurement],
                   chips_per_process: Sequence[int], dtype: str) -> list[ChipPeak]:
    """One ChipPeak per chip of a CPU trial, from each process's measurement, in order."""
    return [cpu_chip_peak(gemm, chips, dtype)
            for gemm, chips in zip(process_gemm, chips_per_process, strict=True)
            for _ in range(chips)]


def trial_peak(chip_peaks: Sequence[ChipPeak]) -> ChipPeak:
    """Mean per-chip peak over the trial's chips (hosts of one trial may differ); None when
    any chip has none."""
    sources = ";".join(sorted({p.source for p in chip_peaks}))
    dtypes = {p.dtype for p in chip_peaks}
    if len(dtypes) != 1:
        raise ValueError(f"chip peaks of one trial are for different dtypes {sorted(dtypes)}")
    values = [p.flops_per_s for p in chip_peaks]
    mean = None if None in values else statistics.fmean(values)
    return ChipPeak(mean, sources, dtypes.pop())


def per_step_times_s(reports: Sequence[CPTrainReport]) -> list[float]:
    """Each measured step's time: the slowest process's time at that step."""
    steps = min(len(r.step_times_s) for r in reports)
    if steps == 0:
        raise ValueError("reports carry no measured step times (steps must be >= 1)")
    return [max(r.step_times_s[i] for r in reports) for i in range(steps)]


def step_time_s(reports: Sequence[CPTrainReport]) -> float:
    """Median over measured steps of the slowest process's time at that step."""
    return statistics.median(per_step_times_s(reports))


def utilisation(flops_per_step: float, step_s: float, chips: int, peak: ChipPeak | None, *,
                name: str) -> float | None:
    """MFU / HFU against `peak`; raises UtilisationAboveOneError when it exceeds 1."""
    if peak is None:
        return None
    value = mfu(flops_per_step, step_s, chips, peak.flops_per_s)
    if value > 1:
        raise UtilisationAboveOneError(
            f"{name}={value:.3f} > 1 is impossible: {flops_per_step:.4g} FLOP per step in "
            f"{step_s:.4g} s on {chips} chip(s) against a peak of {peak.flops_per_s:.4g} "
            f"FLOP/s per chip ({peak.dtype}, {peak.source}); the peak does not describe these "
            f"chips (wrong accelerator.type, or virtual CPU chips sharing cores)")
    return value


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _largest(reports: Sequence[CPTrainReport], field: str):
    """The report with the largest `field` (None where no report has one)."""
    known = [r for r in reports if getattr(r, field) is not None]
    return max(known, key=lambda r: getattr(r, field)) if known else None


def trial_documents(trial: TrialSpec):
    """cu_seqlens of the trial's packed documents (int32 [N+1]): the boundaries its training
    step draws (packing.document_boundaries from its TrainConfig's seed and seq_len, every
    row alike), None for one document per sequence."""
    train_cfg = trial.to_train_config()
    return document_boundaries(train_cfg.documents, seq_len=train_cfg.seq_len,
                               seed=train_cfg.seed)


def memory_metrics(trial: TrialSpec, reports: Sequence[CPTrainReport]) -> dict:
    """The memory figures of TrialMetrics, each kept apart with its own source: measured
    (max over processes; a JAX report's figure is already per chip), XLA's estimate (JAX),
    gdn_core's prediction, and the verified length (the same on every process)."""
    measured = _largest(reports, "peak_memory_bytes")
    estimated = _largest(reports, "estimated_memory_bytes")
    cp = trial.cp_settings()
    predicted = predict_step_memory(trial.to_model_config().stand_in, trial.to_train_config(),
                                    mode=cp.mode, chips=cp.cp_chips, dp=cp.dp,
                                    framework=trial.framework, attn_cp=cp.attn_cp,
                                    layout=cp.layout, kernels=cp.kernels)
    return dict(
        peak_memory_bytes_per_chip=measured.peak_memory_bytes if measured else None,
        memory_source=measured.memory_source if measured else None,
        estimated_memory_bytes_per_chip=estimated.estimated_memory_bytes if estimated else None,
        estimated_memory_source=estimated.estimated_memory_source if estimated else None,
        predicted_memory_bytes_per_chip=predicted.total,
        verified_seq_len=reports[0].verified_seq_len,
    )


def trial_metrics(trial: TrialSpec, reports: Sequence[CPTrainReport], *,
                  peak: ChipPeak | None, device_name: str | None = None) -> TrialMetrics:
    """Every metric of a succeeded trial from its processes' reports (in rank order).

    Raises UtilisationAboveOneError when MFU or HFU would exceed 1 (the trial then fails).
    """
    if not reports:
        raise ValueError("trial_metrics needs at least one report")
    model_cfg = trial.to_model_config()
    # The whole mesh's work: every replica's sequences, on all its chips.
    batch, seq_len, chips = trial.global_batch_size, trial.seq_len, trial.chips
    step_times = per_step_times_s(reports)
    step = statistics.median(step_times)
    compile_times = [t for t in (getattr(r, "compile_time_s", None) for r in reports)
                     if t is not None]
    # MFU's numerator is the model's cost whatever kernel ran; HFU's counts what `kernels` ran
    documents = trial_documents(trial)
    model_flops = model_flops_per_step(model_cfg, batch=batch, seq_len=seq_len,
                                       cu_seqlens=documents).total
    cp = trial.cp_settings()
    hardware_flops = hardware_flops_per_step(model_cfg, mode=cp.mode, chips=cp.cp_chips,
                                             batch=batch, seq_len=seq_len,
                                             framework=trial.framework, remat=trial.remat,
                                             attn_cp=cp.attn_cp, layout=cp.layout,
                                             kernels=cp.kernels, cu_seqlens=documents).total
    losses = reports[0].losses  # the global loss: the same on every process
    measured = losses[trial.warmup_steps:] or losses
    errs = [r.max_rel_err for r in reports if r.max_rel_err is not None]
    return TrialMetrics(
        step_time_s=step,
        tokens_per_s_per_chip=tokens_per_s_per_chip(batch, seq_len, step, chips),
        model_flops_per_step=float(model_flops),
        maxtext_flops_per_step=float(maxtext_model_flops_per_step(
            model_cfg, batch=batch, seq_len=seq_len).total),
        hardware_flops_per_step=float(hardware_flops),
        peak_flops_per_chip=peak.flops_per_s if peak else None,
        peak_flops_source=peak.source if peak else None,
        peak_flops_dtype=peak.dtype if peak else None,
        device_name=device_name,
        measured_steps=len(step_times),
        step_time_min_s=min(step_times),
        step_time_max_s=max(step_times),
        compile_time_s=max(compile_times) if compile_times else None,
        mfu=utilisation(model_flops, step, chips, peak, name="mfu"),
        hfu=utilisation(hardware_flops, step, chips, peak, name="hfu"),
        **memory_metrics(trial, reports),
        comm_bytes_per_step_per_chip=max(r.comm_bytes_per_step for r in reports),
        cp_comm_bytes_per_step_per_chip=max(r.cp_comm_bytes_per_step for r in reports),
        grad_sync_bytes_per_step_per_chip=max(r.grad_sync_bytes_per_step for r in reports),
        loss_first=_finite(measured[0]),
        loss_last=_finite(measured[-1]),
        max_rel_err=max(errs) if errs else None,
    )


__all__ = ["ChipPeak", "UtilisationAboveOneError", "cpu_chip_peak", "cpu_chip_peaks",
           "datasheet_peak", "memory_metrics", "per_step_times_s", "step_time_s",
           "trial_documents", "trial_metrics", "trial_peak", "utilisation"]
