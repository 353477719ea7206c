"""PyTorch trials: one Ray actor per rank, pinned to its chip's bundle, in one process group.

The process group is the default (WORLD) group of each actor process: gloo on CPU, NCCL on
GPU, rendezvous over TCP at rank 0's node IP and a port rank 0 picked. It outlives a trial, so
a warm group runs the next trial of the same shape without a new rendezvous.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gc
import os

import ray

from . import cpu_cores, process_probe
from .errors import RankOutOfMemoryError
from .failures import looks_like_oom
from .placement import cuda_device_index
from .options import DriverOptions
from .spec import TrialSpec


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class TorchRankActor:
    """One rank: a process that owns one chip of the trial's placement group."""

    def __init__(self, rank: int, world_size: int, bundle: int, accelerator_kind: str,
                 threads: int | None) -> None:
        self.rank, self.world_size, self.bundle = rank, world_size, bundle
        self.kind = accelerator_kind
        self.cpu = None
        if accelerator_kind == "cpu":  # a virtual chip: this rank's own cores, pinned
            self.cpu = cpu_cores.claim_and_pin(1)
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

    def info(self) -> process_probe.WorkerInfo:
        return process_probe.describe_self(self.rank, (self.bundle,))

    def oom_counter(self) -> tuple[str | None, int | None]:
        return process_probe.oom_kill_counter()

    def versions(self) -> dict[str, str]:
        return process_probe.software_versions()

    def rendezvous_address(self) -> tuple[str, int]:
        return ray.util.get_node_ip_address(), process_probe.free_port()

    def join(self, host: str, port: int, timeout_s: float) -> int:
        import torch.distributed as dist

        backend = "nccl" if self.kind == "gpu" else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank,
                                world_size=self.world_size,
                                timeout=dt.timedelta(seconds=timeout_s))
        self.group = dist.group.WORLD
        return dist.get_world_size()

    def identity(self) -> process_probe.ProcessIdentity:
        """The device this rank computes on, and its CPU affinity (checked by the runner)."""
        import torch

        name = (torch.cuda.get_device_name() if self.device != "cpu"
                else process_probe.cpu_model_name())
        return process_probe.ProcessIdentity(
            device_name=name, affinity=tuple(sorted(os.sched_getaffinity(0))),
            cpu_chips=self.cpu.chips if self.cpu else (),
            cpu_partition=self.cpu.describe() if self.cpu else None)

    def calibrate_gemm(self, seconds: float, dtype: str = "float32"):
        """This rank's torch GEMM rate in `dtype`, on its own cores with its own threads."""
        from gdn_core.hardware import calibrate_cpu_peak_flops

        measured = calibrate_cpu_peak_flops(seconds=seconds, dtype=dtype)
        where = self.cpu.describe() if self.cpu else "unpinned"
        return dataclasses.replace(measured, source=f"{measured.source}:{where}")

    def run(self, trial: TrialSpec, memory_limit_bytes: int | None):
        from gdn_core.torch_gdn.cp.train import run_cp_training

        model_cfg, train_cfg = trial.to_model_config(), trial.to_train_config()
        try:
            with process_probe.address_space_cap(
                    process_probe.memory_cap_for(self.kind, memory_limit_bytes)):
                report = run_cp_training(model_cfg, train_cfg, group=self.group, mode=trial.cp_mode,
                                         steps=trial.steps, warmup_steps=trial.warmup_steps,
                                         device=self.device, verify=trial.verify,
                                         **trial.step_kwargs())
        except Exception as exc:
            if not looks_like_oom(exc):
                raise
            peak, source = self._peak_memory()
            raise RankOutOfMemoryError(f"rank {self.rank}: {type(exc).__name__}: {exc}",
                                       peak, source, memory_limit_bytes) from None
        finally:
            gc.collect()
        return report  # its memory was measured from the start of run_cp_training

    def _peak_memory(self) -> tuple[int | None, str]:
        """What the run reached before it ran out: gdn_core's measurement (CUDA's allocator
        peak, or this process's RSS mark, both reset when run_cp_training started)."""
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
