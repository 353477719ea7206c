"""JAX trials: one actor per host driving that host's chips; several hosts join jax.distributed.

On CPU a host's virtual chips are JAX CPU devices: the count (this host's bundles of the trial)
and the gloo cross-process collectives must be set before JAX initialises in the process, so
they travel as runtime_env env_vars of a fresh actor process (and are set again in __init__,
before anything touches a backend). On GPU each chip gets its own process (JAX's usual
one-process-per-GPU layout, since a bundle gives a process one GPU); on TPU one process per
TPU VM host owns all of that host's chips (a bundle of the slice placement group).
"""

from __future__ import annotations

import gc

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from . import process_probe
from .errors import RankOutOfMemoryError
from .failures import looks_like_oom
from .spec import TrialSpec

MESH_AXIS = "cp"
_PLATFORM = {"cpu": "cpu", "gpu": "cuda", "tpu": "tpu"}


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class JaxHostActor:
    """One JAX process: its local chips, and (with others) a mesh over all the trial's chips."""

    def __init__(self, process_index: int, num_processes: int, bundles: tuple[int, ...],
                 accelerator_kind: str, local_chips: int, total_chips: int) -> None:
        import jax

        self.process_index, self.num_processes = process_index, num_processes
        self.bundles, self.kind = tuple(bundles), accelerator_kind
        self.local_chips, self.total_chips = local_chips, total_chips
        if accelerator_kind == "cpu":  # no-ops when the env vars already did it
            jax.config.update("jax_num_cpu_devices", local_chips)
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        self.mesh = None
        import gdn_core.jax_gdn.cp.train  # noqa: F401 - load the training code with the worker

    def info(self) -> process_probe.WorkerInfo:
        return process_probe.describe_self(self.process_index, self.bundles)

    def oom_counter(self) -> tuple[str | None, int | None]:
        return process_probe.oom_kill_counter()

    def versions(self) -> dict[str, str]:
        return process_probe.software_versions()

    def rendezvous_address(self) -> str:
        return f"{ray.util.get_node_ip_address()}:{process_probe.free_port()}"

    def join(self, coordinator: str, timeout_s: float) -> int:
        """Initialise jax.distributed (several processes) and build the 1-D mesh over all chips."""
        import jax
        import numpy as np
        from jax.sharding import Mesh

        if self.num_processes > 1:
            jax.distributed.initialize(coordinator_address=coordinator,
                                       num_processes=self.num_processes,
                                       process_id=self.process_index,
                                       initialization_timeout=int(max(timeout_s, 1)))
        devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
        if len(jax.local_devices()) != self.local_chips or len(devices) != self.total_chips:
            raise RuntimeError(
                f"JAX process {self.process_index} sees {len(jax.local_devices())} local / "
                f"{len(devices)} global devices, expected {self.local_chips} / "
                f"{self.total_chips}; was JAX initialised before the actor set "
                f"JAX_NUM_CPU_DEVICES?")
        self.mesh = Mesh(np.array(devices), (MESH_AXIS,))
        return len(devices)

    def calibrate_gemm(self, seconds: float):
        import torch

        from gdn_core.hardware import calibrate_cpu_peak_flops

        threads = torch.get_num_threads()
        torch.set_num_threads(process_probe.host_cpu_count())
        try:
            return calibrate_cpu_peak_flops(seconds=seconds)
        finally:
            torch.set_num_threads(threads)

    def run(self, trial: TrialSpec, memory_limit_bytes: int | None):
        from gdn_core.jax_gdn.cp.train import run_cp_training

        model_cfg, train_cfg = trial.to_model_config(), trial.to_train_config()
        try:
            with process_probe.address_space_cap(memory_limit_bytes):
                return run_cp_training(model_cfg, train_cfg, mesh=self.mesh, axis=MESH_AXIS,
                                       mode=trial.mode, steps=trial.steps,
                                       warmup_steps=trial.warmup_steps, verify=trial.verify)
        except Exception as exc:
            if not looks_like_oom(exc):
                raise
            peak, source = process_probe.peak_rss()
            raise RankOutOfMemoryError(f"JAX process {self.process_index}: "
                                       f"{type(exc).__name__}: {exc}", peak,
                                       f"{source} (whole process)", memory_limit_bytes) from None
        finally:
            gc.collect()


def spawn(chips, *, threads: int | None, chips_on_host) -> list:
    """Start one JAX process per host (CPU, TPU) or per chip (GPU); returns the handles."""
    request = chips.request
    kind = request.accelerator_kind
    slots = chips.process_slots(per_host=(kind == "cpu"))
    actors = []
    for index, bundles in enumerate(slots):
        local = len(bundles) * chips.chips_per_bundle
        env = {"JAX_PLATFORMS": _PLATFORM[kind]}
        if kind == "cpu":
            # XLA sizes its CPU thread pool itself; `threads` applies to torch ranks only.
            env.update(JAX_NUM_CPU_DEVICES=str(local), JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
        options = dict(num_cpus=0, runtime_env={"env_vars": env},
                       scheduling_strategy=PlacementGroupSchedulingStrategy(
                           chips.placement_group, placement_group_bundle_index=bundles[0]))
        # The actor takes its first bundle's resources; the PG keeps the host's other bundles
        # reserved for it, so no other trial lands on those chips.
        if kind == "gpu":
            options["num_gpus"] = 1
        elif kind == "tpu":
            options["resources"] = {"TPU": chips.chips_per_bundle}
        else:
            options["resources"] = {request.resource: 1}
        actors.append(JaxHostActor.options(**options).remote(
            index, len(slots), bundles, kind, local, request.chips))
    return actors


def rendezvous_refs(actors: list, *, timeout_s: float, get) -> list:
    """Process 0 hosts the jax.distributed coordinator; every process joins it."""
    coordinator = get([actors[0].rendezvous_address.remote()], "JAX coordinator address")[0]
    return [a.join.remote(coordinator, timeout_s) for a in actors]


__all__ = ["JaxHostActor", "MESH_AXIS", "rendezvous_refs", "spawn"]
