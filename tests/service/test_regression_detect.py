"""Level-shift detection on series with realistic noise (lognormal jitter around a level):
a slowdown from run k on is found at run k with its size; a series without one has none over
many seeds; a shift inside the series' own spread is no shift; the repeats' spread counts."""

from __future__ import annotations

import numpy as np
import pytest

from service.regressions.detect import detect_shifts

from .regression_nights import nightly_levels


@pytest.mark.parametrize("runs,k,factor,sigma", [(10, 5, 1.3, 0.03), (12, 7, 1.2, 0.02),
                                                (20, 12, 0.7, 0.04), (40, 30, 1.25, 0.03)],
                         ids=lambda v: str(v))
def test_a_slowdown_is_found_at_its_run_with_its_size(runs, k, factor, sigma):
    hits = 0
    for seed in range(40):
        levels = nightly_levels(seed, runs, sigma=sigma, slowdown_from=k, factor=factor)
        shifts = detect_shifts(levels)
        if [s.index for s in shifts] == [k]:
            hits += 1
            # the median levels: within 2σ of the truth each, so the ratio within ~3σ
            assert shifts[0].relative == pytest.approx(factor - 1, abs=3.5 * sigma * factor)
            assert shifts[0].before == pytest.approx(0.05, rel=2.5 * sigma)
    assert hits >= 38, f"found at run {k} in {hits} of 40 series"


@pytest.mark.parametrize("runs,sigma", [(10, 0.03), (15, 0.05), (30, 0.02), (60, 0.04)])
def test_no_shift_on_an_unchanged_series(runs, sigma):
    flagged = [seed for seed in range(100)
               if detect_shifts(nightly_levels(seed, runs, sigma=sigma))]
    assert len(flagged) <= 1, f"shifts reported on unchanged series (seeds {flagged})"


def test_a_shift_within_the_run_to_run_spread_is_no_regression():
    """2σ (6% at σ 3%) over 30 runs: a real change, but inside the series' own noise band."""
    reported = sum(bool(detect_shifts(nightly_levels(seed, 30, sigma=0.03, slowdown_from=15,
                                                     factor=1.06))) for seed in range(50))
    assert reported <= 2
    # the same data without noise is a clean shift, found: it is the noise that guards
    clean = nightly_levels(0, 30, sigma=0.0, slowdown_from=15, factor=1.06)
    assert [s.index for s in detect_shifts(clean)] == [15]


def test_the_repeats_spread_widens_the_guard():
    """Each run's repeats spreading ±15% mean a 12% move of medians is noise, although the
    medians alone jitter far less."""
    levels = nightly_levels(3, 14, sigma=0.005, slowdown_from=7, factor=1.12)
    assert [s.index for s in detect_shifts(levels)] == [7]
    lows, highs = [v * 0.85 for v in levels], [v * 1.15 for v in levels]
    assert detect_shifts(levels, lows=lows, highs=highs) == []


def test_a_slowdown_and_its_fix_are_two_shifts():
    levels = np.array(nightly_levels(5, 24, sigma=0.02))
    levels[8:16] *= 1.4
    shifts = detect_shifts(list(levels))
    assert [s.index for s in shifts] == [8, 16]
    assert shifts[0].relative > 0.3 and shifts[1].relative < -0.2
    assert detect_shifts([0.05, 0.06, 0.07]) == []  # too short for a level on each side


def test_one_outlier_at_the_end_is_no_shift_until_a_second_run_confirms_it():
    """The latest run far off is an outlier (PELT's two-run last level would be pulled across
    by it); with the next run there as well, it is a shift at the first of them."""
    levels = nightly_levels(7, 10, sigma=0.03)
    assert detect_shifts(levels + [levels[-1] * 50]) == []
    (shift,) = detect_shifts(levels + [levels[-1] * 50, levels[-1] * 52])
    assert shift.index == 10 and shift.relative > 40
