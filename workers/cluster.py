"""Connect to Ray: an empty address starts a local Ray whose node advertises virtual CPU chips.

Token authentication (Ray >= 2.59 turns it on by itself for a local cluster) needs no step
here: a local start generates ~/.ray/auth_token and uses it. To reach a secured remote
cluster, give the driver the cluster's token before connecting — `RAY_AUTH_MODE=token` plus
`RAY_AUTH_TOKEN=<token>` or `RAY_AUTH_TOKEN_PATH=<file>` (or the token in
~/.ray/auth_token; `ray get-auth-token` prints it on the head). `ray job submit` entrypoints
run on the head and inherit the cluster's settings. See deploy/README.md.
"""

from __future__ import annotations

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

_started_local: str | None = None
"""GCS address of the local Ray connect_ray started (None: it started none)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterInfo:
    """The Ray cluster this process is connected to."""

    started_locally: bool
    """True when connect_ray started it (a fixed set of chips: no autoscaler to wait for)."""
    resources: dict[str, float]


def connect_ray(address: str | None = None, *, cpu_chips: int | None = None,
                num_cpus: int | None = None) -> ClusterInfo:
    """Use the Ray this process already has, else connect to `address`, else start one.

    address None reads RAY_ADDRESS (set by `ray job submit`); an empty address starts a local
    Ray with `cpu_chips` `cpu_chip` resources (default: $GDN_SWEEP_CPU_CHIPS, else the cores
    this process may use, so each virtual chip is a core of its own; asking for more logs a
    warning: the chips then share cores). Any other value is a Ray address ("auto",
    "10.0.0.1:6379", "ray://head:10001").
    """
    global _started_local
    if not ray.is_initialized():
        if address is None:
            address = os.environ.get("RAY_ADDRESS", "")
        if address:
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
            ray.init(address="local", num_cpus=num_cpus,
                     resources={CPU_CHIP_RESOURCE: float(chips)})
            _started_local = ray.get_runtime_context().gcs_address
    started = _started_local == ray.get_runtime_context().gcs_address
    return ClusterInfo(started_locally=started, resources=ray.cluster_resources())


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


__all__ = ["CPU_CHIPS_ENV", "ClusterInfo", "connect_ray", "cpu_chip_warnings"]
