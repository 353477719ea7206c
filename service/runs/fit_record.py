"""`gdn-sweep plan --fit`'s compiles, recorded as a sweep of plan trials.

Each row of `--fit` bisects compile-only plans (`python -m gdn_core.jax_gdn.plan
--budget-bytes`, one fresh process per row); every compile it made (FitSearch.probes) is a
plan trial like a sweep's (workers.plan_runner.plan_metrics: XLA's estimate, the compiled
bytes and FLOPs, the prediction), stored in one finished sweep so a later `gdn-sweep plan` or
GET /api/capacity reads them as evidence (`estimated`). The sweep's spec is the grid that
holds the probes (kinds [plan], the rows' chips, dp, modes and settings, every length probed);
its trial rows are the probes alone, since a bisection compiles only some of that grid.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Sequence

from gdn_core.datasheets import canonical_accelerator_type
from service.db import crud
from service.db.models import utcnow
from service.runs import sweep_run
from service.runs.db_sink import record_result
from workers.environment import SweepSource, process_environment, trial_environment
from workers.grid import TrialSpec, expand_trials
from workers.plan_runner import plan_metrics
from workers.process_probe import software_versions
from workers.result import AttemptRecord, TrialResult
from workers.sweep_spec import AcceleratorSpec, SweepSpec
from workers.trial_runner import reference_kernels


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FitRow:
    """One bisection of `--fit`: the request it compiled and the FitSearch JSON it printed."""

    request: dict
    """What `python -m gdn_core.jax_gdn.plan --request` took (preset, chips, dp, mode, …)."""
    search: dict
    """Its answer: budget_bytes, granule, fits, exceeds and every probe (StepPlan JSON)."""


def accelerator_spec(accelerator: str) -> AcceleratorSpec:
    """The sweep's accelerator for a `--accelerator` name: cpu, or a chip type (TPU types
    start with v); ValueError naming the value when it is neither."""
    if accelerator.strip().lower() == "cpu":
        return AcceleratorSpec(kind="cpu", type="cpu")
    chip = canonical_accelerator_type(accelerator)
    return AcceleratorSpec(kind="tpu" if chip.startswith("v") else "gpu", type=chip)


def fit_spec(rows: Sequence[FitRow], *, accelerator: str, max_seq_len: int) -> SweepSpec:
    """The grid that holds every probe of `rows` (all share the preset, depth, batch, dtype)."""
    first = rows[0].request
    budget = rows[0].search["budget_bytes"]
    return SweepSpec(
        name=(f"plan --fit: {first['preset']}, the longest seq_len ≤ {max_seq_len:,} within "
              f"{budget / 2**30:,.3f} GiB per {accelerator} chip"),
        kinds=["plan"], frameworks=["jax"],
        modes=sorted({r.request["mode"] for r in rows}),
        chips=sorted({r.request["chips"] for r in rows}),
        dp=sorted({r.request.get("dp", 1) for r in rows}),
        seq_lens=sorted({p["seq_len"] for r in rows for p in r.search["probes"]}),
        model={"preset": first["preset"], "num_layers": first.get("num_layers")},
        batch_size=first.get("batch_size", 1), dtypes=[first.get("dtype", "bfloat16")],
        param_shardings=sorted({r.request.get("param_sharding", "replicated") for r in rows}),
        remats=sorted({r.request.get("remat", "none") for r in rows}),
        accelerator=accelerator_spec(accelerator))


def _point(trial: TrialSpec) -> tuple:
    cp = trial.cp_settings()
    mode = None if cp.cp_chips == 1 else cp.mode  # one chip per replica: any mode is the same
    return mode, trial.chips, trial.dp, trial.seq_len, trial.param_sharding, trial.remat


def probe_trials(rows: Sequence[FitRow], spec: SweepSpec) -> list[tuple[TrialSpec, dict]]:
    """(trial, its StepPlan JSON) of every probe, as the spec's expansion names it; a point
    probed twice (one chip per replica under two modes) once."""
    by_point = {_point(t): t for t in expand_trials(spec)}
    out: dict[str, tuple[TrialSpec, dict]] = {}
    for row in rows:
        r = row.request
        dp = r.get("dp", 1)
        for probe in row.search["probes"]:
            mode = None if r["chips"] == dp else r["mode"]
            trial = by_point[mode, r["chips"], dp, probe["seq_len"],
                             r.get("param_sharding", "replicated"), r.get("remat", "none")]
            out.setdefault(trial.key, (trial.model_copy(update={"skip_reason": None}), probe))
    return list(out.values())


def record_fit(session_factory, rows: Sequence[FitRow], *, accelerator: str,
               max_seq_len: int) -> tuple[int, int]:
    """Store every compile of `rows` as a succeeded plan trial of one new, finished sweep,
    claimed by this process while it writes (no scheduler runs its rows again). Returns
    (sweep id, plan trials stored)."""
    spec = fit_spec(rows, accelerator=accelerator, max_seq_len=max_seq_len)
    probes = probe_trials(rows, spec)
    runner = sweep_run.runner_identity("plan-fit")
    now = utcnow()
    with session_factory() as session:
        sweep = crud.add_sweep(session=session, sweep_create=spec,
                               trials=[t for t, _ in probes])
        sweep.status, sweep.runner, sweep.started_at, sweep.heartbeat_at = (
            "running", runner, now, now)
        session.commit()
        sweep_id = sweep.id
    host, versions = socket.gethostname(), software_versions()
    process = process_environment(accelerator_kind="cpu", framework="jax")  # XLA:CPU compiled
    for trial, plan in probes:
        resolved = reference_kernels(trial)
        record_result(session_factory=session_factory, sweep_id=sweep_id, result=TrialResult(
            trial=trial, status="succeeded", attempts=1, hosts=[host], versions=versions,
            metrics=plan_metrics(trial, plan).model_copy(update={
                "gdn_kernel": resolved.gdn, "attention_kernel": resolved.attention}),
            attempt_history=[AttemptRecord(attempt=1, status="succeeded", hosts=[host],
                                           started_at=now, finished_at=utcnow())],
            environment=trial_environment(
                process, accelerator_kind=trial.accelerator_kind,
                accelerator_type=trial.accelerator_type, device_name=None, host_count=1,
                source=SweepSource(kind="cli").describe()),
            started_at=now, finished_at=utcnow()))
    with session_factory() as session:
        sweep_run.finish(session=session, sweep_id=sweep_id, status="finished")
    return sweep_id, len(probes)


__all__ = ["FitRow", "accelerator_spec", "fit_spec", "probe_trials", "record_fit"]
