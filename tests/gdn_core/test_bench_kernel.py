"""`gdn-sweep bench kernel` at a tiny size: it checks, times and reports correlated-key accuracy."""

import re

import pytest

from gdn_core.bench import kernel


@pytest.mark.slow  # ~20 s of CPU: 8 JAX compiles, a 2 s GEMM calibration
@pytest.mark.timeout(240)
def test_kernel_bench_reports_accuracy_on_correlated_keys(capsys):
    argv = ["--seq-len", "192", "--num-k-heads", "1", "--num-v-heads", "2", "--head-k-dim",
            "32", "--head-v-dim", "32", "--repeats", "1", "--warmup", "0", "--threads", "1",
            "--inverse-blocks", "4"]
    assert kernel.main(argv) == 0
    out = capsys.readouterr().out
    errors = dict(re.findall(r"vs float64 recurrence: (\w+)\s+output rel err (\S+)", out))
    assert set(errors) == set(kernel.IMPLS) - {"fla"}  # fla runs on CUDA only
    assert "fla: needs --device cuda" in out
    for name in ("ours_torch", "ours_jax", "transformers"):
        assert float(errors[name]) < 1e-5, (name, errors[name])
    # The replaced product-form inverse, timed beside it, is wrong on such keys (or not finite).
    assert not float(errors["jax_old_inv"]) < 1e-2
    table = [line.split() for line in out.splitlines() if line.split()[:1] == ["ours_jax"]]
    assert len(table) == 1 and float(table[0][1]) > 0
    assert "time ratio product form / blockwise" in out
