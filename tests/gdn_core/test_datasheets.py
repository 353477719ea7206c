"""Per-chip datasheet tables: peak FLOP/s by dtype, HBM capacity, the accepted spellings of a
chip type; read without torch or jax."""

import subprocess
import sys
import textwrap

import pytest

from gdn_core import datasheets

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
    # the default dtype, bfloat16, for old callers
    assert datasheets.peak_flops_per_chip(name) == EXPECTED_BF16_TFLOPS[name] * 10 ** 12
    assert datasheets.peak_flops_per_chip(name, "bfloat16") == EXPECTED_BF16_TFLOPS[name] * 10 ** 12
    assert datasheets.hbm_bytes_per_chip(name) == EXPECTED_HBM_GIB[name] * 2 ** 30
    assert set(datasheets.ACCELERATOR_TYPES) == set(EXPECTED_BF16_TFLOPS)


@pytest.mark.parametrize("name", sorted(EXPECTED_FP32_TFLOPS))
def test_gpu_float32_peak_is_true_fp32_and_differs_from_bf16(name):
    fp32 = datasheets.peak_flops_per_chip(name, "float32")
    assert fp32 == pytest.approx(EXPECTED_FP32_TFLOPS[name] * 10 ** 12)
    assert fp32 < datasheets.peak_flops_per_chip(name, "bfloat16") / 5  # not TF32, not bf16
    assert datasheets.peak_dtype(name, "float32") == "float32"
    assert datasheets.peak_source(name, "float32").startswith("datasheet_fp32_no_tf32:")


@pytest.mark.parametrize("name", TPUS)
def test_tpu_float32_is_divided_by_the_bf16_peak_recorded_as_such(name):
    # TPUs publish no float32 figure: docs/architecture.md (MaxText's convention) divides by bf16.
    assert datasheets.peak_dtype(name, "float32") == "bfloat16"
    assert (datasheets.peak_flops_per_chip(name, "float32")
            == datasheets.peak_flops_per_chip(name, "bfloat16"))
    source = datasheets.peak_source(name, "float32")
    assert source.startswith(f"datasheet_bf16_dense:{name}") and "float32 run" in source


def test_unknown_dtype_and_chip_name_the_accepted_values():
    with pytest.raises(ValueError, match="dtype='float16' is not one of: float32, bfloat16"):
        datasheets.peak_flops_per_chip("h100", "float16")
    with pytest.raises(ValueError) as err:
        datasheets.peak_flops_per_chip("v3")
    message = str(err.value)
    assert "accelerator_type='v3'" in message
    for name in EXPECTED_BF16_TFLOPS:
        assert name in message
    with pytest.raises(ValueError, match="accelerator_type='mi300x'"):
        datasheets.hbm_bytes_per_chip("mi300x")


@pytest.mark.parametrize("spelling, key", [("V5P", "v5p"), ("H100", "h100-sxm"),
                                           (" b200 ", "b200"), ("TPU-v4", "v4"),
                                           ("tpu v6e", "v6e"), ("NVIDIA A100", "a100"),
                                           ("H100-PCIe", "h100-pcie"), ("h200", "h200-sxm")])
def test_lookup_is_case_insensitive_and_aliases_mean_sxm(spelling, key):
    assert datasheets.canonical_accelerator_type(spelling) == key
    assert datasheets.peak_flops_per_chip(spelling) == EXPECTED_BF16_TFLOPS[key] * 10 ** 12


def test_tables_import_neither_torch_nor_jax():
    code = textwrap.dedent("""
        import sys
        from gdn_core import calibration, datasheets, device_names
        datasheets.peak_flops_per_chip("v5p")
        device_names.device_mismatch("v5p", "TPU v5")
        assert "torch" not in sys.modules and "jax" not in sys.modules, "heavy import"
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
