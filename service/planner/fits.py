"""Models fitted to trial results: memory per chip, compute rate, and the links.

- Memory: gdn_core's analytic predictor, refined by the residual (observed − predicted) fitted
  affine in the local shard (tokens per chip), pooled over chip counts — the sequence-sharded
  modes are flat in D at a fixed shard, and what does depend on D (sharded weights) the
  predictor already carries.
- Compute: step time of one-chip trials against the FLOPs they ran (TimeCurve: log-log
  between the measured points, an achieved FLOP rate per chip type beyond them). Trials of
  one mode at one chip count make such a curve of their own (compute and links together).
- Communication: what a multi-chip step takes beyond its compute, fitted as bytes ÷ bandwidth
  + dependent rounds × latency over measured trials of every dp × cp mesh (each one's recorded
  CP and gradient bytes and its rounds); where they are too few, the chip type's datasheet
  prior (gdn_core.hardware).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from gdn_core.hardware import link_prior
from service.planner.evidence import Observation


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


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TimeCurve:
    """Step seconds against FLOPs per chip through measured points (the median of repeats):
    interpolated in log-log between them — a CPU's rate changes with the working set, so no
    one line fits —, the nearest end's FLOP rate outside them."""

    flops: tuple[float, ...]
    seconds: tuple[float, ...]
    trial_ids: tuple[int, ...]

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

    def seconds_at(self, flops_per_chip: float) -> float:
        if flops_per_chip <= self.flops[0]:
            return self.seconds[0] * flops_per_chip / self.flops[0]
        if flops_per_chip >= self.flops[-1]:
            return self.seconds[-1] * flops_per_chip / self.flops[-1]
        return float(np.exp(np.interp(np.log(flops_per_chip), np.log(self.flops),
                                      np.log(self.seconds))))


def time_curve(observations: Sequence[Observation]) -> TimeCurve | None:
    """The TimeCurve of measured trials (FLOPs per chip → step time), None without any."""
    timed = [o for o in observations if o.kind == "measure" and o.step_time_s
             and o.hardware_flops_per_step]
    if not timed:
        return None
    by_flops: dict[float, list[Observation]] = {}
    for o in timed:
        by_flops.setdefault(o.hardware_flops_per_step / o.chips, []).append(o)
    points = sorted(by_flops.items())
    return TimeCurve(flops=tuple(f for f, _ in points),
                     seconds=tuple(float(np.median([o.step_time_s for o in os]))
                                   for _, os in points),
                     trial_ids=tuple(o.trial_id for _, os in points for o in os))


def fit_compute(observations: Sequence[Observation]) -> TimeCurve | None:
    """Compute alone: one-chip measured trials (nothing crosses chips)."""
    return time_curve([o for o in observations if o.chips == 1])


def dependent_rounds(mode: str, chips: int, *, num_layers: int, remat: str, dp: int = 1
                     ) -> int:
    """Exchanges of one step that wait on each other (ARCHITECTURE.md's table) on a mesh of
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
