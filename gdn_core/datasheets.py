"""Chip datasheets: peak FLOP/s by (chip, compute dtype), HBM capacity and bandwidth, and the
accepted spellings of each chip type.

The peak table is the denominator of MFU (docs/architecture.md, Metrics): the peak of the chip in
the dtype its matmuls run in. "bfloat16" is the dense (no 2:4 sparsity) bf16 tensor-core / MXU
figure; "float32" is true FP32 — not TF32: torch keeps `allow_tf32=False` for matmuls by
default and our JAX float32 path runs at Precision.HIGHEST. TPUs publish no float32 figure
(their MXUs are bf16; float32 at HIGHEST runs several bf16 passes): a float32 TPU run is
divided by the bf16 peak and recorded as such (`peak_dtype`; MaxText's convention, as
docs/architecture.md says). On CPU hosts there is no datasheet figure at all; the peak is a GEMM
calibration (gdn_core.calibration) whose source is recorded. A runtime's device name is mapped
to these chip types by gdn_core.device_names; what the chips' links are assumed to carry before
trials measure them is the planner's (service/planner/link_priors.py).

Imports neither torch nor jax, so the tables stay cheap to load.
"""

from __future__ import annotations

import dataclasses

from .train_config import COMPUTE_DTYPES

TFLOPS = 10 ** 12
GIB = 2 ** 30


@dataclasses.dataclass(frozen=True, slots=True)
class ChipSpec:
    """Datasheet figures of one chip type."""

    bf16_dense_flops: float
    """Peak dense bf16 FLOP/s (tensor cores / MXUs, fp32 accumulation, no sparsity)."""
    fp32_flops: float | None
    """Peak FP32 FLOP/s without TF32 (GPU CUDA cores); None where no datasheet gives one."""
    hbm_bytes: int
    """Nominal HBM capacity, the vendor's "GB" read as GiB."""
    hbm_bytes_per_s: float
    """Peak HBM bandwidth, bytes per second (the vendor's GB/s, 10**9 bytes): the memory
    roof of a roofline (service/planner/roofline.py)."""


# Sources (dense = the datasheets' "with sparsity" bf16 figure halved):
#   TPU: cloud.google.com/tpu/docs/{v4,v5e,v5p,v6e} "Peak compute per chip (bf16)" — v4 275,
#     v5e 197, v5p 459, v6e 918 TFLOP/s; HBM 32, 16, 95, 32 GB. No float32 figure published.
#   A100 (SXM4 and PCIe alike): NVIDIA A100 datasheet (nvidia-a100-datasheet-us-nvidia-1758950-
#     r4-web.pdf): BF16 tensor 312 TFLOP/s dense (624 sparse), FP32 19.5 TFLOP/s; 80 GB.
#   H100: NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100): SXM BF16 1,979 sparse →
#     989 dense, FP32 67 TFLOP/s, 80 GB; PCIe BF16 1,513 sparse → 756 dense, FP32 51, 80 GB;
#     NVL (per GPU) BF16 1,671 sparse → 835 dense, FP32 60, 94 GB.
#   H200: NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): SXM as H100 SXM (989 /
#     67) with 141 GB; NVL BF16 1,671 sparse → 835 dense, FP32 60, 141 GB.
#   B200: NVIDIA HGX B200 per-GPU specification (nvidia.com/en-us/data-center/hgx): BF16 4.5
#     PFLOP/s sparse → 2,250 dense, FP32 75 TFLOP/s; 192 GB (HBM3e, 180 GB usable on HGX).
# HBM bandwidth (GB/s = 10**9 bytes/s), the same pages:
#   TPU: docs.cloud.google.com/tpu/docs/v4 "HBM2 capacity and bandwidth 32 GiB, 1200 GBps";
#     /v5e "16 GB, 819 GBps"; /v5p "HBM bandwidth per chip (GBps) 2765"; /v6e "HBM bandwidth
#     per chip 1638 GBps" (1,640 in Google's launch material; the docs' figure kept). v4's
#     1,228 GB/s seen elsewhere is not Google's documented figure.
#   A100: the A100 datasheet, 80GB SXM 2,039 GB/s (80GB PCIe 1,935): the table's "a100"
#     covers both, so the SXM figure — a roof is an upper bound on speed.
#   H100: nvidia.com/en-us/data-center/h100 — SXM 3.35 TB/s, NVL 3.9 TB/s; the H100 PCIe
#     product brief (PB-11133-001) "greater than 2,000 GBps" → 2.0 TB/s.
#   H200: nvidia.com/en-us/data-center/h200 — 4.8 TB/s, SXM and NVL alike.
#   B200: NVIDIA HGX B200 per-GPU specification — 8 TB/s.
_GBPS = 10 ** 9
CHIP_SPECS: dict[str, ChipSpec] = {
    "v4": ChipSpec(275 * TFLOPS, None, 32 * GIB, 1200 * _GBPS),
    "v5e": ChipSpec(197 * TFLOPS, None, 16 * GIB, 819 * _GBPS),
    "v5p": ChipSpec(459 * TFLOPS, None, 95 * GIB, 2765 * _GBPS),
    "v6e": ChipSpec(918 * TFLOPS, None, 32 * GIB, 1638 * _GBPS),
    "a100": ChipSpec(312 * TFLOPS, 19.5 * TFLOPS, 80 * GIB, 2039 * _GBPS),
    "h100-sxm": ChipSpec(989 * TFLOPS, 67 * TFLOPS, 80 * GIB, 3350 * _GBPS),
    "h100-pcie": ChipSpec(756 * TFLOPS, 51 * TFLOPS, 80 * GIB, 2000 * _GBPS),
    "h100-nvl": ChipSpec(835 * TFLOPS, 60 * TFLOPS, 94 * GIB, 3900 * _GBPS),
    "h200-sxm": ChipSpec(989 * TFLOPS, 67 * TFLOPS, 141 * GIB, 4800 * _GBPS),
    "h200-nvl": ChipSpec(835 * TFLOPS, 60 * TFLOPS, 141 * GIB, 4800 * _GBPS),
    "b200": ChipSpec(2250 * TFLOPS, 75 * TFLOPS, 192 * GIB, 8000 * _GBPS),
}
"""Datasheet figures by canonical accelerator type."""


ACCELERATOR_ALIASES: dict[str, str] = {"h100": "h100-sxm", "h200": "h200-sxm"}
"""Older spellings: a bare "h100" / "h200" means the SXM part (the HGX / DGX boards). Declare
h100-pcie, h100-nvl or h200-nvl for those; the device-name check refuses the wrong one."""

ACCELERATOR_TYPES: tuple[str, ...] = (*CHIP_SPECS, *ACCELERATOR_ALIASES)
"""Every accepted accelerator type (canonical names, then aliases)."""


def canonical_accelerator_type(accelerator_type: str) -> str:
    """The table key for an accepted spelling: "H100" → "h100-sxm", "tpu-v5p" → "v5p"."""
    name = str(accelerator_type).strip().lower()
    for prefix in ("tpu-", "tpu ", "tpu_", "nvidia-", "nvidia ", "nvidia_"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    name = ACCELERATOR_ALIASES.get(name, name)
    if name not in CHIP_SPECS:
        raise ValueError(f"accelerator_type={accelerator_type!r} is not one of: "
                         f"{', '.join(ACCELERATOR_TYPES)} (case-insensitive; h100 and h200 "
                         f"mean the SXM parts)")
    return name


def check_compute_dtype(dtype: str) -> str:
    """Return `dtype` if it is a compute dtype with a peak (train_config.COMPUTE_DTYPES)."""
    if dtype not in COMPUTE_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of: {', '.join(COMPUTE_DTYPES)}")
    return dtype


def peak_dtype(accelerator_type: str, dtype: str = "bfloat16") -> str:
    """The dtype whose datasheet peak divides a `dtype` run on this chip: `dtype` itself, except
    float32 on a TPU (no float32 figure; its matmuls run as bf16 MXU passes) → "bfloat16"."""
    name = canonical_accelerator_type(accelerator_type)
    if check_compute_dtype(dtype) == "float32" and CHIP_SPECS[name].fp32_flops is None:
        return "bfloat16"
    return dtype


def peak_flops_per_chip(accelerator_type: str, dtype: str = "bfloat16") -> float:
    """Datasheet peak FLOP/s of one chip ("v5p", "H100", "h100-pcie", …) for a `dtype` run.

    dtype "bfloat16" (the default, for old callers): dense bf16; "float32": true FP32 (no
    TF32), or on a TPU its bf16 peak (`peak_dtype`). Raises ValueError for an unknown chip.
    """
    spec = CHIP_SPECS[canonical_accelerator_type(accelerator_type)]
    return (spec.bf16_dense_flops if peak_dtype(accelerator_type, dtype) == "bfloat16"
            else spec.fp32_flops)


def peak_source(accelerator_type: str, dtype: str = "bfloat16") -> str:
    """How the datasheet peak of a `dtype` run is named in results, e.g. 'datasheet_bf16_dense:
    h100-sxm', 'datasheet_fp32_no_tf32:a100', or for float32 on a TPU 'datasheet_bf16_dense:v5p
    (float32 run: TPUs publish no float32 peak; bf16 MXU peak, MaxText's convention)'."""
    name = canonical_accelerator_type(accelerator_type)
    used = peak_dtype(accelerator_type, dtype)
    kind = "bf16_dense" if used == "bfloat16" else "fp32_no_tf32"
    note = ("" if used == dtype else " (float32 run: TPUs publish no float32 peak; bf16 MXU "
            "peak, MaxText's convention)")
    return f"datasheet_{kind}:{name}{note}"


def hbm_bytes_per_chip(accelerator_type: str) -> int:
    """Return the nominal HBM capacity of one chip in bytes (vendor figure read as GiB).

    Vendors write "GB" for these numbers; the usable memory a runtime reports is somewhat lower
    (e.g. an H200 reports about 140 GiB, a B200 about 179 GiB). Use for capacity planning, not
    as an allocation limit.
    """
    return CHIP_SPECS[canonical_accelerator_type(accelerator_type)].hbm_bytes


def hbm_bandwidth_per_chip(accelerator_type: str) -> float:
    """Peak HBM bandwidth of one chip in bytes per second (datasheet; ChipSpec)."""
    return CHIP_SPECS[canonical_accelerator_type(accelerator_type)].hbm_bytes_per_s


__all__ = [
    "ACCELERATOR_ALIASES", "ACCELERATOR_TYPES", "CHIP_SPECS", "GIB", "TFLOPS", "ChipSpec",
    "canonical_accelerator_type", "check_compute_dtype", "hbm_bandwidth_per_chip",
    "hbm_bytes_per_chip", "peak_dtype", "peak_flops_per_chip", "peak_source",
]
