"""The sweep driver on a local Ray: real trials, resume, cancel, skipped points, the CLI."""

from __future__ import annotations

import json
import threading

import pytest

from gdn_core.cp_modes import CP_MODES
from workers.driver import run_sweep, run_trials
from workers.events import SweepFinished, TrialFinished, TrialStarted
from workers.result_sink import JsonLinesSink
from workers.grid import expand_trials

from .conftest import MemorySink, assert_consistent_metrics, assert_no_leaks, tiny_spec

ALL_MODES = list(CP_MODES)
DEFAULT_SETTINGS = "/dtype=float32/param_sharding=replicated/remat=none"


def key(point: str) -> str:
    """A trial key from its framework/mode/chips/seq_len, at the default step settings."""
    return point + DEFAULT_SETTINGS


def _same_losses(results):
    """CP is exact: every mode and chip count starts from the same weights and data."""
    firsts = [r.metrics.loss_first for r in results]
    assert max(firsts) - min(firsts) <= 1e-4 * abs(firsts[0]), firsts


@pytest.mark.timeout(60)
def test_the_driver_runs_the_trials_it_is_given_and_expands_no_grid(monkeypatch):
    """The trials come from where the sweep was expanded once (the service: its rows); here
    the one given is marked skipped, which no expansion of the spec says, so it needs no Ray."""
    import workers.driver

    (trial,) = expand_trials(tiny_spec())
    given = trial.model_copy(update={"skip_reason": "skipped where it was stored"})
    monkeypatch.setattr(workers.driver, "expand_trials", None)  # any call would fail
    events = []
    (result,) = run_trials([given], MemorySink(), name="given", on_event=events.append)
    assert (result.trial, result.status, result.error) == (
        given, "skipped", "skipped where it was stored")
    assert events[-1] == SweepFinished("given", {"skipped": 1}, 0)


@pytest.mark.timeout(240)
# 4 chips is the slow tier's (4 rank processes a trial on 2 cores); by default 1 and 2 chips.
@pytest.mark.parametrize("chips", [[1, 2], pytest.param([1, 2, 4], marks=pytest.mark.slow)],
                         ids=lambda chips: "chips=" + ",".join(map(str, chips)))
def test_torch_every_mode(local_ray, chips):
    events, sink = [], MemorySink()
    results = run_sweep(tiny_spec(modes=ALL_MODES, chips=chips, verify=True), sink,
                        on_event=events.append)
    by_key = sink.by_key()
    trials = 1 + len(ALL_MODES) * (len(chips) - 1)  # one baseline, not one per mode
    assert len(results) == len(by_key) == trials
    if 4 in chips:  # Ulysses over 4 chips with 2 key heads: each key head goes to the 2 chips
        # whose value heads use it.
        assert by_key[key("torch/ulysses/chips=4/seq_len=64")].status == "succeeded"
    (baseline,) = [r for r in results if r.trial.chips == 1]
    assert baseline.trial.key == key("torch/none/chips=1/seq_len=64")
    # mode none runs the plain one-chip step: nothing crosses chips
    assert baseline.metrics.cp_comm_bytes_per_step_per_chip == 0
    assert baseline.metrics.grad_sync_bytes_per_step_per_chip == 0
    ran = [r for r in results if r.status != "skipped"]
    for result in ran:
        assert_consistent_metrics(result)
        # Measured (the rank's RSS mark; torch has no compile-time estimate), and predicted.
        assert result.metrics.memory_source == "process_rss_peak"
        assert result.metrics.estimated_memory_bytes_per_chip is None
        if result is not baseline:
            assert result.trial.baseline_key == baseline.trial.key
            assert result.metrics.verified_seq_len == result.trial.seq_len  # all of it fits
            assert result.metrics.max_rel_err < 1e-3  # CP against one chip on the same data
    _same_losses(ran)
    started = [e for e in events if isinstance(e, TrialStarted)]
    # One cold start per shape (chip count); every other trial reuses the warm workers.
    assert len(started) == trials
    assert sum(e.reused_workers for e in started) == trials - len(chips)
    assert all(len(e.workers) == e.trial.chips for e in started)
    assert isinstance(events[-1], SweepFinished) and events[-1].counts == {"succeeded": trials}
    assert_no_leaks()


@pytest.mark.slow  # 4 JAX compiles at D = 4; JAX trials through Ray run by default in
# test_plan_trials.py and test_cpu_partition.py
@pytest.mark.timeout(300)
def test_jax_every_mode_on_4_chips(local_ray):
    events, sink = [], MemorySink()
    results = run_sweep(tiny_spec(frameworks=["jax"], modes=ALL_MODES, chips=[4]), sink,
                        on_event=events.append)
    assert [r.status for r in results] == ["succeeded"] * 4  # ulysses too (Hk=2 < 4 chips)
    ran = results
    for result in ran:
        assert_consistent_metrics(result)
        # One process, 4 chips: its RSS mark shared out and labelled so; XLA's estimate apart.
        assert result.metrics.memory_source == "process_rss_peak/4_chips"
        assert result.metrics.estimated_memory_source == "xla_memory_analysis"
        assert result.metrics.estimated_memory_bytes_per_chip > 0
        assert result.metrics.compile_time_s > 0
    _same_losses(ran)
    started = [e for e in events if isinstance(e, TrialStarted)]
    # One process drives the host's 4 virtual chips.
    assert all(len(e.workers) == 1 and e.workers[0].bundles == (0, 1, 2, 3) for e in started)
    assert_no_leaks()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("framework", ["torch", pytest.param("jax", marks=pytest.mark.slow)])
def test_step_settings_reach_the_step(local_ray, framework):
    # fsdp + remat full through Ray: exact against one chip, and the weight traffic of fsdp
    # (gathers as well as the gradient reduce-scatter) is more than replicated's all-reduce.
    # Two layers: with one, XLA drops the one-trip layer loop and reuses the forward's
    # gathered weights in backward, so fsdp then moves exactly what replicated does.
    sink = MemorySink()
    spec = tiny_spec(frameworks=[framework], modes=["p2p"], chips=[2], seq_lens=[128],
                     model={"preset": "tiny", "num_layers": 2},
                     param_shardings=["replicated", "fsdp"], remats=["none", "full"],
                     verify=True)
    results = {(r.trial.param_sharding, r.trial.remat): r for r in run_sweep(spec, sink)}
    assert len(results) == 4
    for result in results.values():
        assert_consistent_metrics(result)
        assert result.metrics.max_rel_err < 1e-3
    _same_losses(list(results.values()))
    sync = {point: r.metrics.grad_sync_bytes_per_step_per_chip for point, r in results.items()}
    assert sync[("fsdp", "none")] > sync[("replicated", "none")]
    # Recomputation is counted in the hardware FLOPs, never in the model FLOPs.
    full, none = results[("replicated", "full")].metrics, results[("replicated", "none")].metrics
    assert full.model_flops_per_step == none.model_flops_per_step
    assert full.hardware_flops_per_step > none.hardware_flops_per_step
    assert_no_leaks()


@pytest.mark.slow  # jax: 3 compiles, ~45 s here; torch's baseline by default:
# test_torch_every_mode
@pytest.mark.timeout(300)
@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_one_chip_runs_once_as_the_baseline_every_mode_refers_to(local_ray, framework):
    spec = tiny_spec(frameworks=[framework], modes=["all_gather", "p2p"], chips=[1, 2])
    results = run_sweep(spec, MemorySink())
    assert len(results) == 3  # one baseline, not one per mode
    (baseline,) = [r for r in results if r.trial.chips == 1]
    assert baseline.trial.key == key(f"{framework}/none/chips=1/seq_len=64")
    assert_consistent_metrics(baseline)
    # mode none runs the plain one-chip step: nothing crosses chips
    assert baseline.metrics.cp_comm_bytes_per_step_per_chip == 0
    assert baseline.metrics.grad_sync_bytes_per_step_per_chip == 0
    modes = {r.trial.mode: r for r in results if r.trial.chips == 2}
    assert set(modes) == {"all_gather", "p2p"}
    for result in modes.values():
        assert_consistent_metrics(result)
        assert result.trial.baseline_key == baseline.trial.key
    _same_losses(results)
    assert all([a.status for a in r.attempt_history] == ["succeeded"] for r in results)
    assert_no_leaks()


@pytest.mark.slow  # 3 Ray trials; resume by default: test_resume_runs_only_missing_trials, repeat keys: test_grid
@pytest.mark.timeout(240)
def test_repeats_run_as_separate_trials_and_resume(local_ray, tmp_path):
    sink = JsonLinesSink(tmp_path / "sweep.jsonl")
    baseline = key("torch/none/chips=1/seq_len=64")
    first = run_sweep(tiny_spec(repeats=2), sink)
    assert [r.trial.key for r in first] == [f"{baseline}/repeat=0", f"{baseline}/repeat=1"]
    for result in first:
        assert_consistent_metrics(result)
    # Asking for a third repeat runs only it; the first two keep their results.
    second = run_sweep(tiny_spec(repeats=3), sink)
    assert [(r.trial.key, r.trial.repeat) for r in second] == [(f"{baseline}/repeat=2", 2)]
    assert run_sweep(tiny_spec(repeats=3), sink) == []
    assert_no_leaks()


@pytest.mark.timeout(120)
def test_skipped_points_are_reported_with_reasons():
    sink = MemorySink()
    results = run_sweep(tiny_spec(modes=["ulysses"], chips=[8], seq_lens=[64, 128]), sink)
    assert [r.status for r in results] == ["skipped", "skipped"]  # tiny has 4 value heads
    assert all("value heads (4) divisible by chips=8" in r.error for r in results)
    assert sink.started == []  # never placed


@pytest.mark.timeout(120)
def test_more_chips_than_a_local_ray_has_fails_at_once(local_ray):
    (result,) = run_sweep(tiny_spec(chips=[16], seq_lens=[256]), MemorySink())
    assert result.status == "failed" and "chips=16" in result.error
    assert "cpu_chip" in result.error and "GDN_SWEEP_CPU_CHIPS" in result.error


@pytest.mark.timeout(180)
def test_resume_runs_only_missing_trials(local_ray, tmp_path):
    sink = JsonLinesSink(tmp_path / "sweep.jsonl")
    first = run_sweep(tiny_spec(seq_lens=[64]), sink)
    assert [r.status for r in first] == ["succeeded"]
    second = run_sweep(tiny_spec(seq_lens=[64, 128]), sink)
    assert [r.trial.key for r in second] == [key("torch/none/chips=1/seq_len=128")]
    records = [json.loads(line) for line in sink.path.read_text().splitlines()]
    assert [r["event"] for r in records] == ["started", "finished", "started", "finished"]
    assert sink.finished_keys() == {key("torch/none/chips=1/seq_len=64"),
                                    key("torch/none/chips=1/seq_len=128")}
    assert run_sweep(tiny_spec(seq_lens=[64, 128]), sink) == []
    assert_no_leaks()


@pytest.mark.timeout(180)
def test_cancel_stops_the_running_trial_and_cancels_the_rest(local_ray, tmp_path):
    cancel = threading.Event()
    sink = JsonLinesSink(tmp_path / "sweep.jsonl")

    def on_event(event):
        if isinstance(event, TrialStarted):
            cancel.set()

    spec = tiny_spec(seq_lens=[64, 128, 192], steps=5000)
    results = run_sweep(spec, sink, on_event=on_event, cancel_event=cancel)
    assert [r.status for r in results] == ["cancelled"] * 3
    assert "while the trial ran" in results[0].error
    assert all("before the trial started" in r.error for r in results[1:])
    assert sink.finished_keys() == set()  # a resumed sweep runs all three again
    assert_no_leaks()


@pytest.mark.timeout(180)
def test_two_trials_at_once(local_ray):
    sink, events = MemorySink(), []
    results = run_sweep(tiny_spec(seq_lens=[64, 128], steps=20), sink,
                        max_concurrent_trials=2, on_event=events.append)
    assert sorted(r.status for r in results) == ["succeeded", "succeeded"]
    a, b = results
    assert a.started_at < b.finished_at and b.started_at < a.finished_at  # they overlapped
    finished = [e for e in events if isinstance(e, TrialFinished)]
    assert [(e.done, e.total) for e in finished] == [(1, 2), (2, 2)]
    assert_no_leaks()


@pytest.mark.timeout(180)
def test_cli_run_prints_a_line_per_trial(local_ray, tmp_path, capsys):
    from service.cli.main import main

    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("name: cli-test\nframeworks: [torch]\nmodes: [p2p, ulysses]\nchips: [2]\n"
                     "seq_lens: [64]\nmodel: {preset: tiny, num_layers: 1}\nsteps: 2\n")
    out = tmp_path / "out.jsonl"
    assert main(["run", str(sweep), "--jsonl", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    p2p = key("torch/p2p/chips=2/seq_len=64")
    assert any(line.startswith((f"[1/2] {p2p} succeeded", f"[2/2] {p2p} succeeded"))
               for line in lines)
    assert any("sweep 'cli-test' done" in line for line in lines)
    assert len(JsonLinesSink(out).finished_keys()) == 2
    assert_no_leaks()
