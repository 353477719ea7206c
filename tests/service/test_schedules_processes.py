"""Two real `gdn-sweep serve` processes on one PostgreSQL database, each with its scheduler
(and so its schedule thread) inside: a `* * * * *` schedule created over the API makes exactly
one sweep per minute, and the schedulers run them (every trial of the spec is recorded
skipped, so nothing heavy runs)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from workers.process_probe import free_port

from .conftest import scratch_postgres_database
from .test_schedules import SKIPPED_ONLY

REPO_ROOT = Path(__file__).resolve().parents[2]
MINUTES_OBSERVED = 3
"""Due minutes to see fired (so at least two full minutes go by)."""


class Serve:
    """`python -m service.cli serve` on `url`, named `name`, on a free port, 1 CPU chip."""

    def __init__(self, tmp_path: Path, url: str, name: str) -> None:
        self.name, self.port = name, free_port()
        self.log_path = tmp_path / f"{name}.log"
        env = {**os.environ, "DATABASE_URL": url, "GDN_SWEEP_SCHEDULER_ID": name,
               "GDN_SWEEP_CPU_CHIPS": "1", "GDN_SWEEP_RAY_INCLUDE_DASHBOARD": "false",
               "GDN_SWEEP_SCHEDULER_POLL_S": "0.5", "GDN_SWEEP_SCHEDULE_POLL_S": "0.5",
               "GDN_SWEEP_SPOOL_DIR": str(tmp_path / f"spool-{name}")}
        env.pop("RAY_ADDRESS", None)
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "service.cli", "serve", "--port", str(self.port),
                 "--no-access-log"], cwd=REPO_ROOT, env=env, stdout=log,
                stderr=subprocess.STDOUT)
        self.api = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10)

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_ready(self, timeout_s: float = 150) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"{self.name} exited:\n{self.log()}"
            try:
                if self.api.get("/api/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"{self.name} not ready after {timeout_s} s:\n{self.log()}")

    def stop(self) -> None:
        self.api.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_serve_processes_create_exactly_one_sweep_per_minute(tmp_path):
    with scratch_postgres_database("gdn_sweep_schedules") as url:
        from service.db.engine import upgrade_database

        upgrade_database(url)  # once, before both start (they would race to migrate)
        services = [Serve(tmp_path, url, name) for name in ("first", "second")]
        try:
            for service in services:
                service.wait_ready()
            created = services[0].api.post("/api/schedules", json={
                "name": "every minute", "cron": "* * * * *", "spec": SKIPPED_ONLY})
            assert created.status_code == 201, created.text
            schedule_id = created.json()["id"]
            first_due = dt.datetime.fromisoformat(created.json()["next_run_at"].replace(
                "Z", "+00:00"))
            deadline = time.monotonic() + 60 * (MINUTES_OBSERVED + 2)
            while True:
                shown = services[1].api.get(f"/api/schedules/{schedule_id}").json()
                if len(shown["runs"]) >= MINUTES_OBSERVED:
                    break
                assert time.monotonic() < deadline, shown
                for service in services:
                    assert service.process.poll() is None, service.log()
                time.sleep(1)
            time.sleep(5)  # both processes poll past the last due time: still one each
            shown = services[0].api.get(f"/api/schedules/{schedule_id}").json()
            sweeps = services[0].api.get("/api/sweeps", params={
                "schedule_id": schedule_id, "limit": 200}).json()["data"]
        finally:
            for service in services:
                service.stop()
        logs = {service.name: service.log() for service in services}

    runs = sorted(shown["runs"], key=lambda r: r["due_at"])
    dues = [dt.datetime.fromisoformat(r["due_at"].replace("Z", "+00:00")) for r in runs]
    # one run per minute, consecutive from the first due time, each with its own sweep
    assert dues == [first_due + dt.timedelta(minutes=m) for m in range(len(dues))]
    assert [r["outcome"] for r in runs] == ["created"] * len(runs), runs
    assert sorted(r["sweep_id"] for r in runs) == sorted(s["id"] for s in sweeps)
    assert len({s["name"] for s in sweeps}) == len(sweeps) == len(runs) >= MINUTES_OBSERVED
    # the schedulers ran them (no overlap skipped: each finished within its minute)
    assert all(s["status"] == "finished" for s in sweeps[1:]), [s["status"] for s in sweeps]
    fired_by = {name: log.count("event=schedule_fired") + log.count('"schedule_fired"')
                for name, log in logs.items()}
    assert sum(fired_by.values()) == len(runs), fired_by
    for name, log in logs.items():
        assert "Traceback" not in log, f"{name}:\n{log}"
    print(f"runs {len(runs)}, fired by {fired_by}")
