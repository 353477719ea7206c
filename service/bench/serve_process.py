"""`python -m service.cli serve` of a checkout on a free port: how the API benchmarks reach the
service, through the very process a deployment runs (its app factory, `service.main:serve_app`,
its workers and settings from the environment), never an app assembled here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from workers.process_probe import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
"""This checkout (service/bench/ → the root)."""


def psutil_module():
    """psutil, which ray[default] ships (ray/thirdparty_files) and puts on sys.path when ray is
    imported: ray must come first. Two import statements were once sorted into the wrong order
    (ModuleNotFoundError before anything was measured, issue 36), hence import_module."""
    import importlib

    import ray  # noqa: F401

    return importlib.import_module("psutil")


def cpu_seconds(processes) -> float:
    """User + system CPU seconds of the psutil `processes` (one that exited counts 0)."""
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except Exception:  # noqa: BLE001 - exited meanwhile
            pass
    return total


class ServeProcess:
    """`python -m service.cli serve` of `checkout` on a free port, until stop()."""

    def __init__(self, checkout: Path, database_url: str, args: list[str], log: Path,
                 env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        env = {**os.environ, "PYTHONPATH": str(checkout), "GDN_SWEEP_UPGRADE_ON_START": "false",
               "GDN_SWEEP_CPU_CHIPS": "2", "DATABASE_URL": database_url, **(env or {})}
        self.log = log.open("w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "service.cli", "serve", "--port", str(self.port), *args],
            cwd=checkout, env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        """Until /api/health answers 200 and the process tree (its Ray starting) is quiet."""
        import httpx

        psutil = psutil_module()

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"serve exited with {self.process.returncode}; see "
                                 f"{self.log.name}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/api/health", timeout=5) \
                        .status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise SystemExit(f"serve not healthy after {timeout_s:.0f} s; see {self.log.name}")
        tree = [psutil.Process(self.process.pid)]
        while time.monotonic() < deadline:  # a local Ray takes a while to settle
            tree = [tree[0], *tree[0].children(recursive=True)]
            before = cpu_seconds(tree)
            time.sleep(2.0)
            if cpu_seconds(tree) - before < 0.3:
                return

    def api_pids(self) -> list[int]:
        """The serve process and its uvicorn workers (not the scheduler's Ray)."""
        psutil = psutil_module()
        root = psutil.Process(self.process.pid)
        return [root.pid, *(p.pid for p in root.children()
                            if "multiprocessing" in " ".join(p.cmdline()))]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(120)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
