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
import os

import ray

from .options import CPU_CHIP_RESOURCE

CPU_CHIPS_ENV = "GDN_SWEEP_CPU_CHIPS"
"""Virtual CPU chips of a local Ray started by connect_ray (default DEFAULT_CPU_CHIPS)."""
DEFAULT_CPU_CHIPS = 8

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
    Ray with `cpu_chips` (default: $GDN_SWEEP_CPU_CHIPS or 8) `cpu_chip` resources. Any other
    value is a Ray address ("auto", "10.0.0.1:6379", "ray://head:10001").
    """
    global _started_local
    if not ray.is_initialized():
        if address is None:
            address = os.environ.get("RAY_ADDRESS", "")
        if address:
            ray.init(address=address)
        else:
            chips = cpu_chips or int(os.environ.get(CPU_CHIPS_ENV, DEFAULT_CPU_CHIPS))
            if chips < 1:
                raise ValueError(f"cpu_chips={chips!r} must be >= 1 (set {CPU_CHIPS_ENV} or "
                                 f"--cpu-chips)")
            # "local": never attach to some other Ray that happens to run on this machine.
            ray.init(address="local", num_cpus=num_cpus,
                     resources={CPU_CHIP_RESOURCE: float(chips)})
            _started_local = ray.get_runtime_context().gcs_address
    started = _started_local == ray.get_runtime_context().gcs_address
    return ClusterInfo(started_locally=started, resources=ray.cluster_resources())


def chips_on_hosts(resource: str) -> dict[str, float]:
    """How many `resource` chips each alive node advertises, by node id."""
    return {node["NodeID"]: float(node["Resources"].get(resource, 0.0))
            for node in ray.nodes() if node.get("Alive")}


__all__ = ["CPU_CHIPS_ENV", "ClusterInfo", "DEFAULT_CPU_CHIPS", "chips_on_hosts", "connect_ray"]
