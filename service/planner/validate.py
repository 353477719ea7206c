"""`gdn-sweep plan --validate SWEEP_ID`: predict held-out trials of a sweep from the rest.

Whole levels are held out — the largest chip count (every dp × cp mesh of it), the largest
seq_len, and each seq_len between the smallest and the largest — never random points among
near-duplicates, so a prediction is of a size the fits did not see. On a dp × cp sweep the
step time of a held-out chip count rests on the link fit over the measured meshes of the
smaller ones (fits.fit_links) and on the replica of each mesh (meshes.py). Memory is scored on
the part above the fitted constant (what the planner says at the shortest legal sequence, the
weights and optimizer state mostly), so a model that only knows the constant cannot pass; step
time on the whole. The repeats of a grid point (SweepSpec.repeats) are one held-out point,
scored against their median (as the fits read the points they train on): a measurement is the
median of its repeats, not any one of them.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from gdn_core.cp_modes import trial_mode
from gdn_core.presets import get_preset
from service.planner.capacity import plan_capacity
from service.planner.evidence import Observation, split_speed
from service.schemas.planner import CapacityRequest

MEMORY_GOAL = 0.03
"""Memory: every held-out point (so the median too) within 3% (of the part above the
constant)."""
STEP_TIME_MEDIAN_GOAL, STEP_TIME_GOAL = 0.05, 0.10
"""Step time: the median held-out error within 5% (the convention of published step-time
errors: vTrain, Proteus), the worst point within 10%."""
GOALS = {"memory_bytes_per_chip": (MEMORY_GOAL, MEMORY_GOAL),
         "step_time_s": (STEP_TIME_MEDIAN_GOAL, STEP_TIME_GOAL)}
"""Per figure: (median goal, every-point goal)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class HeldOut:
    holdout: str
    """Which level was held out: "largest chips (4)", "seq_len 1024", …"""
    trial_id: int
    """The point's first trial (its repeats: `repeats`)."""
    repeats: tuple[int, ...] = ()
    """Every trial of the point (repeats of one grid point), scored by their median."""
    point: str
    chips: int = 0
    """All chips of the point's mesh."""
    figure: str
    """memory_bytes_per_chip or step_time_s"""
    predicted: float | None
    observed: float
    error: float | None
    """|predicted − observed| ÷ observed (memory: ÷ the part above the constant)."""
    basis: str
    """interpolated or extrapolated (as the planner labels it), or refused."""

    @property
    def over_goal(self) -> bool:
        """Flagged: no prediction, or an error past the figure's every-point goal."""
        return self.error is None or self.error > GOALS[self.figure][1]


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
                           remats=[o.remat], num_layers=o.num_layers,
                           layers=[o.layers], layouts=[o.layout],
                           attn_cps=[o.attn_cp] if o.attn_cp and o.cp_chips > 1 else None)


def _memory_floor(o: Observation, train: Sequence[Observation]) -> float | None:
    """The fitted constant part: the planner's memory of o's mesh at the shortest sequence
    a replica's chips can split (one chunk each)."""
    chunk = get_preset(o.preset, num_layers=o.num_layers).gdn.chunk_size
    short = dataclasses.replace(o, seq_len=o.chips // o.dp * chunk)
    match = _candidate(train, short)
    return None if match is None else match.memory_bytes_per_chip.value


def _candidate(train: Sequence[Observation], o: Observation):
    """The planner's candidate for o's point, from `train`."""
    answer = plan_capacity(train, _request(o))
    return next((c for c in answer.candidates if c.chips == o.chips and c.dp == o.dp
                 and c.mode == trial_mode(o.cp_mode, cp_chips=o.cp_chips)), None)


def _points(held: Sequence[Observation]) -> list[tuple[Observation, tuple[int, ...]]]:
    """The held-out trials by point (settings, kind, mode, mesh, seq_len): the repeats of one
    point as one observation, the first trial's with the median step time and memory of them
    all (a measurement is the median of its repeats, as the fits read them), and the ids."""
    by_point: dict[tuple, list[Observation]] = {}
    for o in held:
        key = (o.settings(), o.kind, o.mode, o.chips, o.dp, o.seq_len, o.memory_is_peak)
        by_point.setdefault(key, []).append(o)

    def median(values):
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    out = []
    for trials in by_point.values():
        memory = median(o.memory_bytes for o in trials)
        out.append((dataclasses.replace(
            trials[0], step_time_s=median(o.step_time_s for o in trials),
            memory_bytes=None if memory is None else round(memory)),
            tuple(o.trial_id for o in trials)))
    return out


def validate(observations: Sequence[Observation]) -> list[HeldOut]:
    """Every held-out point's memory and step-time error (module docstring), the repeats of a
    point scored as one (their median: _points); interpreted runs are neither held out nor
    trained on (evidence.split_speed: no speed, no kernel's memory)."""
    observations, _ = split_speed(observations)
    rows = []
    for name, held in _holdouts(observations):
        train = [o for o in observations if o.trial_id not in held]
        for o, repeats in _points([o for o in observations if o.trial_id in held]):
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
                alone = _candidate(alike, o)
                memory = (alone.memory_bytes_per_chip if alone is not None else
                          match.memory_bytes_per_chip.model_copy(update={"value": None}))
                error = (abs(memory.value - o.memory_bytes) / above
                         if memory.value is not None and above and above > 0 else None)
                rows.append(HeldOut(holdout=name, trial_id=o.trial_id, repeats=repeats,
                                    point=point, chips=o.chips,
                                    figure="memory_bytes_per_chip", predicted=memory.value,
                                    observed=o.memory_bytes, error=error, basis=memory.basis))
            if o.kind == "measure" and o.step_time_s:
                step = match.step_time_s
                error = (abs(step.value - o.step_time_s) / o.step_time_s
                         if step.value is not None else None)
                rows.append(HeldOut(holdout=name, trial_id=o.trial_id, repeats=repeats,
                                    point=point, chips=o.chips, figure="step_time_s",
                                    predicted=step.value,
                                    observed=o.step_time_s, error=error, basis=step.basis))
    return rows


def summary(rows: Sequence[HeldOut]) -> list[dict]:
    """Per figure, over every held-out point ("all"), then per basis: how many, the median
    and the largest error, how many within the every-point goal, and whether the median and
    the worst meet their goals (GOALS; None where nothing was scored)."""
    out = []
    for figure, (median_goal, goal) in GOALS.items():
        for basis in ("all", "interpolated", "extrapolated", "roofline", "refused"):
            errors = [r.error for r in rows if r.figure == figure
                      and (basis == "all" or r.basis == basis)]
            scored = [e for e in errors if e is not None]
            if not errors:
                continue
            median = statistics.median(scored) if scored else None
            out.append({"figure": figure, "basis": basis, "trials": len(errors),
                        "median_error": median, "max_error": max(scored) if scored else None,
                        "within_goal": sum(e <= goal for e in scored), "goal": goal,
                        "median_goal": median_goal,
                        "median_meets_goal": median <= median_goal if scored else None,
                        "every_point_meets_goal": (max(scored) <= goal
                                                   if len(scored) == len(errors) else False)
                        if scored else None})
    return out
