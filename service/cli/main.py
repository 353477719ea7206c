"""The `gdn-sweep` command line.

    gdn-sweep train --preset tiny --framework torch   train on one chip, print the metrics
    gdn-sweep bench kernel|cp|memory [options]        benchmarks (python -m gdn_core.bench)
    gdn-sweep bench scheduling [options]              Ray's per-trial overhead (workers)
    gdn-sweep bench sweep [SWEEP.yaml] [options]      a sweep's wall time: compile, steps, rest
    gdn-sweep bench api [options]                     REST latency over 100,000 result rows
    gdn-sweep run sweep.yaml [--db URL|--jsonl F]     run a sweep on Ray (local or a cluster)
    gdn-sweep serve [--workers N]                     API + dashboard + scheduler
    gdn-sweep scheduler                               the scheduler alone (no HTTP)
    gdn-sweep results [filters] [--csv]               succeeded trials from the database
    gdn-sweep db upgrade                              apply the Alembic migrations
"""

from __future__ import annotations

import argparse
import os
import sys

from gdn_core.train_config import COMPUTE_DTYPES, REMATS

FRAMEWORKS = ("torch", "jax")


def _train(args: argparse.Namespace) -> int:
    from gdn_core import flops, hardware
    from gdn_core.presets import get_preset
    from gdn_core.train_config import TrainConfig

    model_cfg = get_preset(args.preset, num_layers=args.num_layers, vocab_size=args.vocab_size)
    train_cfg = TrainConfig(batch_size=args.batch_size, seq_len=args.seq_len, dtype=args.dtype,
                            remat=args.remat, learning_rate=args.learning_rate, seed=args.seed)
    if args.framework == "torch":
        from gdn_core.torch_gdn.train import run_training
    else:
        from gdn_core.jax_gdn.train import run_training
    report = run_training(model_cfg, train_cfg, steps=args.steps, warmup_steps=args.warmup_steps)
    # The peak of this process in the step's dtype, with the framework's own GEMM.
    peak = (hardware.measure_jax_gemm_flops_per_s(dtype=args.dtype) if args.framework == "jax"
            else hardware.calibrate_cpu_peak_flops(dtype=args.dtype))
    model_flops = flops.model_flops_per_step(model_cfg, batch=args.batch_size,
                                             seq_len=args.seq_len).total
    step_time = report.step_time_s
    print(f"framework={args.framework} preset={model_cfg.name} layers={model_cfg.num_layers} "
          f"batch={args.batch_size} seq_len={args.seq_len} dtype={args.dtype} "
          f"remat={args.remat} chips=1")
    print(f"loss: first={report.losses[0]:.4f} last={report.losses[-1]:.4f}")
    print(f"step_time_s={step_time:.4f}  tokens_per_s_per_chip="
          f"{flops.tokens_per_s_per_chip(args.batch_size, args.seq_len, step_time, 1):.1f}")
    print(f"model_flops_per_step={model_flops:.4g}  mfu="
          f"{flops.mfu(model_flops, step_time, 1, peak.flops_per_s):.4f}  "
          f"(peak {peak.flops_per_s:.3g} FLOP/s from {peak.source})")
    print(f"peak_memory_bytes_per_chip={report.peak_memory_bytes} ({report.memory_source})")
    return 0


def _run_sweep(args: argparse.Namespace) -> int:
    """`run`: into the database (--db, the service's path: sweep row, progress bar, cancel
    from the API, resume) or a JSON-lines file. Both check the file as POST /api/sweeps does
    (exit 2, nothing written) and exit 0 only when every trial succeeded or was skipped, 1
    otherwise, 130 on Ctrl-C (the stopped trials stay pending for a resume)."""
    from workers.options import DriverOptions

    options = DriverOptions(placement_timeout_s=args.placement_timeout_s,
                            worker_start_timeout_s=args.worker_start_timeout_s,
                            max_trial_retries=args.max_trial_retries,
                            reuse_workers=not args.no_reuse_workers)
    if (args.sweep is None) == (args.resume is None):
        args.parser.error("give a sweep YAML file or --resume SWEEP_ID (with --db)")
    if args.db or args.resume is not None:
        if not args.db:
            args.parser.error("--resume needs --db URL")
        from service.cli.commands import run_with_db
        from service.core.config import Settings
        from service.core.logging import configure_logging

        # the progress bar is the view: the log (a line per trial event) shows problems only,
        # unless asked for more
        configure_logging(args.log_level or os.environ.get("GDN_SWEEP_LOG_LEVEL") or "warning",
                          Settings().log_format)
        return run_with_db(args.sweep, database_url=args.db, ray_address=args.address,
                           max_concurrent_trials=args.max_concurrent_trials,
                           cpu_chips=args.cpu_chips, resume_sweep_id=args.resume,
                           progress=not args.no_progress, driver_options=options)
    return _run_into_jsonl(args, options)


def _run_into_jsonl(args: argparse.Namespace, options) -> int:
    from service.core.config import Settings
    from service.runs.foreground import (
        EXIT_BAD_INPUT,
        EXIT_INTERRUPTED,
        SweepFileError,
        load_spec,
        needs_ray,
    )
    from workers.cluster import connect_ray, shutdown_ray
    from workers.driver import run_sweep
    from workers.progress import format_event
    from workers.sink import JsonLinesSink

    settings = Settings()
    try:
        spec = load_spec(args.sweep, grid_cap=settings.grid_cap)
    except SweepFileError as err:
        print(err, file=sys.stderr)
        return EXIT_BAD_INPUT
    sink = JsonLinesSink(args.jsonl or f"{spec.name}.jsonl")

    def show(event) -> None:
        line = format_event(event)
        if line:
            print(line, flush=True)

    try:
        if needs_ray(spec):
            connect_ray(args.address, cpu_chips=args.cpu_chips,
                        dashboard_port=settings.ray_dashboard_port,
                        include_dashboard=settings.ray_include_dashboard)
        run_sweep(spec, sink, max_concurrent_trials=args.max_concurrent_trials,
                  on_event=show, options=options)
    except KeyboardInterrupt:
        _, pending = _jsonl_outcome(sink.path, spec)
        print(f"\nstopped: {pending} trial(s) stay pending for a resume; run the same command "
              f"again to finish them (results so far in {sink.path})", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        shutdown_ray()
    ok, _ = _jsonl_outcome(sink.path, spec)
    return 0 if ok else 1


def _jsonl_outcome(path, spec) -> tuple[bool, int]:
    """(every trial of `spec` succeeded or was skipped, trials without an outcome) from the
    JSON-lines file, whatever run of it wrote them."""
    import json

    from service.runs.foreground import SUCCESSFUL
    from workers.spec import expand_trials

    statuses = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if record.get("event") == "finished":
                statuses[record["key"]] = record["status"]
    keys = [trial.key for trial in expand_trials(spec)]
    ok = all(statuses.get(key) in SUCCESSFUL for key in keys)
    return ok, sum(statuses.get(key, "cancelled") == "cancelled" for key in keys)


def _add_run_parser(sub) -> None:
    run = sub.add_parser("run", help="run a sweep YAML on Ray (resumes from its sink)")
    run.add_argument("sweep", nargs="?",
                     help="sweep YAML (the SweepSpec schema of the REST API)")
    run.add_argument("--jsonl", default=None,
                     help="JSON-lines results file, also read to resume (default <name>.jsonl)")
    run.add_argument("--db", default=None, help="database URL (the service's sink)")
    run.add_argument("--resume", type=int, metavar="SWEEP_ID",
                     help="with --db: finish a recorded sweep instead of reading a file")
    run.add_argument("--no-progress", action="store_true", help="with --db: no progress bar")
    run.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                     help="with --db: the log's level (default $GDN_SWEEP_LOG_LEVEL, else "
                          "warning: info adds one line per trial event)")
    run.add_argument("--address", default=None,
                     help="Ray address (default $RAY_ADDRESS, as under `ray job submit`; "
                          "empty: start a local Ray)")
    run.add_argument("--cpu-chips", type=int, default=None,
                     help="virtual CPU chips of a local Ray (default "
                          "$GDN_SWEEP_CPU_CHIPS, else one per usable core)")
    run.add_argument("--max-concurrent-trials", type=int, default=1)
    run.add_argument("--placement-timeout-s", type=float, default=300.0)
    run.add_argument("--worker-start-timeout-s", type=float, default=180.0)
    run.add_argument("--max-trial-retries", type=int, default=2)
    run.add_argument("--no-reuse-workers", action="store_true",
                     help="fresh actors for every trial (no warm pool)")
    run.set_defaults(run=_run_sweep, parser=run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gdn-sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train a preset on one chip and print its metrics")
    train.add_argument("--preset", default="tiny")
    train.add_argument("--framework", choices=FRAMEWORKS, default="torch")
    train.add_argument("--num-layers", type=int, default=None)
    train.add_argument("--vocab-size", type=int, default=None)
    train.add_argument("--batch-size", type=int, default=1)
    train.add_argument("--seq-len", type=int, default=512)
    train.add_argument("--dtype", choices=COMPUTE_DTYPES, default="float32")
    train.add_argument("--remat", choices=REMATS, default="none",
                       help="activation recomputation: none, full (each layer), gdn (GDN core)")
    train.add_argument("--learning-rate", type=float, default=3e-3)
    train.add_argument("--steps", type=int, default=30)
    train.add_argument("--warmup-steps", type=int, default=2)
    train.add_argument("--seed", type=int, default=0)
    train.set_defaults(run=_train)
    bench = sub.add_parser("bench", help="benchmarks: kernel, cp, memory (see python -m "
                           "gdn_core.bench), scheduling (Ray's per-trial overhead)", add_help=False)
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(run=lambda args: _bench(args.bench_args))
    _add_run_parser(sub)
    from service.cli.commands import add_service_commands

    add_service_commands(sub)
    return parser


def _bench(argv: list[str]) -> int:
    if argv[:1] == ["scheduling"]:
        from workers.bench_scheduling import main as scheduling_main

        return scheduling_main(argv[1:]) or 0
    if argv[:1] == ["sweep"]:
        from service.bench.sweep import main as sweep_main

        return sweep_main(argv[1:]) or 0
    if argv[:1] == ["api"]:
        from service.bench.api import main as api_main

        return api_main(argv[1:]) or 0
    from gdn_core.bench import main as bench_main

    return bench_main(argv) or 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
