"""`gdn-sweep run` (its main in this process; a real process where Ray or signals are the
point), into SQLite (--db) and a JSON-lines file (--jsonl).

Bad input is one message and exit code 2 with nothing written, on both paths, checked as
POST /api/sweeps checks it (the grid cap included). Exit code 0 only when every trial
succeeded or was skipped, 1 when one did not. Ctrl-C exits 130, says how many trials stay
pending, and leaves the sweep queued: running the same file again finishes it.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from sqlalchemy import func, select

from service.cli.main import main as cli_main
from service.db.engine import make_engine, make_session_factory, upgrade_database
from service.db.models import Sweep, Trial
from workers.result_sink import read_jsonl

from .conftest import TINY_SWEEP

REPO_ROOT = Path(__file__).resolve().parents[2]
PATHS = ("db", "jsonl")


def write_sweep(tmp_path: Path, body, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(body if isinstance(body, str) else yaml.safe_dump(body))
    return path


def _sink_args(tmp_path: Path, path: str) -> list[str]:
    return ["--db", f"sqlite:///{tmp_path / 'cli.db'}"] if path == "db" else [
        "--jsonl", str(tmp_path / "cli.jsonl")]


def cli_run(tmp_path: Path, sweep: Path, path: str, *args: str,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """`gdn-sweep run` in this process (its main, argv, environment, stdout and stderr): what
    the command does without paying a Python start and torch/JAX/Ray imports per call."""
    argv = ["run", str(sweep), *_sink_args(tmp_path, path), *args]
    out, err = io.StringIO(), io.StringIO()
    saved = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli_main(argv)
            except SystemExit as exit_:  # argparse's errors
                code = exit_.code
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def cli_process(tmp_path: Path, sweep: Path, path: str, *args: str,
                timeout_s: float = 120) -> subprocess.CompletedProcess:
    """`gdn-sweep run` as a process of its own (a local Ray of its own, started and stopped)."""
    return subprocess.run([sys.executable, "-m", "service.cli", "run", str(sweep),
                           *_sink_args(tmp_path, path), *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout_s)


@pytest.fixture
def migrated_db(tmp_path):
    """The --db path's database, migrated beforehand, so 'nothing written' means no rows."""
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    upgrade_database(url)
    engine = make_engine(url)
    yield make_session_factory(engine)
    engine.dispose()


def row_counts(session_factory) -> tuple[int, int]:
    with session_factory() as s:
        return (s.scalar(select(func.count()).select_from(Sweep)),
                s.scalar(select(func.count()).select_from(Trial)))


def wrote_nothing(tmp_path: Path, path: str, session_factory) -> bool:
    if path == "db":
        return row_counts(session_factory) == (0, 0)
    return not (tmp_path / "cli.jsonl").exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", PATHS)
def test_a_grid_over_the_cap_exits_2_with_the_apis_message_and_writes_nothing(
        tmp_path, migrated_db, path):
    sweep = write_sweep(tmp_path, {**TINY_SWEEP, "chips": [1, 2, 4], "seq_lens": [64, 128, 256]})
    done = cli_run(tmp_path, sweep, path, env={"GDN_SWEEP_GRID_CAP": "8"})
    assert done.returncode == 2, done.stderr
    assert "the grid has 9 trials" in done.stderr
    assert "at most 8 are accepted (GDN_SWEEP_GRID_CAP)" in done.stderr
    assert wrote_nothing(tmp_path, path, migrated_db)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("content", "message"), [
    ("name: x\nframeworks: [torch\nmodes: [p2p]\n",
     r"sweep\.yaml:3:6: not valid YAML: expected ',' or '\]', but got ':' \(while parsing a "
     r"flow sequence at line 2\)"),
    ("- a list\n- not a mapping\n", r"sweep\.yaml: a sweep is a YAML mapping .* holds a list"),
    ("", r"sweep\.yaml: a sweep is a YAML mapping .* holds nothing"),
], ids=["yaml-syntax", "a-list", "empty"])
def test_a_malformed_file_exits_2_with_one_line_naming_it_and_no_traceback(
        tmp_path, migrated_db, path, content, message):
    import re

    done = cli_run(tmp_path, write_sweep(tmp_path, content), path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr + done.stdout
    (line,) = done.stderr.strip().splitlines()
    assert re.search(message, line), line
    assert wrote_nothing(tmp_path, path, migrated_db)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", PATHS)
def test_a_missing_file_exits_2(tmp_path, path):
    done = cli_run(tmp_path, tmp_path / "nowhere.yaml", path)
    assert done.returncode == 2
    assert done.stderr.strip() == f"{tmp_path / 'nowhere.yaml'}: no such file"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", PATHS)
def test_an_invalid_sweep_exits_2_naming_the_field(tmp_path, migrated_db, path):
    done = cli_run(tmp_path, write_sweep(tmp_path, {**TINY_SWEEP, "modes": ["sideways"]}), path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "sweep.yaml: not a valid sweep:" in done.stderr and "modes" in done.stderr
    assert "(got 'sideways')" in done.stderr  # the bad value, beside what is accepted
    assert wrote_nothing(tmp_path, path, migrated_db)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", PATHS)
def test_a_sweep_file_with_a_bad_documents_value_exits_2_naming_it(tmp_path, migrated_db,
                                                                  path):
    sweep = write_sweep(tmp_path, {**TINY_SWEEP, "documents": ["single", "uniform:9"]})
    done = cli_run(tmp_path, sweep, path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "sweep.yaml: not a valid sweep:" in done.stderr and "documents" in done.stderr
    assert "documents='uniform:9' is not single" in done.stderr
    assert wrote_nothing(tmp_path, path, migrated_db)


@pytest.mark.timeout(60)
def test_a_sweep_file_asks_for_packed_documents_and_records_them(tmp_path):
    # seq_len 64 over 3 chips is skipped: the point is recorded without starting Ray
    sweep = write_sweep(tmp_path, {**TINY_SWEEP, "chips": [3], "documents": "uniform:8-24"})
    done = cli_run(tmp_path, sweep, "jsonl")
    assert done.returncode == 0, done.stderr
    (record,) = [r for _, r in read_jsonl(tmp_path / "cli.jsonl").results]
    assert record.trial.documents == "uniform:8-24"
    assert record.trial.key.endswith("/documents=uniform:8-24") and record.status == "skipped"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("path", PATHS)
def test_a_sweep_whose_every_trial_is_skipped_exits_0_without_starting_ray(tmp_path, path):
    # seq_len 64 is not divisible by 3 chips: recorded skipped, nothing to run
    sweep = write_sweep(tmp_path, {**TINY_SWEEP, "chips": [3]})
    import ray

    ray_before = ray.is_initialized()
    done = cli_run(tmp_path, sweep, path)
    assert done.returncode == 0, done.stderr
    assert "skipped" in done.stdout + done.stderr
    assert ray.is_initialized() == ray_before  # no Ray started (nor stopped)


@pytest.mark.timeout(180)
def test_a_sweep_whose_every_trial_fails_exits_1(tmp_path):
    # two chips asked of a local Ray that has one: the trial fails (ChipCapacityError)
    sweep = write_sweep(tmp_path, {**TINY_SWEEP, "modes": ["all_gather"], "chips": [2]})
    done = cli_process(tmp_path, sweep, "db", "--cpu-chips", "1", timeout_s=170)
    assert done.returncode == 1, done.stderr
    assert "failed 1" in done.stderr
    # the summary says why, and ends with where to see the sweep
    assert re.search(r"^  torch all_gather chips=2 seq_len=64: failed: trial needs chips=2 "
                     r"'cpu_chip' resources but the cluster has 1", done.stdout, re.M), done.stdout
    assert re.search(r"^sweep \d+ finished: 1 failed of 1 trial\(s\)\. See them with "
                     r"`gdn-sweep results --sweep-id \d+ --db ", done.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_ctrl_c_exits_130_leaves_trials_pending_and_the_same_command_finishes_them(tmp_path):
    sweep = write_sweep(tmp_path, {**TINY_SWEEP, "seq_lens": [64, 128, 192], "steps": 20})
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    command = [sys.executable, "-m", "service.cli", "run", str(sweep), "--db", url,
               "--cpu-chips", "1"]
    first = subprocess.Popen(command, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
    upgrade_database(url)  # what the run does first; idempotent
    engine = make_engine(url)
    session_factory = make_session_factory(engine)
    try:
        deadline = time.monotonic() + 150
        while True:  # until a trial has started
            assert first.poll() is None and time.monotonic() < deadline, first.stdout.read()
            with session_factory() as s:
                if s.scalar(select(func.count()).select_from(Trial)
                            .where(Trial.status == "running")):
                    break
            time.sleep(0.2)
        first.send_signal(signal.SIGINT)
        output = first.communicate(timeout=120)[0]
        assert first.returncode == 130, output
        assert "Traceback" not in output, output
        assert "cancelled" not in output, output
        with session_factory() as s:
            sweep_row = s.scalars(select(Sweep)).one()
            statuses = list(s.scalars(select(Trial.status)))
        pending = statuses.count("pending")
        assert pending >= 1 and "running" not in statuses, statuses
        assert f"{pending} trial(s) stay pending for a resume" in output, output
        assert (sweep_row.status, sweep_row.runner) == ("queued", None)

        second = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True,
                                timeout=240)
        assert second.returncode == 0, second.stderr
        with session_factory() as s:
            assert s.scalar(select(func.count()).select_from(Sweep)) == 1  # resumed, not new
            assert s.scalars(select(Sweep)).one().status == "finished"
            assert set(s.scalars(select(Trial.status))) == {"succeeded"}
    finally:
        if first.poll() is None:
            first.kill()
        engine.dispose()


# -- bench --help, --new, --resume, --no-progress ---------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("args", [["bench", "--help"], ["bench"]], ids=["help", "no-args"])
def test_bench_help_lists_every_benchmark_and_exits_0(args):
    done = subprocess.run([sys.executable, "-m", "service.cli", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: gdn-sweep bench <name>")
    for name in ("kernel", "cp", "memory", "scheduling", "sweep", "api"):
        assert re.search(rf"^  {name} ", done.stdout, re.M), name


SKIPPED_ONLY = {**TINY_SWEEP, "chips": [3]}
"""seq_len 64 is not divisible by 3 chips: one trial, recorded skipped; runs without Ray."""


def in_process_run(*args: str) -> int:
    from service.cli.main import main

    return main(["run", *args])


@pytest.mark.timeout(60)
def test_new_always_makes_a_sweep_and_without_it_the_same_file_resumes_the_unfinished_one(
        tmp_path, migrated_db, capsys):
    from service.db import crud
    from workers.sweep_spec import SweepSpec

    sweep = write_sweep(tmp_path, SKIPPED_ONLY)
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with migrated_db() as s:  # an unfinished sweep of this very file (a run was stopped)
        unfinished = crud.create_sweep(session=s, sweep_create=SweepSpec(**SKIPPED_ONLY)).id
    assert in_process_run(str(sweep), "--db", url, "--new") == 0
    with migrated_db() as s:
        rows = {row.id: row.status for row in s.scalars(select(Sweep))}
    assert len(rows) == 2 and rows[unfinished] == "queued"
    new_id = max(rows)
    assert re.search(rf"^sweep {new_id} 'tiny': finished\n", capsys.readouterr().out, re.M)

    assert in_process_run(str(sweep), "--db", url) == 0
    with migrated_db() as s:
        assert {row.id: row.status for row in s.scalars(select(Sweep))} == {
            unfinished: "finished", new_id: "finished"}
    assert f"sweep {unfinished} 'tiny': finished" in capsys.readouterr().out


@pytest.mark.timeout(60)
def test_resume_finishes_a_recorded_sweep_by_id_and_refuses_a_non_id(tmp_path, migrated_db,
                                                                      capsys):
    from service.db import crud
    from workers.sweep_spec import SweepSpec

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with migrated_db() as s:
        queued = crud.create_sweep(session=s, sweep_create=SweepSpec(**SKIPPED_ONLY)).id
    assert in_process_run("--resume", str(queued), "--db", url, "--no-progress") == 0
    with migrated_db() as s:
        assert [(row.id, row.status) for row in s.scalars(select(Sweep))] == [
            (queued, "finished")]
    out = capsys.readouterr().out
    assert re.search(r"^torch +all_gather +3 +64 +skipped +- +- +-$", out, re.M), out
    with pytest.raises(SystemExit) as exited:
        in_process_run("--resume", "latest", "--db", url)
    assert exited.value.code == 2
    assert "--resume with --db takes a sweep id (an integer), not 'latest'" in \
        capsys.readouterr().err


@pytest.mark.timeout(60)
def test_a_run_drives_the_sweeps_stored_trial_rows_not_a_new_expansion(tmp_path, migrated_db,
                                                                      capsys):
    from sqlalchemy import update

    from service.db import crud
    from service.db.models import Result
    from workers.sweep_spec import SweepSpec

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    reason = "marked skipped in its row after the sweep was created"
    with migrated_db() as s:  # a runnable trial that its row now says to skip: no Ray needed
        queued = crud.create_sweep(session=s, sweep_create=SweepSpec(**TINY_SWEEP)).id
        s.execute(update(Trial).where(Trial.sweep_id == queued).values(skip_reason=reason))
        s.commit()
    assert in_process_run("--resume", str(queued), "--db", url, "--no-progress") == 0
    with migrated_db() as s:
        assert s.execute(select(Result.status, Result.error)).all() == [("skipped", reason)]


@pytest.mark.timeout(60)
def test_no_progress_silences_the_progress_lines(tmp_path, capsys):
    sweep = write_sweep(tmp_path, SKIPPED_ONLY)
    for quiet in (False, True):
        flags = ["--no-progress"] if quiet else []
        target = tmp_path / f"quiet-{quiet}.jsonl"
        assert in_process_run(str(sweep), "--jsonl", str(target), *flags) == 0
        out = capsys.readouterr().out
        assert ("[1/1] torch/all_gather/chips=3" in out) is not quiet, out
        assert re.search(r"^torch +all_gather +3 +64 +skipped", out, re.M), out


# -- gdn-sweep import: JSON-lines results into the database ---------------------------------------

IMPORT_SWEEP = {**TINY_SWEEP, "chips": [1, 2, 3]}
"""Three trials: the one-chip baseline, all_gather on 2 chips, and 3 chips (skipped)."""


def made_up_results(spec) -> list:
    """A result per runnable trial, with a retried attempt: what a cluster run hands a sink."""
    import datetime as dt

    from workers.grid import expand_trials
    from workers.result import AttemptRecord, TrialMetrics, TrialResult

    at = dt.datetime(2026, 12, 1, 2, 0, tzinfo=dt.UTC)
    results = []
    for n, trial in enumerate(t for t in expand_trials(spec) if t.skip_reason is None):
        start, end = at + dt.timedelta(minutes=2 * n), at + dt.timedelta(minutes=2 * n + 1)
        results.append(TrialResult(
            trial=trial, status="succeeded", attempts=2, hosts=["node-b"],
            versions={"torch": "2.13.0"}, started_at=start, finished_at=end,
            metrics=TrialMetrics(step_time_s=0.25 * (n + 1), tokens_per_s_per_chip=256.0 / (n + 1),
                                 mfu=0.01, peak_memory_bytes_per_chip=2 ** 20 * (n + 1),
                                 memory_source="process_rss"),
            attempt_history=[
                AttemptRecord(attempt=1, status="failed", reason="node died", hosts=["node-a"],
                              started_at=start, finished_at=start),
                AttemptRecord(attempt=2, status="succeeded", hosts=["node-b"],
                              started_at=start, finished_at=end)]))
    return results


def write_results_file(path: Path, spec, results) -> Path:
    from workers.result_sink import JsonLinesSink

    sink = JsonLinesSink.create(path, spec)
    for result in results:
        sink.trial_started(result.trial)
        sink.trial_finished(result)
    return path


def sweep_rows(session, sweep_id: int) -> dict:
    """A sweep's rows as plain values, ids and write times left out (the rest must match)."""
    from service.db.models import Result, TrialAttempt

    def plain(row, drop=()) -> dict:
        return {c.key: getattr(row, c.key) for c in row.__table__.columns
                if c.key not in {"id", "trial_id", "sweep_id", "created_at", *drop}}

    sweep = session.get(Sweep, sweep_id)
    trials = session.scalars(select(Trial).where(Trial.sweep_id == sweep_id)
                             .order_by(Trial.key)).all()
    # a skipped trial's row is written when the sweep is created: its times are that moment
    skipped_times = ("started_at", "finished_at")
    return {
        "sweep": plain(sweep, ("started_at", "finished_at", "runner", "heartbeat_at")),
        "trials": [plain(t, skipped_times if t.status == "skipped" else ()) for t in trials],
        "results": [plain(session.get(Result, t.id),
                          skipped_times if t.status == "skipped" else ()) for t in trials],
        "attempts": [[plain(a) for a in session.scalars(
            select(TrialAttempt).where(TrialAttempt.trial_id == t.id)
            .order_by(TrialAttempt.attempt))] for t in trials],
    }


@pytest.mark.timeout(60)
def test_import_writes_the_rows_a_db_run_writes(tmp_path, session_factory):
    from service.db import crud
    from service.runs import sweep_run
    from service.runs.db_sink import DatabaseSink
    from service.runs.jsonl_import import import_files
    from workers.sweep_spec import SweepSpec

    spec = SweepSpec(**IMPORT_SWEEP)
    results = made_up_results(spec)
    assert len(results) == 2
    with session_factory() as s:  # what `gdn-sweep run --db` writes: the sink, then finish
        by_run = crud.create_sweep(session=s, sweep_create=spec).id
    sink = DatabaseSink(session_factory, by_run, spool=None)
    for result in results:
        sink.trial_started(result.trial)
        sink.trial_finished(result)
    assert sink.wait_drained(30)
    with session_factory() as s:
        sweep_run.finish(session=s, sweep_id=by_run, status="finished")

    (done,) = import_files([write_results_file(tmp_path / "run.jsonl", spec, results)],
                           session_factory=session_factory)
    assert (done.created, done.added, done.trials) == (True, 2, 3)
    with session_factory() as s:
        imported, ran = sweep_rows(s, done.sweep_id), sweep_rows(s, by_run)
        assert s.get(Sweep, done.sweep_id).created_at.replace(tzinfo=None) == \
            dt_of_header(tmp_path / "run.jsonl")
    for trial in ran["trials"]:  # the sink marks a trial started at the moment it starts
        trial.pop("started_at", None)
    for trial in imported["trials"]:
        trial.pop("started_at", None)
    assert imported == ran
    assert sorted(len(a) for a in imported["attempts"]) == [0, 2, 2]  # skipped: none


def dt_of_header(path: Path):
    import datetime as dt
    import json

    header = json.loads(path.read_text().splitlines()[0])
    return dt.datetime.fromisoformat(header["created_at"]).replace(tzinfo=None)


@pytest.mark.timeout(60)
def test_import_is_idempotent_and_a_grown_file_adds_only_what_it_gained(tmp_path,
                                                                        session_factory):
    from service.db.models import Result
    from service.runs.jsonl_import import import_files
    from workers.result_sink import JsonLinesSink
    from workers.sweep_spec import SweepSpec

    spec = SweepSpec(**IMPORT_SWEEP)
    first, second = made_up_results(spec)
    path = write_results_file(tmp_path / "run.jsonl", spec, [first])  # the run was stopped

    def counts(s) -> tuple:
        return (s.scalar(select(func.count()).select_from(Sweep)),
                s.scalar(select(func.count()).select_from(Trial)),
                s.scalar(select(func.count()).select_from(Result)))

    (done,) = import_files([path], session_factory=session_factory)
    with session_factory() as s:
        assert counts(s) == (1, 3, 3)
        assert s.get(Sweep, done.sweep_id).status == "cancelled"  # no scheduler runs the rest
        assert dict(s.execute(select(Trial.key, Trial.status)).all()) == {
            first.trial.key: "succeeded", second.trial.key: "cancelled",
            "torch/all_gather/chips=3/seq_len=64/dtype=float32/param_sharding=replicated/"
            "remat=none": "skipped"}
    (again,) = import_files([path], session_factory=session_factory)
    assert (again.sweep_id, again.created, again.added) == (done.sweep_id, False, 0)

    JsonLinesSink(path).trial_finished(second)  # resumed on the cluster: the file grew
    (grown,) = import_files([path], session_factory=session_factory)
    assert (grown.sweep_id, grown.created, grown.added) == (done.sweep_id, False, 1)
    with session_factory() as s:
        assert counts(s) == (1, 3, 3)
        assert s.get(Sweep, done.sweep_id).status == "finished"
        assert s.scalar(select(Result.tokens_per_s_per_chip).join(
            Trial, Trial.id == Result.trial_id).where(Trial.key == second.trial.key)) == 128.0


@pytest.mark.timeout(60)
def test_import_of_a_bad_file_names_file_and_line_and_writes_nothing(tmp_path, db_url,
                                                                    session_factory, capsys):
    from service.runs.jsonl_import import import_command
    from workers.sweep_spec import SweepSpec

    spec = SweepSpec(**IMPORT_SWEEP)
    good = write_results_file(tmp_path / "good.jsonl", spec, made_up_results(spec))
    bad = write_results_file(tmp_path / "bad.jsonl", spec, made_up_results(spec))
    lines = bad.read_text().splitlines()
    lines[3] = lines[3][:40]  # a line cut short
    bad.write_text("\n".join(lines) + "\n")
    assert import_command([str(good), str(bad)], database_url=db_url) == 2
    assert re.fullmatch(rf"{re.escape(str(bad))}:4: not JSON \(.+\)",
                        capsys.readouterr().err.strip())
    with session_factory() as s:
        assert s.scalar(select(func.count()).select_from(Sweep)) == 0


@pytest.mark.timeout(60)
def test_gdn_sweep_import_as_a_process(tmp_path):
    from workers.sweep_spec import SweepSpec

    spec = SweepSpec(**IMPORT_SWEEP)
    path = write_results_file(tmp_path / "run.jsonl", spec, made_up_results(spec))
    url = f"sqlite:///{tmp_path / 'imported.db'}"
    done = subprocess.run([sys.executable, "-m", "service.cli", "import", str(path), str(path),
                           "--db", url], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=50)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (f"{path}: new sweep 1, 2 result(s) added, 3 trial(s)\n"
                           f"{path}: sweep 1, 0 result(s) added, 3 trial(s)\n")  # idempotent
