"""Level shifts in one series of runs, with ruptures' PELT, judged against the series' own
noise.

Why ruptures and not asv's step detection: ruptures is a maintained library with a public API
(`Pelt(model="l2").fit(x).predict(pen=…)`, exact optimal segmentation under a penalty), numpy
only; asv's step detection lives inside asv (`asv.step_detect`, an internal module of a
benchmark runner, not an API it promises to keep).

The series is taken in log space, so a slowdown is a shift of its level whatever the unit, and
lognormal run-to-run jitter is plain Gaussian noise. Its noise, σ, is the larger of
- the run-to-run spread: the RMS of consecutive differences / √2, the largest tenth of them
  (at least one) left out so that the shifts themselves do not count as noise, and scaled
  back up by what that trimming takes off a normal sample's RMS (the median
  absolute deviation, the textbook robust choice, reads σ at a third of its value on ten runs
  about one time in five, and then noise passes for shifts);
- the repeats' spread: half the median of each run's log range (the repeats of a point in the
  sweep, and a step time's fastest to slowest measured step), a range of a few draws being
  about 2σ;
- NOISE_FLOOR (bit-identical runs, e.g. a memory figure, would otherwise have σ = 0).
PELT's penalty per shift is PENALTY_FACTOR · σ² · ln n (BIC's is 2). Noise guard: a shift no
larger than the series' run-to-run spread (SPREAD_SIGMAS · σ), or whose levels differ by fewer
than MIN_Z standard errors, is no shift (one outlier beside a level of two runs cannot make
one: `_margins`); the weakest such is dropped and the
levels recomputed until every shift left passes. On lognormal noise (10–30 runs, σ 3–5%) this
reports a shift on about 1 series in 1,000 without one, and finds a shift of 8σ (a 27% slowdown
at σ 3%) at its run in 99 of 100, of 6.5σ in 95 (tests/service/test_regression_detect.py
holds looser bounds).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence

import numpy as np
import ruptures

MIN_RUNS_PER_LEVEL = 2
"""Runs a level needs before and after a shift: one odd run is an outlier, not a shift."""
PENALTY_FACTOR = 3.0
"""PELT's penalty per shift, in units of σ² · ln n (BIC's 2, a little stricter)."""
SPREAD_SIGMAS = 3.0
"""The run-to-run spread a shift must exceed, in σ (the band that holds 99.7% of runs)."""
MIN_Z = 6.0
"""Standard errors by which two levels must differ (a maximum over every place a shift could
be is larger than one test's z: this is Bonferroni-strict for hundreds of runs)."""
NOISE_FLOOR = 0.002
"""Smallest σ of a log series (0.2%)."""


@dataclasses.dataclass(frozen=True)
class Shift:
    """One level shift of a series."""

    index: int
    """Position of the first run at the new level."""
    before: float
    """Median of the level before it (the metric's unit)."""
    after: float
    """Median of the level from `index` on, to the next shift."""
    spread: float
    """The run-to-run spread it was judged against, relative (0.05: 5%)."""

    @property
    def relative(self) -> float:
        """after / before − 1."""
        return self.after / self.before - 1.0

    @property
    def log_size(self) -> float:
        """|ln(after / before)|: the size, up or down alike."""
        return abs(math.log(self.after / self.before))


def noise_sigma(log_values: np.ndarray, log_ranges: Sequence[float] = ()) -> float:
    """σ of a log series: the larger of its run-to-run and its repeats' spread (module
    docstring); NOISE_FLOOR at least."""
    sigma = NOISE_FLOOR
    if len(log_values) >= 3:
        diffs = np.sort(np.abs(np.diff(log_values)))
        dropped = max(1, len(diffs) // 10)
        kept = diffs[:len(diffs) - dropped]
        rms = math.sqrt(float(np.mean(kept ** 2)) / 2.0)
        sigma = max(sigma, rms / _trimmed_rms_ratio(dropped / len(diffs)))
    ranges = [r for r in log_ranges if r is not None and math.isfinite(r)]
    if ranges:
        sigma = max(sigma, float(np.median(ranges)) / 2.0)
    return sigma


def _trimmed_rms_ratio(fraction: float) -> float:
    """RMS of a normal sample without its largest `fraction` (in absolute value), over its
    whole RMS: what the trimmed estimate is divided by to be unbiased."""
    cut = statistics.NormalDist().inv_cdf(1 - fraction / 2)
    return math.sqrt(1 - 2 * cut * statistics.NormalDist().pdf(cut) / (1 - fraction))


def detect_shifts(values: Sequence[float], *, lows: Sequence[float | None] | None = None,
                  highs: Sequence[float | None] | None = None) -> list[Shift]:
    """The level shifts of `values` (positive, one per run, in run order), oldest first.
    `lows`/`highs`: each run's smallest and largest observation (its repeats' spread), or
    None where unknown."""
    x = np.log(np.asarray(values, dtype=float))
    n = len(x)
    if n < 2 * MIN_RUNS_PER_LEVEL:
        return []
    ranges = []
    for lo, hi in zip(lows or (), highs or (), strict=False):
        if lo is not None and hi is not None and lo > 0 and hi >= lo:
            ranges.append(math.log(hi / lo))
    sigma = noise_sigma(x, ranges)
    algo = ruptures.Pelt(model="l2", min_size=MIN_RUNS_PER_LEVEL, jump=1).fit(x.reshape(-1, 1))
    ends = algo.predict(pen=PENALTY_FACTOR * sigma ** 2 * math.log(n))
    cuts = [c for c in ends if c < n]  # ruptures lists each segment's end, the last being n
    while cuts:
        margins = _margins(x, cuts, sigma)
        weakest = min(range(len(cuts)), key=lambda i: margins[i])
        if margins[weakest] > 0:
            break
        del cuts[weakest]
    spread = math.exp(SPREAD_SIGMAS * sigma) - 1.0
    bounds = [0, *cuts, n]
    levels = [float(np.exp(np.median(x[a:b]))) for a, b in zip(bounds, bounds[1:])]
    return [Shift(index=c, before=levels[i], after=levels[i + 1], spread=spread)
            for i, c in enumerate(cuts)]


def _margins(x: np.ndarray, cuts: list[int], sigma: float) -> list[float]:
    """How far each cut passes the noise guard (> 0: it does), in σ: the smaller of its size
    less the spread, and its z less MIN_Z. The size is taken between the levels' inner
    middles (of an even count, the middle value nearer the other level), so one outlier next
    to a cut cannot pull a short level across it: both runs of a two-run level must have
    moved."""
    bounds = [0, *cuts, len(x)]
    segments = [np.sort(x[a:b]) for a, b in zip(bounds, bounds[1:])]
    margins = []
    for i in range(len(cuts)):
        before, after = segments[i], segments[i + 1]
        up = np.median(after) > np.median(before)
        inner_before = before[len(before) // 2] if up else before[(len(before) - 1) // 2]
        inner_after = after[(len(after) - 1) // 2] if up else after[len(after) // 2]
        size = max(0.0, (inner_after - inner_before) * (1 if up else -1)) / sigma
        z = size / math.sqrt(1 / len(before) + 1 / len(after))
        margins.append(min(size - SPREAD_SIGMAS, z - MIN_Z))
    return margins
