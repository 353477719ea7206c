"""workers.profile_summary on a trace built by hand (self time, busy union, idle, categories)
and on a real torch.profiler trace, against torch's own aggregation (key_averages)."""

from __future__ import annotations

import json

import pytest

from workers.profile_summary import category, summarise_trace


def _op(name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 7, "tid": tid, "ts": ts, "dur": dur}


def test_self_time_busy_and_idle_of_a_hand_built_trace():
    trace = {"traceEvents": [
        {"ph": "M", "name": "thread_name", "pid": 7, "tid": 1, "args": {"name": "main"}},
        _op("aten::linear", 0, 100), _op("aten::mm", 10, 60), _op("aten::add", 75, 5),
        _op("c10d::allgather_", 150, 50),  # a gap of 50 µs before it: idle
        _op("aten::mm", 160, 20, tid=2),  # inside the all-gather's time, on another thread
        _op("python_function", 0, 500, cat="python_function"),  # not an op: ignored
    ]}
    summary = summarise_trace(trace, framework="torch", wall_s=300e-6)
    tops = {t["name"]: t for t in summary["top_ops"]}
    assert tops["aten::linear"]["self_s"] == pytest.approx((100 - 60 - 5) * 1e-6)
    assert tops["aten::mm"]["self_s"] == pytest.approx((60 + 20) * 1e-6)
    assert tops["aten::mm"]["count"] == 2
    assert tops["c10d::allgather_"]["category"] == "collective"
    assert summary["collective_s"] == pytest.approx(50e-6)
    assert summary["compute_s"] == pytest.approx((100 + 20) * 1e-6)  # self times sum to totals
    assert summary["busy_s"] == pytest.approx(150e-6)  # [0, 100] ∪ [150, 200]
    assert summary["idle_s"] == pytest.approx(150e-6)
    assert [t["name"] for t in summary["top_ops"]][0] == "aten::mm"


def test_cuda_kernels_win_over_cpu_ops_and_jax_ops_are_xla_ops():
    trace = {"traceEvents": [_op("aten::mm", 0, 100),
                             _op("ampere_sgemm", 10, 30, tid=9, cat="kernel"),
                             _op("ncclDevKernel_AllGather_RING_LL", 50, 20, tid=9, cat="kernel")]}
    summary = summarise_trace(trace, framework="torch", wall_s=1e-4)
    assert summary["ops"] == "CUDA kernels" and summary["op_events"] == 2
    assert summary["collective_s"] == pytest.approx(20e-6)
    jax_trace = {"traceEvents": [
        {"ph": "X", "name": "fusion.3", "pid": 1, "tid": 1, "ts": 0, "dur": 10,
         "args": {"hlo_op": "fusion.3", "hlo_module": "jit_step"}},
        {"ph": "X", "name": "end: fusion.3", "pid": 1, "tid": 1, "ts": 10, "dur": 1},
        {"ph": "X", "name": "PjitFunction(step)", "pid": 1, "tid": 2, "ts": 0, "dur": 40}]}
    summary = summarise_trace(jax_trace, framework="jax", wall_s=4e-5)
    assert summary["ops"] == "XLA ops" and [t["name"] for t in summary["top_ops"]] == ["fusion.3"]
    with pytest.raises(ValueError, match="framework='tf' is not one of: jax, torch"):
        summarise_trace(jax_trace, framework="tf", wall_s=1.0)


@pytest.mark.parametrize("name", ["all-gather.3", "all_gather", "ppermute.1", "psum",
                                  "collective-permute-start", "reduce-scatter.2",
                                  "c10d::allreduce_", "gloo:all_to_all", "nccl:send"])
def test_collective_names(name):
    assert category(name) == "collective"


@pytest.mark.parametrize("name", ["aten::mm", "fusion.12", "dot.4", "aten::addmm"])
def test_compute_names(name):
    assert category(name) == "compute"


@pytest.mark.timeout(60)
def test_self_times_agree_with_torch_key_averages(tmp_path):
    """On a real torch.profiler trace, each op's self time is the one torch itself reports."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(128, 128, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            torch.nn.functional.linear(torch.relu(x @ x), x).sum().backward()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    summary = summarise_trace(json.loads(path.read_text()), framework="torch", wall_s=1.0,
                              top=100)
    theirs = {e.key: (e.self_cpu_time_total, e.count) for e in prof.key_averages()}
    checked = 0
    for op in summary["top_ops"]:
        self_us, count = theirs[op["name"]]
        assert op["count"] == count, op
        assert op["self_s"] * 1e6 == pytest.approx(self_us, rel=0.02, abs=2.0), op
        checked += 1
    assert checked >= 5 and {"aten::mm", "aten::relu"} <= {o["name"] for o in summary["top_ops"]}
