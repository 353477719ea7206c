"""`gdn-sweep bench memory` (python -m gdn_core.bench memory) end to end at its smallest: one
(sharding, remat) row of the tiny preset's CP step on 2 virtual chips, and one compile-time
line (issue 36: every benchmark subcommand is run by a test)."""

import re

import pytest

from gdn_core.bench import main as bench_main

ROW = re.compile(r"^replicated\s+none\s+float32\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)"
                 r"\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", re.M)


@pytest.mark.slow  # two cold JAX compiles of the CP training step: about 20 s here
@pytest.mark.timeout(240)
def test_memory_bench_prints_a_row_per_setting_and_the_compile_times(capsys):
    assert bench_main(["memory", "--preset", "tiny", "--local-tokens", "64", "--chips", "2",
                       "--dtypes", "float32", "--shardings", "replicated", "--remats", "none",
                       "--compile-depths", "2"]) == 0
    out = capsys.readouterr().out
    assert "preset=tiny: 2 layers" in out and "2 chips x 64 local tokens" in out
    rows = ROW.findall(out)
    assert len(rows) == 1, out
    args, temps, peak, predicted, h200, v5p, h100, compile_s = map(float, rows[0])
    # a tiny model fits everywhere: the headroom is the chip's usable memory, to the 0.1 GiB
    assert (h200, v5p, h100) == (139.0, 95.0, 80.0)
    assert compile_s > 0
    assert re.search(r"of a   2-layer step:\s+[\d.]+ s, optimised HLO [\d.]+ MB", out), out
