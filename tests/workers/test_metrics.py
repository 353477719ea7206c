"""Folding every process's CPTrainReport into TrialMetrics (hand-computed expectations), and the
MFU denominator: datasheet peaks by dtype, CPU chips' shares of their processes' GEMM rates."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from gdn_core.calibration import PeakMeasurement
from gdn_core.flops.executed import hardware_flops_per_step
from gdn_core.flops.model import model_flops_per_step
from gdn_core.memory.step import predict_step_memory
from gdn_core.packing import document_boundaries
from gdn_core.presets import get_preset
from gdn_core.train_config import CPTrainReport
from workers import metrics
from workers.grid import expand_trials

from .conftest import tiny_spec


def _report(step_times, peak, source, comm, losses=(5.0, 4.0, 3.0), err=None):
    return CPTrainReport(losses=list(losses), step_times_s=list(step_times),
                         peak_memory_bytes=peak, memory_source=source, mode="p2p", chips=2,
                         cp_comm_bytes_per_step=comm, grad_sync_bytes_per_step=5,
                         max_rel_err=err)


def _two_chip_trial():
    return next(t for t in expand_trials(tiny_spec(modes=["p2p"], chips=[2], seq_lens=[64],
                                                   steps=2, warmup_steps=1)) if t.chips == 2)


@pytest.mark.timeout(30)
def test_two_ranks_fold_as_architecture_says():
    trial = _two_chip_trial()
    reports = [_report([0.1, 0.3], 100, "rss-a", 10, err=1e-6),
               _report([0.2, 0.1], 200, "rss-b", 12, err=3e-6)]
    peak = metrics.ChipPeak(1e12, "test", "float32")
    m = metrics.trial_metrics(trial, reports, peak=peak, device_name="Some CPU")
    assert m.step_time_s == pytest.approx(0.25)  # median(max(.1,.2), max(.3,.1))
    assert (m.measured_steps, m.step_time_min_s, m.step_time_max_s) == (2, 0.2, 0.3)
    assert m.compile_time_s == 0.0  # CPTrainReport's default: nothing compiled (torch)
    assert (m.peak_memory_bytes_per_chip, m.memory_source) == (200, "rss-b")
    assert m.comm_bytes_per_step_per_chip == 17
    assert (m.loss_first, m.loss_last) == (4.0, 3.0)  # measured steps only
    assert m.max_rel_err == 3e-6
    model_cfg = get_preset("tiny", num_layers=1)
    expected = model_flops_per_step(model_cfg, batch=1, seq_len=64).total
    assert m.model_flops_per_step == expected
    assert m.mfu == pytest.approx(expected / (0.25 * 2 * 1e12))
    assert math.isclose(m.tokens_per_s_per_chip * m.step_time_s * 2, 64)
    assert m.hfu >= m.mfu and m.peak_flops_source == "test"
    assert (m.peak_flops_dtype, m.device_name) == ("float32", "Some CPU")


@pytest.mark.timeout(30)
def test_memory_figures_keep_measured_estimated_and_predicted_apart():
    trial = _two_chip_trial()
    reports = [dataclasses.replace(_report([0.1, 0.1], 300, "process_rss_peak/2_chips", 1),
                                   estimated_memory_bytes=40,
                                   estimated_memory_source="xla_memory_analysis",
                                   verified_seq_len=32),
               dataclasses.replace(_report([0.1, 0.1], 100, "process_rss_peak/2_chips", 1),
                                   estimated_memory_bytes=50,
                                   estimated_memory_source="xla_memory_analysis",
                                   verified_seq_len=32)]
    m = metrics.trial_metrics(trial, reports, peak=None)
    assert (m.peak_memory_bytes_per_chip, m.memory_source) == (300, "process_rss_peak/2_chips")
    assert (m.estimated_memory_bytes_per_chip, m.estimated_memory_source) == (
        50, "xla_memory_analysis")
    assert m.predicted_memory_bytes_per_chip == predict_step_memory(
        trial.to_model_config(), trial.to_train_config(), mode=trial.mode, chips=2,
        framework=trial.framework).total
    assert m.verified_seq_len == 32
    # torch-like reports: no estimate; nothing measured stays None, never an estimate.
    bare = [_report([0.1, 0.1], None, "unknown", 1), _report([0.1, 0.1], None, "unknown", 1)]
    m = metrics.trial_metrics(trial, bare, peak=None)
    assert m.peak_memory_bytes_per_chip is None and m.memory_source is None
    assert m.estimated_memory_bytes_per_chip is None and m.estimated_memory_source is None
    assert m.predicted_memory_bytes_per_chip > 0 and m.verified_seq_len is None


@pytest.mark.timeout(30)
def test_hfu_counts_the_trials_framework():
    trial = _two_chip_trial()
    reports = [_report([0.1, 0.1], 1, "x", 1), _report([0.1, 0.1], 1, "x", 1)]
    for framework in ("jax", "torch"):
        cast = trial.model_copy(update={"framework": framework})
        expected = hardware_flops_per_step(
            cast.to_model_config(), mode=cast.mode, chips=2, batch=1, seq_len=64,
            framework=framework, remat=cast.remat).total
        assert metrics.trial_metrics(cast, reports, peak=None).hardware_flops_per_step == \
            expected


@pytest.mark.timeout(30)
def test_reference_and_fused_trials_share_model_flops_not_hardware_flops(monkeypatch):
    # The same point under kernels=reference and kernels=fused (torch): MFU's numerator is
    # the model's cost, the same for both; HFU's counts what each kernel ran. The trial's
    # cp_settings carries `kernels` (gdn_core.cp_modes.CPSettings).
    trial = _two_chip_trial().model_copy(update={"framework": "torch"})
    reports = [_report([0.1, 0.1], 1, "x", 1), _report([0.1, 0.1], 1, "x", 1)]
    peak = metrics.ChipPeak(1e12, "test", "float32")
    reference = metrics.trial_metrics(trial, reports, peak=peak)
    settings = type(trial).cp_settings
    monkeypatch.setattr(type(trial), "cp_settings",
                        lambda self: dataclasses.replace(settings(self), kernels="fused"))
    fused = metrics.trial_metrics(trial, reports, peak=peak)
    assert fused.model_flops_per_step == reference.model_flops_per_step
    assert fused.mfu == reference.mfu
    assert fused.hardware_flops_per_step != reference.hardware_flops_per_step
    assert fused.hardware_flops_per_step == hardware_flops_per_step(
        trial.to_model_config(), mode="p2p", chips=2, batch=1, seq_len=64, framework="torch",
        remat=trial.remat, kernels="fused").total
    # MFU ≤ 1 is still enforced for a fused trial
    too_low = metrics.ChipPeak(fused.model_flops_per_step / (0.1 * 2) / 1.5, "x", "float32")
    with pytest.raises(metrics.UtilisationAboveOneError, match=r"^mfu=1.500 > 1"):
        metrics.trial_metrics(trial, reports, peak=too_low)


@dataclasses.dataclass
class _TimedReport:
    """A report as part B's CPTrainReport carries it, with a compile time."""

    report: CPTrainReport
    compile_time_s: float

    def __getattr__(self, name):
        return getattr(self.report, name)


@pytest.mark.timeout(30)
def test_compile_time_is_the_slowest_process():
    trial = _two_chip_trial()
    reports = [_TimedReport(_report([0.1, 0.3], 1, "x", 1), 2.0),
               _TimedReport(_report([0.2, 0.1], 1, "x", 1), 5.0)]
    m = metrics.trial_metrics(trial, reports, peak=None)
    assert m.compile_time_s == 5.0 and m.mfu is None and m.peak_flops_dtype is None


@pytest.mark.timeout(30)
def test_mfu_above_one_fails_naming_figure_peak_and_source():
    trial = _two_chip_trial()
    reports = [_report([0.1, 0.1], 1, "x", 1), _report([0.1, 0.1], 1, "x", 1)]
    model_flops = metrics.trial_metrics(trial, reports, peak=None).model_flops_per_step
    too_low = metrics.ChipPeak(model_flops / (0.1 * 2) / 1.5, "cpu_gemm_calibration:test",
                               "bfloat16")  # MFU 1.5
    with pytest.raises(metrics.UtilisationAboveOneError) as err:
        metrics.trial_metrics(trial, reports, peak=too_low)
    message = str(err.value)
    assert message.startswith("mfu=1.500 > 1 is impossible")
    assert f"{too_low.flops_per_s:.4g} FLOP/s" in message
    assert "bfloat16, cpu_gemm_calibration:test" in message
    # HFU counts more FLOPs than MFU: a peak between them fails on hfu.
    m = metrics.trial_metrics(trial, reports, peak=metrics.ChipPeak(1e15, "x", "bfloat16"))
    between = metrics.ChipPeak(model_flops / (0.1 * 2) * (1 + m.hfu / m.mfu) / 2, "x",
                               "bfloat16")
    with pytest.raises(metrics.UtilisationAboveOneError, match=r"^hfu="):
        metrics.trial_metrics(trial, reports, peak=between)


def test_datasheet_peak_follows_the_dtype():
    bf16, fp32 = metrics.datasheet_peak("H100", "bfloat16"), metrics.datasheet_peak("h100",
                                                                                   "float32")
    assert (bf16.flops_per_s, bf16.dtype, bf16.source) == (989e12, "bfloat16",
                                                            "datasheet_bf16_dense:h100-sxm")
    assert (fp32.flops_per_s, fp32.dtype, fp32.source) == (67e12, "float32",
                                                            "datasheet_fp32_no_tf32:h100-sxm")
    assert metrics.datasheet_peak("h100-pcie", "bfloat16").flops_per_s == 756e12
    tpu = metrics.datasheet_peak("v5p", "float32")
    assert (tpu.flops_per_s, tpu.dtype) == (459e12, "bfloat16") and "float32 run" in tpu.source
    assert metrics.datasheet_peak("v5p", "bfloat16").flops_per_s == 459e12


@pytest.mark.timeout(30)
def test_tpu_float32_trial_records_the_bf16_peak_it_was_divided_by():
    trial = _two_chip_trial()
    reports = [_report([0.1, 0.1], 1, "x", 1), _report([0.1, 0.1], 1, "x", 1)]
    m = metrics.trial_metrics(trial, reports, peak=metrics.datasheet_peak("v5p", "float32"))
    assert m.peak_flops_per_chip == 459e12 and m.peak_flops_dtype == "bfloat16"
    assert 0 < m.mfu < 1 and "float32 run" in m.peak_flops_source


def test_cpu_chip_peak_is_its_process_rate_over_its_chips():
    torch_rank = PeakMeasurement(8e10, "cpu_gemm_calibration:torch:fp32:1024^3:threads=1:"
                                       "cores=0-0(1 per chip)")
    jax_host = PeakMeasurement(6e10, "cpu_gemm_calibration:jax:fp32:1024^3:cores=0-1(1 per "
                                     "chip)")
    peaks = metrics.cpu_chip_peaks([torch_rank, jax_host], [1, 2], "float32")
    assert [p.flops_per_s for p in peaks] == [8e10, 3e10, 3e10]
    trial = metrics.trial_peak(peaks)
    assert trial.flops_per_s == pytest.approx(14e10 / 3) and trial.dtype == "float32"
    assert trial.source == ";".join(sorted({torch_rank.source, jax_host.source}))
    with pytest.raises(ValueError, match="different dtypes"):
        metrics.trial_peak([metrics.ChipPeak(1.0, "a", "float32"),
                            metrics.ChipPeak(1.0, "a", "bfloat16")])


@pytest.mark.timeout(30)
def test_a_dp_mesh_counts_every_replicas_tokens_and_flops_over_all_its_chips():
    """dp 2 × cp 2: the step trains 2 replicas × batch_size sequences on 4 chips, so tokens/s/
    chip, model and hardware FLOPs cover the global batch, and the prediction is the mesh's."""
    trial = next(t for t in expand_trials(tiny_spec(modes=["p2p"], chips=[4], dp=[2],
                                                    seq_lens=[64], steps=2, warmup_steps=1)))
    assert (trial.chips, trial.dp, trial.global_batch_size) == (4, 2, 2)
    reports = [dataclasses.replace(_report([0.5, 0.5], 100, "rss", 10), chips=4, dp=2)
               for _ in range(4)]
    m = metrics.trial_metrics(trial, reports, peak=metrics.ChipPeak(1e12, "test", "float32"))
    model_cfg = get_preset("tiny", num_layers=1)
    assert m.tokens_per_s_per_chip == pytest.approx(2 * 64 / 0.5 / 4)
    assert m.model_flops_per_step == model_flops_per_step(model_cfg, batch=2, seq_len=64).total
    assert m.hardware_flops_per_step == hardware_flops_per_step(
        model_cfg, mode="p2p", chips=2, batch=2, seq_len=64, framework=trial.framework).total
    assert m.mfu == pytest.approx(m.model_flops_per_step / (0.5 * 4 * 1e12))
    assert m.predicted_memory_bytes_per_chip == predict_step_memory(
        model_cfg, trial.to_train_config(), mode="p2p", chips=2, dp=2,
        framework=trial.framework).total


@pytest.mark.timeout(30)
def test_a_packed_trials_model_flops_count_attention_per_document():
    """documents=uniform:…: the model FLOPs are the single-document trial's less exactly the
    attention pairs between its documents (the boundaries its step draws from its seed), so
    its MFU at the same step time is lower, and at most 1; HFU never falls below MFU."""
    spec = tiny_spec(modes=["p2p"], chips=[2], seq_lens=[64], layers=["hybrid"],
                     model={"preset": "tiny", "num_layers": 2},
                     documents=["single", "uniform:8-24"])
    single, packed = [t for t in expand_trials(spec) if t.chips == 2]
    assert (single.documents, packed.documents) == ("single", "uniform:8-24")
    cu = metrics.trial_documents(packed)
    assert cu.tolist() == document_boundaries("uniform:8-24", seq_len=64, seed=0).tolist()
    assert metrics.trial_documents(single) is None
    reports = [dataclasses.replace(_report([0.5, 0.5], 100, "rss", 10), attn_cp="all_gather_kv")
               for _ in range(2)]
    peak = metrics.ChipPeak(1e9, "test", "float32")
    m_single = metrics.trial_metrics(single, reports, peak=peak)
    m_packed = metrics.trial_metrics(packed, reports, peak=peak)
    lengths = np.diff(cu)
    skipped_pairs = 64 * 65 // 2 - int(sum(d * (d + 1) // 2 for d in lengths))
    attention = get_preset("tiny").attention
    qk_and_av, attention_layers, forward_and_backward = 2, 1, 3
    difference = (forward_and_backward * attention_layers * qk_and_av * 2 * attention.num_heads
                  * attention.head_dim * skipped_pairs)
    assert m_single.model_flops_per_step - m_packed.model_flops_per_step == difference > 0
    assert m_packed.mfu < m_single.mfu <= 1
    assert m_packed.hfu >= m_packed.mfu


def test_ratios_to_the_one_chip_baseline_are_derived_beside_the_metrics():
    """workers.result derives both (TrialPublic reads them there): 4 chips at 150 tokens/s
    each against one chip at 200 tokens/s is 75% scaling and a 3× speed-up."""
    from workers.result import scaling_efficiency, speedup_vs_one_chip

    assert scaling_efficiency(150.0, 200.0) == 0.75
    assert speedup_vs_one_chip(150.0, 4, 200.0) == 3.0
    assert speedup_vs_one_chip(200.0, 1, 200.0) == scaling_efficiency(200.0, 200.0) == 1.0
