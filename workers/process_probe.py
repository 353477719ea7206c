"""What a worker process can tell about itself: where it runs, its memory, its software.

Runs inside the rank / host actors (and in a small node-pinned task after a rank died).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import os
import platform
import resource
import socket
from pathlib import Path

from gdn_core.device_memory import status_kib

_VERSION_PACKAGES = ("torch", "jax", "jaxlib", "ray", "gdn-sweep")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class WorkerInfo:
    """One worker process of a trial, as reported in the trial-started event."""

    process_index: int
    """Torch rank, or JAX process index."""
    bundles: tuple[int, ...]
    """Placement-group bundle indices (chips) this process drives."""
    node_id: str
    node_ip: str
    hostname: str
    pid: int


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ProcessIdentity:
    """What a worker process runs on: the device its runtime names and its CPU affinity."""

    device_name: str
    """torch.cuda.get_device_name() / JAX device_kind on GPU and TPU; the CPU model on CPU."""
    affinity: tuple[int, ...]
    """os.sched_getaffinity of the process now (its calling thread), sorted."""
    cpu_chips: tuple[int, ...] = ()
    """Virtual CPU chips of its node it holds (workers.cpu_cores ledger); () off CPU."""
    cpu_partition: str | None = None
    """CpuPartition.describe(), e.g. 'cores=0-0(1 per chip)'; None off CPU."""


def cpu_model_name() -> str:
    """The CPU model ('model name' of /proc/cpuinfo), else platform.processor() / machine()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def memory_cap_for(accelerator_kind: str, limit_bytes: int | None) -> int | None:
    """The address-space cap a rank applies: only CPU-chip processes take one.

    RLIMIT_AS counts virtual address space, and CUDA (and the TPU runtime) reserve far more
    of it than they ever touch: capped, a GPU/TPU process fails to initialise its device.
    """
    return limit_bytes if accelerator_kind == "cpu" else None


def describe_self(process_index: int, bundles: tuple[int, ...]) -> WorkerInfo:
    import ray

    ctx = ray.get_runtime_context()
    return WorkerInfo(process_index=process_index, bundles=tuple(bundles),
                      node_id=ctx.get_node_id(), node_ip=ray.util.get_node_ip_address(),
                      hostname=socket.gethostname(), pid=os.getpid())


def software_versions() -> dict[str, str]:
    """python and the packages a trial's numbers depend on (without importing them)."""
    versions = {"python": platform.python_version()}
    for name in _VERSION_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def host_cpu_count() -> int:
    """Cores this process may run on (the container's share, not the machine's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def free_port() -> int:
    """A TCP port free on this host right now (the OS picks it; a rendezvous binds it soon)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def address_space_cap(extra_bytes: int | None):
    """Let this process's address space grow by at most extra_bytes (RLIMIT_AS soft limit).

    Only the soft limit moves, so it is restored afterwards and the worker stays reusable.
    Allocations past it fail inside the trial (torch raises, Python raises MemoryError).
    """
    if extra_bytes is None:
        yield None
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    current = (status_kib("VmSize") or 0) * 1024
    cap = current + extra_bytes
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield extra_bytes
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def oom_kill_counter() -> tuple[str | None, int | None]:
    """(file, count) of kernel OOM kills in this process's memory cgroup (v2 or v1).

    Read again after a rank died: a higher count means the kernel's OOM killer struck.
    """
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # cgroup v2
            candidate = Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.events"
        elif "memory" in controllers.split(","):
            candidate = Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.oom_control"
        else:
            continue
        count = read_oom_kills(str(candidate))
        if count is not None:
            return str(candidate), count
    return None, None


def read_oom_kills(path: str) -> int | None:
    """The `oom_kill N` line of a cgroup memory.events / memory.oom_control file."""
    try:
        for line in Path(path).read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


__all__ = ["ProcessIdentity", "WorkerInfo", "address_space_cap", "cpu_model_name",
           "describe_self", "free_port", "host_cpu_count", "memory_cap_for", "oom_kill_counter",
           "read_oom_kills", "software_versions"]
