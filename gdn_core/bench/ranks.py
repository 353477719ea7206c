"""D ranks of a process group spawned on this host for a benchmark that times collectives:
gloo over loopback (CPU), or NCCL with one GPU per rank (needs D GPUs on this host)."""

from __future__ import annotations

import datetime
import os
import queue as queue_lib
import socket
import time
import traceback
from collections.abc import Callable


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_entry(rank, world, port, threads, backend, job, spec, results):
    import torch
    import torch.distributed as dist

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(threads)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=300))
    try:
        results.put((rank, job(rank, world, spec), None))
    except BaseException:  # report, then re-raise so the parent sees the failure
        results.put((rank, None, traceback.format_exc()))
        raise
    finally:
        dist.destroy_process_group()


def run_on_ranks(job: Callable[[int, int, dict], object], spec: dict, *, chips: int,
                 backend: str = "gloo", timeout_s: float = 600.0):
    """Run job(rank, chips, spec) on `chips` spawned ranks (each with cores/chips torch
    threads, at least one) and return rank 0's result; `job` is a module-level function (it
    is pickled to the ranks) whose collectives every rank issues alike."""
    import torch.multiprocessing as mp

    threads = max(1, len(os.sched_getaffinity(0)) // chips)
    results = mp.get_context("spawn").Queue()
    ctx = mp.spawn(_rank_entry, args=(chips, free_port(), threads, backend, job, spec, results),
                   nprocs=chips, join=False)
    collected, deadline = {}, time.monotonic() + timeout_s
    try:
        while len(collected) < chips:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{chips} ranks took over {timeout_s} s")
            try:  # drain while waiting: a child cannot exit before its queue data is read
                rank, out, error = results.get(timeout=0.2)
            except queue_lib.Empty:
                ctx.join(timeout=0.01)  # raises if a rank died
                continue
            if error is not None:
                raise RuntimeError(f"rank {rank} of {chips} failed:\n{error}")
            collected[rank] = out
        ctx.join()
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
    return collected[0]


__all__ = ["free_port", "run_on_ranks"]
