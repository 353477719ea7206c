"""The chip a runtime's device name denotes, and the check of it against a declared type."""

import pytest

from gdn_core import device_names


@pytest.mark.parametrize("device_name, key", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 NVL", "h100-nvl"), ("NVIDIA H200", "h200-sxm"), ("NVIDIA H200 NVL", "h200-nvl"),
    ("NVIDIA A100-SXM4-80GB", "a100"), ("NVIDIA A100 80GB PCIe", "a100"), ("NVIDIA B200", "b200"),
    ("NVIDIA GH200 480GB", None), ("NVIDIA GB200", None), ("TPU v4", "v4"),
    ("TPU v4 lite", None), ("TPU v5 lite", "v5e"), ("TPU v5e", "v5e"), ("TPU v5", "v5p"),
    ("TPU v5p", "v5p"), ("TPU v6 lite", "v6e"), ("TPU7x", None), ("cpu", None),
    ("NVIDIA GeForce RTX 4090", None), ("Intel(R) Xeon(R) Processor", None)])
def test_device_name_mapping(device_name, key):
    assert device_names.accelerator_type_from_device_name(device_name) == key


@pytest.mark.parametrize("declared, device_name, matches", [
    ("h100", "NVIDIA H100 80GB HBM3", True), ("h100-sxm", "NVIDIA H100 80GB HBM3", True),
    ("h100-sxm", "NVIDIA H100 PCIe", False), ("h100", "NVIDIA H100 PCIe", False),
    ("h100-pcie", "NVIDIA H100 PCIe", True), ("h200", "NVIDIA H200", True),
    ("h200", "NVIDIA H200 NVL", False), ("h100", "NVIDIA A100-SXM4-80GB", False),
    ("v5p", "TPU v5", True), ("v5e", "TPU v5 lite", True), ("v5p", "TPU v5 lite", False),
    ("b200", "NVIDIA GB200", False)])
def test_device_mismatch(declared, device_name, matches):
    assert (device_names.device_mismatch(declared, device_name) is None) == matches


def test_mismatch_names_both_and_the_fix():
    reason = device_names.device_mismatch("h100", "NVIDIA A100-SXM4-80GB")
    assert "'h100'" in reason and "'NVIDIA A100-SXM4-80GB'" in reason
    assert "declare accelerator.type 'a100'" in reason
    reason = device_names.device_mismatch("h100", "NVIDIA GeForce RTX 4090")
    assert "not in the peak table" in reason
