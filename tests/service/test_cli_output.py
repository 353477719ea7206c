"""What the `gdn-sweep` commands print, as a newcomer reads it (issue 35, item 4): the help
lists every command; `results` has one number format per column, memory in GiB, kernels and
layers columns, and one chip as `1 chip (no CP)`; a read command run without --db or
DATABASE_URL names the database it opened, and refuses (creating nothing) where there is none;
`run` says why each trial did not succeed and ends with where to see them.

Against real SQLite files, with the commands' own main (in this process; one real process
where the printed help is the point).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from service.cli.main import build_parser, main as gdn_sweep
from service.db.engine import make_engine, make_session_factory, upgrade_database
from workers.grid import expand_trials
from workers.sweep_spec import SweepSpec

from .conftest import TINY_SWEEP
from .seed import seed_sweep

REPO_ROOT = Path(__file__).resolve().parents[2]
GIB = 2 ** 30


@pytest.fixture
def sqlite_db(tmp_path):
    """A migrated SQLite file: (its URL, a session factory on it)."""
    url = f"sqlite:///{tmp_path / 'results.db'}"
    upgrade_database(url)
    engine = make_engine(url)
    yield url, make_session_factory(engine)
    engine.dispose()


def registered_commands() -> set[str]:
    """The sub-commands argparse dispatches to, read from the parser itself."""
    import argparse

    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return set(action.choices)


@pytest.mark.timeout(60)
def test_help_lists_every_registered_command_with_its_help():
    done = subprocess.run([sys.executable, "-m", "service.cli", "--help"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr
    section = done.stdout.split("\ncommands:\n", 1)[1].split("\n\n", 1)[0]
    listed = dict(re.findall(r"^  (\S+) +(\S.*)$", section, re.M))
    assert set(listed) == registered_commands()
    assert {"plan", "schedule", "regressions", "results", "run", "serve"} <= set(listed)
    assert all(len(text) > 10 for text in listed.values()), listed


def table_rows(printed: str) -> list[dict[str, str]]:
    """`gdn-sweep results`' rows by column title (cells are right-aligned under titles)."""
    header, *lines = printed.splitlines()[:-1]
    ends, at = [], 0
    for title in header.split():
        at = header.index(title, at) + len(title)
        ends.append((title, at))
    return [{title: line[start:end].strip() for (title, end), start
             in zip(ends, [0] + [e for _, e in ends[:-1]])} for line in lines]


@pytest.mark.timeout(60)
def test_results_print_one_format_per_column_memory_in_gib_and_the_kernels(sqlite_db, capsys):
    url, session_factory = sqlite_db
    # tokens/s/chip from 5 digits (the one-chip rows, ×300) down to 3, memory from MiB to GiB
    grid = dict(frameworks=["jax", "torch"], modes=["p2p"], chips=[1, 2],
                seq_lens=[1024, 2 ** 20], layers=["gdn_only", "hybrid"],
                kernels=["reference", "fused"])
    seed_sweep(session_factory, speed_of=lambda t: 300.0 if t.chips == 1 else 1.0, **grid)
    runnable = [t for t in expand_trials(SweepSpec.model_validate({**TINY_SWEEP, **grid}))
                if t.skip_reason is None]
    capsys.readouterr()
    assert gdn_sweep(["results", "--db", url, "--limit", "100"]) == 0
    printed = capsys.readouterr()
    assert printed.err == ""  # told the database: nothing to say about it
    rows = table_rows(printed.out)
    assert len(rows) == len(runnable) > 16 and "e+" not in printed.out and "e-" not in printed.out
    decimals = {"tok/s/chip": 1, "vs_1chip": 3, "step_s": 4, "min_s": 4, "max_s": 4,
                "mfu%": 3, "peak_GiB/chip": 3, "xla_est_GiB/chip": 3}
    for title, places in decimals.items():
        cells = [row[title] for row in rows if row[title]]
        assert cells and all(re.fullmatch(rf"\d+\.\d{{{places}}}", c) for c in cells), \
            (title, cells)
    speeds = sorted(float(row["tok/s/chip"]) for row in rows)
    assert speeds[0] < 1000 < 10_000 < speeds[-1]  # both magnitudes, in the one format
    for row in rows:  # seed.py: the measured peak is seq_len × 1000 bytes, the MFU chips/100
        assert row["peak_GiB/chip"] == f"{int(row['seq_len']) * 1000 / GIB:.3f}"
        assert row["mfu%"] == f"{int(row['chips']):.3f}"
    assert {row["kernels"] for row in rows} == {"reference", "fused"}
    assert {row["layers"] for row in rows} == {"gdn_only", "hybrid"}
    assert {row["mode"] for row in rows if row["chips"] == "1"} == {"1 chip (no CP)"}
    assert {row["mode"] for row in rows if row["chips"] == "2"} == {"p2p"}


READ_COMMANDS = (["results"], ["regressions"], ["schedule", "list"], ["schedule", "show", "1"],
                 ["plan", "--validate", "1"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", READ_COMMANDS, ids=" ".join)
def test_a_read_command_without_a_database_says_where_it_looked_and_creates_nothing(
        tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    for name in ("DATABASE_URL", "GDN_SWEEP_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    assert gdn_sweep(command) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"no database at {tmp_path / 'gdn_sweep.db'} (the default, "
                          f"sqlite:///gdn_sweep.db in the current folder)"), err
    assert "nothing was created" in err and "--db URL" in err and "DATABASE_URL" in err
    assert list(tmp_path.iterdir()) == []

    missing = tmp_path / "elsewhere.db"  # one named that is not there: refused the same way
    assert gdn_sweep([*command, "--db", f"sqlite:///{missing}"]) == 1
    assert capsys.readouterr().err.startswith(f"no database at {missing} (--db)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", [*READ_COMMANDS, ["plan", "--preset", "tiny", "--seq-len",
                                     "1024", "--accelerator", "v5p"], ["db", "upgrade"]],
                         ids=" ".join)
def test_every_database_command_says_in_one_line_when_the_database_is_unreachable(
        capsys, command):
    """One way to open the database, one way to fail (service/cli/database.py): exit 1 and a
    line naming the driver's error, no traceback."""
    from workers.process_probe import free_port

    url = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none"  # nothing listens
    assert gdn_sweep([*command, "--db", url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("database unreachable: OperationalError: ") and \
        len(err.strip().splitlines()) == 1, err


@pytest.mark.timeout(60)
def test_a_plan_without_a_database_answers_from_the_datasheets_and_creates_nothing(
        tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in ("DATABASE_URL", "GDN_SWEEP_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    assert gdn_sweep(["plan", "--preset", "qwen3.5-9b", "--seq-len", "1048576",
                      "--accelerator", "v5p", "--max-chips", "64"]) == 0
    printed = capsys.readouterr()
    assert printed.err.startswith(f"no database at {tmp_path / 'gdn_sweep.db'}")
    assert "planning from the datasheets and published runs alone" in printed.err
    assert "roofline at MaxText's measured 27.6% MFU on v5p" in printed.out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.timeout(60)
def test_results_without_db_names_the_default_database_it_read(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in ("DATABASE_URL", "GDN_SWEEP_DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    upgrade_database("sqlite:///gdn_sweep.db")
    engine = make_engine("sqlite:///gdn_sweep.db")
    try:
        seed_sweep(make_session_factory(engine), modes=["p2p"], chips=[2], seq_lens=[64])
    finally:
        engine.dispose()
    capsys.readouterr()
    assert gdn_sweep(["results"]) == 0
    printed = capsys.readouterr()
    assert printed.err == (f"reading sqlite:///gdn_sweep.db ({tmp_path / 'gdn_sweep.db'}): the "
                           f"default; --db URL or DATABASE_URL reads another\n")
    assert printed.out.splitlines()[-1] == "1 of 1 succeeded trial(s) matching"


SKIPPED_AND_RUN = {**TINY_SWEEP, "chips": [3]}
"""seq_len 64 over 3 chips: recorded skipped with its reason, without starting Ray."""


@pytest.mark.timeout(60)
def test_run_prints_why_each_trial_did_not_succeed_and_where_to_see_them(tmp_path, capsys):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump(SKIPPED_AND_RUN))
    url = f"sqlite:///{tmp_path / 'run.db'}"
    assert gdn_sweep(["run", str(sweep), "--db", url, "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    reasons = out.index("trials that did not succeed, and why:")
    assert out[reasons + 1] == ("  torch all_gather chips=3 seq_len=64: skipped: seq_len=64 is "
                                "not divisible by chips=3")
    closing = re.fullmatch(r"sweep (\d+) finished: 1 skipped of 1 trial\(s\)\. See them with "
                           r"`(gdn-sweep results [^`]+)` \(the succeeded ones\), or at "
                           r"/sweeps/(\d+) on the dashboard of `gdn-sweep serve --db (\S+)`",
                           out[-1])
    assert closing, out[-1]
    sweep_id, command, page_id, serve_db = closing.groups()
    assert page_id == sweep_id and serve_db == url
    assert shlex.split(command) == ["gdn-sweep", "results", "--sweep-id", sweep_id, "--db", url]
    assert gdn_sweep(shlex.split(command)[1:]) == 0  # the command it prints runs
    assert capsys.readouterr().out.splitlines()[-1] == "0 of 0 succeeded trial(s) matching"

    target = tmp_path / "run.jsonl"  # into a file: the same reasons, then the import command
    assert gdn_sweep(["run", str(sweep), "--jsonl", str(target), "--no-progress"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "  torch all_gather chips=3 seq_len=64: skipped: seq_len=64 is not divisible by " \
           "chips=3" in out
    assert re.fullmatch(rf"sweep \w+ finished: 1 skipped of 1 trial\(s\); results in "
                        rf"{re.escape(str(target))}; load them with `gdn-sweep import "
                        rf"{re.escape(str(target))} --db URL`", out[-1]), out[-1]
