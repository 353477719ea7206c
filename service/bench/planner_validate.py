"""`gdn-sweep bench planner-validate`: record a sequence-length sweep on a fresh SQLite
database and print `gdn-sweep plan --validate` of it, then the step-time goal judged where
this host can show it (issue 35 item 6).

The protocol: JAX, p2p, the tiny preset with one layer (float32, batch 1), chips 1, 2 and 4 ×
seq_len 4,096, 6,144, 8,192, 12,288 and 16,384 — every step at least ~100 ms on one core of
the 2-core host this was written on (0.14 s at one chip × 4,096 tokens) —, 10 timed steps
after 2 warm-up steps (a trial's step time is their median), each grid point run 5 times as
separate trials (the fits and the validation read the median of the repeats: two disturbed
repeats of five leave it alone), one trial at a time, 75 trials in about 7 minutes. Five
lengths, not three: with repeats 3-5% apart (this host's, quiet), the seq_len hold-outs meet
the goal far more often on five (simulated, the noise alone, 3 repeats: 77% against 55% of
runs at 5%, 99% against 89% at 3%); the largest is still extrapolated (1.33× beyond). Virtual
CPU chips are one per usable core unless --chips asks for more (then they share cores); each
trial's process is pinned to its chips' cores (workers/cpu_cores.py), which the results record
in peak_flops_source ("cores=0-1(…)").

The goal (validate.STEP_TIME_MEDIAN_GOAL, STEP_TIME_GOAL: median ≤ 5%, worst ≤ 10%) is judged
on the sequence-length hold-outs at chip counts up to the host's cores: there each virtual
chip has a core of its own. The chip-count hold-out (the largest chip count, predicted from
the smaller ones through the link fit) and the seq_len hold-outs on chips that share cores are
printed as they are: chips that share a core cannot run at once, which no model of
independent chips holds. The load average is printed before and after: on a shared host,
another process on a core stretches every multi-chip step (rerun on a quiet host).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TextIO

import yaml

SEQ_LENS = (4096, 6144, 8192, 12288, 16384)
CHIPS = (1, 2, 4)
MIN_STEP_S = 0.1
"""The shortest step the protocol wants: below, a step is dominated by per-step overheads and
the working set fits the caches, which is not the regime the planner extrapolates to."""


def sweep_spec(args: argparse.Namespace) -> dict:
    """The sweep the protocol records (its YAML is printed with the results)."""
    return {"name": "planner-validate: seq_len hold-outs", "kinds": ["measure"],
            "frameworks": ["jax"], "modes": [args.mode], "chips": list(args.chips),
            "seq_lens": list(args.seq_lens), "model": {"preset": "tiny",
                                                      "num_layers": args.num_layers},
            "steps": args.steps, "warmup_steps": args.warmup_steps, "repeats": args.repeats,
            "accelerator": {"kind": "cpu", "type": "cpu"}, "trial_timeout_s": 600.0}


def goal_table(rows, cores: int) -> list[tuple[str, bool, dict | None]]:
    """(scope, whether the goal is judged there, the step-time summary of its held-out rows)
    for: the seq_len hold-outs at chips ≤ cores (the goal), those on chips sharing cores, and
    the chip-count hold-out."""
    from service.planner.validate import summary

    steps = [r for r in rows if r.figure == "step_time_s"]
    lengths = [r for r in steps if "seq_len" in r.holdout]
    scopes = ((f"seq_len hold-outs, chips ≤ {cores} (the goal)", True,
               [r for r in lengths if r.chips <= cores]),
              (f"seq_len hold-outs, chips > {cores}: chips share cores (reported)", False,
               [r for r in lengths if r.chips > cores]),
              ("chip-count hold-out (reported)", False,
               [r for r in steps if r.holdout.startswith("largest chips")]))
    out = []
    for name, judged, scoped in scopes:
        overall = [s for s in summary(scoped) if s["basis"] == "all"]
        out.append((name, judged, overall[0] if overall else None))
    return out


def _write_goal_table(table, out: TextIO) -> None:
    out.write("\nstep time (each point the median of its repeats) by scope:\n")
    for name, judged, s in table:
        if s is None or s["median_error"] is None:
            out.write(f"  {name:<60} no point predicted\n")
            continue
        verdict = (f"  → median {'meets' if s['median_meets_goal'] else 'misses'} "
                   f"{100 * s['median_goal']:.0f}%, worst "
                   f"{'meets' if s['every_point_meets_goal'] else 'misses'} "
                   f"{100 * s['goal']:.0f}%") if judged else ""
        out.write(f"  {name:<60} {s['trials']:>2} point(s)  median "
                  f"{100 * s['median_error']:5.1f}%  worst {100 * s['max_error']:5.1f}%  "
                  f"{s['within_goal']}/{s['trials']} within {100 * s['goal']:.0f}%{verdict}\n")


def _short_steps(url: str) -> list[str]:
    """Points whose step was shorter than MIN_STEP_S."""
    from sqlalchemy import select

    from service.db.engine import make_engine, make_session_factory
    from service.db.models import Result

    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            rows = session.execute(select(Result.chips, Result.seq_len, Result.step_time_s)
                                   .where(Result.status == "succeeded")).all()
    finally:
        engine.dispose()
    by_point: dict[tuple[int, int], list[float]] = {}
    for chips, seq_len, step in rows:
        by_point.setdefault((chips, seq_len), []).append(step)
    return [f"chips={c}/seq_len={s}: {statistics.median(v):.3f} s"
            for (c, s), v in sorted(by_point.items()) if statistics.median(v) < MIN_STEP_S]


BUSY_LOAD_PER_CORE = 0.5
"""A 1-minute load average above this many per core before the sweep: other processes run on
the chips' cores, and the figures will carry their load (flagged). During and just after the
sweep its own trials count too (about the running trial's chips, up to the cores)."""


LOAD_SAMPLE_S = 5.0


def _sample_load(samples: list[float], done: threading.Event) -> None:
    """The 1-minute load average every LOAD_SAMPLE_S until `done` (at least once)."""
    samples.append(os.getloadavg()[0])
    while not done.wait(LOAD_SAMPLE_S):
        samples.append(os.getloadavg()[0])


def _load(cores: int, *, flag: bool = True) -> str:
    one, five, _ = os.getloadavg()
    busy = ""
    if flag and one > BUSY_LOAD_PER_CORE * cores:
        busy = (f" — BUSY (over {BUSY_LOAD_PER_CORE:g} per core): other processes share the "
                "cores; rerun on a quiet host")
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {cores} cores{busy}"


def _gdn_sweep(*argv: str) -> int:
    """`gdn-sweep ARGV` in a process of its own (its output to ours), as a user runs it."""
    sys.stdout.flush()
    return subprocess.run([sys.executable, "-m", "service.cli", *argv], check=False).returncode


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gdn-sweep bench planner-validate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", default=None, help="a new SQLite file to record into (default: one "
                   "in a temporary folder, removed at the end); refused if it exists")
    p.add_argument("--seq-lens", type=int, nargs="+", default=list(SEQ_LENS))
    p.add_argument("--chips", type=int, nargs="+", default=list(CHIPS))
    p.add_argument("--mode", choices=("p2p", "all_gather", "log_scan", "ulysses"),
                   default="p2p")
    p.add_argument("--num-layers", type=int, default=1)
    p.add_argument("--steps", type=int, default=10, help="timed steps per trial")
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5, help="trials per grid point")
    return p


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    args = parser().parse_args(argv)
    out = out or sys.stdout
    from workers.cpu_cores import usable_cores

    cores = len(usable_cores())
    with tempfile.TemporaryDirectory(prefix="gdn-planner-validate-") as tmp:
        db = Path(args.db) if args.db else Path(tmp) / "planner-validate.db"
        if db.exists():
            print(f"--db {db} exists: the protocol records into a fresh database; name a new "
                  "file", file=sys.stderr)
            return 2
        url = f"sqlite:///{db.resolve()}"
        spec_path = Path(tmp) / "sweep.yaml"
        spec_path.write_text(yaml.safe_dump(sweep_spec(args), sort_keys=False))
        out.write(f"sweep ({spec_path.name}):\n{spec_path.read_text()}\nbefore: "
                  f"{_load(cores)}\n")
        out.flush()
        start, samples, done = time.monotonic(), [], threading.Event()
        sampler = threading.Thread(target=_sample_load, args=(samples, done), daemon=True)
        sampler.start()
        code = _gdn_sweep("run", str(spec_path), "--db", url, "--new", "--no-progress",
                          "--cpu-chips", str(max(cores, *args.chips)),
                          "--max-concurrent-trials", "1")
        done.set()
        sampler.join()
        out.write(f"recorded in {time.monotonic() - start:.0f} s into {url}; during it the "
                  f"1-minute load average was {statistics.mean(samples):.2f} on average, "
                  f"{max(samples):.2f} at most (every {LOAD_SAMPLE_S:g} s; its own trials "
                  f"count up to their chips); after: {_load(cores, flag=False)}\n")
        if code != 0:
            print(f"the sweep did not finish (exit {code})", file=sys.stderr)
            return code
        short = _short_steps(url)
        if short:
            out.write(f"steps under {MIN_STEP_S * 1000:.0f} ms (below the protocol's "
                      f"floor): {'; '.join(short)}\n")
        out.flush()
        from service.db.engine import make_engine, make_session_factory
        from service.planner.evidence import load_observations
        from service.planner.validate import validate

        code = _gdn_sweep("plan", "--db", url, "--validate", "1")
        engine = make_engine(url)
        try:
            with make_session_factory(engine)() as session:
                rows = validate(load_observations(session, preset="tiny",
                                                  accelerator_type="cpu"))
        finally:
            engine.dispose()
        _write_goal_table(goal_table(rows, cores), out)
        return code


if __name__ == "__main__":
    raise SystemExit(main())
