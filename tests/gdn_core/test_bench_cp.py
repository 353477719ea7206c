"""`gdn-sweep bench cp` (python -m gdn_core.bench cp; the default gdn_only table) end to end
at its smallest: the tiny preset's GDN layer under p2p on 1 and 2 virtual chips (issue 36:
every benchmark subcommand is run by a test; --layers hybrid: test_bench_cp_hybrid.py)."""

import re

import pytest

from gdn_core.bench import main as bench_main

ROW = re.compile(r"^p2p\s+(\d)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)$",
                 re.M)


@pytest.mark.slow  # three cold JAX compiles of a layer's fwd+bwd: about 15 s here
@pytest.mark.timeout(240)
def test_cp_bench_prints_memory_bytes_and_flops_per_chip(capsys):
    assert bench_main(["cp", "--preset", "tiny", "--local-tokens", "64", "--chips", "1", "2",
                       "--modes", "p2p", "--time-steps", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("preset=tiny GDN layer:")
    rows = {int(m[0]): m[1:] for m in ROW.findall(out)}
    assert set(rows) == {1, 2}, out
    memory, mem_ratio, recv, grad_sum, flops_ratio, step_s = rows[2]
    assert float(memory) > 0 and float(step_s) > 0
    assert float(recv) > 0  # p2p sends the chunk states from chip to chip
    assert 1.0 <= float(flops_ratio) < 1.5  # CP adds some compute, not a multiple
    one_chip = rows[1]
    assert (float(one_chip[1]), float(one_chip[2]), float(one_chip[4])) == (1.0, 0.0, 1.0)
    assert "per-chip memory max/min across D (goal <= 1.02): p2p " in out
