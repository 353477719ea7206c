"""`gdn-sweep bench scheduling`: what Ray adds to a trial, next to the training step itself.

For each chip count: a cold trial (placement group + actor start + process group, then the
run) and the same trial again, warm, on the reused actors (as the driver's warm pool reuses
them), all through the driver's own pieces (tiny preset, 1 layer, all_gather). Columns (seconds):
    placement    TrialChips.create: placement group reserved and ready
    start+pg     WorkerGroup.create: actors started, process group / jax.distributed joined
    cold_ovh     placement + start+pg + the first run's wall beyond its training steps
    warm_ovh     a warm trial's wall beyond its training steps (Ray calls, model build, CP
                 set-up, result transfer)
    ray_rtt      one no-op call to every actor and back (Ray's own per-call cost)
    step         median training step time (what the trial measures)
    warm_trial   a warm trial's whole wall time (the per-trial cost once Ray is up)
"""

from __future__ import annotations

import argparse
import statistics
import time

import ray

from gdn_core.train_config import FRAMEWORKS

from .cluster import connect_ray
from .grid import expand_trials
from .options import DriverOptions
from .placement import ChipRequest, TrialChips
from .sweep_spec import SweepSpec
from .worker_group import WorkerGroup, WorkerGroupContext

def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def _trial(framework: str, chips: int, seq_len: int, steps: int):
    spec = SweepSpec(name="bench-scheduling", frameworks=[framework], modes=["all_gather"],
                     chips=[chips], seq_lens=[seq_len], model={"preset": "tiny", "num_layers": 1},
                     steps=steps, warmup_steps=1)
    (trial,) = expand_trials(spec)
    if trial.skip_reason:
        raise ValueError(f"chips={chips}, seq_len={seq_len}: {trial.skip_reason}")
    return trial


def _run(group: WorkerGroup, trial):
    """(wall_s, step_time_s, training_s) of one trial on a started group."""
    reports, wall = _timed(lambda: ray.get(group.run(trial)))
    step = statistics.median(max(r.step_times_s[i] for r in reports)
                             for i in range(len(reports[0].step_times_s)))
    # Warm-up steps are not timed by the report; count them at the measured step time.
    return wall, step, step * (trial.steps + trial.warmup_steps)


def bench_shape(framework: str, chips: int, *, seq_len: int, steps: int, repeats: int,
                options: DriverOptions) -> dict[str, float]:
    trial = _trial(framework, chips, seq_len, steps)
    request = ChipRequest(framework=framework, chips=chips, accelerator_kind="cpu",
                          accelerator_type="cpu")
    placed, placement_s = _timed(lambda: TrialChips.create(
        request, timeout_s=options.placement_timeout_s))
    ctx = WorkerGroupContext(chips=placed, options=options)
    try:
        group, start_s = _timed(lambda: WorkerGroup.create(ctx))
    except BaseException:
        placed.remove()
        raise
    try:
        cold_wall, _, cold_train = _run(group, trial)
        warm = [_run(group, trial) for _ in range(repeats)]
        rtts = [_timed(lambda: ray.get([a.info.remote() for a in group.actors]))[1]
                for _ in range(5)]
    finally:
        group.shutdown()
    return {
        "chips": chips, "placement": placement_s, "start+pg": start_s,
        "cold_ovh": placement_s + start_s + cold_wall - cold_train,
        "warm_ovh": statistics.median(w - t for w, _, t in warm),
        "ray_rtt": statistics.median(rtts),
        "step": statistics.median(s for _, s, _ in warm),
        "warm_trial": statistics.median(w for w, _, _ in warm),
    }


def format_table(rows: list[dict[str, float]]) -> str:
    columns = ["chips", "placement", "start+pg", "cold_ovh", "warm_ovh", "ray_rtt", "step",
               "warm_trial"]
    lines = ["  ".join(f"{c:>10}" for c in columns)]
    for row in rows:
        lines.append("  ".join(f"{row[c]:>10d}" if c == "chips" else f"{row[c]:>10.3f}"
                               for c in columns))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gdn-sweep bench scheduling",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=FRAMEWORKS, default="torch")
    parser.add_argument("--chips", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="warm trials per chip count")
    parser.add_argument("--address", default=None,
                        help="Ray address (default $RAY_ADDRESS; empty: start a local Ray)")
    parser.add_argument("--cpu-chips", type=int, default=None,
                        help="virtual CPU chips of a local Ray (default "
                             "$GDN_SWEEP_CPU_CHIPS, else one per usable core)")
    args = parser.parse_args(argv)
    _, ray_up_s = _timed(lambda: connect_ray(args.address, cpu_chips=args.cpu_chips))
    print(f"Ray up in {ray_up_s:.1f} s; framework={args.framework}, tiny preset, 1 layer, "
          f"{args.steps} steps (+1 warm-up), {args.repeats} warm trials per chip count")
    rows = []
    for chips in args.chips:
        rows.append(bench_shape(args.framework, chips, seq_len=args.seq_len, steps=args.steps,
                                repeats=args.repeats, options=DriverOptions()))
        print(format_table(rows[-1:]).splitlines()[-1] if len(rows) > 1
              else format_table(rows), flush=True)
    return 0


__all__ = ["bench_shape", "format_table", "main"]
