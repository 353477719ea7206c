"""Profile one stored trial again: a sweep of exactly that grid point with `profile: true`.

Why a new sweep and not a flag on the trial: a result row is immutable once written (the
fact table planners query), and a sweep is the unit the scheduler runs, resumes and cancels;
a one-trial sweep reuses all of that, keeps the original measurement untouched, and its own
trial (same key, same settings) holds the new measurement beside the profile.
"""

from __future__ import annotations

from pydantic import ValidationError
from sqlalchemy.orm import Session

from gdn_core.cp_modes import NO_CP
from service.db import crud
from service.db.models import Sweep, Trial
from workers.grid import expand_trials
from workers.sweep_spec import AcceleratorSpec, ModelSpec, SweepSpec


class NotProfilable(ValueError):
    """The trial runs no training step that could be profiled (the message says why)."""


def point_spec(trial: Trial, sweep_spec: SweepSpec) -> SweepSpec:
    """The sweep whose one trial is `trial`'s grid point, profiled. NotProfilable for a plan
    (it compiles, runs no step) or a point recorded skipped (it cannot run)."""
    if trial.kind != "measure":
        raise NotProfilable(f"trial {trial.id} is kind={trial.kind!r}: a plan compiles the step "
                            "and runs none; only kind 'measure' trials can be profiled")
    if trial.skip_reason is not None:
        raise NotProfilable(f"trial {trial.id} was skipped ({trial.skip_reason}); a point that "
                            "cannot run cannot be profiled")
    one_chip = trial.mode == NO_CP  # the baseline / pure data parallel: runs once as NO_CP
    return SweepSpec(
        name=f"profile of trial {trial.id}: {trial.key}"[:200], kinds=["measure"],
        frameworks=[trial.framework],
        modes=[sweep_spec.modes[0] if one_chip else trial.mode], layers=[trial.layers],
        attn_cps=[trial.attn_cp] if trial.attn_cp else sweep_spec.attn_cps,
        layouts=[trial.layout], chips=[trial.chips], dp=[trial.dp], seq_lens=[trial.seq_len],
        model=ModelSpec(preset=trial.preset, num_layers=trial.num_layers,
                        vocab_size=trial.vocab_size),
        batch_size=trial.batch_size, dtypes=[trial.dtype],
        param_shardings=[trial.param_sharding], remats=[trial.remat], kernels=[trial.kernels],
        documents=[trial.documents],
        steps=trial.steps, warmup_steps=trial.warmup_steps,
        accelerator=AcceleratorSpec(kind=trial.accelerator_kind, type=trial.accelerator_type),
        verify=trial.verify, trial_timeout_s=trial.timeout_s, repeats=1,
        one_chip_baseline=one_chip and trial.chips == 1,
        admit_over_memory=True,  # it ran (or was admitted) once already: measure, don't refuse
        profile=True)


def queue_profile_sweep(*, session: Session, trial_id: int) -> Sweep | None:
    """Queue (commit) the one-trial sweep that profiles trial `trial_id`'s point; None when
    there is no such trial; NotProfilable when it cannot be profiled."""
    trial = session.get(Trial, trial_id)
    if trial is None:
        return None
    try:
        spec = point_spec(trial, crud.stored_spec(session.get(Sweep, trial.sweep_id).spec))
    except ValidationError as err:  # a preset or chip type this version no longer knows
        raise NotProfilable(f"trial {trial.id} ({trial.key}) cannot be run by this version: "
                            f"{err.errors()[0]['msg']}") from err
    trials = expand_trials(spec)
    if [t.key for t in trials] != [_unrepeated(trial.key)]:  # exactly the trial's point
        raise NotProfilable(f"trial {trial.id} ({trial.key}) cannot be rebuilt by this "
                            f"version: its point expands to {[t.key for t in trials]}")
    if trials[0].skip_reason is not None:
        raise NotProfilable(f"trial {trial.id} ({trial.key}) cannot run any more: "
                            f"{trials[0].skip_reason}")
    return crud.create_sweep(session=session, sweep_create=spec, trials=trials)


def _unrepeated(key: str) -> str:
    """A key without its `/repeat=r` part (the profile sweep runs its point once)."""
    return "/".join(part for part in key.split("/") if not part.startswith("repeat="))


__all__ = ["NotProfilable", "point_spec", "queue_profile_sweep"]
