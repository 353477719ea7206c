"""Per-chip peak (by dtype) and memory tables, device-name mapping and matching, and the CPU
GEMM calibrations of both frameworks."""

import math
import subprocess
import sys
import textwrap

import pytest
import torch

from gdn_core import hardware as hw

EXPECTED_BF16_TFLOPS = {"v4": 275, "v5e": 197, "v5p": 459, "v6e": 918, "a100": 312,
                        "h100-sxm": 989, "h100-pcie": 756, "h100-nvl": 835, "h200-sxm": 989,
                        "h200-nvl": 835, "b200": 2250, "h100": 989, "h200": 989}
EXPECTED_FP32_TFLOPS = {"a100": 19.5, "h100-sxm": 67, "h100-pcie": 51, "h100-nvl": 60,
                        "h200-sxm": 67, "h200-nvl": 60, "b200": 75, "h100": 67, "h200": 67}
EXPECTED_HBM_GIB = {"v4": 32, "v5e": 16, "v5p": 95, "v6e": 32, "a100": 80, "h100-sxm": 80,
                    "h100-pcie": 80, "h100-nvl": 94, "h200-sxm": 141, "h200-nvl": 141,
                    "b200": 192, "h100": 80, "h200": 141}
TPUS = ("v4", "v5e", "v5p", "v6e")


@pytest.mark.parametrize("name", sorted(EXPECTED_BF16_TFLOPS))
def test_tables(name):
    assert hw.peak_flops_per_chip(name) == EXPECTED_BF16_TFLOPS[name] * 10 ** 12  # old callers
    assert hw.peak_flops_per_chip(name, "bfloat16") == EXPECTED_BF16_TFLOPS[name] * 10 ** 12
    assert hw.hbm_bytes_per_chip(name) == EXPECTED_HBM_GIB[name] * 2 ** 30
    assert hw.PEAK_BF16_DENSE_FLOPS_PER_CHIP[name] == EXPECTED_BF16_TFLOPS[name] * 10 ** 12
    assert set(hw.ACCELERATOR_TYPES) == set(EXPECTED_BF16_TFLOPS)


@pytest.mark.parametrize("name", sorted(EXPECTED_FP32_TFLOPS))
def test_gpu_float32_peak_is_true_fp32_and_differs_from_bf16(name):
    fp32 = hw.peak_flops_per_chip(name, "float32")
    assert fp32 == pytest.approx(EXPECTED_FP32_TFLOPS[name] * 10 ** 12)
    assert fp32 < hw.peak_flops_per_chip(name, "bfloat16") / 5  # not TF32, not bf16
    assert hw.peak_dtype(name, "float32") == "float32"
    assert hw.peak_source(name, "float32").startswith("datasheet_fp32_no_tf32:")


@pytest.mark.parametrize("name", TPUS)
def test_tpu_float32_is_divided_by_the_bf16_peak_recorded_as_such(name):
    # TPUs publish no float32 figure: docs/architecture.md (MaxText's convention) divides by bf16.
    assert hw.peak_dtype(name, "float32") == "bfloat16"
    assert hw.peak_flops_per_chip(name, "float32") == hw.peak_flops_per_chip(name, "bfloat16")
    source = hw.peak_source(name, "float32")
    assert source.startswith(f"datasheet_bf16_dense:{name}") and "float32 run" in source


def test_unknown_dtype_and_chip_name_the_accepted_values():
    with pytest.raises(ValueError, match="dtype='float16' is not one of: float32, bfloat16"):
        hw.peak_flops_per_chip("h100", "float16")
    with pytest.raises(ValueError) as err:
        hw.peak_flops_per_chip("v3")
    message = str(err.value)
    assert "accelerator_type='v3'" in message
    for name in EXPECTED_BF16_TFLOPS:
        assert name in message
    with pytest.raises(ValueError, match="accelerator_type='mi300x'"):
        hw.hbm_bytes_per_chip("mi300x")


@pytest.mark.parametrize("spelling, key", [("V5P", "v5p"), ("H100", "h100-sxm"),
                                           (" b200 ", "b200"), ("TPU-v4", "v4"),
                                           ("tpu v6e", "v6e"), ("NVIDIA A100", "a100"),
                                           ("H100-PCIe", "h100-pcie"), ("h200", "h200-sxm")])
def test_lookup_is_case_insensitive_and_aliases_mean_sxm(spelling, key):
    assert hw.canonical_accelerator_type(spelling) == key
    assert hw.peak_flops_per_chip(spelling) == EXPECTED_BF16_TFLOPS[key] * 10 ** 12


@pytest.mark.parametrize("device_name, key", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 NVL", "h100-nvl"), ("NVIDIA H200", "h200-sxm"), ("NVIDIA H200 NVL", "h200-nvl"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA A100 80GB PCIe", "a100"), ("NVIDIA B200", "b200"),
    ("NVIDIA GH200 480GB", None), ("NVIDIA GB200", None), ("TPU v4", "v4"),
    ("TPU v4 lite", None), ("TPU v5 lite", "v5e"), ("TPU v5e", "v5e"), ("TPU v5", "v5p"),
    ("TPU v5p", "v5p"), ("TPU v6 lite", "v6e"), ("TPU7x", None), ("cpu", None),
    ("NVIDIA GeForce RTX 4090", None), ("Intel(R) Xeon(R) Processor", None)])
def test_device_name_mapping(device_name, key):
    assert hw.accelerator_type_from_device_name(device_name) == key


@pytest.mark.parametrize("declared, device_name, matches", [
    ("h100", "NVIDIA H100 80GB HBM3", True), ("h100-sxm", "NVIDIA H100 80GB HBM3", True),
    ("h100-sxm", "NVIDIA H100 PCIe", False), ("h100", "NVIDIA H100 PCIe", False),
    ("h100-pcie", "NVIDIA H100 PCIe", True), ("h200", "NVIDIA H200", True),
    ("h200", "NVIDIA H200 NVL", False), ("h100", "NVIDIA A100-SXM4-80GB", False),
    ("v5p", "TPU v5", True), ("v5e", "TPU v5 lite", True), ("v5p", "TPU v5 lite", False),
    ("b200", "NVIDIA GB200", False)])
def test_device_mismatch(declared, device_name, matches):
    assert (hw.device_mismatch(declared, device_name) is None) == matches


def test_mismatch_names_both_and_the_fix():
    reason = hw.device_mismatch("h100", "NVIDIA A100-SXM4-80GB")
    assert "'h100'" in reason and "'NVIDIA A100-SXM4-80GB'" in reason
    assert "declare accelerator.type 'a100'" in reason
    assert "not in the peak table" in hw.device_mismatch("h100", "NVIDIA GeForce RTX 4090")


def test_tables_import_neither_torch_nor_jax():
    code = textwrap.dedent("""
        import sys
        from gdn_core import hardware
        hardware.peak_flops_per_chip("v5p")
        assert "torch" not in sys.modules and "jax" not in sys.modules, "heavy import"
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr


@pytest.mark.timeout(20)
def test_cpu_calibration():
    got = hw.calibrate_cpu_peak_flops(size=256, seconds=0.3)  # ~0.3 s; wall time not asserted:
    # the hosts are shared and noisy, the timeout bounds it
    assert math.isfinite(got.flops_per_s) and got.flops_per_s > 0
    assert got.source == (f"cpu_gemm_calibration:torch:fp32:256^3:"
                          f"threads={torch.get_num_threads()}")


@pytest.mark.timeout(20)
def test_calibration_names_dtype_and_rejects_bad_arguments():
    for dtype in ("bfloat16", torch.bfloat16):
        got = hw.calibrate_cpu_peak_flops(size=64, seconds=0.05, dtype=dtype)
        assert got.flops_per_s > 0 and got.source.startswith("cpu_gemm_calibration:torch:bf16:")
    with pytest.raises(ValueError, match="size=0 must be a positive integer"):
        hw.calibrate_cpu_peak_flops(size=0)
    with pytest.raises(ValueError, match="device='tpu' is not one of: cpu, cuda"):
        hw.measure_gemm_flops_per_s(device="tpu")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dtype, tag", [("float32", "fp32"), ("bfloat16", "bf16")])
def test_jax_calibration_in_each_dtype(dtype, tag):
    got = hw.measure_jax_gemm_flops_per_s(size=128, seconds=0.1, dtype=dtype)
    assert math.isfinite(got.flops_per_s) and got.flops_per_s > 0
    assert got.source == f"cpu_gemm_calibration:jax:{tag}:128^3"
    with pytest.raises(ValueError, match="dtype='int8' is not one of"):
        hw.measure_jax_gemm_flops_per_s(dtype="int8")
