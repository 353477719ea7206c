"""`python -m gdn_core.bench cp-gdn`: torch's GDN rule under all_gather, this package's CP
rule, fla composed with our exchange and fla's own cp_context, side by side on gloo ranks (fla
under Triton's interpreter on this CPU)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest


@pytest.mark.slow  # two gloo ranks, fla interpreted: about 30 s here
@pytest.mark.timeout(300)
def test_cp_gdn_benchmark_prints_three_paths_that_agree():
    done = subprocess.run([sys.executable, "-m", "gdn_core.bench", "cp-gdn", "--repeats", "1"],
                          capture_output=True, text=True, timeout=280,
                          env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "times are NOT speeds" in done.stdout
    rows = {m.group(1): m for m in re.finditer(
        r"^  (reference|fla composed|fla cp_context)\s+([\d.]+)\s+([\d.]+)x\s+(\S+)$",
        done.stdout, re.MULTILINE)}
    assert set(rows) == {"reference", "fla composed", "fla cp_context"}, done.stdout
    for path in ("fla composed", "fla cp_context"):
        assert float(rows[path].group(4)) < 1e-4, rows[path].group(0)
