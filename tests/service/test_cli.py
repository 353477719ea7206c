"""`gdn-sweep run` as a real process, into SQLite (--db) and a JSON-lines file (--jsonl).

Bad input is one message and exit code 2 with nothing written, on both paths, checked as
POST /api/sweeps checks it (the grid cap included). Exit code 0 only when every trial
succeeded or was skipped, 1 when one did not. Ctrl-C exits 130, says how many trials stay
pending, and leaves the sweep queued: running the same file again finishes it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from sqlalchemy import func, select

from service.db.engine import make_engine, make_session_factory, upgrade_database
from service.db.models import Sweep, Trial

from .conftest import TINY_SWEEP

REPO_ROOT = Path(__file__).resolve().parents[2]
PATHS = ("db", "jsonl")


def write_sweep(tmp_path: Path, body, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(body if isinstance(body, str) else yaml.safe_dump(body))
    return path


def cli_run(tmp_path: Path, sweep: Path, path: str, *args: str, env: dict | None = None,
            timeout_s: float = 120) -> subprocess.CompletedProcess:
    sink = ["--db", f"sqlite:///{tmp_path / 'cli.db'}"] if path == "db" else [
        "--jsonl", str(tmp_path / "cli.jsonl")]
    return subprocess.run([sys.executable, "-m", "service.cli", "run", str(sweep), *sink, *args],
                          cwd=REPO_ROOT, env={**os.environ, **(env or {})}, capture_output=True,
                          text=True, timeout=timeout_s)


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
    assert wrote_nothing(tmp_path, path, migrated_db)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("path", PATHS)
def test_a_sweep_whose_every_trial_is_skipped_exits_0_without_starting_ray(tmp_path, path):
    # seq_len 64 is not divisible by 3 chips: recorded skipped, nothing to run
    sweep = write_sweep(tmp_path, {**TINY_SWEEP, "chips": [3]})
    done = cli_run(tmp_path, sweep, path)
    assert done.returncode == 0, done.stderr
    assert "skipped" in done.stdout + done.stderr
    assert "Started a local Ray" not in done.stderr


@pytest.mark.timeout(180)
def test_a_sweep_whose_every_trial_fails_exits_1(tmp_path):
    # two chips asked of a local Ray that has one: the trial fails (ChipCapacityError)
    sweep = write_sweep(tmp_path, {**TINY_SWEEP, "modes": ["all_gather"], "chips": [2]})
    done = cli_run(tmp_path, sweep, "db", "--cpu-chips", "1", timeout_s=170)
    assert done.returncode == 1, done.stderr
    assert "failed 1" in done.stderr


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
