"""A local Ray started by connect_ray listens on loopback only, its dashboard on the port
asked for, and shutdown_ray leaves none of its processes behind (the dashboard and
runtime-env agents included, which Ray's own shutdown leaves for minutes).

The Ray runs in a subprocess: its processes are then this test's to inspect and count.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import ray  # noqa: F401 - ray[default] ships psutil and puts it on sys.path

import psutil  # noqa: E402

from workers.process_probe import free_port  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}
AGENTS = {"ray::DashboardAgent", "ray::RuntimeEnvAgent"}

LOCAL_RAY = """
import json, sys, time
from workers.cluster import connect_ray, local_ray_processes, shutdown_ray

connect_ray("", cpu_chips=1, dashboard_port=int(sys.argv[1]))
deadline = time.monotonic() + 90
while time.monotonic() < deadline:  # the raylet starts its agents after ray.init returns
    names = {p.name() for p in local_ray_processes()}
    if {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= names:
        break
    time.sleep(0.5)
print(json.dumps([p.pid for p in local_ray_processes()]), flush=True)
sys.stdin.readline()
shutdown_ray()
"""


def listening(pids: set[int]) -> list[tuple[str, int, str]]:
    """(address, port, process name) of every TCP socket these processes listen on."""
    found = []
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in pids:
            try:
                name = psutil.Process(conn.pid).name()
            except psutil.Error:
                continue
            found.append((conn.laddr.ip, conn.laddr.port, name))
    return found


def alive(pids: set[int]) -> set[int]:
    left = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                left.add(pid)
        except psutil.NoSuchProcess:
            pass
    return left


@pytest.mark.slow  # its own Ray; by default serve's Ray: test_serve_process (loopback, every process ends)
@pytest.mark.timeout(240)
def test_local_ray_listens_on_loopback_only_and_shutdown_ends_every_process():
    dashboard_port = free_port()
    driver = subprocess.Popen([sys.executable, "-c", LOCAL_RAY, str(dashboard_port)],
                              cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        line = driver.stdout.readline()
        assert line, f"the local Ray did not start (exit code {driver.poll()})"
        ray_pids = set(json.loads(line))
        names = {psutil.Process(pid).name() for pid in alive(ray_pids)}
        assert AGENTS <= names and {"raylet", "gcs_server"} <= names, names

        sockets = listening(ray_pids | {driver.pid})
        exposed = [s for s in sockets if s[0] not in LOOPBACK]
        assert not exposed, f"listening beyond loopback: {exposed}"
        assert any(port == dashboard_port for _, port, _ in sockets), sockets
        assert {"raylet", "gcs_server", "ray::DashboardAgent"} <= {n for *_, n in sockets}

        driver.stdin.write("\n")
        driver.stdin.flush()
        assert driver.wait(60) == 0
        deadline = time.monotonic() + 10
        while alive(ray_pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {pid: psutil.Process(pid).name() for pid in alive(ray_pids)}
        assert not left, f"processes of the local Ray left behind: {left}"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
