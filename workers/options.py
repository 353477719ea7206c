"""How the driver runs trials on Ray: timeouts, retries, warm reuse, resource caps."""

from __future__ import annotations

import dataclasses
from typing import Literal

from .compile_cache import default_jax_cache_dir
from .environment import SweepSource
from .profile_store import ProfileRetention, default_artifact_dir

PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
PLACEMENT_STRATEGIES: tuple[str, ...] = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
CPU_CHIP_RESOURCE = "cpu_chip"
"""The custom resource each CPU host advertises, one unit per virtual chip."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class DriverOptions:
    """Settings of the sweep driver that are not part of the sweep spec (the how, not the what)."""

    placement_timeout_s: float = 300.0
    """How long a trial's placement group may wait for its chips before the trial fails."""
    worker_start_timeout_s: float = 180.0
    """How long actors may take to start and join their process group / jax.distributed."""
    max_trial_retries: int = 2
    """Retries of a trial whose actor or node died (not of failures, OOMs or timeouts)."""
    reuse_workers: bool = True
    """Keep a finished trial's actors and placement group for the next trial of the same shape
    (framework, chips, accelerator); all are torn down when the sweep ends."""
    placement_strategy: PlacementStrategy = "PACK"
    """Placement group strategy: PACK keeps a trial's chips on as few hosts as possible."""
    rank_memory_limit_bytes: int | None = None
    """Cap on how much address space each rank process may add during a trial (RLIMIT_AS).
    Applied to CPU-chip processes only (process_probe.memory_cap_for): CUDA and the TPU
    runtime reserve far more address space than they use. For tests and hosts without memory
    cgroups; None leaves memory uncapped."""
    cpu_threads_per_chip: int | None = None
    """torch threads of a rank on a virtual CPU chip; None: the chip's cores (each rank is
    pinned to its chip's cores, see workers.cpu_cores). A JAX process sizes XLA's pool from
    the cores it is pinned to."""
    jax_compile_cache_dir: str = dataclasses.field(default_factory=default_jax_cache_dir)
    """JAX's persistent compilation cache of the trial processes (a directory on each host, or
    a path all hosts share); "" turns it off. Default: $GDN_SWEEP_JAX_CACHE_DIR, else
    ~/.cache/gdn-sweep/jax-compile (workers.compile_cache)."""
    artifact_dir: str = dataclasses.field(default_factory=default_artifact_dir)
    """Where the driver stores trial artifacts (profile traces) that results refer to by a
    relative path. Default: $GDN_SWEEP_ARTIFACT_DIR, else ~/.cache/gdn-sweep/artifacts (the
    service's Settings.artifact_dir reads the same variable, so it serves what was stored)."""
    profile_retention: ProfileRetention = dataclasses.field(
        default_factory=ProfileRetention.from_env)
    """How much the traces under artifact_dir may hold (bytes, age, the disk's free minimum);
    default: $GDN_SWEEP_PROFILE_MAX_BYTES, …_MAX_AGE_DAYS, …_MIN_FREE_BYTES, else 20 GiB, 30
    days, 1 GiB (workers.profile_store)."""
    cpu_peak_calibration_s: float = 0.5
    """Seconds of GEMM timing for the MFU denominator of CPU chips, by the trial's own
    processes under their affinity, once per (node, framework, dtype, cores) per sweep."""
    collective_timeout_s: float = 1800.0
    """Timeout of one torch collective or store wait (a hung peer surfaces as an error)."""
    poll_interval_s: float = 0.25
    """How often a running trial checks for cancellation."""
    source: SweepSource = SweepSource()
    """What started the sweep (the API, a schedule, `gdn-sweep run`, a Ray job), recorded in
    every trial's environment; a submitted Ray job is recognised whatever this says."""

    def __post_init__(self) -> None:
        for name in ("placement_timeout_s", "worker_start_timeout_s", "cpu_peak_calibration_s",
                     "collective_timeout_s", "poll_interval_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"DriverOptions.{name}={getattr(self, name)!r} must be > 0")
        if not isinstance(self.max_trial_retries, int) or self.max_trial_retries < 0:
            raise ValueError(f"DriverOptions.max_trial_retries={self.max_trial_retries!r} must "
                             f"be an integer >= 0")
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise ValueError(f"DriverOptions.placement_strategy={self.placement_strategy!r} is "
                             f"not one of: {', '.join(PLACEMENT_STRATEGIES)}")
        for name in ("rank_memory_limit_bytes", "cpu_threads_per_chip"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"DriverOptions.{name}={value!r} must be a positive integer "
                                 f"or None")


__all__ = ["CPU_CHIP_RESOURCE", "DriverOptions", "PLACEMENT_STRATEGIES", "PlacementStrategy"]
