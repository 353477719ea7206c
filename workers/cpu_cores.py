"""Virtual CPU chips as a real partition of their host's cores.

A CPU host advertises N `cpu_chip` resources; its usable cores (the affinity Ray's workers
start with) are split into N disjoint blocks of cores // N cores each (at least one). With
N > cores the chips must share: chip i runs on core i mod cores, and everything that reports
the partition says so.

Which chip a process holds is decided by a per-node ledger of lock files, one per chip, under
the temp dir: a process takes the first free chips with an exclusive `fcntl.flock` and keeps
the file open for its life, so the kernel frees the chip when the process dies (a killed
actor, a crashed node agent) and warm, idle workers keep theirs. Ray's accounting of the
`cpu_chip` resource guarantees that enough chips are free; a lock can lag a killed process by
a moment, hence the short wait.

Pinning covers every thread of the process (os.sched_setaffinity(0) only moves the calling
thread); threads started later inherit it. It must happen before XLA creates its CPU client:
XLA sizes its intra-op thread pool from the CPUs the process may run on.
"""

from __future__ import annotations

import dataclasses
import fcntl
import logging
import os
import tempfile
import time
from pathlib import Path

log = logging.getLogger(__name__)

LEDGER_DIR_ENV = "GDN_SWEEP_CPU_LEDGER_DIR"
"""Where the per-node chip lock files live (default: <tempdir>/gdn-sweep-cpu-chips-<uid>)."""

_held: list[int] = []
"""Open lock-file descriptors of the chips this process holds (kept for its lifetime)."""


def usable_cores() -> tuple[int, ...]:
    """Cores this process may run on (the container's or cgroup's share, not the machine's)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except AttributeError:  # macOS: no affinity API
        return tuple(range(os.cpu_count() or 1))


def chip_cores(host_cores: tuple[int, ...], chips_on_host: int) -> list[tuple[int, ...]]:
    """The cores of each of a host's `chips_on_host` virtual chips, by chip index.

    chips <= cores: disjoint blocks of cores // chips consecutive cores (leftover cores idle).
    chips > cores: chip i on core i mod cores (chips share cores).
    """
    if chips_on_host < 1 or not host_cores:
        raise ValueError(f"chips_on_host={chips_on_host!r} must be >= 1 and host_cores="
                         f"{host_cores!r} non-empty")
    cores = len(host_cores)
    if chips_on_host > cores:
        return [(host_cores[i % cores],) for i in range(chips_on_host)]
    per_chip = cores // chips_on_host
    return [host_cores[i * per_chip:(i + 1) * per_chip] for i in range(chips_on_host)]


def core_ranges(cores) -> str:
    """'0-3,6' for cores {0, 1, 2, 3, 6}."""
    cores, runs = sorted(cores), []
    for core in cores:
        if runs and core == runs[-1][1] + 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(f"{a}-{b}" for a, b in runs)


@dataclasses.dataclass(frozen=True, slots=True)
class CpuPartition:
    """The virtual chips one process holds and the cores it is pinned to."""

    chips: tuple[int, ...]
    """Chip indices (ledger slots) on its node."""
    cores: tuple[int, ...]
    """Union of those chips' cores: the process's affinity."""
    host_cores: int
    """Usable cores of the node."""
    chips_on_host: int
    """cpu_chip resources the node advertises."""

    @property
    def shared(self) -> bool:
        """True when the node advertises more chips than cores (chips share cores)."""
        return self.chips_on_host > self.host_cores

    @property
    def cores_per_chip(self) -> float:
        return len(self.cores) / len(self.chips)

    def describe(self) -> str:
        """e.g. 'cores=0-0(1 per chip)'; names the sharing when chips share cores."""
        shared = (f", shared: {self.chips_on_host} cpu_chip on {self.host_cores} cores"
                  if self.shared else "")
        return f"cores={core_ranges(self.cores)}({self.cores_per_chip:g} per chip{shared})"


def ledger_dir(node_id: str) -> Path:
    root = os.environ.get(LEDGER_DIR_ENV) or os.path.join(
        tempfile.gettempdir(), f"gdn-sweep-cpu-chips-{os.getuid()}")
    path = Path(root) / node_id
    path.mkdir(parents=True, exist_ok=True)
    return path


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def claim_chips(count: int, *, node_id: str, chips_on_host: int,
                host_cores: tuple[int, ...] | None = None,
                timeout_s: float = 30.0) -> CpuPartition:
    """Take the first `count` free chips of this node's ledger for this process's lifetime."""
    host_cores = host_cores or usable_cores()
    if not 1 <= count <= chips_on_host:
        raise ValueError(f"count={count!r} chips must be between 1 and the node's "
                         f"chips_on_host={chips_on_host}")
    blocks = chip_cores(host_cores, chips_on_host)
    directory = ledger_dir(node_id)
    deadline = time.monotonic() + timeout_s
    taken: dict[int, int] = {}
    while True:
        for chip in range(chips_on_host):
            if len(taken) == count:
                break
            if chip not in taken:
                fd = _try_lock(directory / f"chip{chip}.lock")
                if fd is not None:
                    taken[chip] = fd
        if len(taken) == count:
            break
        if time.monotonic() > deadline:
            for fd in taken.values():
                os.close(fd)
            raise RuntimeError(
                f"only {len(taken)} of {count} virtual CPU chips free in {directory} after "
                f"{timeout_s:g} s (the node advertises {chips_on_host} cpu_chip); a process "
                f"outside Ray's accounting holds the rest")
        time.sleep(0.1)  # a killed holder's lock goes when its process is fully gone
    _held.extend(taken.values())
    chips = tuple(sorted(taken))
    cores = tuple(sorted({core for chip in chips for core in blocks[chip]}))
    partition = CpuPartition(chips=chips, cores=cores, host_cores=len(host_cores),
                             chips_on_host=chips_on_host)
    if partition.shared:
        log.warning("node %s advertises %d cpu_chip on %d cores: virtual chips share cores, "
                    "so per-chip figures are not those of a chip of its own", node_id,
                    chips_on_host, len(host_cores))
    return partition


def pin_process(cores: tuple[int, ...]) -> None:
    """Restrict every thread of this process to `cores` (new threads inherit it)."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cores)
        except ProcessLookupError:  # the thread ended meanwhile
            pass
    os.sched_setaffinity(0, cores)
    # torch (OpenMP) sizes its default pool from this when imported after the pinning.
    os.environ["OMP_NUM_THREADS"] = str(len(cores))


def node_cpu_chips(node_id: str, resource: str) -> int:
    """How many `resource` chips the Ray node `node_id` advertises (from inside a worker)."""
    import ray

    for node in ray.nodes():
        if node["NodeID"] == node_id:
            return int(node["Resources"].get(resource, 0))
    raise RuntimeError(f"Ray node {node_id} is not in ray.nodes()")


def claim_and_pin(count: int) -> CpuPartition:
    """In a Ray worker on a CPU host: claim `count` chips of its node and pin to their cores.

    The node's chip count comes from Ray itself (what it advertises is what it hands out).
    """
    import ray

    from .options import CPU_CHIP_RESOURCE

    node_id = ray.get_runtime_context().get_node_id()
    advertised = node_cpu_chips(node_id, CPU_CHIP_RESOURCE)
    partition = claim_chips(count, node_id=node_id, chips_on_host=max(advertised, count))
    pin_process(partition.cores)
    return partition


__all__ = ["CpuPartition", "LEDGER_DIR_ENV", "chip_cores", "claim_and_pin", "claim_chips",
           "core_ranges", "ledger_dir", "node_cpu_chips", "pin_process", "usable_cores"]
