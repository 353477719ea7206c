"""What a trial produced: its status and the metrics of docs/architecture.md."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .grid import TrialSpec

FinalStatus = Literal["succeeded", "failed", "oom", "timeout", "skipped", "cancelled"]
"""How a trial ended: the status its result row holds."""
TrialStatus = Literal["pending", "running", FinalStatus]
TRIAL_STATUSES: tuple[str, ...] = get_args(TrialStatus)
FINAL_STATUSES: frozenset[str] = frozenset(get_args(FinalStatus))
ProfileStatus = Literal["stored", "failed", "skipped"]
"""What became of a profiled step's trace (TrialProfile.status)."""


class TrialMetrics(BaseModel):
    """Measured figures of a finished trial (names and meaning as in docs/architecture.md): the one
    list of metrics, which the service's results columns and API fields follow."""

    model_config = ConfigDict(extra="forbid")
    step_time_s: float | None = None
    """Median wall time of the measured steps (a full training step, the device synchronised)."""
    tokens_per_s_per_chip: float | None = None
    model_flops_per_step: float | None = None
    """MFU's numerator: the model's cost (gdn_core.flops.model), the same under every kernel."""
    maxtext_flops_per_step: float | None = None
    hardware_flops_per_step: float | None = None
    """HFU's numerator: what the trial's framework and kernels ran (gdn_core.flops.executed)."""
    peak_flops_per_chip: float | None = None
    peak_flops_source: str | None = None
    peak_flops_dtype: str | None = None
    """Compute dtype the peak is for (the trial's dtype: float32 or bfloat16)."""
    device_name: str | None = None
    """The chip as the ranks' runtime names it (torch.cuda.get_device_name, JAX device_kind,
    the CPU model on CPU hosts); checked against accelerator_type before the trial runs."""
    gdn_kernel: str | None = None
    """The GDN rule the step ran, with its version where it is a library's
    (gdn_core.kernels.resolve_kernels on the worker: e.g. "reference jax chunk rule")."""
    attention_kernel: str | None = None
    """The hybrid's attention kernel the step ran (e.g. "jax 0.10.2 dot_product_attention
    xla"); None without attention layers."""
    measured_steps: int | None = None
    """Steps timed after warm-up (step_time_s is their median)."""
    step_time_min_s: float | None = None
    step_time_max_s: float | None = None
    """Spread of the measured steps' times (each step: the slowest process's time)."""
    compile_time_s: float | None = None
    """Seconds the slowest process spent compiling (JAX: lowering + XLA compile of the step and
    of any verify reference; 0 for torch eager), apart from the timed steps."""
    mfu: float | None = None
    hfu: float | None = None
    peak_memory_bytes_per_chip: int | None = None
    memory_source: str | None = None
    """What peak_memory_bytes_per_chip measured: the device's allocator peak on GPU/TPU
    (cuda_max_allocated, jax_peak_bytes_in_use), the process RSS high-water mark on CPU hosts
    (per chip when one process drives several); never an estimate."""
    estimated_memory_bytes_per_chip: int | None = None
    estimated_memory_source: str | None = None
    """XLA's compile-time memory analysis of the step (JAX): an estimate, kept apart."""
    predicted_memory_bytes_per_chip: int | None = None
    """gdn_core's analytic memory predictor for this trial's shape and step settings."""
    comm_bytes_per_step_per_chip: int | None = None
    """Everything a chip received per step: the two parts below (max over chips of each sum)."""
    cp_comm_bytes_per_step_per_chip: int | None = None
    """The CP mode's exchanges and the conv halo (max over chips)."""
    grad_sync_bytes_per_step_per_chip: int | None = None
    """Gradient all-reduce / reduce-scatter and weight all-gathers (zero1, fsdp), max over chips."""
    compiled_flops_per_step_per_chip: float | None = None
    """Plan trials: matmul FLOPs of the compiled per-chip program, loop trips counted
    (gdn_core.jax_gdn.hlo_flops; XLA's cost_analysis counts a loop body once)."""
    loss_first: float | None = None
    loss_last: float | None = None
    max_rel_err: float | None = None
    verified_seq_len: int | None = None
    """verify=True: tokens per sequence compared against one chip (seq_len, or a prefix of it
    when the whole sequence would not fit on one chip); None when not verified."""


def scaling_efficiency(tokens_per_s_per_chip: float,
                       baseline_tokens_per_s_per_chip: float) -> float:
    """A trial's tokens/s/chip ÷ its one-chip baseline's (docs/architecture.md): 1 is perfect
    scaling, below 1 what the chips lose to communication and CP work."""
    return tokens_per_s_per_chip / baseline_tokens_per_s_per_chip


def speedup_vs_one_chip(tokens_per_s_per_chip: float, chips: int,
                        baseline_tokens_per_s_per_chip: float) -> float:
    """Tokens/s of the whole trial (tokens/s/chip × chips) ÷ tokens/s of its one-chip
    baseline: chips × scaling_efficiency."""
    return chips * scaling_efficiency(tokens_per_s_per_chip, baseline_tokens_per_s_per_chip)


class AttemptRecord(BaseModel):
    """One attempt of a trial: why it ended and where it ran (kept for retried trials)."""

    model_config = ConfigDict(extra="forbid")
    attempt: int
    status: TrialStatus
    reason: str | None = None
    hosts: list[str] = Field(default_factory=list)
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None


class TrialProfile(BaseModel):
    """The profile of one extra step run after the measured ones (SweepSpec.profile;
    workers.profiling): in no metric above. The trace file lies under the artifact directory
    (DriverOptions.artifact_dir) at `path`."""

    model_config = ConfigDict(extra="forbid")
    path: str | None = None
    """Relative to the artifact directory; None when the profiler failed (see error)."""
    bytes: int | None = None
    format: str
    """workers.profiling: chrome_trace_json_gz (torch) or xprof_run_tar_gz (JAX)."""
    summary: dict = Field(default_factory=dict)
    """workers.profile_summary.summarise_trace: top ops by self time; compute, collective and
    idle seconds of the profiled step."""
    error: str | None = None
    status: ProfileStatus | None = None
    """stored (at `path`); failed (the profiler or the fetch failed: see error); skipped (the
    trace was taken but not kept: the artifact directory's disk or retention limit had no
    room, error says which). The trial's measurements stand in every case. Not given: stored
    when there is a path, else failed."""

    @model_validator(mode="after")
    def _status_from_path(self) -> TrialProfile:
        if self.status is None:
            self.status = "stored" if self.path is not None else "failed"
        return self


class TrialResult(BaseModel):
    """A trial's outcome, handed to the sink when it ends (whatever the status)."""

    model_config = ConfigDict(extra="forbid")
    trial: TrialSpec
    status: TrialStatus
    error: str | None = None
    metrics: TrialMetrics = TrialMetrics()
    attempts: int = 0
    attempt_history: list[AttemptRecord] = Field(default_factory=list)
    """Every attempt in order; the last one is the outcome above."""
    hosts: list[str] = Field(default_factory=list)
    versions: dict[str, str] = Field(default_factory=dict)
    environment: dict[str, Any] | None = None
    """What the trial measured in (workers.environment: packages, project commit, device
    runtime, hosts, the sweep's source); None when no worker process ran it (skipped before
    placement, or its workers never started)."""
    profile: TrialProfile | None = None
    """The profiled extra step (trials of a sweep with profile: true that succeeded)."""
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
