"""`gdn-sweep bench sweep`: where a sweep's wall time goes, with JAX's compile cache cold and warm.

Runs a sweep (the README's demo by default, or a sweep YAML) through the driver on a local Ray,
`--runs` times in one process: the first run with an empty compilation cache (a first sweep),
the later ones reusing it (a nightly sweep of the same grid). Each run starts its workers
afresh, as a new sweep does. Per run it prints (seconds, summed over trials; trials run one at
a time, so the parts add up to the trials' wall time):
    wall        the run, from the first trial's start to the last one's end
    trials      trials that ran (skipped ones excluded), and wall / trial
    compile     JAX lowering + XLA compile in the trial processes (slowest process per trial)
    steps       warm-up + timed training steps (measured step times)
    other       the rest: placement, process start-up, process-group joins, peak calibration,
                model build, input transfer, Ray calls
Columns side by side in one run: this machine is noisy, remembered numbers are not comparable.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import yaml

from workers.cluster import connect_ray
from workers.driver import run_sweep
from workers.options import DriverOptions
from workers.result import TrialResult
from workers.result_sink import JsonLinesSink
from workers.sweep_spec import SweepSpec


def summarize(results: list[TrialResult], wall_s: float) -> dict[str, float]:
    """The run's wall time split into compile, training steps and the rest."""
    ran = [r for r in results if r.status != "skipped"]
    compile_s = sum(r.metrics.compile_time_s or 0.0 for r in ran)
    steps_s = sum((r.metrics.step_time_s or 0.0) * (r.trial.steps + r.trial.warmup_steps)
                  for r in ran)
    trials_s = sum((r.finished_at - r.started_at).total_seconds() for r in ran
                   if r.started_at and r.finished_at)
    return {"wall": wall_s, "trials": len(ran), "per_trial": wall_s / max(len(ran), 1),
            "compile": compile_s, "compile_frac": compile_s / wall_s if wall_s else 0.0,
            "steps": steps_s, "other": max(trials_s - compile_s - steps_s, 0.0),
            "failed": sum(r.status != "succeeded" for r in ran)}


def format_rows(rows: list[tuple[str, dict[str, float]]]) -> str:
    head = (f"{'run':<14}{'wall_s':>8}{'trials':>7}{'s/trial':>8}{'compile_s':>10}"
            f"{'compile%':>9}{'steps_s':>8}{'other_s':>8}{'failed':>7}")
    lines = [head]
    for name, r in rows:
        lines.append(f"{name:<14}{r['wall']:>8.1f}{r['trials']:>7d}{r['per_trial']:>8.2f}"
                     f"{r['compile']:>10.1f}{100 * r['compile_frac']:>8.0f}%{r['steps']:>8.1f}"
                     f"{r['other']:>8.1f}{r['failed']:>7d}")
    return "\n".join(lines)


def run_once(spec: SweepSpec, *, cache_dir: str, workdir: Path, index: int):
    sink = JsonLinesSink(workdir / f"run{index}.jsonl")
    start = time.perf_counter()
    results = run_sweep(spec, sink, options=DriverOptions(jax_compile_cache_dir=cache_dir))
    return summarize(results, time.perf_counter() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gdn-sweep bench sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", nargs="?", default=None,
                        help="sweep YAML (default: the README's demo sweep)")
    parser.add_argument("--runs", type=int, default=2,
                        help="runs of the sweep: the first with an empty compile cache")
    parser.add_argument("--no-cache", action="store_true",
                        help="no persistent compile cache in any run (for comparison)")
    parser.add_argument("--cpu-chips", type=int, default=None)
    args = parser.parse_args(argv)
    if args.sweep:
        spec = SweepSpec.model_validate(yaml.safe_load(Path(args.sweep).read_text()))
    else:
        from service.demo import demo_sweep

        spec = SweepSpec.model_validate(demo_sweep())
    connect_ray("", cpu_chips=args.cpu_chips)
    rows = []
    with tempfile.TemporaryDirectory(prefix="gdn-bench-sweep-") as tmp:
        cache_dir = "" if args.no_cache else str(Path(tmp) / "jax-cache")
        for index in range(args.runs):
            label = "no cache" if args.no_cache else ("cold cache" if index == 0
                                                      else "warm cache")
            rows.append((f"{index + 1}: {label}",
                         run_once(spec, cache_dir=cache_dir, workdir=Path(tmp), index=index)))
            print(format_rows(rows[-1:]) if index == 0 else format_rows(rows[-1:])
                  .splitlines()[-1], flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
