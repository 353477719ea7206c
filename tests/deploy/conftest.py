"""Fixtures of the deploy tests: a real Ray head of the test's own (`ray start --head --block`
on 127.0.0.1, every port its own, token authentication), torn down by killing exactly its
process group.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray  # noqa: F401 - puts the psutil Ray bundles on sys.path

from workers.process_probe import free_port

import psutil  # noqa: E402 - after ray (above)

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKER_PORTS = 64
"""Ports of the head's worker range: the job supervisor, the driver and a few actors."""


def _port_range(size: int) -> int:
    """First port of `size` consecutive ports free right now (random, below the OS's
    ephemeral range so free_port() does not hand them out meanwhile)."""
    for _ in range(200):
        base = random.randrange(20_000, 32_000 - size)
        try:
            with contextlib.ExitStack() as stack:
                for port in range(base, base + size):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {size} consecutive free ports found")


@dataclasses.dataclass
class RayHead:
    """A running head: its addresses, the token clients need, its process group."""

    process: subprocess.Popen
    gcs_port: int
    dashboard_port: int
    temp_dir: Path
    token: str

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    def client_env(self, **extra: str) -> dict[str, str]:
        """The environment a `ray job submit` client needs for this head: the documented
        recipe (RAY_AUTH_MODE=token plus the cluster's token), nothing else of Ray's."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("RAY_") or k in ("RAY_USAGE_STATS_ENABLED",)}
        return {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token, **extra}

    def processes(self) -> list[psutil.Process]:
        """Every live process of this head: its process group, and anything whose command
        line names its temp dir (a process that left the group would still name it)."""
        found = []
        for process in psutil.process_iter(["pid", "cmdline"]):
            try:
                if process.status() == psutil.STATUS_ZOMBIE:
                    continue
                in_group = os.getpgid(process.pid) == self.process.pid
                names_dir = str(self.temp_dir) in " ".join(process.info["cmdline"] or ())
            except (psutil.Error, ProcessLookupError):
                continue
            if in_group or names_dir:
                found.append(process)
        return found


def _wait_for_dashboard(head: RayHead, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    request = urllib.request.Request(f"{head.dashboard_url}/api/jobs/",
                                     headers={"Authorization": f"Bearer {head.token}"})
    while True:
        assert head.process.poll() is None, f"ray start exited {head.process.returncode}"
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                json.load(response)
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Ray head's job API did not answer in {timeout_s:.0f} s")
            time.sleep(0.5)


@contextlib.contextmanager
def ray_head(*, cpu_chips: int = 2, num_cpus: int = 2, startup_timeout_s: float = 90
             ) -> Iterator[RayHead]:
    """`ray start --head --block` on 127.0.0.1 with free ports, its own --temp-dir, token auth
    with a token made here and `cpu_chips` cpu_chip resources; a child in a process group of
    its own, killed as a group afterwards (the test fails if any of it survives)."""
    temp_dir = Path(tempfile.mkdtemp(prefix="rayh", dir="/tmp"))  # short: socket paths
    token = secrets.token_hex(32)
    workers = _port_range(WORKER_PORTS)
    ports = {name: free_port() for name in (
        "port", "dashboard-port", "ray-client-server-port", "node-manager-port",
        "object-manager-port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
        "runtime-env-agent-port", "metrics-export-port")}
    command = ["ray", "start", "--head", "--block", "--node-ip-address", "127.0.0.1",
               "--dashboard-host", "127.0.0.1", "--temp-dir", str(temp_dir),
               "--num-cpus", str(num_cpus), "--resources", json.dumps({"cpu_chip": cpu_chips}),
               "--min-worker-port", str(workers),
               "--max-worker-port", str(workers + WORKER_PORTS - 1),
               "--disable-usage-stats", "--include-dashboard", "true",
               *[arg for name, port in ports.items() for arg in (f"--{name}", str(port))]]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    log = (temp_dir / "ray-start.log").open("w")
    process = subprocess.Popen(command, cwd=temp_dir, env=env, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    head = RayHead(process=process, gcs_port=ports["port"],
                   dashboard_port=ports["dashboard-port"], temp_dir=temp_dir, token=token)
    try:
        _wait_for_dashboard(head, startup_timeout_s)
        yield head
    finally:
        _stop(head)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _stop(head: RayHead, grace_s: float = 5.0) -> None:
    """SIGTERM to the head's group (`ray start --block` then stops what it started), SIGKILL
    to whatever of it is left after `grace_s`; fails if anything of it survives that."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(head.process.pid, signal.SIGTERM)
    _, alive = psutil.wait_procs(head.processes(), timeout=grace_s)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(head.process.pid, signal.SIGKILL)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    head.process.wait(10)
    _, alive = psutil.wait_procs(head.processes(), timeout=10)
    assert not alive, f"processes of the Ray head survived: {alive}"


@pytest.fixture(scope="module")
def ray_head_with_token() -> Iterator[RayHead]:
    with ray_head() as head:
        yield head
