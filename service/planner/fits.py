"""Models fitted to trial results: memory per chip, compute rate, and the links.

- Memory: gdn_core's analytic predictor, refined by the residual (observed − predicted) fitted
  affine in the local shard (tokens per chip), pooled over chip counts — the sequence-sharded
  modes are flat in D at a fixed shard, and what does depend on D (sharded weights) the
  predictor already carries.
- Compute: step time against the hardware FLOPs per chip it ran (TimeCurve), through the
  median of each point's repeats. The achieved FLOP rate is not one number: it moves with the
  per-chip work (the working set against the caches on a CPU, a kernel's occupancy on a GPU).
  It is modelled log-linear in the per-chip work — log seconds = a + b · log FLOPs, the rate
  ∝ FLOPs^(1 − b) —: between measured points piecewise (log-log interpolation), beyond them
  the exponent b fitted by least squares over all the points (TIME_EXPONENT_RANGE bounds it;
  from three points up, MIN_POINTS_FOR_EXPONENT: below, a constant rate).
  Chosen from data (2026-12-07, JAX tiny p2p, one chip pinned to one core, 1,024–16,384
  tokens, 2 repeats): b ≈ 1.1 over 2,048–16,384 (the rate falls ~8% per doubling of the
  shard, 14 → 11 GFLOP/s); from 4,096 and 8,192, 16,384 tokens were missed by 9.5% at a
  constant rate, 6.2% by an affine time (overhead + FLOPs ÷ a rate), 2.5% by the log-linear
  rate; `plan --validate` of that sweep, one-chip seq_len hold-outs: median 5.1% → 2.0%, the
  largest length 9.5% → 2.7%. Per component (GDN rule, attention, MLP) was not chosen: along
  a sequence-length sweep every component but attention grows linearly with the local
  tokens, so their rates cannot be told apart by such data (collinear), while the cache
  effect they share is the one that moves.
  One-chip trials give compute alone (fit_compute). Trials of one mode at one chip count make
  a curve of their own, compute at that chip count (contention of chips that share a host
  included), with the exposed communication the link fit gives for each trial's recorded
  bytes and rounds taken out before the fit and added back at the target (chips_curve; whole
  steps where the link fit would leave a trial under half its time, as on virtual chips whose
  contention grows with the work).
- Communication: what a multi-chip step takes beyond its compute, fitted as bytes ÷ bandwidth
  + dependent rounds × latency over measured trials of every dp × cp mesh (each one's recorded
  CP and gradient bytes and its rounds); where they are too few, the chip type's datasheet
  prior (link_priors.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np

from service.planner.evidence import Observation
from service.planner.link_priors import link_prior


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class AffineFit:
    """y = intercept + slope · x over observed x in [x_min, x_max]."""

    intercept: float
    slope: float
    x_min: float
    x_max: float
    trial_ids: tuple[int, ...]

    def __call__(self, x: float) -> float:
        return self.intercept + self.slope * x

    @classmethod
    def least_squares(cls, xs: Sequence[float], ys: Sequence[float],
                      trial_ids: Sequence[int]) -> AffineFit:
        """Least squares; a constant (the mean) when every x is the same."""
        x, y = np.asarray(xs, float), np.asarray(ys, float)
        if np.ptp(x) == 0:
            intercept, slope = float(y.mean()), 0.0
        else:
            slope, intercept = (float(c) for c in np.polyfit(x, y, 1))
        return cls(intercept=intercept, slope=slope, x_min=float(x.min()), x_max=float(x.max()),
                   trial_ids=tuple(trial_ids))


def fit_memory(observations: Sequence[Observation]) -> AffineFit | None:
    """Residual memory (observed − analytic prediction) against local tokens, or None."""
    known = [o for o in observations
             if o.memory_bytes is not None and o.predicted_memory_bytes is not None]
    if not known:
        return None
    return AffineFit.least_squares([o.local_tokens for o in known],
                                   [o.memory_bytes - o.predicted_memory_bytes for o in known],
                                   [o.trial_id for o in known])


TIME_EXPONENT_RANGE = (0.5, 1.5)
"""Bounds of the fitted exponent b (seconds ∝ FLOPs^b) used beyond the measured points: b = 1
is a constant rate; outside [0.5, 1.5] the rate would change by more than the square root of
the work, which a few points 2× apart (±5% noise each: ±0.1 on b) do not show — a trend that
steep between two points is noise, or a regime (a cache edge) that need not continue."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TimeCurve:
    """Step seconds against FLOPs per chip through measured points (the median of repeats):
    interpolated in log-log between them (the achieved rate log-linear in the work between
    neighbours), and beyond them from the nearest end along the exponent fitted over all of
    them (the module docstring)."""

    flops: tuple[float, ...]
    seconds: tuple[float, ...]
    trial_ids: tuple[int, ...]
    exponent: float = 1.0
    """b of seconds ∝ FLOPs^b beyond the ends: least squares in log-log over the points,
    within TIME_EXPONENT_RANGE (1, a constant rate, from fewer than three)."""

    @classmethod
    def through(cls, flops: Sequence[float], seconds: Sequence[float],
                trial_ids: Sequence[int]) -> TimeCurve:
        """The curve through points sorted by FLOPs, its exponent fitted to them."""
        return cls(flops=tuple(flops), seconds=tuple(seconds), trial_ids=tuple(trial_ids),
                   exponent=fitted_exponent(flops, seconds))

    @property
    def flops_min(self) -> float:
        return self.flops[0]

    @property
    def flops_max(self) -> float:
        return self.flops[-1]

    @property
    def flops_per_s(self) -> float:
        """The achieved rate at the largest point."""
        return self.flops[-1] / self.seconds[-1]

    def flops_per_s_at(self, flops_per_chip: float) -> float:
        """The achieved rate the curve gives at `flops_per_chip`."""
        return flops_per_chip / self.seconds_at(flops_per_chip)

    def seconds_at(self, flops_per_chip: float) -> float:
        if flops_per_chip <= self.flops[0]:
            return self.seconds[0] * (flops_per_chip / self.flops[0]) ** self.exponent
        if flops_per_chip >= self.flops[-1]:
            return self.seconds[-1] * (flops_per_chip / self.flops[-1]) ** self.exponent
        return float(np.exp(np.interp(np.log(flops_per_chip), np.log(self.flops),
                                      np.log(self.seconds))))


MIN_POINTS_FOR_EXPONENT = 3
"""Points a fitted exponent needs: the slope of two is as much their noise as a trend (two
points 2× apart, ±5% each: ±0.1 on b; 2026-12-07, 6-step trials of 10-30 ms at 256 and 512
tokens gave b ≈ 1.4 and missed 1,024 tokens by 42%, where a constant rate missed by 7%)."""


def fitted_exponent(flops: Sequence[float], seconds: Sequence[float]) -> float:
    """b of log seconds = a + b · log FLOPs by least squares, clipped to TIME_EXPONENT_RANGE;
    1 (a constant rate) from fewer than MIN_POINTS_FOR_EXPONENT distinct FLOPs."""
    x, y = np.log(np.asarray(flops, float)), np.log(np.asarray(seconds, float))
    if len(np.unique(x)) < MIN_POINTS_FOR_EXPONENT:
        return 1.0
    slope = float(np.polyfit(x, y, 1)[0])
    return float(np.clip(slope, *TIME_EXPONENT_RANGE))


def _timed(observations: Sequence[Observation]) -> list[Observation]:
    return [o for o in observations if o.kind == "measure" and o.step_time_s
            and o.hardware_flops_per_step]


def time_curve(observations: Sequence[Observation],
               less: Callable[[Observation], float] | None = None) -> TimeCurve | None:
    """The TimeCurve of measured trials (FLOPs per chip → step time, less `less(o)` of each
    where given), None without any."""
    by_flops: dict[float, list[Observation]] = {}
    for o in _timed(observations):
        by_flops.setdefault(o.hardware_flops_per_step / o.chips, []).append(o)
    if not by_flops:
        return None
    points = sorted(by_flops.items())
    return TimeCurve.through(
        [f for f, _ in points],
        [float(np.median([o.step_time_s - (less(o) if less else 0.0) for o in os]))
         for _, os in points],
        [o.trial_id for _, os in points for o in os])


def fit_compute(observations: Sequence[Observation]) -> TimeCurve | None:
    """Compute alone: one-chip measured trials (nothing crosses chips)."""
    return time_curve([o for o in observations if o.chips == 1])


def dependent_rounds(mode: str, chips: int, *, num_layers: int, remat: str, dp: int = 1
                     ) -> int:
    """Exchanges of one step that wait on each other (docs/architecture.md's table) on a mesh of
    dp replicas of `chips` CP chips each: per GDN layer and pass the mode's rounds plus the
    conv halo within a replica (none without CP); forward, backward, and the recomputed
    forward under remat; then one gradient reduction over all dp × chips chips."""
    if chips * dp == 1:
        return 0
    if chips == 1:
        return 1
    per_pass = {"ulysses": 2, "p2p": chips - 1, "all_gather": 1,
                "log_scan": math.ceil(math.log2(chips))}[mode] + 1
    passes = 2 + (remat != "none")
    return num_layers * per_pass * passes + 1


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class LinkFit:
    """Communication time = bytes ÷ bytes_per_s + rounds × latency_s."""

    bytes_per_s: float
    latency_s: float
    source: str
    chips_max: int
    """Largest chip count (all the mesh's) among the trials fitted (1 for a prior alone)."""
    trial_ids: tuple[int, ...]

    def seconds(self, comm_bytes: float, rounds: int) -> float:
        return comm_bytes / self.bytes_per_s + rounds * self.latency_s


def link_rows(observations: Sequence[Observation], mode: str) -> list[Observation]:
    """The measured trials a link fit of `mode` reads: every multi-chip mesh (any dp) whose
    replicas run `mode`, and the pure data-parallel ones (one chip per replica: only the
    gradient reduction crosses chips, whatever the mode)."""
    return [o for o in observations if o.kind == "measure" and o.chips > 1
            and (o.cp_mode == mode or o.cp_chips == 1) and o.step_time_s
            and o.hardware_flops_per_step and o.cp_comm_bytes is not None]


def _two_directions(comm: np.ndarray, rounds: np.ndarray) -> bool:
    """Whether the rows' (bytes, rounds) span two directions: bandwidth and latency can be
    told apart (two chip counts, or two meshes of one chip count)."""
    scaled = np.stack([comm / max(comm.max(), 1.0), rounds / max(rounds.max(), 1.0)], 1)
    return np.linalg.matrix_rank(scaled, tol=1e-6) == 2


def fit_links(observations: Sequence[Observation], compute: TimeCurve | None, *,
              accelerator_type: str, mode: str) -> LinkFit:
    """Bandwidth and latency of `mode`'s exchanges from the multi-chip measured trials of
    link_rows (dp × cp meshes included: each row's time beyond its per-chip compute is its
    CP and gradient bytes ÷ bandwidth + its dependent rounds × latency), both where the rows'
    (bytes, rounds) span two directions, the bandwidth alone otherwise; else the datasheet
    prior."""
    prior = link_prior(accelerator_type)
    rows = link_rows(observations, mode)
    if compute is None or not rows:
        return LinkFit(bytes_per_s=prior.bytes_per_s, latency_s=prior.latency_s,
                       source=f"datasheet prior: {prior.source}", chips_max=1, trial_ids=())
    left = np.array([o.step_time_s - compute.seconds_at(o.hardware_flops_per_step / o.chips)
                     for o in rows])
    comm = np.array([o.cp_comm_bytes + (o.grad_sync_bytes or 0) for o in rows], float)
    rounds = np.array([dependent_rounds(mode, o.cp_chips, num_layers=o.num_layers,
                                        remat=o.remat, dp=o.dp) for o in rows], float)
    ids, chips_max = tuple(o.trial_id for o in rows), max(o.chips for o in rows)
    meshes = sorted({(o.dp, o.cp_chips) for o in rows})
    what = (f"{len(rows)} measured trials on {len(meshes)} mesh(es) dp×cp "
            + ", ".join(f"{dp}×{cp}" for dp, cp in meshes))
    if _two_directions(comm, rounds):
        (inverse_bw, latency), *_ = np.linalg.lstsq(np.stack([comm, rounds], 1), left,
                                                    rcond=None)
        if inverse_bw > 0 and latency >= 0:
            return LinkFit(bytes_per_s=float(1 / inverse_bw), latency_s=float(latency),
                           source=f"fitted to {what}", chips_max=chips_max, trial_ids=ids)
    # One direction (or a fit that came out unphysical): latency from the prior.
    beyond = left - rounds * prior.latency_s
    if beyond.sum() > 0:
        return LinkFit(bytes_per_s=float(comm.sum() / beyond.sum()), latency_s=prior.latency_s,
                       source=f"bandwidth fitted to {what}, latency from the prior "
                              f"({prior.source})", chips_max=chips_max, trial_ids=ids)
    return LinkFit(bytes_per_s=prior.bytes_per_s, latency_s=prior.latency_s,
                   source=f"datasheet prior ({what} left no time beyond compute): "
                          f"{prior.source}", chips_max=chips_max, trial_ids=ids)


def trial_comm_seconds(o: Observation, links: LinkFit) -> float | None:
    """The exposed communication the link fit gives for a trial's recorded CP and gradient
    bytes and its dependent rounds (None: no bytes recorded)."""
    if o.chips == 1:
        return 0.0
    if o.cp_comm_bytes is None:
        return None
    return links.seconds(o.cp_comm_bytes + (o.grad_sync_bytes or 0),
                         dependent_rounds(o.cp_mode, o.cp_chips, num_layers=o.num_layers,
                                          remat=o.remat, dp=o.dp))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ChipsCurve:
    """Step time at one chip count from one mode's trials on as many chips at other lengths:
    their compute (step time less the link fit's communication of each one's recorded bytes
    and rounds) on a TimeCurve, the target's own communication added back — or, where the
    link model does not describe those trials (links None), their whole steps on the curve."""

    compute: TimeCurve
    links: LinkFit | None
    chips: int

    @property
    def flops_min(self) -> float:
        return self.compute.flops_min

    @property
    def flops_max(self) -> float:
        return self.compute.flops_max

    @property
    def trial_ids(self) -> tuple[int, ...]:
        return tuple(sorted({*self.compute.trial_ids,
                             *(self.links.trial_ids if self.links else ())}))

    def seconds_at(self, flops_per_chip: float, comm_bytes: float | None, rounds: int
                   ) -> float | None:
        """None: the links are apart and the target's bytes are unknown."""
        if self.links is None or self.chips == 1:
            return self.compute.seconds_at(flops_per_chip)
        if comm_bytes is None:
            return None
        return self.compute.seconds_at(flops_per_chip) + self.links.seconds(comm_bytes, rounds)

    @property
    def note(self) -> str:
        what = f"trials on {self.chips} chip{'s' if self.chips > 1 else ''} at other lengths"
        if self.links is None or self.chips == 1:
            whole = " (whole steps: the link fit leaves them too little compute)" if (
                self.chips > 1) else ""
            return f"{what}{whole}, log-log in FLOPs per chip (exponent " \
                   f"{self.compute.exponent:.2f} beyond them)"
        return (f"compute of {what} (less their links), log-log in FLOPs per chip (exponent "
                f"{self.compute.exponent:.2f} beyond them), + links: {self.links.source}")


def chips_curve(observations: Sequence[Observation], links: LinkFit, *, mode: str,
                chips: int) -> ChipsCurve | None:
    """The ChipsCurve of `mode`'s measured trials on `chips` chips (the dp of the observations
    given), None without two lengths. The links are taken apart unless a trial lacks its
    bytes or the link fit leaves one less than half its time for compute (it then does not
    describe these trials: on virtual chips sharing a host, contention that grows with the
    work is in their time and in no link)."""
    rows = [o for o in _timed(observations) if o.chips == chips and o.cp_mode == mode]
    if len({o.hardware_flops_per_step for o in rows}) < 2:
        return None
    comm = {o.trial_id: trial_comm_seconds(o, links) for o in rows}
    if any(c is None or c > o.step_time_s / 2 for o, c in zip(rows, comm.values())):
        return ChipsCurve(compute=time_curve(rows), links=None, chips=chips)
    return ChipsCurve(compute=time_curve(rows, less=lambda o: comm[o.trial_id]), links=links,
                      chips=chips)


def scaled_comm_bytes(observations: Sequence[Observation], *, mode: str, chips: int,
                      local_tokens: int) -> tuple[int, int, tuple[int, ...]] | None:
    """(CP bytes, gradient-sync bytes, trial ids) per chip per step at `chips`, from the
    recorded bytes of this mode nearest in chip count, scaled by how each grows with D:
    p2p one state each way (one at D = 2), all_gather D − 1 pairs, log_scan ⌈log2 D⌉,
    ulysses (D − 1)/D of the local tokens; gradient sync (D − 1)/D. None: no record."""
    if chips == 1:
        return 0, 0, ()
    rows = [o for o in observations if o.mode == mode and o.chips > 1
            and o.cp_comm_bytes is not None and o.grad_sync_bytes is not None]
    if not rows:
        return None
    base = min(rows, key=lambda o: (abs(math.log(o.chips / chips)), -o.trial_id))

    def growth(d: int, tokens: int) -> float:
        return {"p2p": 1 if d == 2 else 2, "all_gather": d - 1,
                "log_scan": math.ceil(math.log2(d)), "ulysses": (d - 1) / d * tokens}[mode]

    cp = base.cp_comm_bytes * growth(chips, local_tokens) / growth(base.chips, base.local_tokens)
    sync = base.grad_sync_bytes * ((chips - 1) / chips) / ((base.chips - 1) / base.chips)
    return round(cp), round(sync), (base.trial_id,)
