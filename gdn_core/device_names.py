"""Which chip a runtime's device name denotes, and whether it is the chip a trial declared.

torch.cuda.get_device_name and JAX's device_kind name the parts differently from the datasheet
table's chip types (gdn_core.datasheets); a trial on the wrong part would divide by the wrong
peak, so the worker checks the devices it sees against the declared type.
"""

from __future__ import annotations

from .datasheets import CHIP_SPECS, canonical_accelerator_type


def accelerator_type_from_device_name(device_name: str) -> str | None:
    """Map a runtime's device name to a canonical table key, or None for a chip it lacks.

    torch.cuda.get_device_name: "NVIDIA H100 80GB HBM3" → h100-sxm, "NVIDIA H100 PCIe" →
    h100-pcie, "NVIDIA H100 NVL" → h100-nvl, "NVIDIA H200" → h200-sxm, "NVIDIA H200 NVL" →
    h200-nvl, "NVIDIA A100-SXM4-80GB" → a100. JAX device_kind: "TPU v4", "TPU v5 lite" / "TPU
    v5e" → v5e, "TPU v5" / "TPU v5p" → v5p, "TPU v6 lite" / "TPU v6e" → v6e. Grace superchips
    (GH200, GB200) and TPU v4 lite (v4i) have other figures: None.
    """
    name = " ".join(device_name.lower().replace("-", " ").split())
    if any(other in name for other in ("gh200", "gb200", "v4 lite", "v4i")):
        return None
    if "h100" in name or "h200" in name:
        family = "h100" if "h100" in name else "h200"
        if "pcie" in name and family == "h100":
            return "h100-pcie"
        return f"{family}-nvl" if "nvl" in name else f"{family}-sxm"
    if "a100" in name:
        return "a100"
    if "b200" in name:
        return "b200"
    if name.startswith("tpu"):
        for needles, key in ((("v5 lite", "v5e", "v5litepod"), "v5e"),
                             (("v6 lite", "v6e"), "v6e"), (("v5p",), "v5p"),
                             (("v4",), "v4")):
            if any(n in name for n in needles):
                return key
        if name.split()[-1] == "v5":  # v5p reports device_kind "TPU v5"
            return "v5p"
    return None


def device_mismatch(accelerator_type: str, device_name: str) -> str | None:
    """Why the devices a trial sees are not the declared chip, or None when they are.

    "h100" declared on "NVIDIA H100 80GB HBM3" matches (h100 means SXM); "h100-sxm" declared on
    "NVIDIA H100 PCIe" does not: its peak is 756, not 989 TFLOP/s.
    """
    declared = canonical_accelerator_type(accelerator_type)
    seen = accelerator_type_from_device_name(device_name)
    if seen == declared:
        return None
    hint = (f"declare accelerator.type {seen!r}" if seen is not None
            else f"this chip is not in the peak table ({', '.join(CHIP_SPECS)})")
    return (f"declared accelerator_type={accelerator_type!r} ({declared}) but the devices are "
            f"{device_name!r} ({seen or 'unknown'}); {hint}")


__all__ = ["accelerator_type_from_device_name", "device_mismatch"]
