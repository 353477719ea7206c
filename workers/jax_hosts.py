"""JAX trials: one actor per host driving that host's chips; several hosts join jax.distributed.

On CPU a host's virtual chips are JAX CPU devices: the count (this host's bundles of the trial)
and the gloo cross-process collectives must be set before JAX initialises in the process, so
they travel as runtime_env env_vars of a fresh actor process (and are set again in __init__,
before anything touches a backend). On GPU each chip gets its own process (JAX's usual
one-process-per-GPU layout: the node's GPUs all visible, `local_device_ids` naming its own); on
TPU one process per TPU VM host owns all of that host's chips (a bundle of the slice placement
group), its process id the slice's worker id. The CP mesh follows the hardware
(`mesh_utils.create_device_mesh`: the torus on TPU).
"""

from __future__ import annotations

import os

import ray

from gdn_core.device_memory import jax_gpu_allocator_env

from . import process_probe
from .chip_process import ChipProcess
from .compile_cache import jax_cache_env
from .grid import TrialSpec
from .options import DriverOptions
from .placement import cuda_device_index, tpu_worker_id

MESH_AXIS = "cp"
DATA_AXIS = "dp"
"""The data-parallel axis of a dp × cp trial's 2-D mesh (batch sharded over it)."""
_PLATFORM = {"cpu": "cpu", "gpu": "cuda", "tpu": "tpu"}


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class JaxHostActor(ChipProcess):
    """One JAX process: its local chips, and (with others) a mesh over all the trial's chips."""

    framework = "jax"

    def __init__(self, process_index: int, num_processes: int, bundles: tuple[int, ...],
                 accelerator_kind: str, local_chips: int, total_chips: int) -> None:
        # On CPU: pinned to the union of its chips' cores before JAX creates its CPU client.
        super().__init__(index=process_index, bundles=bundles,
                         accelerator_kind=accelerator_kind, cpu_chips=local_chips)
        self.num_processes, self.label = num_processes, f"JAX process {process_index}"
        self.local_chips, self.total_chips = local_chips, total_chips
        import jax

        if accelerator_kind == "cpu":  # no-ops when the env vars already did it
            jax.config.update("jax_num_cpu_devices", local_chips)
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
            import torch  # gdn_core imports it; keep its pool on this process's cores too

            torch.set_num_threads(len(self.cpu.cores))
        self.mesh = None
        import gdn_core.jax_gdn.cp.train  # noqa: F401 - load the training code with the worker

    def rendezvous_address(self) -> str:
        return f"{ray.util.get_node_ip_address()}:{process_probe.free_port()}"

    def join(self, coordinator: str, timeout_s: float) -> int:
        """Initialise jax.distributed (several processes) and build the 1-D mesh over all chips."""
        import jax
        from jax.experimental import mesh_utils
        from jax.sharding import Mesh

        process_id = distributed_process_id(self.kind, self.index, self.num_processes)
        local_device_ids = None
        if self.kind == "gpu":  # every GPU of the node is visible: drive the one Ray gave us
            local_device_ids = [cuda_device_index(ray.get_gpu_ids(),
                                                  os.environ.get("CUDA_VISIBLE_DEVICES"))]
        if self.num_processes > 1:
            jax.distributed.initialize(coordinator_address=coordinator,
                                       num_processes=self.num_processes, process_id=process_id,
                                       local_device_ids=local_device_ids,
                                       initialization_timeout=int(max(timeout_s, 1)))
        elif local_device_ids is not None:  # what initialize(local_device_ids=) sets
            jax.config.update("jax_cuda_visible_devices", str(local_device_ids[0]))
        devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
        if len(jax.local_devices()) != self.local_chips or len(devices) != self.total_chips:
            raise RuntimeError(
                f"{self.label} sees {len(jax.local_devices())} local / "
                f"{len(devices)} global devices, expected {self.local_chips} / "
                f"{self.total_chips}; was JAX initialised before the actor set "
                f"JAX_NUM_CPU_DEVICES?")
        # The CP ring along the hardware: TPU chips in torus order, GPUs in XLA's
        # topology-aware id order; CPU devices keep the (process, id) order given.
        self.mesh = Mesh(mesh_utils.create_device_mesh((len(devices),), devices), (MESH_AXIS,))
        return len(devices)

    def _device_name(self) -> str:
        import jax

        return ", ".join(sorted({d.device_kind for d in jax.local_devices()}))

    def _measure_gemm(self, seconds: float, dtype: str):
        """The jitted-matmul rate on one local device; XLA runs it on the whole process's
        pool (its chips' cores), so a chip's share is this / local chips."""
        from gdn_core.calibration import measure_jax_gemm_flops_per_s

        return measure_jax_gemm_flops_per_s(seconds=seconds, dtype=dtype)

    def _train(self, trial: TrialSpec):
        from gdn_core.jax_gdn.cp.train import run_cp_training

        mesh, batch_axis = trial_mesh(self.mesh, trial.dp)
        return run_cp_training(trial.to_model_config(), trial.to_train_config(), mesh=mesh,
                               axis=MESH_AXIS, batch_axis=batch_axis, cp=trial.cp_settings(),
                               steps=trial.steps, warmup_steps=trial.warmup_steps,
                               verify=trial.verify, after_timed_steps=self.step_profiler(trial))

    def _peak_memory(self) -> tuple[int | None, str]:
        """Per chip, labelled: the device peak on GPU/TPU, on CPU the process's RSS mark
        shared over its chips (the source names the division)."""
        import jax

        from gdn_core.device_memory import jax_peak_memory

        return jax_peak_memory(jax.local_devices())


def trial_mesh(mesh, dp: int):
    """(mesh, batch axis) of a trial with dp replicas on the process's 1-D mesh over all
    chips: the mesh itself for dp 1 (no batch axis), else (dp, chips / dp) with axes
    (DATA_AXIS, MESH_AXIS), so each replica's CP group is chips / dp neighbours of the 1-D
    hardware order (a TPU torus's ring segments)."""
    if dp == 1:
        return mesh, None
    from jax.sharding import Mesh

    return Mesh(mesh.devices.reshape(dp, -1), (DATA_AXIS, MESH_AXIS)), DATA_AXIS


def distributed_process_id(accelerator_kind: str, process_index: int,
                           num_processes: int) -> int:
    """This process's jax.distributed process id: on a multi-host TPU slice the host's own
    worker id (the index the driver ordered processes by, from the same node label), else
    `process_index`."""
    if accelerator_kind != "tpu" or num_processes == 1:
        return process_index
    worker = tpu_worker_id(ray.get_runtime_context().get_node_labels(), os.environ)
    if worker != process_index:
        raise RuntimeError(f"this TPU host is slice worker {worker} but was started as JAX "
                           f"process {process_index}: process ids must follow the slice")
    return worker


def host_actor_options(chips, *, compile_cache_dir: str = "") -> list[tuple[tuple[int, ...],
                                                                              dict]]:
    """(bundles, Ray actor options) of each JAX process, in process order: one process per host
    on CPU, per GPU, per TPU VM host (ordered by slice worker id). A non-empty
    compile_cache_dir turns JAX's persistent compilation cache on there."""
    kind = chips.request.accelerator_kind
    processes = []
    for bundles in chips.process_slots(per_host=(kind == "cpu")):
        env = {"JAX_PLATFORMS": _PLATFORM[kind], **jax_cache_env(compile_cache_dir)}
        if kind == "cpu":
            local = len(bundles) * chips.chips_per_bundle
            env.update(JAX_NUM_CPU_DEVICES=str(local), JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
        elif kind == "gpu":  # the step's own peak, against what admission assumed usable
            env.update(jax_gpu_allocator_env())
        # The actor takes its first bundle's resources; the PG keeps the host's other bundles
        # reserved for it, so no other trial lands on those chips.
        processes.append((bundles, chips.actor_options(bundles[0], env=env)))
    return processes


def spawn(chips, *, options: DriverOptions) -> list:
    """Start one JAX process per host (CPU, TPU) or per chip (GPU); returns the handles."""
    request = chips.request
    processes = host_actor_options(chips, compile_cache_dir=options.jax_compile_cache_dir)
    actors = []
    for index, (bundles, options) in enumerate(processes):
        local = len(bundles) * chips.chips_per_bundle
        actors.append(JaxHostActor.options(**options).remote(
            index, len(processes), bundles, request.accelerator_kind, local, request.chips))
    return actors


def rendezvous_refs(actors: list, *, timeout_s: float, get) -> list:
    """Process 0 (actors come in process order) hosts the jax.distributed coordinator; every
    process joins it."""
    coordinator = get([actors[0].rendezvous_address.remote()], "JAX coordinator address")[0]
    return [a.join.remote(coordinator, timeout_s) for a in actors]


__all__ = ["DATA_AXIS", "JaxHostActor", "MESH_AXIS", "distributed_process_id", "host_actor_options",
           "rendezvous_refs", "spawn"]
