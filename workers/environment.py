"""The environment a trial measured in: what a number depends on besides the grid point.

Collected where the trial runs: `process_environment` inside every worker process of the
trial (ChipProcess.environment, and the plan task), so it describes the machine that measured,
not the driver's. The runner merges the processes' answers (`merge_environments`) and adds
what only the driver knows (`trial_environment`: chip type, device name, host count, and the
sweep's source). The result carries it to the sink; the service stores each distinct one once.

Keys and where each value comes from (None: the process could not say; never a guess):

    python                   platform.python_version()
    packages.<name>          importlib.metadata of jax, jaxlib, torch, fla-core, ray
                             (None: not installed)
    project.version          importlib.metadata of gdn-sweep
    project.git_commit       $GDN_SWEEP_GIT_COMMIT, else `git rev-parse HEAD` of the checkout
                             the worker imports `workers` from (None: no checkout, no git)
    project.git_dirty        `git diff --quiet HEAD` of that checkout (tracked files changed)
    runtime.cuda             GPU only: torch.version.cuda (torch trials), the CUDA runtime
                             JAX's plugin loaded (JAX trials)
    runtime.cudnn            GPU only: torch.backends.cudnn.version() / JAX's plugin's cuDNN
    runtime.nvidia_driver    GPU only: /proc/driver/nvidia/version (the kernel module)
    runtime.libtpu           TPU only: importlib.metadata of libtpu (or libtpu-nightly)
    accelerator.*            the trial's accelerator kind and type, the device name its
                             processes report, the number of hosts its processes ran on
    source                   {"kind": api | cli | schedule | ray_job | python, ...}: what
                             started the sweep (SweepSource)
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import json
import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any, Literal

PACKAGES = ("jax", "jaxlib", "torch", "fla-core", "ray")
"""Packages whose versions a trial's numbers depend on."""
_LIBTPU_PACKAGES = ("libtpu", "libtpu-nightly")
_NVIDIA_DRIVER_FILE = Path("/proc/driver/nvidia/version")
_GIT_TIMEOUT_S = 5.0


def package_version(name: str) -> str | None:
    """The installed version of distribution `name`, None when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def project_identity() -> dict[str, Any]:
    """{version, git_commit, git_dirty} of the code this process imported (once per process:
    the code loaded does not change after import, whatever the checkout does)."""
    checkout = Path(__file__).resolve().parents[1]
    commit = os.environ.get("GDN_SWEEP_GIT_COMMIT") or None
    dirty = None
    if commit is None and (checkout / ".git").exists():  # a file in a git worktree
        commit = _git(checkout, "rev-parse", "HEAD")
        if commit is not None:
            dirty = _git(checkout, "diff", "--quiet", "HEAD", status_only=True)
    return {"version": package_version("gdn-sweep"), "git_commit": commit, "git_dirty": dirty}


def _git(checkout: Path, *args: str, status_only: bool = False):
    """git's stdout (or, status_only: True when it exits 1, False on 0); None if it cannot."""
    try:
        done = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True,
                              text=True, timeout=_GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if status_only:
        return {0: False, 1: True}.get(done.returncode)
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def cuda_version_text(version: int | None) -> str | None:
    """CUDA's integer version (1000·major + 10·minor, e.g. 12080) as "12.8"."""
    return None if not version else f"{version // 1000}.{version % 1000 // 10}"


def cudnn_version_text(version: int | None) -> str | None:
    """cuDNN's integer version as "major.minor.patch" (9.x: 10000·major + 100·minor + patch,
    e.g. 90100; 8.x: 1000·major + 100·minor + patch, e.g. 8902)."""
    if not version:
        return None
    major, rest = (version // 10000, version % 10000) if version >= 90000 else (
        version // 1000, version % 1000)
    return f"{major}.{rest // 100}.{rest % 100}"


def nvidia_driver_version(path: Path = _NVIDIA_DRIVER_FILE) -> str | None:
    """The NVIDIA kernel module's version from /proc/driver/nvidia/version, None without it."""
    try:
        found = re.search(r"Kernel Module\s+(?:for \S+\s+)?(\d[\w.]*)", path.read_text())
    except OSError:
        return None
    return found.group(1) if found else None


def _torch_gpu_runtime() -> dict[str, str | None]:
    import torch

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"cuda": torch.version.cuda, "cudnn": cudnn_version_text(cudnn)}


def _jax_gpu_runtime() -> dict[str, str | None]:
    try:  # JAX names these only in its CUDA plugin's private module (what jax checks at start)
        from jax._src.lib import cuda_versions
    except ImportError:
        return {"cuda": None, "cudnn": None}
    if cuda_versions is None:
        return {"cuda": None, "cudnn": None}
    return {"cuda": cuda_version_text(cuda_versions.cuda_runtime_get_version()),
            "cudnn": cudnn_version_text(cuda_versions.cudnn_get_version())}


def runtime_versions(accelerator_kind: str, framework: str) -> dict[str, str | None]:
    """Driver and runtime versions of the device the trial ran on, as the trial's framework
    reports them; every value None on CPU (no device runtime took part)."""
    runtime: dict[str, str | None] = {"cuda": None, "cudnn": None, "nvidia_driver": None,
                                      "libtpu": None}
    if accelerator_kind == "gpu":
        runtime.update(_torch_gpu_runtime() if framework == "torch" else _jax_gpu_runtime())
        runtime["nvidia_driver"] = nvidia_driver_version()
    elif accelerator_kind == "tpu":
        runtime["libtpu"] = next(filter(None, map(package_version, _LIBTPU_PACKAGES)), None)
    return runtime


def process_environment(*, accelerator_kind: str, framework: str) -> dict[str, Any]:
    """What this worker process runs with (see the module docstring for each key)."""
    return {"python": platform.python_version(),
            "packages": {name: package_version(name) for name in PACKAGES},
            "project": dict(project_identity()),
            "runtime": runtime_versions(accelerator_kind, framework)}


def merge_environments(environments: list[dict[str, Any]]) -> dict[str, Any]:
    """One environment for a trial's processes: a value they all share as it is; values that
    differ (hosts set up differently) joined as "a | b", so the difference is on record."""
    if not environments:
        return {}
    if all(isinstance(env, dict) for env in environments):
        keys = dict.fromkeys(key for env in environments for key in env)
        return {key: merge_environments([env.get(key) for env in environments]) for key in keys}
    distinct = list(dict.fromkeys(json.dumps(value, sort_keys=True) for value in environments))
    if len(distinct) == 1:
        return environments[0]
    return " | ".join(str(json.loads(value)) for value in distinct)


SourceKind = Literal["api", "cli", "schedule", "ray_job", "python"]
SOURCE_KINDS: tuple[str, ...] = ("api", "cli", "schedule", "ray_job", "python")
_RAY_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"
"""Set by Ray's job supervisor in the environment of a `ray job submit` entrypoint only."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class SweepSource:
    """What started a sweep: the service's API, a schedule of the service, `gdn-sweep run`,
    a Ray job (deploy/run_sweep.py under `ray submit` / `ray job submit`), or a direct call
    of workers.driver ("python")."""

    kind: SourceKind = "python"
    schedule_id: int | None = None
    """kind "schedule": the schedule that fired the sweep."""

    def __post_init__(self) -> None:
        if self.kind not in SOURCE_KINDS:
            raise ValueError(f"SweepSource.kind={self.kind!r} is not one of: "
                             f"{', '.join(SOURCE_KINDS)}")
        if (self.kind == "schedule") != (self.schedule_id is not None):
            raise ValueError(f"SweepSource.schedule_id={self.schedule_id!r} goes with kind "
                             f"'schedule' and only with it (kind={self.kind!r})")

    def describe(self) -> dict[str, Any]:
        """The source as stored, read in the driver process once Ray is connected: a process
        that is a submitted Ray job says so (with its job ids) whatever kind it was given."""
        if self.kind == "schedule":
            return {"kind": "schedule", "schedule_id": self.schedule_id}
        submission = _ray_job_submission_id()
        if self.kind == "ray_job" or submission is not None:
            return {"kind": "ray_job", "job_id": _ray_job_id(), "submission_id": submission}
        return {"kind": self.kind}


def _ray_job_submission_id() -> str | None:
    raw = os.environ.get(_RAY_JOB_CONFIG_ENV)
    if raw is None:
        return None
    try:
        return json.loads(raw).get("metadata", {}).get("job_submission_id") or "unnamed"
    except (ValueError, AttributeError):
        return "unnamed"


def _ray_job_id() -> str | None:
    """This driver's Ray job id (ray.get_runtime_context().get_job_id()), None before init."""
    import ray

    return ray.get_runtime_context().get_job_id() if ray.is_initialized() else None


def trial_environment(process: dict[str, Any], *, accelerator_kind: str, accelerator_type: str,
                      device_name: str | None, host_count: int,
                      source: dict[str, Any]) -> dict[str, Any]:
    """A trial's whole environment: its processes' (merged) and what the driver knows."""
    return {**process,
            "accelerator": {"kind": accelerator_kind, "type": accelerator_type,
                            "device_name": device_name, "host_count": host_count},
            "source": source}


__all__ = ["PACKAGES", "SOURCE_KINDS", "SweepSource", "cuda_version_text", "cudnn_version_text",
           "merge_environments", "nvidia_driver_version", "package_version",
           "process_environment", "project_identity", "runtime_versions", "trial_environment"]
