"""Run one trial to a result: place it (or take a warm group), run, classify, retry, clean up.

Before a trial runs, its workers ask gdn_core.kernels' rule book whether its `kernels` can run
there: a fused kernel they cannot serve makes the trial `skipped` with the reason before
anything is built (no metrics, never a silent fallback to the reference). What a succeeded
trial stores as gdn_kernel and attention_kernel is the step's own answer, carried back in its
report (CPTrainReport.gdn_kernel / attention_kernel: what the step resolved where it ran); a
kernel that refuses from inside the step is `skipped` too (failures.classify).

Every path out of an attempt either hands the group back to the warm pool (it ran cleanly) or
shuts it down (actors killed, placement group removed), so a finished trial holds nothing.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
from collections.abc import Callable

import ray

from gdn_core.kernels import DEFAULT_KERNELS, ResolvedKernels, resolve_kernels

from . import metrics, plan_runner
from .environment import trial_environment
from .errors import PlacementCancelledError
from .events import SweepEvent, TrialRetrying, TrialStarted
from .failures import classify, kernel_oom_kill_seen
from .grid import TrialSpec
from .options import DriverOptions
from .placement import ChipRequest, TrialChips
from .profile_store import store_profile
from .result import AttemptRecord, TrialMetrics, TrialProfile, TrialResult
from .warm_pool import WarmPool
from .worker_group import WorkerGroup, WorkerGroupContext


class _Stopped(Exception):
    """An attempt ended by the driver: status 'timeout' or 'cancelled'."""

    def __init__(self, status: str, error: str) -> None:
        super().__init__(error)
        self.status, self.error = status, error


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _Attempt:
    status: str
    error: str | None = None
    retry: bool = False
    metrics: TrialMetrics = dataclasses.field(default_factory=TrialMetrics)
    hosts: tuple[str, ...] = ()
    versions: dict | None = None
    environment: dict | None = None
    profile: TrialProfile | None = None


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


class TrialRunner:
    """Runs trials for one sweep; shares the warm pool and per-host CPU peaks across them."""

    def __init__(self, *, options: DriverOptions, pool: WarmPool, cancel_event: threading.Event,
                 emit: Callable[[SweepEvent], None]) -> None:
        self.options, self.pool, self.cancel_event, self.emit = options, pool, cancel_event, emit
        self._host_gemm: dict = {}
        """CPU GEMM peaks (PeakMeasurement) by WorkerGroup.cpu_calibration_keys key."""
        self._lock = threading.Lock()
        self.source = options.source.describe()
        """The sweep's source as every trial's environment records it (read once, here)."""

    def run(self, trial: TrialSpec, warm_group: WorkerGroup | None = None) -> TrialResult:
        """The trial's final result (never raises for the trial's own failures), with one
        AttemptRecord per attempt: a trial that succeeded on attempt 2 keeps attempt 1's
        reason. warm_group: an idle group of the trial's shape the driver took from the pool
        when it admitted the trial (so two trials admitted together never count on one)."""
        started, history = now(), []
        while True:
            attempt, attempt_started = len(history) + 1, now()
            if self.cancel_event.is_set():
                if warm_group is not None:
                    self.pool.give(warm_group)  # unused: back to the pool, closed at the end
                    warm_group = None
                outcome = _Attempt(status="cancelled", error="sweep cancelled before it ran")
            else:
                outcome = self._attempt(trial, attempt, warm_group)
                warm_group = None
            history.append(AttemptRecord(attempt=attempt, status=outcome.status,
                                         reason=outcome.error, hosts=list(outcome.hosts),
                                         started_at=attempt_started, finished_at=now()))
            if outcome.retry and attempt <= self.options.max_trial_retries:
                self.emit(TrialRetrying(trial, attempt, outcome.error or ""))
                continue
            error = outcome.error
            if outcome.retry:  # a dead actor or node, retries used up
                error = (f"gave up after {attempt} attempt(s) (DriverOptions.max_trial_retries="
                         f"{self.options.max_trial_retries}): {error}")
            return TrialResult(trial=trial, status=outcome.status, error=error,
                               metrics=outcome.metrics, attempts=attempt,
                               attempt_history=history, hosts=list(outcome.hosts),
                               versions=outcome.versions or {}, profile=outcome.profile,
                               environment=outcome.environment, started_at=started,
                               finished_at=now())

    # ------------------------------------------------------------------ one attempt

    def _attempt(self, trial: TrialSpec, attempt: int,
                 warm_group: WorkerGroup | None = None) -> _Attempt:
        if trial.kind == "plan":
            return self._plan_attempt(trial, attempt)
        group, counters, device_name = None, [], None
        try:
            group, reused = ((warm_group, True) if warm_group
                             else self._acquire(trial, retry=attempt > 1))
            device_name = ", ".join(group.device_names) or None
            group.check_devices(trial.accelerator_type)  # the chip MFU's peak is for
            # A fused kernel that cannot serve it here (never a fallback), or a GPU whose
            # reported memory the prediction exceeds: skipped before anything is built.
            refusal = (group.resolve_kernels(trial).get("unavailable")
                       or group.device_memory_problem(trial))
            if refusal is not None:
                result = _Attempt(status="skipped", error=refusal, hosts=_hosts(group),
                                  metrics=TrialMetrics(device_name=device_name))
            else:
                peak = self._peak(trial, group)
                counters = group.oom_counters()
                refs = group.run(trial)
                self.emit(TrialStarted(trial, attempt, group.workers, reused))
                reports = self._wait(refs, deadline=time.monotonic() + trial.timeout_s,
                                     timeout_s=trial.timeout_s)
                measured = metrics.trial_metrics(trial, reports, peak=peak,
                                                 device_name=device_name)
                result = _Attempt(status="succeeded", metrics=measured.model_copy(
                                      update=ran_kernels(reports)),
                                  hosts=_hosts(group), versions=group.versions,
                                  profile=self._profile(trial, group))
        except _Stopped as stop:
            self._discard(group)
            return _Attempt(status=stop.status, error=stop.error, hosts=_hosts(group),
                            metrics=TrialMetrics(device_name=device_name),
                            environment=self._environment(trial, group, device_name))
        except PlacementCancelledError as err:
            return _Attempt(status="cancelled", error=str(err))
        except Exception as exc:  # noqa: BLE001 - every failure becomes a result
            self._discard(group)
            verdict = classify(exc)
            if verdict.retry and group is not None and self._oom_killed(group, counters):
                return _Attempt(status="oom", error="a rank was killed by the kernel OOM killer "
                                f"(its memory cgroup's oom_kill count rose): {verdict.error}",
                                hosts=_hosts(group), metrics=TrialMetrics(device_name=device_name),
                                environment=self._environment(trial, group, device_name))
            known = TrialMetrics(peak_memory_bytes_per_chip=verdict.peak_memory_bytes,
                                 memory_source=verdict.memory_source, device_name=device_name)
            return _Attempt(status=verdict.status, error=verdict.error, retry=verdict.retry,
                            metrics=known, hosts=_hosts(group),
                            environment=self._environment(trial, group, device_name))
        self.pool.give(group)
        return dataclasses.replace(result,
                                   environment=self._environment(trial, group, device_name))

    def _environment(self, trial: TrialSpec, group: WorkerGroup | None,
                     device_name: str | None) -> dict | None:
        """The attempt's environment: its processes' and the driver's part (None when the
        attempt never got its processes)."""
        if group is None or not group.environment:
            return None
        return trial_environment(group.environment, accelerator_kind=trial.accelerator_kind,
                                 accelerator_type=trial.accelerator_type,
                                 device_name=device_name, host_count=group.host_count,
                                 source=self.source)

    def _profile(self, trial: TrialSpec, group: WorkerGroup) -> TrialProfile | None:
        """The profiled extra step of a succeeded trial (trial.profile): process 0's capture,
        its trace stored under DriverOptions.artifact_dir. A trace that cannot be stored
        leaves the measurements standing and says why."""
        if not trial.profile:
            return None
        try:
            captured = ray.get(group.actors[0].take_profile.remote(),
                               timeout=self.options.worker_start_timeout_s)
        except Exception as err:  # noqa: BLE001 - the trial's measurements stand without it
            return TrialProfile(format="none", error=f"process 0's profile could not be "
                                                     f"fetched: {type(err).__name__}: {err}")
        if captured is None:
            return TrialProfile(format="none", error="process 0 kept no profile of the step")
        try:
            return store_profile(captured, artifact_dir=self.options.artifact_dir,
                                 trial_key=trial.key, retention=self.options.profile_retention)
        except OSError as err:
            return TrialProfile(format=captured.format, summary=captured.summary,
                                error=f"the trace could not be stored under "
                                      f"{self.options.artifact_dir}: {err}")

    def _plan_attempt(self, trial: TrialSpec, attempt: int) -> _Attempt:
        """Compile the trial's step in a one-CPU Ray task (plan_runner); no chips, no run."""
        ref = plan_runner.compile_plan.remote(
            plan_runner.plan_request(trial), timeout_s=trial.timeout_s,
            compile_cache_dir=self.options.jax_compile_cache_dir)
        self.emit(TrialStarted(trial, attempt, (), False))
        try:
            out, = self._wait([ref], deadline=time.monotonic() + trial.timeout_s,
                              timeout_s=trial.timeout_s)
        except _Stopped as stop:
            ray.cancel(ref, force=True)
            return _Attempt(status=stop.status, error=stop.error)
        except Exception as exc:  # noqa: BLE001 - every failure becomes a result
            verdict = classify(exc)
            return _Attempt(status=verdict.status, error=verdict.error, retry=verdict.retry)
        resolved = reference_kernels(trial)  # a plan compiles the reference step
        environment = trial_environment(  # compiled by XLA:CPU on one host, whatever the chip
            out["environment"], accelerator_kind=trial.accelerator_kind,
            accelerator_type=trial.accelerator_type, device_name=None, host_count=1,
            source=self.source)
        return _Attempt(status="succeeded", hosts=(out["host"],), versions=out["versions"],
                        environment=environment,
                        metrics=plan_runner.plan_metrics(trial, out["plan"]).model_copy(update={
                            "gdn_kernel": resolved.gdn, "attention_kernel": resolved.attention}))

    def _acquire(self, trial: TrialSpec, *, retry: bool) -> tuple[WorkerGroup, bool]:
        request = ChipRequest(framework=trial.framework, chips=trial.chips,
                              accelerator_kind=trial.accelerator_kind,
                              accelerator_type=trial.accelerator_type,
                              strategy=self.options.placement_strategy)
        group = self.pool.take(request.shape)
        if group is not None:
            return group, True
        # A first attempt was admitted with room made for it; a retry was not.
        with self.pool.waiting_for(request.resource, evict_idle=retry):
            chips = TrialChips.create(request, timeout_s=self.options.placement_timeout_s,
                                      cancelled=self.cancel_event.is_set,
                                      poll_interval_s=self.options.poll_interval_s)
        try:
            ctx = WorkerGroupContext(chips=chips, options=self.options)
            group = WorkerGroup.create(ctx)
        except BaseException:
            chips.remove()  # partial start: the actors are already killed, free the chips
            raise
        return group, False

    def _peak(self, trial: TrialSpec, group: WorkerGroup) -> metrics.ChipPeak:
        """The trial's per-chip peak in its dtype: the datasheet's on GPU / TPU; on CPU each
        process's own GEMM rate under its affinity, measured once per (node, framework, dtype,
        cores, chips) per sweep, even with concurrent trials."""
        if trial.accelerator_kind != "cpu":
            return metrics.datasheet_peak(trial.accelerator_type, trial.dtype)
        keys = group.cpu_calibration_keys(trial.dtype)
        with self._lock:
            missing: dict[tuple, int] = {}  # key → the first process that has it
            for index, key in enumerate(keys):
                if key not in self._host_gemm:
                    missing.setdefault(key, index)
            if missing:
                measured = group.calibrate_processes(
                    list(missing.values()), dtype=trial.dtype,
                    seconds=self.options.cpu_peak_calibration_s)
                self._host_gemm.update(zip(missing, measured))
            process_gemm = [self._host_gemm[key] for key in keys]
        return metrics.trial_peak(metrics.cpu_chip_peaks(
            process_gemm, group.chips_per_process(), trial.dtype))

    def _wait(self, refs: list, *, deadline: float, timeout_s: float) -> list:
        """Every process's report; stops early on cancel, timeout or the first failure."""
        pending, done = list(refs), {}
        while pending:
            if self.cancel_event.is_set():
                raise _Stopped("cancelled", "sweep cancelled while the trial ran")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Stopped("timeout", f"trial ran past timeout_s={timeout_s:g} "
                               f"(SweepSpec.trial_timeout_s); its actors were killed")
            ready, pending = ray.wait(pending, num_returns=1,
                                      timeout=min(self.options.poll_interval_s, remaining))
            for ref in ready:
                done[ref] = ray.get(ref)  # a failed rank raises here; the rest are killed
        return [done[ref] for ref in refs]

    def _oom_killed(self, group: WorkerGroup, counters: list) -> bool:
        seen = set()
        for worker, (path, count) in zip(group.workers, counters):
            if (worker.node_id, path) in seen:
                continue
            seen.add((worker.node_id, path))
            if kernel_oom_kill_seen(worker.node_id, path, count):
                return True
        return False

    @staticmethod
    def _discard(group: WorkerGroup | None) -> None:
        if group is not None:
            group.shutdown()


def ran_kernels(reports: list) -> dict[str, str | None]:
    """gdn_kernel and attention_kernel of a trial's result: what its step reported running
    (every process resolves alike; process 0's answer is the trial's)."""
    return {"gdn_kernel": reports[0].gdn_kernel,
            "attention_kernel": reports[0].attention_kernel}


def reference_kernels(trial: TrialSpec) -> ResolvedKernels:
    """The reference implementations of the trial's framework and decoder (no worker needed:
    the reference depends on neither the device nor the packages)."""
    model_cfg = trial.to_model_config()
    hybrid = model_cfg.layers == "hybrid"
    return resolve_kernels(trial.framework, DEFAULT_KERNELS, device_kind=trial.accelerator_kind,
                           dtype=trial.dtype, has_attention=hybrid,
                           head_dim=model_cfg.attention.head_dim if hybrid else None)


def _unique(values) -> tuple[str, ...]:
    return tuple(dict.fromkeys(values))


def _hosts(group: WorkerGroup | None) -> tuple[str, ...]:
    """Where an attempt ran, also when it failed (empty when it never got its workers)."""
    return () if group is None else _unique(w.hostname for w in group.workers)


__all__ = ["TrialRunner"]
