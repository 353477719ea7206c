"""Connect to Ray: an empty address starts a local Ray whose node advertises virtual CPU chips.

Token authentication (Ray >= 2.59 turns it on by itself for a local cluster) needs no step
here: a local start generates ~/.ray/auth_token and uses it. To reach a secured remote
cluster, give the driver the cluster's token before connecting — `RAY_AUTH_MODE=token` plus
`RAY_AUTH_TOKEN=<token>` or `RAY_AUTH_TOKEN_PATH=<file>` (or the token in
~/.ray/auth_token; `ray get-auth-token` prints it on the head). `ray job submit` entrypoints
run on the head and inherit the cluster's settings. See deploy/README.md.

A local Ray listens on 127.0.0.1 only (GCS, raylet, workers, agents, dashboard): nothing of it
is reachable from another machine. Its dashboard port and whether it runs are parameters.
`shutdown_ray` stops it completely: Ray's own shutdown leaves the dashboard and runtime-env
agents behind for minutes when their raylet goes first, so survivors are ended too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os

import ray

from .cpu_cores import usable_cores
from .options import CPU_CHIP_RESOURCE

log = logging.getLogger(__name__)

CPU_CHIPS_ENV = "GDN_SWEEP_CPU_CHIPS"
"""Virtual CPU chips of a local Ray started by connect_ray (default: the usable cores, one
chip per core; more than that and chips share cores)."""

LOOPBACK = "127.0.0.1"
_started_local: str | None = None
"""GCS address of the local Ray connect_ray started (None: it started none)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterInfo:
    """The Ray cluster this process is connected to."""

    started_locally: bool
    """True when connect_ray started it (a fixed set of chips: no autoscaler to wait for)."""
    resources: dict[str, float]


def connect_ray(address: str | None = None, *, cpu_chips: int | None = None,
                num_cpus: int | None = None, dashboard_port: int | None = None,
                include_dashboard: bool | None = None) -> ClusterInfo:
    """Use the Ray this process already has, else connect to `address`, else start one.

    address None reads RAY_ADDRESS (set by `ray job submit`); an empty address starts a local
    Ray on 127.0.0.1 with `cpu_chips` `cpu_chip` resources (default: $GDN_SWEEP_CPU_CHIPS,
    else the cores this process may use, so each virtual chip is a core of its own; asking for
    more logs a warning: the chips then share cores), its dashboard on `dashboard_port` (None:
    Ray's 8265 or the next free port) unless `include_dashboard` is False. Any other value is
    a Ray address ("auto", "10.0.0.1:6379", "ray://head:10001").
    """
    global _started_local
    if not ray.is_initialized():
        if address is None:
            address = os.environ.get("RAY_ADDRESS", "")
        if address:
            with _driver_process(loopback=False):
                ray.init(address=address)
        else:
            cores = len(usable_cores())
            chips = cpu_chips or int(os.environ.get(CPU_CHIPS_ENV) or cores)
            if chips < 1:
                raise ValueError(f"cpu_chips={chips!r} must be >= 1 (set {CPU_CHIPS_ENV} or "
                                 f"--cpu-chips)")
            if chips > cores:
                log.warning("local Ray with %d cpu_chip on %d usable cores: virtual chips will "
                            "share cores (their peaks say so); a chip of its own needs "
                            "--cpu-chips / %s <= %d", chips, cores, CPU_CHIPS_ENV, cores)
            # "local": never attach to some other Ray that happens to run on this machine.
            with _driver_process(loopback=True):
                ray.init(address="local", num_cpus=num_cpus,
                         resources={CPU_CHIP_RESOURCE: float(chips)},
                         _node_ip_address=LOOPBACK, dashboard_host=LOOPBACK,
                         dashboard_port=dashboard_port, include_dashboard=include_dashboard)
            _started_local = ray.get_runtime_context().gcs_address
            if not _started_local.startswith(f"{LOOPBACK}:"):
                log.warning("the local Ray listens on %s, not on %s only", _started_local,
                            LOOPBACK)
    started = _started_local == ray.get_runtime_context().gcs_address
    return ClusterInfo(started_locally=started, resources=ray.cluster_resources())


@contextlib.contextmanager
def _driver_process(*, loopback: bool):
    """Two of Ray's module settings, for this driver process only while it connects.

    Ray installs a C++ crash handler in the driver for SIGTERM too, which prints a stack trace
    and aborts the process 3 s later, whatever shutdown was under way: the driver keeps
    Python's signal handling (workers keep the handler: their settings come from their own
    environment). With `loopback`, the node's address is 127.0.0.1 (Ray otherwise resolves
    127.0.0.1 to the machine's outward address), so every Ray process binds loopback only.
    """
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER, ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER
    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    if loopback:
        ray_constants.ENABLE_RAY_CLUSTER = False  # node address = get_localhost_ip()
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER, ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = saved


def local_ray_processes() -> list:
    """psutil.Process of every process of the local Ray this process started (GCS, raylet,
    dashboard and its modules, agents, workers, reaper); empty when it started none."""
    import psutil  # ray[default] ships it (ray/thirdparty_files, on sys.path once ray is in)

    node = ray._private.worker._global_node
    if not ray.is_initialized() or node is None or _started_local is None:
        return []
    roots = [info.process.pid for infos in node.all_processes.values() for info in infos]
    found: dict[int, psutil.Process] = {}
    for pid in roots:
        try:
            root = psutil.Process(pid)
            for process in [root, *root.children(recursive=True)]:
                found[process.pid] = process
        except psutil.Error:
            continue
    return list(found.values())


def shutdown_ray(timeout_s: float = 10.0) -> None:
    """Disconnect from Ray; a local Ray this process started is stopped completely: Ray's
    shutdown, then whatever of its processes outlived it (the agents do) ended, SIGKILL after
    `timeout_s`."""
    global _started_local
    if not ray.is_initialized():
        return
    import psutil

    processes = local_ray_processes()
    ray.shutdown(wait_for_processes=True)
    _started_local = None
    left = [p for p in processes if _alive(p)]
    if left:
        log.info("ending %d process(es) the local Ray left behind: %s", len(left),
                 ", ".join(sorted({_name(p) for p in left})))
        for process in left:
            with contextlib.suppress(psutil.Error):
                process.terminate()
        _, left = psutil.wait_procs(left, timeout=timeout_s / 2)
        for process in left:
            with contextlib.suppress(psutil.Error):
                process.kill()
        _, left = psutil.wait_procs(left, timeout=timeout_s / 2)
        if left:
            log.warning("processes of the local Ray still alive: %s",
                        ", ".join(f"{_name(p)} (pid {p.pid})" for p in left))


def _alive(process) -> bool:
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _name(process) -> str:
    try:
        return process.name()
    except Exception:  # noqa: BLE001 - gone meanwhile
        return "?"


def cpu_chip_warnings(chips: list[int]) -> list[str]:
    """Warnings for a CPU sweep asking for more chips than the cluster has cores, or run on
    nodes advertising more cpu_chip than they have CPUs (Ray's "CPU" resource, one per core
    unless the node was started with --num-cpus): such chips share cores."""
    nodes = [n for n in ray.nodes() if n.get("Alive")
             and n["Resources"].get(CPU_CHIP_RESOURCE, 0) > 0]
    cores = sum(int(n["Resources"].get("CPU", 0)) for n in nodes)
    warnings = []
    if chips and cores and max(chips) > cores:
        warnings.append(f"the sweep asks for up to {max(chips)} CPU chips but the cluster's "
                        f"cpu_chip nodes have {cores} cores: those trials' chips share cores")
    for node in nodes:
        advertised = node["Resources"][CPU_CHIP_RESOURCE]
        node_cores = node["Resources"].get("CPU", 0)
        if node_cores and advertised > node_cores:
            warnings.append(f"node {node.get('NodeManagerAddress', node['NodeID'])} "
                            f"advertises {advertised:g} cpu_chip on {node_cores:g} CPUs: its "
                            f"virtual chips share cores")
    for warning in warnings:
        log.warning("%s", warning)
    return warnings


__all__ = ["CPU_CHIPS_ENV", "LOOPBACK", "ClusterInfo", "connect_ray", "cpu_chip_warnings",
           "local_ray_processes", "shutdown_ray"]
