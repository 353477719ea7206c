"""Folding every process's CPTrainReport into TrialMetrics (hand-computed expectations)."""

from __future__ import annotations

import math

import pytest

from gdn_core import flops
from gdn_core.hardware import PeakMeasurement
from gdn_core.presets import get_preset
from gdn_core.train_config import CPTrainReport
from workers import metrics
from workers.spec import expand_trials

from .conftest import tiny_spec


def _report(step_times, peak, source, comm, losses=(5.0, 4.0, 3.0), err=None):
    return CPTrainReport(losses=list(losses), step_times_s=list(step_times),
                         peak_memory_bytes=peak, memory_source=source, mode="p2p", chips=2,
                         cp_comm_bytes_per_step=comm, grad_sync_bytes_per_step=5,
                         max_rel_err=err)


@pytest.mark.timeout(30)
def test_two_ranks_fold_as_architecture_says():
    (trial,) = expand_trials(tiny_spec(modes=["p2p"], chips=[2], seq_lens=[64], steps=2,
                                       warmup_steps=1))
    reports = [_report([0.1, 0.3], 100, "rss-a", 10, err=1e-6),
               _report([0.2, 0.1], 200, "rss-b", 12, err=3e-6)]
    peak = metrics.ChipPeak(1e9, "test")
    m = metrics.trial_metrics(trial, reports, peak=peak)
    assert m.step_time_s == pytest.approx(0.25)  # median(max(.1,.2), max(.3,.1))
    assert (m.peak_memory_bytes_per_chip, m.memory_source) == (200, "rss-b")
    assert m.comm_bytes_per_step_per_chip == 17
    assert (m.loss_first, m.loss_last) == (4.0, 3.0)  # measured steps only
    assert m.max_rel_err == 3e-6
    model_cfg = get_preset("tiny", num_layers=1)
    expected = flops.model_flops_per_step(model_cfg, batch=1, seq_len=64).total
    assert m.model_flops_per_step == expected
    assert m.mfu == pytest.approx(expected / (0.25 * 2 * 1e9))
    assert math.isclose(m.tokens_per_s_per_chip * m.step_time_s * 2, 64)
    assert m.hfu >= m.mfu and m.peak_flops_source == "test"


@pytest.mark.timeout(30)
def test_cpu_chip_peak_is_a_share_of_the_host():
    host = PeakMeasurement(flops_per_s=8e10, source="cpu_gemm_calibration:fp32")
    peaks = metrics.host_chip_peaks(["a", "a", "b"], {"a": host, "b": host}, {"a": 8, "b": 4})
    assert [p.flops_per_s for p in peaks] == [1e10, 1e10, 2e10]
    assert metrics.trial_peak(peaks).flops_per_s == pytest.approx(4e10 / 3)
    assert metrics.datasheet_peak("H100").flops_per_s == 989e12
