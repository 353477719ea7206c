"""`gdn-sweep bench sweep` end to end at its smallest: a one-trial sweep YAML, one run (cold
compile cache), on a local Ray of one chip (issue 36: every benchmark subcommand is run by a
test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import TINY_SWEEP

REPO_ROOT = Path(__file__).resolve().parents[2]
COLUMNS = ["run", "wall_s", "trials", "s/trial", "compile_s", "compile%", "steps_s", "other_s",
           "failed"]


@pytest.mark.slow  # a local Ray and a trial's workers, in a process of its own: ~30 s here
@pytest.mark.timeout(300)
def test_sweep_bench_splits_a_runs_wall_time(tmp_path):
    sweep = tmp_path / "tiny.yaml"
    sweep.write_text(yaml.safe_dump({**TINY_SWEEP, "frameworks": ["jax"]}))
    done = subprocess.run(
        [sys.executable, "-m", "service.cli", "bench", "sweep", str(sweep), "--runs", "1",
         "--cpu-chips", "1"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=280,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["run"])
    assert lines[header].split() == COLUMNS
    row = lines[header + 1].split()
    assert row[:3] == ["1:", "cold", "cache"], lines[header + 1]
    wall, trials, per_trial, compile_s, compile_pct, steps, other, failed = row[3:]
    assert int(trials) == 1 and int(failed) == 0
    assert float(wall) > 0 and float(compile_s) > 0  # a JAX trial compiles its step
    assert float(compile_s) + float(steps) + float(other) <= float(wall) * 1.01 + 0.1
