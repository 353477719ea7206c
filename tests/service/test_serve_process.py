"""`gdn-sweep serve` as a real process: its log has one line per sweep and trial event with the
ids, serve and its local Ray listen on loopback only, and SIGTERM is a clean stop: the scheduler stops, the local Ray goes completely (raylet,
GCS, dashboard, agents, workers), "shutdown complete" is logged, no traceback, exit code 0.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import ray  # noqa: F401 - ray[default] ships psutil and puts it on sys.path

import psutil  # noqa: E402

from workers.process_probe import free_port

from ..workers.test_local_ray_binding import LOOPBACK, listening

from .conftest import TINY_SWEEP

REPO_ROOT = Path(__file__).resolve().parents[2]


class Serve:
    """`python -m service.cli serve` on SQLite in tmp_path, 2 CPU chips, a free port."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.port, self.log_path = free_port(), tmp_path / "serve.log"
        env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'serve.db'}",
               "GDN_SWEEP_CPU_CHIPS": "2", "GDN_SWEEP_SCHEDULER_POLL_S": "0.5",
               "GDN_SWEEP_SPOOL_DIR": str(tmp_path / "spool")}
        with self.log_path.open("w") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "service.cli", "serve", "--port", str(self.port), *args],
                cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.api = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10)

    def log(self) -> str:
        return self.log_path.read_text()

    def wait_ready(self, timeout_s: float = 120) -> None:
        """Until /api/health answers 200 and the scheduler's local Ray runs (in serve's
        process, or in its scheduler process with --workers > 1)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"serve exited:\n{self.log()}"
            try:
                healthy = self.api.get("/api/health").status_code == 200
            except httpx.HTTPError:
                healthy = False
            names = {p.name() for p in self.descendants()}
            if healthy and {"raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names:
                return
            time.sleep(0.5)
        raise AssertionError(f"serve not ready after {timeout_s} s:\n{self.log()}")

    def descendants(self) -> list:
        processes = []
        for process in psutil.Process(self.process.pid).children(recursive=True):
            try:
                process.name()  # cached: still known once it has exited
                processes.append(process)
            except psutil.NoSuchProcess:
                pass
        return processes

    def stop(self) -> None:
        self.api.close()
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def left_alive(processes, timeout_s: float) -> dict[int, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = {}
        for process in processes:
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    left[process.pid] = process.name()
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def sigterm_and_check_clean_exit(serve: Serve) -> None:
    ray_processes = serve.descendants()
    names = {p.name() for p in ray_processes}
    assert {"raylet", "gcs_server", "ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names, names
    serve.process.send_signal(signal.SIGTERM)
    try:
        code = serve.process.wait(30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"serve still running 30 s after SIGTERM:\n{serve.log()}") from None
    log = serve.log()
    assert code == 0, log
    assert "shutdown complete" in log
    assert "Traceback" not in log and "*** SIGTERM received" not in log, log  # Ray's C++ one
    left = left_alive(ray_processes, timeout_s=5)
    assert not left, f"processes of serve's Ray left behind: {left}"


@pytest.mark.timeout(180)
def test_sigterm_stops_serve_and_its_whole_local_ray(tmp_path):
    serve = Serve(tmp_path)
    try:
        serve.wait_ready()
        sockets = listening({serve.process.pid} | {p.pid for p in serve.descendants()})
        exposed = [s for s in sockets if s[0] not in LOOPBACK]
        assert not exposed, f"serve or its Ray listens beyond loopback: {exposed}"
        assert {"raylet", "gcs_server"} <= {name for *_, name in sockets}, sockets
        sigterm_and_check_clean_exit(serve)
    finally:
        serve.stop()


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [1, 2])
def test_serve_logs_sweep_and_trial_events_with_ids_then_stops_cleanly(tmp_path, workers):
    """With --workers 2 the sweep runs in serve's scheduler process (its log lines there)."""
    serve = Serve(tmp_path, "--workers", str(workers))
    try:
        serve.wait_ready()
        sweep_id = serve.api.post("/api/sweeps", json=TINY_SWEEP).json()["id"]
        deadline = time.monotonic() + 150
        while serve.api.get(f"/api/sweeps/{sweep_id}").json()["status"] != "finished":
            assert time.monotonic() < deadline, serve.log()
            time.sleep(0.5)
        key = serve.api.get(f"/api/sweeps/{sweep_id}/trials").json()["data"][0]["key"]
        log = serve.log()
        ids, trial = rf"sweep_id={sweep_id}\b", re.escape(json.dumps(key))  # quoted: it holds =
        for event in (rf"INFO service\.runs\.sweep_queue sweep {sweep_id}: claimed .*{ids}",
                      rf"INFO service\.runs\.sweep_queue sweep {sweep_id}: running .*{ids}",
                      rf"INFO service\.sweeps trial started {ids} trial={trial} ",
                      rf"INFO service\.sweeps trial finished {ids} trial={trial} "
                      r"status=succeeded duration_s=\d+\.\d+",
                      rf"INFO service\.runs\.sweep_queue sweep {sweep_id}: finished .*{ids}"
                      r".* status=finished"):
            assert re.search(event, log), f"no line matching {event!r} in:\n{log}"
        sigterm_and_check_clean_exit(serve)
    finally:
        serve.stop()
