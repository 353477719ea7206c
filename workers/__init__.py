"""workers: Ray placement and execution of sweep trials (docs/architecture.md, workers/README.md).

Main entry point: `run_sweep(spec, sink, ...)` / `SweepDriver` (driver.py). One concern per
module: placement (placement groups), torch_ranks (one actor per rank), jax_hosts (one actor per
host), chip_process (what those two actors share), worker_group (starting them all-or-nothing), warm_pool (reuse between trials),
trial_runner (one trial to a result), failures (status from an error), metrics (reports to
TrialMetrics), events, cluster (connecting to Ray), bench_scheduling (`gdn-sweep bench
scheduling`). The contracts shared with the service: sweep_spec (what a sweep asks for), grid
(the trials it expands to), memory_admission (will a trial fit its chip), result, result_sink
(where results go).

Names are imported lazily so `from workers.sweep_spec import SweepSpec` does not import Ray.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "run_sweep": "driver", "SweepDriver": "driver", "DriverOptions": "options",
    "connect_ray": "cluster", "JsonLinesSink": "result_sink", "ResultSink": "result_sink",
    "SweepSpec": "sweep_spec", "TrialSpec": "grid", "expand_trials": "grid",
    "TrialResult": "result", "TrialMetrics": "result",
    "TrialStarted": "events", "TrialRetrying": "events", "TrialFinished": "events",
    "SweepFinished": "events",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module 'workers' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
