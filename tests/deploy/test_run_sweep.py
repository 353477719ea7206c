"""deploy/run_sweep.py, the sweep entry script for clusters, as real processes.

End to end (slow): a Ray head of the test's own with token authentication (`ray start --head`),
`ray job submit --working-dir . -- python deploy/run_sweep.py SWEEP --db URL` run twice into a
scratch PostgreSQL database makes two sweeps whose trials succeed; a closed database port makes
the job fail with the one-line reason in its log; without RAY_AUTH_MODE=token the client is
refused (what a newcomer hit). The commands are deploy/README.md's recipe.

Quick ones: the script runs from any directory, and refuses what it cannot run (a database or
Ray nobody answers at, a --jsonl folder that does not exist, a results file that holds a sweep)
in one line, before connecting to Ray, writing nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from sqlalchemy import select

from service.db.engine import make_engine, make_session_factory
from service.db.models import Sweep, Trial
from tests.service.conftest import scratch_postgres_database
from workers.process_probe import free_port
from workers.result_sink import JsonLinesSink
from workers.sweep_spec import SweepSpec

from .conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "deploy" / "run_sweep.py"
TINY_NIGHTLY = {
    "name": "nightly-tiny", "frameworks": ["torch"], "modes": ["all_gather"], "chips": [1],
    "seq_lens": [64], "model": {"preset": "tiny", "num_layers": 1}, "steps": 1,
    "warmup_steps": 1, "accelerator": {"kind": "cpu", "type": "cpu"}, "verify": False,
}
"""One one-chip trial of the tiny preset: the whole job takes seconds once Ray is up."""


def write_sweep(tmp_path: Path, body: dict = TINY_NIGHTLY) -> Path:
    path = tmp_path / "nightly-tiny.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def closed_port_url() -> str:
    return f"postgresql://postgres@127.0.0.1:{free_port()}/gdn_sweep"


def run_script(cwd: Path, *args: str, env: dict | None = None,
               timeout_s: float = 60) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd,
                          env={**base, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout_s)


def one_line_reason(done: subprocess.CompletedProcess) -> str:
    """The script's reason: its last line on stderr (Ray's own C++ logging may precede it)."""
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines, done
    return lines[-1]


# -- quick: refused before Ray, in one line, from any directory -------------------------------

@pytest.mark.timeout(60)
def test_the_script_runs_from_any_directory(tmp_path):
    done = run_script(tmp_path, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: run_sweep.py")
    for option in ("--db", "--jsonl", "--resume", "--address", "--cpu-chips"):
        assert option in done.stdout


@pytest.mark.timeout(60)
def test_an_unreachable_database_is_one_line_before_ray(tmp_path):
    # Run from elsewhere (as `ray submit` runs it from the head's home directory): the sweep
    # path is the checkout's. The Ray address is closed too: reaching Ray first would say so.
    url = closed_port_url()
    done = run_script(tmp_path, "deploy/sweeps/nightly-h100.yaml", "--db", url,
                      "--address", f"127.0.0.1:{free_port()}")
    assert done.returncode == 1
    reason = one_line_reason(done)
    assert reason.startswith("cannot reach the database postgresql+psycopg://postgres@"), reason
    assert "Connection refused" in reason


def in_process(capsys, cwd: Path, monkeypatch, *args: str) -> tuple[int, str]:
    """The script's main in this process (cheaper than a process): exit code, stderr."""
    from service.cli.main import cluster_main

    monkeypatch.chdir(cwd)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    code = cluster_main(list(args))
    return code, capsys.readouterr().err


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("target", "reason"), [
    ("missing/", "--jsonl missing/: no such folder"),
    ("missing/nightly.jsonl", "--jsonl missing/nightly.jsonl: the folder missing does not exist"),
], ids=["folder", "file"])
def test_a_jsonl_path_in_a_missing_folder_is_one_line_before_ray(tmp_path, monkeypatch, capsys,
                                                                 target, reason):
    code, err = in_process(capsys, tmp_path, monkeypatch, str(write_sweep(tmp_path)),
                           "--jsonl", target, "--address", f"127.0.0.1:{free_port()}")
    assert (code, err) == (2, reason + "\n")
    assert not (tmp_path / "missing").exists()


@pytest.mark.timeout(60)
def test_an_unreachable_ray_is_one_line_and_writes_no_file(tmp_path):
    (tmp_path / "out").mkdir()
    port = free_port()
    started = time.monotonic()
    done = run_script(tmp_path, str(write_sweep(tmp_path)), "--jsonl", "out/",
                      "--address", f"127.0.0.1:{port}")
    assert done.returncode == 1
    assert one_line_reason(done) == (f"cannot reach Ray: nothing answers at 127.0.0.1:{port} "
                                     f"(Connection refused)")
    assert time.monotonic() - started < 30  # not ray.init's minutes of retries
    assert list((tmp_path / "out").iterdir()) == []


def test_the_sink_is_required_unless_resuming_a_results_file(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exited:
        in_process(capsys, tmp_path, monkeypatch, str(write_sweep(tmp_path)))
    assert exited.value.code == 2
    assert capsys.readouterr().err.endswith(
        "error: give the sink: --db URL or --jsonl FILE|DIR/ (or --resume FILE)\n")
    # --resume FILE is the sink: the file is read (here: it is missing) before Ray
    assert in_process(capsys, tmp_path, monkeypatch, "--resume", "gone.jsonl", "--address",
                      f"127.0.0.1:{free_port()}") == (2, "gone.jsonl: no such file\n")


@pytest.mark.timeout(60)
def test_with_ray_unreachable_the_new_sweep_is_recorded_failed_saying_why(tmp_path, monkeypatch,
                                                                         capsys):
    url = f"sqlite:///{tmp_path / 'nightly.db'}"
    port = free_port()
    code, err = in_process(capsys, tmp_path, monkeypatch, str(write_sweep(tmp_path)), "--db",
                           url, "--address", f"127.0.0.1:{port}")
    reason = f"cannot reach Ray: nothing answers at 127.0.0.1:{port} (Connection refused)"
    assert code == 1 and err.splitlines()[-1] == reason, err
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:  # the dashboard shows why it failed
            (sweep,) = session.scalars(select(Sweep)).all()
            assert (sweep.status, sweep.error) == ("failed", reason)
            assert list(session.scalars(select(Trial.status))) == ["failed"]
    finally:
        engine.dispose()


@pytest.mark.timeout(60)
def test_a_results_file_that_holds_a_sweep_is_refused_one_file_one_sweep(tmp_path, monkeypatch,
                                                                         capsys):
    sweep = write_sweep(tmp_path)
    JsonLinesSink.create(tmp_path / "nightly.jsonl", SweepSpec.model_validate(TINY_NIGHTLY))
    before = (tmp_path / "nightly.jsonl").read_text()
    code, err = in_process(capsys, tmp_path, monkeypatch, str(sweep), "--jsonl",
                           "nightly.jsonl", "--address", f"127.0.0.1:{free_port()}")
    assert code == 2
    assert re.fullmatch(r"nightly\.jsonl already holds sweep [0-9a-f]{32} \('nightly-tiny'\); "
                        r"continue it with --resume nightly\.jsonl, or give a folder .*\n", err)
    assert (tmp_path / "nightly.jsonl").read_text() == before


def test_the_ray_address_is_the_given_one_else_ray_address_else_auto(monkeypatch):
    from service.cli.main import ray_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert ray_address(None, cluster=True) == "auto"  # a head started by `ray up`
    assert ray_address(None, cluster=False) == ""  # gdn-sweep run: a local Ray
    assert ray_address("10.0.0.1:6379", cluster=True) == "10.0.0.1:6379"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")  # `ray job submit` sets it
    assert ray_address(None, cluster=True) == "10.0.0.2:6379"
    assert ray_address(None, cluster=False) == "10.0.0.2:6379"


# -- end to end: ray job submit to a head of our own --------------------------------------------

def job_submit(head, *entrypoint: str, env: dict | None = None, timeout_s: float = 240
               ) -> subprocess.CompletedProcess:
    """deploy/README.md's recipe: from the repository, RAY_AUTH_MODE=token and the cluster's
    RAY_AUTH_TOKEN in the client's environment."""
    return subprocess.run(
        ["ray", "job", "submit", "--address", head.dashboard_url, "--working-dir", ".", "--",
         *entrypoint], cwd=REPO_ROOT, env=env if env is not None else head.client_env(),
        capture_output=True, text=True, timeout=timeout_s)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ray_job_submit_makes_a_new_sweep_each_time_and_fails_on_a_closed_database(
        ray_head_with_token, tmp_path):
    head = ray_head_with_token
    sweep = write_sweep(tmp_path)
    with scratch_postgres_database("gdn_sweep_e2e") as url:
        ids = []
        for _ in range(2):
            done = job_submit(head, "python", "deploy/run_sweep.py", str(sweep), "--db", url)
            assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
            assert "Traceback" not in done.stdout
            found = re.search(r"^sweep (\d+) 'nightly-tiny': finished$", done.stdout, re.M)
            assert found, done.stdout[-4000:]
            ids.append(int(found.group(1)))
            assert re.search(r"^torch +none +1 +64 +succeeded +[0-9.]+ +[0-9.]+% ", done.stdout,
                             re.M), done.stdout[-3000:]
        engine = make_engine(url)
        try:
            with make_session_factory(engine)() as session:
                sweeps = session.scalars(select(Sweep).order_by(Sweep.id)).all()
                assert [s.id for s in sweeps] == ids and ids[0] != ids[1]
                assert [s.status for s in sweeps] == ["finished", "finished"]
                assert sweeps[0].created_at < sweeps[1].created_at
                statuses = session.execute(select(Trial.sweep_id, Trial.status)).all()
                assert sorted(statuses) == [(ids[0], "succeeded"), (ids[1], "succeeded")]
        finally:
            engine.dispose()

    closed = closed_port_url()
    done = job_submit(head, "python", "deploy/run_sweep.py", str(sweep), "--db", closed)
    assert done.returncode != 0
    assert "Traceback" not in done.stdout
    assert re.search(r"^cannot reach the database postgresql\+psycopg://postgres@127\.0\.0\.1:"
                     r"\d+/gdn_sweep: OperationalError: .*Connection refused$", done.stdout,
                     re.M), done.stdout[-3000:]
    assert re.search(r"Job '\w+' failed", done.stdout + done.stderr), done.stdout[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_without_the_token_settings_the_cluster_refuses_the_client_and_the_script(
        ray_head_with_token, tmp_path):
    head = ray_head_with_token
    no_mode = {k: v for k, v in head.client_env().items() if k != "RAY_AUTH_MODE"}
    done = job_submit(head, "true", env=no_mode, timeout_s=60)
    assert done.returncode != 0
    assert "AuthenticationError" in done.stderr

    # the script on a machine without the token (no ~/.ray/auth_token either): one line, fast
    (tmp_path / "out").mkdir()
    no_token = {**{k: v for k, v in no_mode.items() if k != "RAY_AUTH_TOKEN"},
                "HOME": str(tmp_path)}
    done = run_script(tmp_path, str(write_sweep(tmp_path)), "--jsonl", "out/",
                      "--address", f"127.0.0.1:{head.gcs_port}", env=no_token)
    assert done.returncode == 1
    assert re.fullmatch(r"cannot reach Ray: the Ray cluster at \S+ refused this process's token "
                        r"\(.*\): set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=.*",
                        one_line_reason(done))
    assert list((tmp_path / "out").iterdir()) == []


def test_the_cron_example_runs_the_script_with_options_it_takes_on_files_that_exist():
    import argparse
    import shlex

    from croniter import croniter

    from service.cli.main import add_run_arguments
    from service.runs.sweep_file import load_spec

    lines = (REPO_ROOT / "deploy" / "cron" / "nightly-sweep.crontab").read_text().splitlines()
    entries = [line.removeprefix("# ") for line in lines
               if re.match(r"(# )?[0-9*]\S* \S+ \S+ \S+ \S+ cd ", line)]
    assert len(entries) == 3  # ray submit into the database, ray job submit, ray submit to JSONL
    for entry in entries:
        fields = entry.split(" ", 5)
        assert croniter.is_valid(" ".join(fields[:5])), entry
        words = shlex.split(fields[5].split(" && ", 1)[1].split(" >>")[0])
        if words[:2] == ["ray", "submit"]:
            cluster, script, separator, *args = words[2:]
            assert (REPO_ROOT / cluster).is_file() and separator == "--", entry
        else:
            assert words[words.index("--") + 1] == "python", entry
            script, *args = words[words.index("--") + 2:]
            assert "RAY_AUTH_MODE=token" in fields[5], entry  # else AuthenticationError
        assert script == "deploy/run_sweep.py"
        assert load_spec(REPO_ROOT / args[0]).name == "nightly-h100"
        assert "--resume" not in args  # each night a new sweep
        parser = argparse.ArgumentParser()
        add_run_arguments(parser, cluster=True)
        parsed = parser.parse_args(args)
        assert parsed.db or parsed.jsonl, entry


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_jsonl_on_the_cluster_a_file_per_run_resumed_when_asked_then_imported(
        ray_head_with_token, tmp_path):
    from service.runs.jsonl_import import import_command
    from workers.result_sink import read_jsonl

    head = ray_head_with_token
    sweep = tmp_path / "two.yaml"
    sweep.write_text(yaml.safe_dump({**TINY_NIGHTLY, "seq_lens": [64, 128]}))
    results = tmp_path / "results"
    results.mkdir()
    done = job_submit(head, "python", "deploy/run_sweep.py", str(sweep), "--jsonl",
                      f"{results}/")
    assert done.returncode == 0, done.stdout[-4000:]
    (path,) = results.iterdir()
    assert re.fullmatch(r"nightly-tiny-\d{8}T\d{6}Z\.jsonl", path.name)
    held = read_jsonl(path)
    assert [r.status for _, r in held.results] == ["succeeded", "succeeded"]
    assert f"sweep {held.header['uid']} 'nightly-tiny': finished" in done.stdout

    # as if the run had died after its first trial: `--resume FILE` runs only the other one
    lines = path.read_text().splitlines()
    last_started = max(i for i, line in enumerate(lines) if '"started"' in line)
    path.write_text("\n".join(lines[:last_started]) + "\n")
    done = job_submit(head, "python", "deploy/run_sweep.py", "--resume", str(path))
    assert done.returncode == 0, done.stdout[-4000:]
    assert re.search(r"^\[1/1\] torch/none/chips=1/seq_len=", done.stdout, re.M), done.stdout
    assert [r.status for _, r in read_jsonl(path).results] == ["succeeded", "succeeded"]
    assert len(list(results.iterdir())) == 1  # resumed in place, no new file

    url = f"sqlite:///{tmp_path / 'imported.db'}"
    assert import_command([str(path), str(path)], database_url=url) == 0
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            (row,) = session.scalars(select(Sweep)).all()
            assert (row.name, row.status) == ("nightly-tiny", "finished")
            assert sorted(session.scalars(select(Trial.status))) == ["succeeded", "succeeded"]
    finally:
        engine.dispose()
