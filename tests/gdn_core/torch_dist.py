"""Run a function on D processes joined in a real gloo process group on 127.0.0.1.

    results = run_in_process_group(job, world_size=4, args=(spec,), timeout_s=90)

`job(rank, world_size, *args)` runs in every process of the group and returns something
picklable (numpy arrays, numbers, strings: torch tensors sent through a queue die with their
sender). The results come back as a list indexed by rank. A failing rank fails the call with
its traceback; a hang fails it after `timeout_s`.

The processes of one world size are spawned once per test session and run job after job (a
"world"): starting D processes that import torch and gdn_core costs ~10 s on this 2-core host,
and the suite runs some twenty jobs. Each job starts from the default group, torch's initial
seed and one thread; a job that fails or hangs takes its world down with it (the next job
spawns a fresh one), so nothing it left half done reaches another test. `fresh=True` (or
GDN_SWEEP_FRESH_WORLDS=1 for the whole run) spawns processes for that job alone.
"""

from __future__ import annotations

import atexit
import datetime
import os
import queue as queue_lib
import random
import socket
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

GROUP_TIMEOUT_S = 1800
"""gloo's own timeout for a collective; the caller's timeout_s (which kills the world) is the
one a test sees."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _next_job(jobs, parent: int):
    """The next job from `jobs`, or None once the process that spawned this rank is gone (this
    rank was reparented): an xdist worker can end without running atexit, and a rank must not
    outlive the test run that started it."""
    while True:
        try:
            return jobs.get(timeout=1.0)
        except queue_lib.Empty:
            if os.getppid() != parent:
                return None


def _serve(rank: int, world_size: int, port: int, jobs, results, parent: int) -> None:
    """A rank of a world: join the group, then run each job from `jobs` until None arrives or
    `parent` (the test process) is gone."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=GROUP_TIMEOUT_S))
    initial_seed = torch.initial_seed()
    try:
        while (task := _next_job(jobs, parent)) is not None:
            job, args = task
            torch.set_num_threads(1)  # D processes share the host's cores
            torch.manual_seed(initial_seed)
            random.seed(0)
            try:
                results.put((rank, job(rank, world_size, *args), None))
            except BaseException:
                results.put((rank, None, traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class _World:
    """world_size daemon processes in one gloo group, each with its own job queue."""

    def __init__(self, world_size: int) -> None:
        ctx = mp.get_context("spawn")
        self.world_size = world_size
        self.jobs = [ctx.Queue() for _ in range(world_size)]
        self.results = ctx.Queue()
        port = free_port()
        self.processes = [ctx.Process(target=_serve, daemon=True,
                                      args=(rank, world_size, port, self.jobs[rank],
                                            self.results, os.getpid()))
                          for rank in range(world_size)]
        for process in self.processes:
            process.start()

    def run(self, job, args: tuple, timeout_s: float) -> list:
        for jobs in self.jobs:
            jobs.put((job, args))
        collected: dict[int, object] = {}
        deadline = time.monotonic() + timeout_s
        while len(collected) < self.world_size:
            if time.monotonic() > deadline:
                missing = sorted(set(range(self.world_size)) - set(collected))
                raise TimeoutError(f"ranks {missing} of {self.world_size} did not finish "
                                   f"within timeout_s={timeout_s}")
            try:  # drain while waiting: a child cannot exit before its queue data is read
                rank, out, error = self.results.get(timeout=0.2)
            except queue_lib.Empty:
                dead = [r for r, p in enumerate(self.processes) if not p.is_alive()]
                if dead:
                    raise RuntimeError(f"ranks {dead} of {self.world_size} died "
                                       f"(exit codes {[self.processes[r].exitcode for r in dead]})")
                continue
            if error is not None:
                raise RuntimeError(f"rank {rank} of {self.world_size} failed:\n{error}")
            collected[rank] = out
        return [collected[r] for r in range(self.world_size)]

    def close(self, *, wait_s: float = 0.0) -> None:
        for jobs in self.jobs:
            jobs.put(None)
        for process in self.processes:
            process.join(timeout=wait_s)
            if process.is_alive():
                process.terminate()


_worlds: dict[int, _World] = {}


@atexit.register
def _close_worlds() -> None:
    for world in _worlds.values():
        world.close(wait_s=5.0)
    _worlds.clear()


def noop_job(rank: int, world_size: int) -> int:
    return rank


def start_worlds(*world_sizes: int, timeout_s: float = 180.0) -> None:
    """Spawn the worlds of these sizes now (all at once) and wait until each has joined its
    group; those already running are kept."""
    fresh = [size for size in world_sizes if size not in _worlds]
    for size in fresh:
        _worlds[size] = _World(size)
    for size in fresh:
        run_in_process_group(noop_job, world_size=size, timeout_s=timeout_s)


def run_in_process_group(job, *, world_size: int, args: tuple = (), timeout_s: float = 90.0,
                         fresh: bool = False) -> list:
    """Run `job(rank, world_size, *args)` on every rank of the world of world_size processes;
    return their results, indexed by rank."""
    fresh = fresh or os.environ.get("GDN_SWEEP_FRESH_WORLDS") == "1"
    world = _World(world_size) if fresh else _worlds.get(world_size) or _World(world_size)
    if not fresh:
        _worlds[world_size] = world
    try:
        results = world.run(job, args, timeout_s)
    except BaseException:
        _worlds.pop(world_size, None)
        world.close()
        raise
    if fresh:
        world.close(wait_s=5.0)
    return results
