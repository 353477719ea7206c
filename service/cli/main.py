"""The `gdn-sweep` command line: the parser, and the actions of train, bench, run and import
(the service's commands are in commands.py, parsers.py, plan.py, schedule.py, regressions.py).

`gdn-sweep --help` lists every command from the registered sub-parsers themselves (each with
its one-line help), so the list cannot leave one out; `gdn-sweep COMMAND --help` gives a
command's options.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import textwrap
from pathlib import Path

from gdn_core.train_config import COMPUTE_DTYPES, FRAMEWORKS, REMATS


def _train(args: argparse.Namespace) -> int:
    from gdn_core import calibration
    from gdn_core.flops.model import model_flops_per_step
    from gdn_core.flops.utilisation import mfu, tokens_per_s_per_chip
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
    peak = (calibration.measure_jax_gemm_flops_per_s(dtype=args.dtype)
            if args.framework == "jax" else calibration.calibrate_cpu_peak_flops(dtype=args.dtype))
    model_flops = model_flops_per_step(model_cfg, batch=args.batch_size,
                                       seq_len=args.seq_len).total
    step_time = report.step_time_s
    print(f"framework={args.framework} preset={model_cfg.name} layers={model_cfg.num_layers} "
          f"batch={args.batch_size} seq_len={args.seq_len} dtype={args.dtype} "
          f"remat={args.remat} chips=1")
    print(f"loss: first={report.losses[0]:.4f} last={report.losses[-1]:.4f}")
    print(f"step_time_s={step_time:.4f}  tokens_per_s_per_chip="
          f"{tokens_per_s_per_chip(args.batch_size, args.seq_len, step_time, 1):.1f}")
    print(f"model_flops_per_step={model_flops:.4g}  mfu="
          f"{mfu(model_flops, step_time, 1, peak.flops_per_s):.4f}  "
          f"(peak {peak.flops_per_s:.3g} FLOP/s from {peak.source})")
    print(f"peak_memory_bytes_per_chip={report.peak_memory_bytes} ({report.memory_source})")
    return 0


def _run_sweep(args: argparse.Namespace) -> int:
    """`run`, and `deploy/run_sweep.py` (args.cluster): into the database (--db, the service's
    path: sweep row, progress bar, cancel from the API, resume) or a JSON-lines file. Both
    check the file as POST /api/sweeps does (exit 2, nothing written), then the sink, then Ray,
    and exit 0 only when every trial succeeded or was skipped, 1 otherwise, 130 on Ctrl-C (the
    stopped trials stay pending for a resume); see service/runs/run_command.py."""
    from pydantic import ValidationError

    from service.cli.commands import cli_settings
    from service.runs.admission import validation_text
    from service.runs.preflight import EXIT_BAD_INPUT
    from service.runs.run_command import run_sweep_into_db, run_sweep_into_jsonl
    from workers.environment import SweepSource
    from workers.options import DriverOptions

    parser = args.parser
    if (args.sweep is None) == (args.resume is None):
        parser.error("give a sweep YAML file, or --resume (a sweep id with --db, a results "
                     "file otherwise)")
    if args.cluster and not (args.db or args.jsonl or args.resume is not None):
        parser.error("give the sink: --db URL or --jsonl FILE|DIR/ (or --resume FILE)")
    if args.resume is not None and args.jsonl is not None:
        parser.error("--resume FILE continues the sweep in FILE; leave out --jsonl")
    if args.resume is not None and args.new and not args.cluster:
        parser.error("--new starts a new sweep; leave out --resume")
    resume_sweep_id = None
    if args.resume is not None and args.db:
        try:
            resume_sweep_id = int(args.resume)
        except ValueError:
            parser.error(f"--resume with --db takes a sweep id (an integer), not {args.resume!r}")
    address = ray_address(args.address, cluster=args.cluster)
    options = DriverOptions(placement_timeout_s=args.placement_timeout_s,
                            worker_start_timeout_s=args.worker_start_timeout_s,
                            max_trial_retries=args.max_trial_retries,
                            reuse_workers=not args.no_reuse_workers,
                            source=SweepSource(kind="ray_job" if args.cluster else "cli"))
    try:
        settings = cli_settings(database_url=args.db, ray_address=address,
                                max_concurrent_trials=args.max_concurrent_trials,
                                cpu_chips=args.cpu_chips)
    except ValidationError as err:
        print(validation_text(err).replace("\n", "; "), file=sys.stderr)
        return EXIT_BAD_INPUT
    # profile traces go where a service on the same settings serves them from
    options = dataclasses.replace(options, artifact_dir=settings.artifact_dir)
    new = args.new or args.cluster
    if args.db:
        from service.core.config import Settings
        from service.core.logging import configure_logging

        # the progress bar is the view: the log (a line per trial event) shows problems only,
        # unless asked for more
        configure_logging(args.log_level or os.environ.get("GDN_SWEEP_LOG_LEVEL") or "warning",
                          Settings().log_format)
        return run_sweep_into_db(args.sweep, settings=settings, resume_sweep_id=resume_sweep_id,
                                 new=new and resume_sweep_id is None,
                                 progress=not args.no_progress, driver_options=options)
    return run_sweep_into_jsonl(args.sweep, settings=settings, target=args.jsonl,
                                resume_file=args.resume, new=new and args.resume is None,
                                progress=not args.no_progress, driver_options=options)


def ray_address(given: str | None, *, cluster: bool) -> str:
    """The Ray address a run uses: the one given, else $RAY_ADDRESS (`ray job submit` sets
    it), else "" (a local Ray) for `gdn-sweep run` and "auto" for the cluster script: on a
    head started by `ray up`/`ray start` nothing sets RAY_ADDRESS, and the script must find
    that cluster, never start a Ray of its own."""
    if given is not None:
        return given
    return os.environ.get("RAY_ADDRESS") or ("auto" if cluster else "")


def add_run_arguments(run: argparse.ArgumentParser, *, cluster: bool) -> None:
    """The options of `gdn-sweep run` (cluster=False) and of deploy/run_sweep.py (cluster=True:
    the sink is required, every run is a new sweep, the Ray address defaults to auto)."""
    run.add_argument("sweep", nargs="?",
                     help="sweep YAML (the SweepSpec schema of the REST API)")
    sink = run.add_mutually_exclusive_group()
    sink.add_argument("--db", default=None,
                      help="database URL (the service's sink), e.g. "
                           "postgresql://user@host:5432/gdn_sweep")
    sink.add_argument("--jsonl", default=None, metavar="FILE|DIR/",
                      help="JSON-lines results: a folder (DIR/) gets a new file per run, "
                           "<name>-<UTC time>.jsonl; a file is made"
                           + (" (one that exists is refused: one file, one sweep)" if cluster
                              else ", or resumed when it holds this same sweep (default "
                                   "<name>.jsonl)")
                           + "; load it into a database with `gdn-sweep import`")
    run.add_argument("--resume", metavar="SWEEP_ID|FILE",
                     help="finish an interrupted sweep instead of starting one: with --db its "
                          "sweep id, else the results file it was writing")
    if not cluster:
        run.add_argument("--new", action="store_true",
                         help="always a new sweep (default: the same file again resumes an "
                              "unfinished identical sweep)")
    run.add_argument("--no-progress", action="store_true",
                     help="no progress bar (--db) or progress lines (--jsonl)")
    run.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                     help="with --db: the log's level (default $GDN_SWEEP_LOG_LEVEL, else "
                          "warning: info adds one line per trial event)")
    run.add_argument("--address", default=None,
                     help="Ray address (default $RAY_ADDRESS, as under `ray job submit`, else "
                          + ("auto: the cluster this machine is a node of; never a Ray of its "
                             "own" if cluster else "a local Ray; empty: a local Ray") + ")")
    run.add_argument("--cpu-chips", type=int, default=None,
                     help="virtual CPU chips of a local Ray (only a local Ray: "
                          + ("--address ''" if cluster else "no address") +
                          "; default $GDN_SWEEP_CPU_CHIPS, else one per usable core)")
    run.add_argument("--max-concurrent-trials", type=int, default=1)
    run.add_argument("--placement-timeout-s", type=float, default=300.0)
    run.add_argument("--worker-start-timeout-s", type=float, default=180.0)
    run.add_argument("--max-trial-retries", type=int, default=2)
    run.add_argument("--no-reuse-workers", action="store_true",
                     help="fresh actors for every trial (no warm pool)")
    run.set_defaults(run=_run_sweep, parser=run, cluster=cluster, new=cluster)


def cluster_main(argv: list[str] | None = None) -> int:
    """deploy/run_sweep.py: `gdn-sweep run` for a cluster head (see that script)."""
    parser = argparse.ArgumentParser(
        prog="run_sweep.py", description=CLUSTER_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_arguments(parser, cluster=True)
    args = parser.parse_args(argv)
    if args.sweep is not None:
        args.sweep = str(_sweep_file(Path(args.sweep)))
    return args.run(args)


def _sweep_file(path: Path) -> Path:
    """A relative sweep path from the working directory, else from the checkout this package
    runs from: `ray submit` runs the script from the head's home directory, with the checkout
    where the cluster config's file_mounts put it (`pip install -e` from there)."""
    if path.is_absolute() or path.exists():
        return path
    checkout = Path(__file__).resolve().parents[2]
    return checkout / path if (checkout / path).is_file() else path


CLUSTER_DESCRIPTION = """\
Run a sweep on the Ray cluster this runs on (`ray submit` / `ray job submit`): a new sweep
each run (its own id and date) unless --resume, into the shared database (--db) or a
JSON-lines file (--jsonl, for `gdn-sweep import`). A relative sweep path is read from
the working directory, else from the checkout the package runs from (under `ray submit`,
the one the cluster's file_mounts copied). The sweep's id, a summary table, the reason of
each trial that did not succeed and where to see the results are printed at the end. Exit
codes: 0 every trial succeeded or was skipped, 1 otherwise or when the database or Ray cannot
be reached, 2 bad input, 130 interrupted."""


def _import(args: argparse.Namespace) -> int:
    from service.runs.jsonl_import import import_command

    return import_command(args.files, database_url=args.db)


def _add_import_parser(sub) -> None:
    p = sub.add_parser("import", help="load JSON-lines results (gdn-sweep run --jsonl, "
                       "deploy/run_sweep.py --jsonl) into the database; importing a file "
                       "again adds only what it gained")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--db", default=None,
                   help="database URL (default: $DATABASE_URL, else sqlite:///gdn_sweep.db)")
    p.set_defaults(run=_import)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gdn-sweep", usage="gdn-sweep [-h] COMMAND ...",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    # the commands are listed in the description, generated below from the registered
    # sub-parsers (argparse's own listing would come after the options, wrapped narrow)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                prog="gdn-sweep", help=argparse.SUPPRESS)
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
    from gdn_core.bench import BENCHMARKS

    bench = sub.add_parser("bench", help="benchmarks, printing figures: "
                           f"{', '.join([*BENCHMARKS, *EXTRA_BENCHMARKS])} (`gdn-sweep bench` "
                           "lists them)", add_help=False)
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(run=lambda args: _bench(args.bench_args))
    add_run_arguments(sub.add_parser("run", help="run a sweep YAML on Ray into the database "
                                     "or a JSON-lines file"), cluster=False)
    _add_import_parser(sub)
    from service.cli.commands import add_service_commands

    add_service_commands(sub)
    parser.description = DESCRIPTION + "\n" + command_summary(subcommands(parser))
    return parser


def command_summary(commands: dict[str, str], width: int = 92) -> str:
    """The `gdn-sweep --help` list: one entry per command, its help wrapped beside it."""
    column = max(len(name) for name in commands) + 4
    return "\n".join(textwrap.fill(text, width, initial_indent=f"  {name:<{column - 2}}",
                                    subsequent_indent=" " * column)
                     for name, text in commands.items())


DESCRIPTION = """\
Measure how Gated DeltaNet training scales under context parallelism: sweeps of CP mode x
chips x sequence length run on Ray, results in a SQL database, read from the dashboard
(`gdn-sweep serve`), `gdn-sweep results` or SQL. `gdn-sweep COMMAND --help` gives a
command's options.

commands:"""


def subcommands(parser: argparse.ArgumentParser) -> dict[str, str]:
    """{name: one-line help} of every command registered on the `gdn-sweep` parser: what
    its --help lists."""
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help for choice in action._choices_actions}
    return {name: helps.get(name) or "" for name in action.choices}


EXTRA_BENCHMARKS = {
    "scheduling": "Ray's per-trial overhead (workers.bench_scheduling)",
    "sweep": "a sweep's wall time: compile, steps, the rest (service.bench.sweep)",
    "api": "REST latency over 100,000 result rows (service.bench.api_load)",
    "planner-validate": "record a seq_len sweep, `plan --validate` it "
                        "(service.bench.planner_validate)",
}
"""`gdn-sweep bench` names beyond gdn_core.bench.BENCHMARKS (dispatched in _bench)."""
BENCH_USAGE = """\
usage: gdn-sweep bench <name> [options]   (gdn-sweep bench <name> --help for its options)
benchmarks:
{gdn_core}
{extra}
"""


def _bench(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        from gdn_core.bench import BENCHMARKS

        width = max(map(len, [*BENCHMARKS, *EXTRA_BENCHMARKS]))
        print(BENCH_USAGE.format(
            gdn_core="\n".join(f"  {name:<{width}} {target.split(':')[0]}"
                               for name, target in BENCHMARKS.items()),
            extra="\n".join(f"  {name:<{width}} {text}"
                             for name, text in EXTRA_BENCHMARKS.items())),
            end="")
        return 0
    if argv[:1] == ["scheduling"]:
        from workers.bench_scheduling import main as scheduling_main

        return scheduling_main(argv[1:]) or 0
    if argv[:1] == ["sweep"]:
        from service.bench.sweep import main as sweep_main

        return sweep_main(argv[1:]) or 0
    if argv[:1] == ["planner-validate"]:
        from service.bench.planner_validate import main as planner_validate_main

        return planner_validate_main(argv[1:]) or 0
    if argv[:1] == ["api"]:
        from service.bench.api_load import main as api_main

        return api_main(argv[1:]) or 0
    from gdn_core.bench import main as bench_main

    return bench_main(argv) or 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # `bench` hands everything after it to the benchmark; argparse's REMAINDER cannot take an
    # option (`bench --help`) as its first word, so those come back unrecognised
    args, unknown = parser.parse_known_args(argv)
    if unknown and getattr(args, "command", None) != "bench":
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if unknown:
        args.bench_args = unknown + args.bench_args
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
