"""The GEMM calibrations of both frameworks on a CPU: their sources and argument checks."""

import math

import pytest
import torch

from gdn_core import calibration


@pytest.mark.timeout(20)
def test_cpu_calibration():
    # ~0.3 s; wall time not asserted: the hosts are shared and noisy, the timeout bounds it
    got = calibration.calibrate_cpu_peak_flops(size=256, seconds=0.3)
    assert math.isfinite(got.flops_per_s) and got.flops_per_s > 0
    assert got.source == (f"cpu_gemm_calibration:torch:fp32:256^3:"
                          f"threads={torch.get_num_threads()}")


@pytest.mark.timeout(20)
def test_calibration_names_dtype_and_rejects_bad_arguments():
    for dtype in ("bfloat16", torch.bfloat16):
        got = calibration.calibrate_cpu_peak_flops(size=64, seconds=0.05, dtype=dtype)
        assert got.flops_per_s > 0 and got.source.startswith("cpu_gemm_calibration:torch:bf16:")
    with pytest.raises(ValueError, match="size=0 must be a positive integer"):
        calibration.calibrate_cpu_peak_flops(size=0)
    with pytest.raises(ValueError, match="device='tpu' is not one of: cpu, cuda"):
        calibration.measure_gemm_flops_per_s(device="tpu")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype, tag", [("float32", "fp32"), ("bfloat16", "bf16")])
def test_jax_calibration_in_each_dtype(dtype, tag):
    got = calibration.measure_jax_gemm_flops_per_s(size=128, seconds=0.1, dtype=dtype)
    assert math.isfinite(got.flops_per_s) and got.flops_per_s > 0
    assert got.source == f"cpu_gemm_calibration:jax:{tag}:128^3"
    with pytest.raises(ValueError, match="dtype='int8' is not one of"):
        calibration.measure_jax_gemm_flops_per_s(dtype="int8")
