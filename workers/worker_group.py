"""The started processes of one trial shape on its chips; built by `WorkerGroup.create`.

Creation is all-or-nothing: if any actor fails to start or to join the process group within
DriverOptions.worker_start_timeout_s, the actors started so far are killed and the error
propagates (the caller then removes the placement group). `shutdown` kills every actor and
removes the placement group. A group that ran a trial cleanly can run the next one (warm).
"""

from __future__ import annotations

import dataclasses

import ray

from gdn_core.device_names import device_mismatch

from . import jax_hosts, torch_ranks
from .environment import merge_environments
from .errors import DeviceMismatchError, WorkerStartupError
from .grid import TrialSpec
from .options import DriverOptions
from .placement import TrialChips
from .process_probe import ProcessIdentity, WorkerInfo, memory_cap_for

_FRAMEWORKS = {"torch": torch_ranks, "jax": jax_hosts}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class WorkerGroupContext:
    """Everything a worker group is built from."""

    chips: TrialChips
    options: DriverOptions


class WorkerGroup:
    """Actors of one trial shape, in process order, with where each one runs."""

    def __init__(self, ctx: WorkerGroupContext, actors: list, workers: tuple[WorkerInfo, ...],
                 versions: dict[str, str],
                 identities: tuple[ProcessIdentity, ...] = (),
                 environment: dict | None = None) -> None:
        self.ctx, self.actors, self.workers, self.versions = ctx, actors, workers, versions
        self.identities = identities
        """Per process: the device its runtime names and its CPU affinity / virtual chips."""
        self.environment = environment or {}
        """What the processes run with, merged (workers.environment.merge_environments)."""
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
            actors = framework.spawn(ctx.chips, options=ctx.options)
            workers = tuple(get([a.info.remote() for a in actors], "starting the actors"))
            versions = get([actors[0].versions.remote()], "reading software versions")[0]
            join = framework.rendezvous_refs(actors, timeout_s=ctx.options.collective_timeout_s,
                                             get=get)
            get(join, "joining the process group")
            # After the join: a JAX process may touch its devices only once distributed is up.
            identities = tuple(get([a.identity.remote() for a in actors],
                                   "reading the device names"))
            environment = merge_environments(get([a.environment.remote() for a in actors],
                                                 "reading the environment"))
        except BaseException:
            kill_actors(actors)
            raise
        return cls(ctx, actors, workers, versions, identities, environment)

    @property
    def chips(self) -> TrialChips:
        return self.ctx.chips

    def run(self, trial: TrialSpec) -> list:
        """Start the trial on every process; one ObjectRef per process (its CPTrainReport)."""
        self.trials_run += 1
        limit = memory_cap_for(self.chips.request.accelerator_kind,
                               self.ctx.options.rank_memory_limit_bytes)
        return [a.run.remote(trial, limit) for a in self.actors]

    def resolve_kernels(self, trial: TrialSpec) -> dict[str, str | None]:
        """What the trial's `kernels` run as on these processes (ChipProcess.resolve_kernels):
        {"gdn": …, "attention": …}, or {"unavailable": why} when any process cannot serve it
        (each distinct reason, joined by "; ")."""
        answers = ray.get([a.resolve_kernels.remote(trial) for a in self.actors],
                          timeout=self.ctx.options.worker_start_timeout_s)
        reasons = list(dict.fromkeys(a["unavailable"] for a in answers if "unavailable" in a))
        if reasons:
            return {"unavailable": "; ".join(reasons)}
        return answers[0]

    def device_memory_problem(self, trial: TrialSpec) -> str | None:
        """Why the trial does not fit these processes' GPUs as they report their memory
        (ChipProcess.device_memory_problem), or None."""
        answers = ray.get([a.device_memory_problem.remote(trial) for a in self.actors],
                          timeout=self.ctx.options.worker_start_timeout_s)
        return next((a for a in answers if a is not None), None)

    def oom_counters(self) -> list[tuple[str | None, int | None]]:
        """Each process's memory-cgroup OOM-kill counter (file, count), read before a run."""
        return ray.get([a.oom_counter.remote() for a in self.actors],
                       timeout=self.ctx.options.worker_start_timeout_s)

    @property
    def host_count(self) -> int:
        """Distinct nodes the processes run on."""
        return len({worker.node_id for worker in self.workers})

    @property
    def device_names(self) -> tuple[str, ...]:
        """The distinct device names the processes reported, in process order."""
        return tuple(dict.fromkeys(i.device_name for i in self.identities))

    def check_devices(self, accelerator_type: str) -> None:
        """Raise DeviceMismatchError unless every process's devices are `accelerator_type`
        (GPU / TPU groups; a CPU host's model is not checked)."""
        if self.chips.request.accelerator_kind == "cpu":
            return
        for name in self.device_names:
            reason = device_mismatch(accelerator_type, name)
            if reason is not None:
                raise DeviceMismatchError(reason)

    def cpu_calibration_keys(self, dtype: str) -> list[tuple]:
        """Per process, what its CPU GEMM peak depends on: (node, framework, dtype, cores it is
        pinned to, chips it drives); processes with equal keys measure the same."""
        framework = self.chips.request.framework
        return [(worker.node_id, framework, dtype, len(identity.affinity),
                 len(identity.cpu_chips))
                for worker, identity in zip(self.workers, self.identities)]

    def calibrate_processes(self, indices: list[int], *, dtype: str,
                            seconds: float) -> list:
        """GEMM peak (PeakMeasurement) of each process in `indices`, measured by that process
        under its own affinity with its framework's GEMM in `dtype`, all at once."""
        refs = [self.actors[i].calibrate_gemm.remote(seconds, dtype) for i in indices]
        return ray.get(refs, timeout=self.ctx.options.worker_start_timeout_s)

    def chips_per_process(self) -> list[int]:
        """Chips (placement bundles × chips per bundle) each process drives."""
        return [len(w.bundles) * self.chips.chips_per_bundle for w in self.workers]

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
