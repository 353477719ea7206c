"""Per-chip peak and memory tables, device-name mapping, and the CPU GEMM calibration."""

import math

import pytest
import torch

from gdn_core import hardware as hw

EXPECTED_PEAK_TFLOPS = {"v4": 275, "v5e": 197, "v5p": 459, "v6e": 918,
                        "a100": 312, "h100": 989, "h200": 989, "b200": 2250}
EXPECTED_HBM_GIB = {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32,
                    "a100": 80, "h100": 80, "h200": 141, "b200": 192}


@pytest.mark.parametrize("name", sorted(EXPECTED_PEAK_TFLOPS))
def test_tables(name):
    assert hw.peak_flops_per_chip(name) == EXPECTED_PEAK_TFLOPS[name] * 10 ** 12
    assert hw.hbm_bytes_per_chip(name) == EXPECTED_HBM_GIB[name] * 2 ** 30


@pytest.mark.parametrize("spelling, key", [("V5P", "v5p"), ("H100", "h100"), (" b200 ", "b200"),
                                           ("TPU-v4", "v4"), ("tpu v6e", "v6e"),
                                           ("NVIDIA A100", "a100")])
def test_lookup_is_case_insensitive(spelling, key):
    assert hw.peak_flops_per_chip(spelling) == EXPECTED_PEAK_TFLOPS[key] * 10 ** 12


def test_unknown_type_lists_accepted_names():
    with pytest.raises(ValueError) as err:
        hw.peak_flops_per_chip("v3")
    message = str(err.value)
    assert "accelerator_type='v3'" in message
    for name in EXPECTED_PEAK_TFLOPS:
        assert name in message
    with pytest.raises(ValueError, match="accelerator_type='mi300x'"):
        hw.hbm_bytes_per_chip("mi300x")


@pytest.mark.parametrize("device_name, key", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA B200", "b200"), ("TPU v4", "v4"), ("TPU v5 lite", "v5e"), ("TPU v5p", "v5p"),
    ("TPU v6 lite", "v6e"), ("cpu", None), ("NVIDIA GeForce RTX 4090", None)])
def test_device_name_mapping(device_name, key):
    assert hw.accelerator_type_from_device_name(device_name) == key


@pytest.mark.timeout(20)
def test_cpu_calibration():
    got = hw.calibrate_cpu_peak_flops(size=256, seconds=0.3)  # ~0.3 s; wall time not asserted:
    # the hosts are shared and noisy, the timeout bounds it
    assert math.isfinite(got.flops_per_s) and got.flops_per_s > 0
    assert got.source == (f"cpu_gemm_calibration:fp32:256^3:"
                          f"torch.get_num_threads()={torch.get_num_threads()}")


@pytest.mark.timeout(20)
def test_calibration_names_dtype_and_rejects_bad_arguments():
    got = hw.calibrate_cpu_peak_flops(size=64, seconds=0.05, dtype=torch.bfloat16)
    assert got.flops_per_s > 0 and got.source.startswith("cpu_gemm_calibration:bf16:64^3:")
    with pytest.raises(ValueError, match="size=0 must be a positive integer"):
        hw.calibrate_cpu_peak_flops(size=0)
    with pytest.raises(ValueError, match="device='tpu' is not one of: cpu, cuda"):
        hw.measure_gemm_flops_per_s(device="tpu")
