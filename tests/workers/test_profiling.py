"""Profiled trials through the real Ray path (`SweepSpec.profile`): the extra step's trace is
stored under the artifact directory and opens with its profiler's own reader; the trial's
metrics are the unprofiled trial's kind (same fields, the measured steps only)."""

from __future__ import annotations

import gzip
import json
import tarfile

import pytest

from workers.driver import run_trials
from workers.grid import expand_trials
from workers.options import DriverOptions
from workers.result import TrialMetrics

from .conftest import MemorySink, assert_no_leaks, tiny_spec

STEPS = 2


def _run(spec, tmp_path, *, unprofiled_repeat: int | None = None):
    trials = expand_trials(spec)
    if unprofiled_repeat is not None:  # the same point, run again without the profile
        trials = [t.model_copy(update={"profile": t.repeat != unprofiled_repeat})
                  for t in trials]
    sink = MemorySink()
    run_trials(trials, sink, name=spec.name,
               options=DriverOptions(artifact_dir=str(tmp_path / "artifacts")))
    return sorted(sink.results, key=lambda r: r.trial.repeat)


def _filled(metrics: TrialMetrics) -> set[str]:
    return {name for name, value in metrics.model_dump().items() if value is not None}


@pytest.mark.timeout(180)
def test_a_profiled_torch_trial_keeps_a_chrome_trace_of_one_extra_step(local_ray, tmp_path):
    spec = tiny_spec(chips=[2], one_chip_baseline=False, steps=STEPS, repeats=2, profile=True)
    profiled, plain = _run(spec, tmp_path, unprofiled_repeat=1)
    assert (profiled.status, plain.status) == ("succeeded", "succeeded"), (profiled.error,
                                                                             plain.error)
    assert plain.profile is None
    # The metrics: the same figures as without a profile, from the measured steps only.
    assert _filled(profiled.metrics) == _filled(plain.metrics)
    assert profiled.metrics.measured_steps == STEPS
    m = profiled.metrics
    assert m.step_time_min_s <= m.step_time_s <= m.step_time_max_s

    profile = profiled.profile
    assert profile.error is None and profile.format == "chrome_trace_json_gz"
    stored = tmp_path / "artifacts" / profile.path
    assert stored.name.endswith(".pt.trace.json.gz") and stored.stat().st_size == profile.bytes
    # The Chrome trace format torch.profiler wrote (what Perfetto reads): the step's ops, the
    # CP mode's exchange among them.
    trace = json.loads(gzip.decompress(stored.read_bytes()))
    names = {e.get("name") for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert {"aten::mm", "_AllGather", "Optimizer.step#AdamW.step"} <= names

    summary = profile.summary
    assert summary["ops"] == "CPU ops" and summary["op_events"] > 0
    tops = summary["top_ops"]
    assert [t["self_s"] for t in tops] == sorted((t["self_s"] for t in tops), reverse=True)
    # Both parts present; their sizes are not compared (a timing margin on shared cores: a
    # collective waits out its peer's compute). The listed ops are a part of each total.
    assert summary["collective_s"] > 0 and summary["compute_s"] > 0
    for part in ("compute", "collective"):
        listed = sum(t["self_s"] for t in tops if t["category"] == part)
        assert listed <= summary[f"{part}_s"] * (1 + 1e-9), part
    assert summary["idle_s"] == pytest.approx(max(0.0, summary["wall_s"] - summary["busy_s"]))
    assert 0 < summary["busy_s"] <= summary["wall_s"]
    assert_no_leaks()


@pytest.mark.slow  # compiling the JAX step: ~25 s on a shared 2-core host
@pytest.mark.timeout(300)
def test_a_profiled_jax_trial_keeps_an_xprof_run_that_xprof_reads(local_ray, tmp_path):
    xprof = pytest.importorskip("xprof.convert.raw_to_tool_data")
    spec = tiny_spec(frameworks=["jax"], chips=[2], one_chip_baseline=False, steps=STEPS,
                     profile=True)
    (result,) = _run(spec, tmp_path)
    assert result.status == "succeeded", result.error
    assert result.metrics.measured_steps == STEPS
    profile = result.profile
    assert profile.error is None and profile.format == "xprof_run_tar_gz"
    stored = tmp_path / "artifacts" / profile.path
    with tarfile.open(stored) as tar:
        tar.extractall(tmp_path / "run", filter="data")
    planes = sorted((tmp_path / "run").glob("plugins/profile/*/*.xplane.pb"))
    assert len(planes) == 1
    # XProf (TensorBoard's profile plugin) reads the XPlane: its trace viewer shows the
    # step's XLA ops, the CP mode's all-gather among them.
    data, content_type = xprof.xspace_to_tool_data([str(planes[0])], "trace_viewer", {})
    assert content_type == "application/json"
    events = json.loads(data)["traceEvents"]
    ops = {e["args"]["hlo_op"] for e in events if "hlo_op" in e.get("args", {})}
    assert any(op.startswith("all_gather") or op.startswith("all-gather") for op in ops), ops
    summary = profile.summary
    assert summary["ops"] == "XLA ops" and summary["collective_s"] > 0
    assert {t["category"] for t in summary["top_ops"]} <= {"compute", "collective"}
    assert_no_leaks()
