"""`gdn-sweep plan --validate SWEEP_ID`: predict held-out trials of a sweep from the rest.

Whole levels are held out — the largest chip count, the largest seq_len, and each seq_len
between the smallest and the largest — never random points among near-duplicates, so a
prediction is of a size the fits did not see. Memory is scored on the part above the fitted
constant (what the fit says at the shortest legal sequence, the weights and optimizer state
mostly), so a model that only knows the constant cannot pass; step time on the whole.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from gdn_core.presets import get_preset
from service.planner.capacity import Point, plan_capacity, predict_memory
from service.planner.evidence import Observation
from service.planner.schemas import CapacityRequest

MEMORY_GOAL, STEP_TIME_GOAL = 0.05, 0.10
"""Relative errors the planner is held to inside the measured range."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class HeldOut:
    holdout: str
    """Which level was held out: "largest chips (4)", "seq_len 1024", …"""
    trial_id: int
    point: str
    figure: str
    """memory_bytes_per_chip or step_time_s"""
    predicted: float | None
    observed: float
    error: float | None
    """|predicted − observed| ÷ observed (memory: ÷ the part above the constant)."""
    basis: str
    """interpolated or extrapolated (as the planner labels it), or refused."""


def _holdouts(observations: Sequence[Observation]) -> list[tuple[str, set[int]]]:
    multi = sorted({o.chips for o in observations if o.chips > 1})
    lengths = sorted({o.seq_len for o in observations})
    out = []
    if len(multi) >= 2:
        top = multi[-1]
        out.append((f"largest chips ({top})",
                    {o.trial_id for o in observations if o.chips == top}))
    if len(lengths) >= 2:
        for length in lengths[1:]:
            out.append((f"{'largest ' if length == lengths[-1] else ''}seq_len {length}",
                        {o.trial_id for o in observations if o.seq_len == length}))
    return out


def _request(o: Observation) -> CapacityRequest:
    return CapacityRequest(preset=o.preset, seq_len=o.seq_len, accelerator=o.accelerator_type,
                           chip_memory_bytes=2 ** 62, max_chips=o.chips,
                           dp=[o.dp], batch_size=o.batch_size, dtype=o.dtype,
                           frameworks=[o.framework],
                           modes=[o.cp_mode], param_shardings=[o.param_sharding],
                           remats=[o.remat], num_layers=o.num_layers)


def _memory_floor(o: Observation, train: Sequence[Observation]) -> float | None:
    """The fitted constant part: the planner's memory at the shortest sequence the point's
    chips can split (one chunk each)."""
    model_cfg = get_preset(o.preset, num_layers=o.num_layers)
    request = _request(o).model_copy(
        update={"seq_len": o.chips // o.dp * model_cfg.gdn.chunk_size})
    point = Point(o.framework, o.cp_mode, o.chips, o.param_sharding, o.remat, o.dp)
    group = [t for t in train if t.settings() == o.settings()]
    return predict_memory(request, model_cfg, point, group, []).value


def _candidate(train: Sequence[Observation], o: Observation):
    """The planner's candidate for o's point, from `train`."""
    answer = plan_capacity(train, _request(o))
    return next((c for c in answer.candidates if c.chips == o.chips and c.dp == o.dp
                 and c.mode == ("none" if o.chips == o.dp else o.cp_mode)), None)


def validate(observations: Sequence[Observation]) -> list[HeldOut]:
    """Every held-out trial's memory and step-time error (module docstring)."""
    rows = []
    for name, held in _holdouts(observations):
        train = [o for o in observations if o.trial_id not in held]
        for o in (o for o in observations if o.trial_id in held):
            match = _candidate(train, o)
            if match is None:
                continue
            mesh = f"chips={o.chips}" + (f"/dp={o.dp}" if o.dp > 1 else "")
            point = f"{o.kind}/{o.framework}/{o.mode}/{mesh}/seq_len={o.seq_len}"
            if o.memory_bytes is not None:
                # from what the held-out figure is (a measured peak, or XLA's estimate) alone
                alike = [t for t in train if t.memory_is_peak == o.memory_is_peak]
                floor = _memory_floor(o, alike)
                above = o.memory_bytes - floor if floor is not None else None
                memory = _candidate(alike, o).memory_bytes_per_chip
                error = (abs(memory.value - o.memory_bytes) / above
                         if memory.value is not None and above and above > 0 else None)
                rows.append(HeldOut(holdout=name, trial_id=o.trial_id, point=point,
                                    figure="memory_bytes_per_chip", predicted=memory.value,
                                    observed=o.memory_bytes, error=error, basis=memory.basis))
            if o.kind == "measure" and o.step_time_s:
                step = match.step_time_s
                error = (abs(step.value - o.step_time_s) / o.step_time_s
                         if step.value is not None else None)
                rows.append(HeldOut(holdout=name, trial_id=o.trial_id, point=point,
                                    figure="step_time_s", predicted=step.value,
                                    observed=o.step_time_s, error=error, basis=step.basis))
    return rows


def summary(rows: Sequence[HeldOut]) -> list[dict]:
    """Per figure and basis: how many, the median and the largest error, and whether the
    in-range goal holds for the median (the convention of published step-time errors:
    vTrain, Proteus) and for every point."""
    out = []
    for figure, goal in (("memory_bytes_per_chip", MEMORY_GOAL), ("step_time_s", STEP_TIME_GOAL)):
        for basis in ("interpolated", "extrapolated", "refused"):
            errors = [r.error for r in rows if r.figure == figure and r.basis == basis]
            scored = [e for e in errors if e is not None]
            if not errors:
                continue
            judged = bool(scored) and basis == "interpolated"
            median = statistics.median(scored) if scored else None
            out.append({"figure": figure, "basis": basis, "trials": len(errors),
                        "median_error": median, "max_error": max(scored) if scored else None,
                        "within_goal": sum(e <= goal for e in scored), "goal": goal,
                        "median_meets_goal": median <= goal if judged else None,
                        "every_point_meets_goal": max(scored) <= goal if judged else None})
    return out
