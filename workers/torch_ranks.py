"""PyTorch trials: one Ray actor per rank, pinned to its chip's bundle, in one process group.

The process group is the default (WORLD) group of each actor process: gloo on CPU, NCCL on
GPU, rendezvous over TCP at rank 0's node IP and a port rank 0 picked. It outlives a trial, so
a warm group runs the next trial of the same shape without a new rendezvous.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import gc

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from . import process_probe
from .errors import RankOutOfMemoryError
from .failures import looks_like_oom
from .spec import TrialSpec


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class TorchRankActor:
    """One rank: a process that owns one chip of the trial's placement group."""

    def __init__(self, rank: int, world_size: int, bundle: int, accelerator_kind: str,
                 threads: int | None, chips_on_host: float) -> None:
        import torch

        self.rank, self.world_size, self.bundle = rank, world_size, bundle
        self.kind = accelerator_kind
        cores = process_probe.host_cpu_count()
        # Virtual chips share the host's cores: give each its share, not all of them.
        self.threads = threads or max(1, int(cores // max(chips_on_host, 1)))
        torch.set_num_threads(self.threads)
        self.device = "cpu"
        if accelerator_kind == "gpu":
            torch.cuda.set_device(0)  # Ray sets CUDA_VISIBLE_DEVICES to this rank's GPU
            self.device = "cuda:0"
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

    def calibrate_gemm(self, seconds: float):
        """Measure this host's GEMM peak with all its cores (restoring the rank's threads)."""
        import torch

        from gdn_core.hardware import calibrate_cpu_peak_flops

        torch.set_num_threads(process_probe.host_cpu_count())
        try:
            return calibrate_cpu_peak_flops(seconds=seconds)
        finally:
            torch.set_num_threads(self.threads)

    def run(self, trial: TrialSpec, memory_limit_bytes: int | None):
        from gdn_core.torch_gdn.cp.train import run_cp_training

        model_cfg, train_cfg = trial.to_model_config(), trial.to_train_config()
        rss_reset = self.device == "cpu" and process_probe.reset_peak_rss()
        try:
            with process_probe.address_space_cap(memory_limit_bytes):
                report = run_cp_training(model_cfg, train_cfg, group=self.group, mode=trial.mode,
                                         steps=trial.steps, warmup_steps=trial.warmup_steps,
                                         device=self.device, verify=trial.verify)
        except Exception as exc:
            if not looks_like_oom(exc):
                raise
            peak, source = self._peak_memory()
            raise RankOutOfMemoryError(f"rank {self.rank}: {type(exc).__name__}: {exc}",
                                       peak, source, memory_limit_bytes) from None
        finally:
            gc.collect()
        if rss_reset:  # the report's RSS peak spans the process life; this one spans the trial
            peak, source = process_probe.peak_rss()
            report = dataclasses.replace(report, peak_memory_bytes=peak, memory_source=source)
        return report

    def _peak_memory(self) -> tuple[int | None, str]:
        if self.device != "cpu":
            import torch

            return int(torch.cuda.max_memory_allocated()), "cuda_max_allocated"
        return process_probe.peak_rss()


def spawn(chips, *, threads: int | None, chips_on_host) -> list:
    """Start one rank actor per bundle (ranks of a host adjacent); returns the handles."""
    request = chips.request
    slots = chips.process_slots(per_host=False)
    resources = {"GPU": 1} if request.accelerator_kind == "gpu" else {request.resource: 1}
    actors = []
    for rank, (bundle,) in enumerate(slots):
        node = chips.bundle_nodes[bundle]
        options = dict(num_cpus=0, scheduling_strategy=PlacementGroupSchedulingStrategy(
            chips.placement_group, placement_group_bundle_index=bundle))
        if "GPU" in resources:
            options["num_gpus"] = 1
        else:
            options["resources"] = resources
        actors.append(TorchRankActor.options(**options).remote(
            rank, len(slots), bundle, request.accelerator_kind, threads,
            chips_on_host.get(node, 1.0)))
    return actors


def rendezvous_refs(actors: list, *, timeout_s: float, get) -> list:
    """Form the process group: rank 0 picks the address, every rank joins it."""
    host, port = get([actors[0].rendezvous_address.remote()], "rank 0 rendezvous address")[0]
    return [a.join.remote(host, port, timeout_s) for a in actors]


__all__ = ["TorchRankActor", "rendezvous_refs", "spawn"]
