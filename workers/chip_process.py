"""The half of a trial's worker process that is the same in every framework: the base of
TorchRankActor (torch_ranks) and JaxHostActor (jax_hosts).

A process owns one or more chips of the trial's placement group. On CPU hosts it is pinned to
its chips' cores (cpu_cores) as it starts; it reports where it runs, what it runs on, its
software and its memory cgroup's OOM-kill count (process_probe), measures its GEMM peak under
that affinity, and runs a trial's training step under the rank memory cap, turning an
out-of-memory error into RankOutOfMemoryError with the peak it reached. The framework's half
says how: its device name, its GEMM, its training step and its peak memory. Before a trial
runs, each process resolves the trial's `kernels` where the device and packages are known
(packed documents included: a fused kernel that takes no document boundaries is refused), and
a GPU process checks the predicted memory against what its device reports usable.
"""

from __future__ import annotations

import dataclasses
import gc
import os

from . import cpu_cores, environment, process_probe
from .errors import RankOutOfMemoryError
from .failures import looks_like_oom
from .grid import TrialSpec


class ChipProcess:
    """Shared methods of the actor classes (each subclass is the `ray.remote` one)."""

    label: str
    """How errors name this process, e.g. 'rank 3' or 'JAX process 0'."""
    framework: str
    """The framework the process trains with: 'torch' or 'jax'."""

    def __init__(self, *, index: int, bundles: tuple[int, ...], accelerator_kind: str,
                 cpu_chips: int) -> None:
        """index: the torch rank or JAX process index; bundles: the placement bundles (chips)
        it drives; cpu_chips: virtual CPU chips it claims and pins to on a CPU host."""
        self.index, self.bundles, self.kind = index, tuple(bundles), accelerator_kind
        # Pinned before the framework starts: torch and XLA size their thread pools from the
        # CPUs the process may run on.
        self.cpu = cpu_cores.claim_and_pin(cpu_chips) if accelerator_kind == "cpu" else None

    def info(self) -> process_probe.WorkerInfo:
        return process_probe.describe_self(self.index, self.bundles)

    def oom_counter(self) -> tuple[str | None, int | None]:
        return process_probe.oom_kill_counter()

    def versions(self) -> dict[str, str]:
        return process_probe.software_versions()

    def environment(self) -> dict:
        """What this process runs with: packages, project, device runtime
        (workers.environment.process_environment)."""
        return environment.process_environment(accelerator_kind=self.kind,
                                               framework=self.framework)

    def identity(self) -> process_probe.ProcessIdentity:
        """The devices this process computes on, and its CPU affinity (checked by the runner)."""
        name = process_probe.cpu_model_name() if self.kind == "cpu" else self._device_name()
        return process_probe.ProcessIdentity(
            device_name=name, affinity=tuple(sorted(os.sched_getaffinity(0))),
            cpu_chips=self.cpu.chips if self.cpu else (),
            cpu_partition=self.cpu.describe() if self.cpu else None)

    def calibrate_gemm(self, seconds: float, dtype: str = "float32"):
        """This process's GEMM rate in `dtype` under its own affinity, the source naming the
        cores it ran on (PeakMeasurement)."""
        measured = self._measure_gemm(seconds, dtype)
        where = self.cpu.describe() if self.cpu else "unpinned"
        return dataclasses.replace(measured, source=f"{measured.source}:{where}")

    def resolve_kernels(self, trial: TrialSpec) -> dict[str, str | None]:
        """What this process would run for the trial's `kernels` on its device with its
        installed packages: {"gdn": …, "attention": …} (gdn_core.kernels.resolve_kernels), or
        {"unavailable": the reason} when a fused kernel cannot serve the trial here."""
        from gdn_core.kernels import KernelUnavailable, resolve_kernels
        from gdn_core.packing import SINGLE_DOCUMENT

        model_cfg = trial.to_model_config()
        hybrid = model_cfg.layers == "hybrid"
        try:
            resolved = resolve_kernels(
                trial.framework, trial.kernels, device_kind=self.kind, dtype=trial.dtype,
                head_dim=model_cfg.attention.head_dim if hybrid else None, has_attention=hybrid,
                gdn_head_k_dim=model_cfg.gdn.head_k_dim, gdn_chunk_size=model_cfg.gdn.chunk_size,
                packed_documents=trial.documents != SINGLE_DOCUMENT)
        except KernelUnavailable as err:
            return {"unavailable": str(err)}
        return {"gdn": resolved.gdn, "attention": resolved.attention}

    def device_memory_problem(self, trial: TrialSpec) -> str | None:
        """Why the trial's step is predicted not to fit this process's GPU as the device
        reports it (memory_admission.device_memory_problem), or None (it fits, the sweep
        admits over memory, or the device is not a GPU)."""
        if self.kind != "gpu" or trial.admit_over_memory or trial.kind != "measure":
            return None
        from .memory_admission import device_memory_problem

        return device_memory_problem(trial.to_model_config(), trial.to_train_config(),
                                     trial.cp_settings(), framework=trial.framework,
                                     accelerator_type=trial.accelerator_type)

    def run(self, trial: TrialSpec, memory_limit_bytes: int | None):
        """This process's CPTrainReport of the trial's training step."""
        self.profiler = None
        try:
            with process_probe.address_space_cap(
                    process_probe.memory_cap_for(self.kind, memory_limit_bytes)):
                return self._train(trial)
        except Exception as exc:
            if not looks_like_oom(exc):
                raise
            peak, source = self._peak_memory()
            raise RankOutOfMemoryError(f"{self.label}: {type(exc).__name__}: {exc}", peak,
                                       source, memory_limit_bytes) from None
        finally:
            gc.collect()

    def step_profiler(self, trial: TrialSpec, *, device: str = "cpu"):
        """run_cp_training's after_timed_steps for `trial`: None unless trial.profile; process
        0 profiles the extra step, the others run it (workers.profiling)."""
        if not trial.profile:
            return None
        from .profiling import StepProfiler

        self.profiler = StepProfiler(framework=trial.framework, enabled=self.index == 0,
                                     device=device)
        return self.profiler

    def take_profile(self):
        """The CapturedProfile of the last run's extra step (process 0; None elsewhere, or
        when the trial was not profiled); handed over once."""
        profiler, self.profiler = getattr(self, "profiler", None), None
        return None if profiler is None else profiler.captured

    # The framework's half.

    def _device_name(self) -> str:
        """The accelerator this process drives, as its runtime names it (GPU / TPU)."""
        raise NotImplementedError

    def _measure_gemm(self, seconds: float, dtype: str):
        raise NotImplementedError

    def _train(self, trial: TrialSpec):
        """Run gdn_core's run_cp_training for `trial` (trial.cp_settings()) on this process."""
        raise NotImplementedError

    def _peak_memory(self) -> tuple[int | None, str]:
        """Peak memory per chip the run reached before it ran out, and its source."""
        raise NotImplementedError


__all__ = ["ChipProcess"]
