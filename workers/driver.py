"""The sweep driver: a sweep's trials in, one TrialResult per trial out, handed to a sink.

The driver runs the trials it is given and never expands a grid: a sweep is expanded once,
where it is created (the service writes the expansion as trial rows and hands the driver
TrialSpecs read back from them; `run_sweep` expands a SweepSpec for callers that keep no
expansion of their own). Used in-process by the REST service (a local or connected Ray) and
by `gdn-sweep run` under `ray job submit` on a cluster head. Resumable: trials whose keys the
sink already finished are not run again. Trials of one shape run back to back so warm workers
are reused; several trials run at once when `max_concurrent_trials` and the cluster's chips
allow (a trial is admitted only when its chips are free, so placement groups do not queue
behind each other).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import logging
import threading
from collections.abc import Callable, Sequence

import ray

from .cluster import connect_ray, cpu_chip_warnings
from .errors import ChipCapacityError
from .events import SweepEvent, SweepFinished, TrialFinished
from .grid import TrialSpec, expand_trials
from .options import DriverOptions
from .placement import ChipRequest, chip_resource
from .result import TrialResult
from .result_sink import ResultSink
from .sweep_spec import SweepSpec
from .trial_runner import TrialRunner, now
from .warm_pool import WarmPool
from .worker_group import WorkerGroup

log = logging.getLogger(__name__)


def _shape(trial: TrialSpec) -> tuple:
    return (trial.kind, trial.framework, trial.chips, trial.accelerator_kind,
            trial.accelerator_type)


def _chips_held(trial: TrialSpec) -> int:
    """Chips a running trial occupies: a plan compiles on one CPU and holds none."""
    return 0 if trial.kind == "plan" else trial.chips


class SweepDriver:
    """Runs one sweep's trials; `run()` once, `cancel()` from any thread (or set cancel_event).
    `name` is the sweep's, for the SweepFinished event."""

    def __init__(self, trials: Sequence[TrialSpec], sink: ResultSink, *, name: str,
                 options: DriverOptions | None = None, max_concurrent_trials: int = 1,
                 on_event: Callable[[SweepEvent], None] | None = None,
                 cancel_event: threading.Event | None = None) -> None:
        if not isinstance(max_concurrent_trials, int) or max_concurrent_trials < 1:
            raise ValueError(f"max_concurrent_trials={max_concurrent_trials!r} must be an "
                             f"integer >= 1")
        self.trials, self.sink, self.name = list(trials), sink, name
        self.options = options or DriverOptions()
        self.max_concurrent_trials = max_concurrent_trials
        self.cancel_event = cancel_event or threading.Event()
        self._on_event = on_event
        self._event_lock = threading.Lock()
        self._results: list[TrialResult] = []
        self._total = 0

    def cancel(self) -> None:
        """Stop running trials (status 'cancelled') and report the rest cancelled."""
        self.cancel_event.set()

    def emit(self, event: SweepEvent) -> None:
        if self._on_event is None:
            return
        with self._event_lock:  # callbacks come one at a time, whatever thread ran the trial
            try:
                self._on_event(event)
            except Exception:  # noqa: BLE001 - a broken listener must not break the sweep
                log.exception("on_event callback raised; continuing the sweep")

    def _finish(self, result: TrialResult) -> None:
        self.sink.trial_finished(result)
        self._results.append(result)
        self.emit(TrialFinished(result, len(self._results), self._total))

    def run(self) -> list[TrialResult]:
        """Run every trial the sink has not finished; results in the order they ended."""
        finished = self.sink.finished_keys()
        trials = [t for t in self.trials if t.key not in finished]
        self._total = len(trials)
        runnable = [t for t in trials if t.skip_reason is None]
        for trial in trials:  # skipped points never touch Ray
            if trial.skip_reason is not None:
                self._finish(TrialResult(trial=trial, status="skipped", error=trial.skip_reason,
                                         started_at=now(), finished_at=now()))
        if runnable:
            static = connect_ray().started_locally
            cpu_chips = [_chips_held(t) for t in runnable if t.accelerator_kind == "cpu"]
            if cpu_chips:
                cpu_chip_warnings(cpu_chips)  # logged: chips beyond cores share them
            runnable.sort(key=_shape)  # stable: same-shape trials adjacent → warm reuse
            self._run_trials(collections.deque(runnable), static_cluster=static)
        counts = collections.Counter(r.status for r in self._results)
        self.emit(SweepFinished(self.name, dict(counts), len(finished)))
        return list(self._results)

    def _run_trials(self, pending: collections.deque, *, static_cluster: bool) -> None:
        pool = WarmPool(enabled=self.options.reuse_workers)
        runner = TrialRunner(options=self.options, pool=pool, cancel_event=self.cancel_event,
                             emit=self.emit)
        running: dict[cf.Future, TrialSpec] = {}
        in_use: collections.Counter = collections.Counter()
        try:
            with cf.ThreadPoolExecutor(self.max_concurrent_trials,
                                       thread_name_prefix="gdn-trial") as executor:
                while (pending and not self.cancel_event.is_set()) or running:
                    while (pending and len(running) < self.max_concurrent_trials
                           and not self.cancel_event.is_set()):
                        trial = pending[0]
                        verdict = self._admit(trial, pool, in_use, static_cluster)
                        if verdict is False:
                            break  # wait for a running trial to free chips
                        pending.popleft()
                        if isinstance(verdict, Exception):
                            self._finish(TrialResult(trial=trial, status="failed",
                                                     error=str(verdict), started_at=now(),
                                                     finished_at=now()))
                            continue
                        in_use[chip_resource(trial.accelerator_kind)] += _chips_held(trial)
                        self.sink.trial_started(trial)
                        warm = verdict if isinstance(verdict, WorkerGroup) else None
                        running[executor.submit(runner.run, trial, warm)] = trial
                    if not running:
                        continue
                    done, _ = cf.wait(running, timeout=self.options.poll_interval_s,
                                      return_when=cf.FIRST_COMPLETED)
                    for future in done:
                        trial = running.pop(future)
                        in_use[chip_resource(trial.accelerator_kind)] -= _chips_held(trial)
                        self._finish(future.result())
        except BaseException:
            self.cancel_event.set()  # stop trials still running before the pool closes
            raise
        finally:
            pool.close()
        for trial in pending:  # cancelled before they started
            self._finish(TrialResult(trial=trial, status="cancelled",
                                     error="sweep cancelled before the trial started",
                                     started_at=now(), finished_at=now()))

    def _admit(self, trial: TrialSpec, pool: WarmPool, in_use: collections.Counter,
               static_cluster: bool) -> WorkerGroup | bool | Exception:
        """True to start `trial` now (or the idle group of its shape, taken from the pool for
        it: counting on a group still in the pool let two trials admitted together both wait
        for one, the second blocking on chips the pool then held), False to wait, or the error
        that fails it outright. A plan needs no chips: always True."""
        if trial.kind == "plan":
            return True
        request = ChipRequest(framework=trial.framework, chips=trial.chips,
                              accelerator_kind=trial.accelerator_kind,
                              accelerator_type=trial.accelerator_type)
        resource = request.resource
        warm = pool.take(request.shape)
        if warm is not None:
            return warm
        total = ray.cluster_resources().get(resource, 0.0)
        if static_cluster and trial.chips > total:
            return ChipCapacityError(trial.chips, resource, total)
        overflow = in_use[resource] + pool.idle_chips(resource) + trial.chips - total
        if overflow > 0:
            pool.evict(resource, int(overflow))
            overflow = in_use[resource] + pool.idle_chips(resource) + trial.chips - total
        # Nothing of ours running: let placement decide (an autoscaler may add hosts).
        return overflow <= 0 or in_use[resource] == 0


def run_trials(trials: Sequence[TrialSpec], sink: ResultSink, *, name: str,
               max_concurrent_trials: int = 1,
               on_event: Callable[[SweepEvent], None] | None = None,
               cancel_event: threading.Event | None = None,
               options: DriverOptions | None = None) -> list[TrialResult]:
    """Run the `trials` of sweep `name` that `sink` has not finished; see SweepDriver."""
    return SweepDriver(trials, sink, name=name, options=options,
                       max_concurrent_trials=max_concurrent_trials, on_event=on_event,
                       cancel_event=cancel_event).run()


def run_sweep(spec: SweepSpec, sink: ResultSink, *, max_concurrent_trials: int = 1,
              on_event: Callable[[SweepEvent], None] | None = None,
              cancel_event: threading.Event | None = None,
              options: DriverOptions | None = None) -> list[TrialResult]:
    """Expand `spec` (here, once) and run its trials that `sink` has not finished: for a
    caller that keeps no expansion of its own (tests, benchmarks); see run_trials."""
    return run_trials(expand_trials(spec), sink, name=spec.name,
                      max_concurrent_trials=max_concurrent_trials, on_event=on_event,
                      cancel_event=cancel_event, options=options)


__all__ = ["SweepDriver", "run_sweep", "run_trials"]
