"""The started processes of one trial shape on its chips; built by `WorkerGroup.create`.

Creation is all-or-nothing: if any actor fails to start or to join the process group within
DriverOptions.worker_start_timeout_s, the actors started so far are killed and the error
propagates (the caller then removes the placement group). `shutdown` kills every actor and
removes the placement group. A group that ran a trial cleanly can run the next one (warm).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import ray

from . import jax_hosts, torch_ranks
from .errors import WorkerStartupError
from .options import DriverOptions
from .placement import TrialChips
from .process_probe import WorkerInfo
from .spec import TrialSpec

_FRAMEWORKS = {"torch": torch_ranks, "jax": jax_hosts}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class WorkerGroupContext:
    """Everything a worker group is built from."""

    chips: TrialChips
    options: DriverOptions
    chips_on_host: Mapping[str, float]
    """Chip resources each node advertises (sizes threads and the CPU chip's share of peak)."""


class WorkerGroup:
    """Actors of one trial shape, in process order, with where each one runs."""

    def __init__(self, ctx: WorkerGroupContext, actors: list, workers: tuple[WorkerInfo, ...],
                 versions: dict[str, str]) -> None:
        self.ctx, self.actors, self.workers, self.versions = ctx, actors, workers, versions
        self.trials_run = 0

    @classmethod
    def create(cls, ctx: WorkerGroupContext) -> "WorkerGroup":
        """Start the actors and their process group / jax.distributed; all-or-nothing."""
        framework = _FRAMEWORKS[ctx.chips.request.framework]
        timeout_s = ctx.options.worker_start_timeout_s
        actors: list = []

        def get(refs, what):
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
            if len(ready) < len(refs):
                raise WorkerStartupError(what, timeout_s)
            return ray.get(refs)

        try:
            actors = framework.spawn(ctx.chips, threads=ctx.options.cpu_threads_per_chip,
                                     chips_on_host=ctx.chips_on_host)
            workers = tuple(get([a.info.remote() for a in actors], "starting the actors"))
            versions = get([actors[0].versions.remote()], "reading software versions")[0]
            join = framework.rendezvous_refs(actors, timeout_s=ctx.options.collective_timeout_s,
                                             get=get)
            get(join, "joining the process group")
        except BaseException:
            kill_actors(actors)
            raise
        return cls(ctx, actors, workers, versions)

    @property
    def chips(self) -> TrialChips:
        return self.ctx.chips

    def run(self, trial: TrialSpec) -> list:
        """Start the trial on every process; one ObjectRef per process (its CPTrainReport)."""
        self.trials_run += 1
        limit = self.ctx.options.rank_memory_limit_bytes
        return [a.run.remote(trial, limit) for a in self.actors]

    def oom_counters(self) -> list[tuple[str | None, int | None]]:
        """Each process's memory-cgroup OOM-kill counter (file, count), read before a run."""
        return ray.get([a.oom_counter.remote() for a in self.actors],
                       timeout=self.ctx.options.worker_start_timeout_s)

    def calibrate_hosts(self, nodes: set[str], seconds: float) -> dict:
        """GEMM peak of each node in `nodes`, measured by one of this group's processes there."""
        refs = {}
        for actor, worker in zip(self.actors, self.workers):
            if worker.node_id in nodes and worker.node_id not in refs:
                refs[worker.node_id] = actor.calibrate_gemm.remote(seconds)
        values = ray.get(list(refs.values()), timeout=self.ctx.options.worker_start_timeout_s)
        return dict(zip(refs, values))

    def shutdown(self) -> None:
        """Kill every actor and give the chips back (idempotent)."""
        kill_actors(self.actors)
        self.chips.remove()


def kill_actors(actors: list) -> None:
    """ray.kill each actor (no restart); tolerate ones already dead."""
    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already dead or never started: nothing to free
            pass


__all__ = ["WorkerGroup", "WorkerGroupContext", "kill_actors"]
