"""PyTorch trials: one Ray actor per rank, pinned to its chip's bundle, in one process group.

The process group is the default (WORLD) group of each actor process: gloo on CPU, NCCL on
GPU, rendezvous over TCP at rank 0's node IP and a port rank 0 picked. It outlives a trial, so
a warm group runs the next trial of the same shape without a new rendezvous.
"""

from __future__ import annotations

import datetime as dt
import os

import ray

from . import cpu_cores, process_probe
from .chip_process import ChipProcess
from .grid import TrialSpec
from .options import DriverOptions
from .placement import cuda_device_index


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class TorchRankActor(ChipProcess):
    """One rank: a process that owns one chip of the trial's placement group."""

    framework = "torch"

    def __init__(self, rank: int, world_size: int, bundle: int, accelerator_kind: str,
                 threads: int | None) -> None:
        super().__init__(index=rank, bundles=(bundle,), accelerator_kind=accelerator_kind,
                         cpu_chips=1)  # a virtual CPU chip: this rank's own cores
        self.world_size, self.label = world_size, f"rank {rank}"
        if self.cpu is not None:
            cores = len(self.cpu.cores)
        else:  # host threads of a GPU rank: its share of the host's cores
            node_gpus = cpu_cores.node_cpu_chips(ray.get_runtime_context().get_node_id(), "GPU")
            cores = max(1, process_probe.host_cpu_count() // max(node_gpus, 1))
        import torch

        self.threads = threads or cores
        torch.set_num_threads(self.threads)
        self.device = "cpu"
        if accelerator_kind == "gpu":
            # Every GPU of the node is visible (placement.TrialChips.actor_options): take ours.
            index = cuda_device_index(ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES"))
            torch.cuda.set_device(index)
            self.device = f"cuda:{index}"
        self.group = None
        # Import the training code now: part of starting the worker, not of the first trial.
        import gdn_core.torch_gdn.cp.train  # noqa: F401

    def rendezvous_address(self) -> tuple[str, int]:
        return ray.util.get_node_ip_address(), process_probe.free_port()

    def join(self, host: str, port: int, timeout_s: float) -> int:
        import torch.distributed as dist

        backend = "nccl" if self.kind == "gpu" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.index,
                                world_size=self.world_size,
                                timeout=dt.timedelta(seconds=timeout_s))
        self.group = dist.group.WORLD
        return dist.get_world_size()

    def _device_name(self) -> str:
        import torch

        return torch.cuda.get_device_name()

    def _measure_gemm(self, seconds: float, dtype: str):
        """torch's GEMM rate on this rank's own cores with its own threads."""
        from gdn_core.calibration import calibrate_cpu_peak_flops

        return calibrate_cpu_peak_flops(seconds=seconds, dtype=dtype)

    def _train(self, trial: TrialSpec):
        from gdn_core.torch_gdn.cp.train import run_cp_training

        return run_cp_training(trial.to_model_config(), trial.to_train_config(),
                               group=self.group, cp=trial.cp_settings(), steps=trial.steps,
                               warmup_steps=trial.warmup_steps, device=self.device,
                               verify=trial.verify,
                               after_timed_steps=self.step_profiler(trial, device=self.device))

    def _peak_memory(self) -> tuple[int | None, str]:
        """gdn_core's measurement: CUDA's allocator peak, or this process's RSS mark, both
        reset when run_cp_training started."""
        from gdn_core.device_memory import torch_peak_memory

        return torch_peak_memory(self.device)


def rank_actor_options(chips) -> list[tuple[int, dict]]:
    """(bundle, Ray actor options) of each rank, in rank order (ranks of a host adjacent)."""
    return [(bundle, chips.actor_options(bundle))
            for (bundle,) in chips.process_slots(per_host=False)]


def spawn(chips, *, options: DriverOptions) -> list:
    """Start one rank actor per bundle (ranks of a host adjacent); returns the handles."""
    request = chips.request
    ranks = rank_actor_options(chips)
    return [TorchRankActor.options(**actor_options).remote(
                rank, len(ranks), bundle, request.accelerator_kind, options.cpu_threads_per_chip)
            for rank, (bundle, actor_options) in enumerate(ranks)]


def rendezvous_refs(actors: list, *, timeout_s: float, get) -> list:
    """Form the process group: rank 0 picks the address, every rank joins it."""
    host, port = get([actors[0].rendezvous_address.remote()], "rank 0 rendezvous address")[0]
    return [a.join.remote(host, port, timeout_s) for a in actors]


__all__ = ["TorchRankActor", "rank_actor_options", "rendezvous_refs", "spawn"]
