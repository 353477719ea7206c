"""scripts/device-check.sh and the step-table benchmark it ends with, on this CPU-only host.

Without a CUDA device the script must say so, let the gpu tests skip and exit 0; the step
table's code path (a child process per row, the table, its JSON and markdown) runs here on
the tiny preset. The GPU numbers themselves come only from a device run.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

from gdn_core.bench import step
from gdn_core.device_memory import JAX_GPU_MEMORY_FRACTION
from gdn_core.flops.model import model_flops_per_step
from gdn_core.presets import get_preset
from gdn_core.train_config import FRAMEWORKS

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device-check.sh"
needs_no_cuda = pytest.mark.skipif(
    torch.cuda.is_available(), reason="a CUDA device is present: the script runs the full check")


def run_script(*args, out_dir, timeout_s):
    env = dict(os.environ, OUT=str(out_dir), PYTHON=sys.executable)
    env.pop("JAX_PLATFORMS", None)  # as on a fresh machine: the script chooses
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout_s)


@needs_no_cuda
@pytest.mark.timeout(240)
def test_script_without_cuda_says_so_skips_gpu_tests_and_exits_0(tmp_path):
    done = run_script(out_dir=tmp_path, timeout_s=200)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-2000:]
    assert "no CUDA device" in out
    assert "devices: cuda=0 jax_gpu=0" in out
    assert " skipped" in out and "passed" not in out and "failed" not in out, out[-3000:]
    assert "=== kernel" not in out and "=== step" not in out  # they need a GPU
    assert "=== pallas" not in out
    assert "env: ok" in out and "tests: ok" in out  # the summary
    # JAX's allocator as the sweep's workers set it: one constant, one owner.
    assert (f"XLA_PYTHON_CLIENT_PREALLOCATE=false XLA_PYTHON_CLIENT_MEM_FRACTION="
            f"{JAX_GPU_MEMORY_FRACTION}") in out
    assert (tmp_path / "device-check.log").read_text().count("no CUDA device") >= 1


@pytest.mark.slow  # four child processes building and compiling both frameworks' CP step
@pytest.mark.timeout(600)
def test_step_table_runs_the_sweeps_step_reference_beside_fused_on_cpu(tmp_path):
    seq_len = 64
    done = subprocess.run(
        [sys.executable, "-m", "gdn_core.bench", "step", "--device", "cpu", "--preset", "tiny",
         "--seq-len", str(seq_len), "--steps", "1", "--warmup", "1", "--dtypes", "float32",
         "--budget-s", "500", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=560,
        env={k: v for k, v in os.environ.items() if k != "GDN_SWEEP_INTERPRET_KERNELS"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = {(r["framework"], r["kernels"]): r
            for r in json.loads((tmp_path / "step-table.json").read_text())}
    assert list(rows) == [(f, k) for f in FRAMEWORKS for k in ("reference", "fused")]
    # torch's fused GDN is fla-core's, which needs a GPU, and JAX's the Pallas chunk rule,
    # which needs a TPU or GPU (or the interpreter switch): skipped with that reason, not run
    # as the reference.
    for key, why in ((("torch", "fused"), "CUDA"), (("jax", "fused"), "the Pallas chunk rule "
                                                                      "needs a TPU or GPU")):
        skipped = rows[key]
        assert skipped["status"] == "skipped" and why in skipped["reason"], skipped
        assert skipped["step_time_s"] is None
    flops = model_flops_per_step(get_preset("tiny", layers="hybrid"), batch=1,
                                 seq_len=seq_len).total
    for key in (("torch", "reference"), ("jax", "reference")):
        row = rows[key]
        assert row["status"] == "ok" and row["reason"] is None, (key, row["reason"])
        assert row["step_time_s"] > 0 and len(row["step_times_s"]) == 1, key
        assert math.isclose(row["tokens_per_s"], seq_len / row["step_time_s"]), key
        assert row["model_flops_per_step"] == flops, key  # the same whatever the kernels
        assert row["peak_source"].startswith(f"cpu_gemm_calibration:{key[0]}:fp32"), key
        assert 0 < row["mfu"] <= 1, key
        assert row["memory_source"].startswith("process_rss"), key
        assert len(row["losses"]) == 2 and all(math.isfinite(x) for x in row["losses"]), key
    assert rows["jax", "reference"]["attention_kernel"].startswith("reference jax")
    markdown = (tmp_path / "step-table.md").read_text()
    assert markdown.startswith("| framework | kernels | dtype |")
    assert markdown.count("| skipped |") == 2


@pytest.mark.timeout(120)
def test_step_table_torch_rows_run_the_sweeps_step_and_skip_fused_gdn_on_cpu(tmp_path):
    # The default tier's share of the above: torch only (no JAX compile), ~5 s here.
    done = subprocess.run(
        [sys.executable, "-m", "gdn_core.bench", "step", "--device", "cpu", "--preset", "tiny",
         "--seq-len", "64", "--steps", "1", "--warmup", "1", "--dtypes", "float32",
         "--frameworks", "torch", "--budget-s", "100", "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    reference, fused = json.loads((tmp_path / "step-table.json").read_text())
    assert (reference["kernels"], fused["kernels"]) == ("reference", "fused")
    assert reference["status"] == "ok" and 0 < reference["mfu"] <= 1
    assert reference["gdn_kernel"] == "reference torch chunk rule"
    assert reference["model_flops_per_step"] == model_flops_per_step(
        get_preset("tiny", layers="hybrid"), batch=1, seq_len=64).total
    assert fused["status"] == "skipped" and "CUDA" in fused["reason"]
    assert fused["step_time_s"] is None and fused["losses"] == []


def test_rows_beyond_the_budget_are_reported_not_lost_and_exit_0(tmp_path, capsys):
    code = step.main(["--device", "cpu", "--preset", "tiny", "--dtypes", "bfloat16,float32",
                      "--budget-s", "0", "--out", str(tmp_path)])
    assert code == 0  # not reached is not a failure: a cold machine reports what it finished
    rows = json.loads((tmp_path / "step-table.json").read_text())
    assert [(r["dtype"], r["framework"], r["kernels"]) for r in rows] == [
        (dtype, framework, kernels) for dtype in ("bfloat16", "float32")
        for framework in FRAMEWORKS for kernels in ("reference", "fused")]
    assert all(r["status"] == "not reached" and "budget" in r["reason"] for r in rows)
    assert capsys.readouterr().out.count("NOT REACHED") == len(rows)


def test_step_options_are_checked():
    with pytest.raises(SystemExit, match="--frameworks='torch,tf'"):
        step.main(["--frameworks", "torch,tf", "--budget-s", "0"])
    with pytest.raises(SystemExit, match="--kernels='fast'"):
        step.main(["--kernels", "fast", "--budget-s", "0"])


@pytest.mark.slow  # every part of the script on CPU at toy sizes: minutes of JAX compiles here
@pytest.mark.timeout(1800)
def test_script_cpu_dry_run_runs_every_part(tmp_path):
    done = run_script("--cpu-dry-run", out_dir=tmp_path, timeout_s=1700)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-2000:]
    for part in ("env", "tests", "kernel", "pallas", "step"):
        assert f"{part}: ok" in done.stdout, part
    assert "check gdn_core pallas chunk rule (interpreted) vs xla_reference" in done.stdout
    assert (tmp_path / "step-table.json").exists()


PLAN_ROW = re.compile(r"^\s*(torch|jax)\s+(reference|fused)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\w+)\s+"
                      r"(\w+)\s+([\d.]+)\s+([\d.]+)\s+(yes|NO)\s+([\d.]+)\s+(yes|NO)$")
"""A plan row: framework, kernels, preset, layers, seq_len, remat, dtype, predicted GiB, then
(usable GiB, fits) for the H100 80GB and the H200 141GB."""


def plan_rows(text: str) -> list[tuple]:
    return [m.groups() for m in map(PLAN_ROW.match, text.splitlines()) if m]


@pytest.mark.timeout(120)
def test_plan_lists_the_parts_and_step_rows_and_every_row_fits_an_h100(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path))
    done = subprocess.run(["bash", str(SCRIPT), "--plan"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    out = done.stdout
    limits = dict(re.findall(r"^  (env|tests|kernel|pallas|step)\s+(\d+) s", out,
                             re.MULTILINE))
    assert list(limits) == ["env", "tests", "kernel", "pallas", "step"]
    assert sum(map(int, limits.values())) < 480 and f"sum {sum(map(int, limits.values()))} s" \
        in out
    assert "kernel_pallas --device cuda --dtype bfloat16 --seq-len 32768" in out
    rows = plan_rows(out)
    # Rows in the step module's framework order (gdn_core.train_config.FRAMEWORKS).
    assert [(r[0], r[1]) for r in rows] == [(f, k) for f in FRAMEWORKS
                                            for k in ("reference", "fused")]
    for (framework, kernels, preset, layers, seq_len, remat, dtype, predicted, h100, h100_fits,
         h200, h200_fits) in rows:
        # The hybrid preset at full depth and 32K tokens, made to fit by remat full.
        assert (preset, layers, seq_len, remat, dtype) == (
            "qwen3.5-0.8b", "24", "32768", "full", "bfloat16"), framework
        assert float(predicted) < float(h100) and h100_fits == "yes", (framework, kernels)
        assert float(predicted) < float(h200) and h200_fits == "yes", (framework, kernels)
        assert float(h100) < 80 < float(h200) < 141  # usable, not the datasheet's round figure
    assert "kernel workspace (estimate from fla-core" in out and "until measured on a chip" in out
    assert "=== " not in out and not list(tmp_path.iterdir())  # nothing ran, nothing written


@pytest.mark.timeout(120)
def test_plan_needs_neither_torch_nor_jax_and_says_when_a_row_does_not_fit():
    probe = ("import sys; from gdn_core.bench import step; "
             "code = step.main(['--plan', '--device', 'cuda', '--remat', 'none']); "
             "print('imported', sorted(m for m in ('torch', 'jax') if m in sys.modules), code)")
    done = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "imported [] 0" in done.stdout  # shapes and arithmetic only: no GPU, no compile
    rows = plan_rows(done.stdout)
    assert len(rows) == 4
    # Without recomputation the 32K hybrid needs ~202 (torch) / 310 GiB (JAX): no H100 fits.
    assert all(r[5] == "none" and r[9] == "NO" and float(r[7]) > 150 for r in rows), rows


def test_a_row_predicted_over_its_device_is_skipped_before_it_runs(monkeypatch):
    monkeypatch.setattr(step, "usable_here", lambda device, framework: (2**20, "a stand-in"))

    def must_not_run(*args, **kwargs):
        raise AssertionError("the row ran although predicted over its device")
    monkeypatch.setattr(step, "_torch_row", must_not_run)
    args = step.build_parser().parse_args(["--device", "cpu", "--preset", "tiny",
                                           "--seq-len", "64"])
    row = step.run_row(args, "float32", "torch", "reference")
    assert row.status == "skipped" and row.step_time_s is None
    assert re.match(r"predicted \d+\.\d GiB > usable 0\.0 GiB \(a stand-in; ", row.reason)
    assert row.predicted_memory_bytes > 2**20 and row.remat == "full"


def test_fused_rows_need_a_warmup_step_and_reference_rows_do_not(tmp_path):
    with pytest.raises(SystemExit, match=r"--warmup=0 with --kernels including fused.*"
                                         r"autotune.*--warmup >= 1"):
        step.main(["--warmup", "0", "--budget-s", "0"])
    assert step.main(["--device", "cpu", "--preset", "tiny", "--warmup", "0", "--kernels",
                      "reference", "--budget-s", "0", "--out", str(tmp_path)]) == 0


def test_cuda_rows_run_jax_at_the_workers_allocator_fraction(monkeypatch):
    seen = {}

    def fake_run(argv, **kwargs):
        seen.update(kwargs["env"])
        return subprocess.CompletedProcess(argv, 1, stdout="", stderr="stand-in")
    monkeypatch.setattr(step.subprocess, "run", fake_run)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    args = step.build_parser().parse_args(["--device", "cuda", "--preset", "tiny"])
    row = step.run_row_in_child(args, "bfloat16", "jax", "reference", timeout_s=10)
    assert row.status == "failed"  # the stand-in child's exit
    assert seen["XLA_PYTHON_CLIENT_MEM_FRACTION"] == str(JAX_GPU_MEMORY_FRACTION)
    assert seen["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"


@pytest.mark.timeout(300)
def test_pallas_row_checks_then_times_the_jax_rules_interpreted(capsys):
    """The device check's JAX-rule row at toy size on this CPU: the Pallas rule through Pallas's
    interpreter, checked against the XLA rule (bf16), then both timed."""
    from gdn_core.bench import kernel_pallas

    code = kernel_pallas.main(["--device", "cpu", "--interpret", "--seq-len", "80",
                               "--num-k-heads", "1", "--num-v-heads", "2", "--head-k-dim", "16",
                               "--head-v-dim", "16", "--repeats", "1", "--warmup", "0"])
    out = capsys.readouterr().out
    assert code == 0, out
    check = re.search(r"check gdn_core pallas chunk rule \(interpreted\) vs xla_reference "
                      r"\(bfloat16, tolerance 2e-02\): (.*)", out)
    assert check, out
    errors = dict(re.findall(r"(\w+) ([\d.e+-]+)", check.group(1)))
    assert list(errors) == ["o", "dq", "dk", "dv", "dg", "dbeta"]
    assert all(float(e) < 2e-2 for e in errors.values()), errors
    assert re.search(r"pallas\s+median [\d.]+ s", out) and "measure Pallas's interpreter" in out
