"""Run a function on D spawned processes joined in a real gloo process group on 127.0.0.1.

    results = run_in_process_group(job, world_size=4, args=(spec,), timeout_s=90)

`job(rank, world_size, *args)` runs in every process after `init_process_group("gloo")` and
returns something picklable (numpy arrays, numbers, strings: torch tensors sent through a
queue die with their sender). The results come back as a list indexed by rank. A failing rank
fails the call with its traceback; a hang fails it after `timeout_s`.
"""

from __future__ import annotations

import datetime
import os
import queue as queue_lib
import socket
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, job, world_size, port, results, args, timeout_s):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torch.set_num_threads(1)  # D processes share the host's cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        out = job(rank, world_size, *args)
        results.put((rank, out, None))
    except BaseException:  # report, then re-raise so spawn fails the parent too
        results.put((rank, None, traceback.format_exc()))
        raise
    finally:
        dist.destroy_process_group()


def run_in_process_group(job, *, world_size: int, args: tuple = (), timeout_s: float = 90.0):
    """Spawn `world_size` ranks running `job(rank, world_size, *args)`; return their results."""
    results = mp.get_context("spawn").Queue()
    ctx = mp.spawn(_entry, args=(job, world_size, free_port(), results, args, timeout_s),
                   nprocs=world_size, join=False)
    collected: dict[int, object] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(collected) < world_size:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"ranks {sorted(set(range(world_size)) - set(collected))} of {world_size} "
                    f"did not finish within timeout_s={timeout_s}")
            try:  # drain while waiting: a child cannot exit before its queue data is read
                rank, out, error = results.get(timeout=0.2)
            except queue_lib.Empty:
                ctx.join(timeout=0.01)  # raises if a rank died
                continue
            if error is not None:
                raise RuntimeError(f"rank {rank} of {world_size} failed:\n{error}")
            collected[rank] = out
        while not ctx.join(timeout=max(1.0, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks did not exit within timeout_s={timeout_s}")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
    return [collected[r] for r in range(world_size)]
