"""Per-chip hardware figures: datasheet peak FLOP/s by (chip, compute dtype), HBM capacity, the
chip a runtime's device name denotes, and measured GEMM peaks (torch and JAX).

The peak table is the denominator of MFU (docs/architecture.md, Metrics): the peak of the chip in
the dtype its matmuls run in. "bfloat16" is the dense (no 2:4 sparsity) bf16 tensor-core / MXU
figure; "float32" is true FP32 — not TF32: torch keeps `allow_tf32=False` for matmuls by
default and our JAX float32 path runs at Precision.HIGHEST. TPUs publish no float32 figure
(their MXUs are bf16; float32 at HIGHEST runs several bf16 passes): a float32 TPU run is
divided by the bf16 peak and recorded as such (`peak_dtype`; MaxText's convention, as
docs/architecture.md says). On CPU hosts there is no datasheet figure at all; the peak is a GEMM
calibration whose source is recorded.

torch and jax are imported only by the calibration functions, so the tables stay cheap to load.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from typing import Literal

TFLOPS = 10 ** 12
GIB = 2 ** 30

ComputeDType = Literal["float32", "bfloat16"]
PEAK_DTYPES: tuple[str, ...] = ("float32", "bfloat16")


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

@dataclasses.dataclass(frozen=True, slots=True)
class LinkPrior:
    """What a chip's interconnect is said to do, before any trial measures it."""

    bytes_per_s: float
    """Bytes per second one chip can receive over its chip-to-chip links (all of them)."""
    latency_s: float
    """Time of one dependent exchange round beyond its bytes (assumed, not a datasheet's)."""
    source: str


# Datasheet bandwidth per chip, one direction: NVLink 3/4/5 600/900/1800 GB/s both directions
# (A100, H100/H200, B200 datasheets) → 300/450/900 GB/s in; TPU ICI per chip v4 2,400 Gbps,
# v5e 1,600, v5p 4,800, v6e 3,584 (cloud.google.com/tpu/docs system architecture pages) →
# bytes/s over all links. Latencies are an order of magnitude, 10 µs (NCCL / ICI small-message
# rounds), to be replaced by the fit wherever trials at several chip counts exist. PCIe H100s
# talk over PCIe Gen5 x16 (64 GB/s per direction) without an NVLink bridge.
_NVLINK = "NVLink per-GPU bandwidth (datasheet, one direction); latency assumed 10 µs"
_ICI = "ICI bandwidth per chip (Cloud TPU system architecture); latency assumed 10 µs"
LINK_PRIORS: dict[str, LinkPrior] = {
    "v4": LinkPrior(2400e9 / 8, 10e-6, _ICI), "v5e": LinkPrior(1600e9 / 8, 10e-6, _ICI),
    "v5p": LinkPrior(4800e9 / 8, 10e-6, _ICI), "v6e": LinkPrior(3584e9 / 8, 10e-6, _ICI),
    "a100": LinkPrior(300e9, 10e-6, _NVLINK), "h100-sxm": LinkPrior(450e9, 10e-6, _NVLINK),
    "h100-nvl": LinkPrior(450e9, 10e-6, _NVLINK), "h200-sxm": LinkPrior(450e9, 10e-6, _NVLINK),
    "h200-nvl": LinkPrior(450e9, 10e-6, _NVLINK), "b200": LinkPrior(900e9, 10e-6, _NVLINK),
    "h100-pcie": LinkPrior(64e9, 10e-6, "PCIe Gen5 x16, one direction; latency assumed 10 µs"),
    "cpu": LinkPrior(2e9, 50e-6, "virtual CPU chips of one host: no datasheet; 2 GB/s and "
                     "50 µs assumed (shared-memory collectives of XLA:CPU / gloo)"),
}
"""Interconnect priors by canonical accelerator type (and "cpu"): the planner's
communication model where no trials at several chip counts fit one."""


def link_prior(accelerator_type: str) -> LinkPrior:
    """The prior of `accelerator_type` (aliases accepted; "cpu" for virtual CPU chips)."""
    if accelerator_type == "cpu":
        return LINK_PRIORS["cpu"]
    return LINK_PRIORS[canonical_accelerator_type(accelerator_type)]


ACCELERATOR_ALIASES: dict[str, str] = {"h100": "h100-sxm", "h200": "h200-sxm"}
"""Older spellings: a bare "h100" / "h200" means the SXM part (the HGX / DGX boards). Declare
h100-pcie, h100-nvl or h200-nvl for those; the device-name check refuses the wrong one."""

ACCELERATOR_TYPES: tuple[str, ...] = (*CHIP_SPECS, *ACCELERATOR_ALIASES)
"""Every accepted accelerator type (canonical names, then aliases)."""

PEAK_BF16_DENSE_FLOPS_PER_CHIP: dict[str, float] = {
    name: CHIP_SPECS[canonical_name].bf16_dense_flops
    for name, canonical_name in ((n, ACCELERATOR_ALIASES.get(n, n)) for n in ACCELERATOR_TYPES)}
"""Peak bf16 dense FLOP/s by accepted accelerator type (aliases included), for old callers."""

HBM_BYTES_PER_CHIP: dict[str, int] = {
    name: CHIP_SPECS[ACCELERATOR_ALIASES.get(name, name)].hbm_bytes for name in ACCELERATOR_TYPES}
"""Nominal HBM capacity per chip in bytes, taking the vendors' figures as GiB (2**30 bytes).

Vendors write "GB" for these numbers; the usable memory a runtime reports is somewhat lower
(e.g. an H200 reports about 140 GiB, a B200 about 179 GiB). Use for capacity planning, not as
an allocation limit.
"""


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


def _check_dtype(dtype: str) -> str:
    if dtype not in PEAK_DTYPES:
        raise ValueError(f"dtype={dtype!r} is not one of: {', '.join(PEAK_DTYPES)}")
    return dtype


def peak_dtype(accelerator_type: str, dtype: str = "bfloat16") -> str:
    """The dtype whose datasheet peak divides a `dtype` run on this chip: `dtype` itself, except
    float32 on a TPU (no float32 figure; its matmuls run as bf16 MXU passes) → "bfloat16"."""
    name = canonical_accelerator_type(accelerator_type)
    if _check_dtype(dtype) == "float32" and CHIP_SPECS[name].fp32_flops is None:
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
    """Return the nominal HBM capacity of one chip in bytes (vendor figure read as GiB)."""
    return CHIP_SPECS[canonical_accelerator_type(accelerator_type)].hbm_bytes


def hbm_bandwidth_per_chip(accelerator_type: str) -> float:
    """Peak HBM bandwidth of one chip in bytes per second (datasheet; ChipSpec)."""
    return CHIP_SPECS[canonical_accelerator_type(accelerator_type)].hbm_bytes_per_s


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


# ---------------------------------------------------------------------------- calibration


@dataclasses.dataclass(frozen=True, slots=True)
class PeakMeasurement:
    """A measured GEMM throughput and where it came from."""

    flops_per_s: float
    """Median FLOP/s of the timed GEMMs (2·n³ FLOPs per n×n×n GEMM)."""
    source: str
    """How it was measured, e.g. 'cpu_gemm_calibration:torch:fp32:1024^3:threads=2'."""


_DTYPE_TAGS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


def _median_rate(run_once: Callable[[int], float], *, size: int, seconds: float,
                 min_samples: int) -> float:
    """Median FLOP/s of size³ GEMMs; run_once(reps) times `reps` back-to-back GEMMs, synced."""
    first = max(run_once(1), run_once(1))  # warm-up (allocations, kernel selection, compile)
    reps = max(1, int(seconds / 10 / max(first, 1e-9)))
    samples, deadline = [], time.perf_counter() + seconds
    while len(samples) < min_samples or time.perf_counter() < deadline:
        samples.append(run_once(reps) / reps)
    return 2 * size ** 3 / statistics.median(samples)


def _check_timing(size, seconds) -> None:
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"size={size!r} must be a positive integer")
    if not seconds > 0:
        raise ValueError(f"seconds={seconds!r} must be positive")


CALIBRATION_GEMM_SIZE = {"cpu": 1024, "cuda": 8192}
"""Side of the square GEMMs of a peak measurement, per device (the benchmarks' calibrations)."""


def measure_gemm_flops_per_s(*, device="cpu", size: int = 1024, seconds: float = 1.0,
                             dtype="float32", min_samples: int = 5) -> PeakMeasurement:
    """Time repeated size×size×size torch GEMMs on `device`; return the median FLOP/s.

    dtype: "float32" / "bfloat16" or a torch dtype. Each sample times enough back-to-back
    GEMMs to last about seconds / 10 (one GEMM on a CPU, many on a GPU, where one is
    microseconds), with the device synchronised; sampling stops once `seconds` have passed
    and at least `min_samples` samples exist. On CPU it uses torch's current threads.
    """
    import torch

    _check_timing(size, seconds)
    if str(device).split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r} is not one of: cpu, cuda (optionally cuda:N)")
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    dev = torch.device(device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device=dev, dtype=dtype)
    b = torch.randn(size, size, generator=gen).to(device=dev, dtype=dtype)
    out = torch.empty(size, size, device=dev, dtype=dtype)

    def timed(reps: int) -> float:
        sync()
        start = time.perf_counter()
        for _ in range(reps):
            torch.matmul(a, b, out=out)
        sync()
        return time.perf_counter() - start

    flops_per_s = _median_rate(timed, size=size, seconds=seconds, min_samples=min_samples)
    tag = _DTYPE_TAGS.get(str(dtype).removeprefix("torch."), str(dtype))
    where = (f"threads={torch.get_num_threads()}" if dev.type == "cpu"
             else torch.cuda.get_device_name(dev))
    return PeakMeasurement(flops_per_s=flops_per_s,
                           source=f"{dev.type}_gemm_calibration:torch:{tag}:{size}^3:{where}")


def measure_jax_gemm_flops_per_s(*, size: int = 1024, seconds: float = 1.0,
                                 dtype: str = "float32", device=None,
                                 min_samples: int = 5) -> PeakMeasurement:
    """Time a jitted size×size×size jnp.matmul on one JAX device; return the median FLOP/s.

    The matmul the model runs: float32 at Precision.HIGHEST; bfloat16 inputs with
    preferred_element_type=float32. On CPU, XLA runs it on its whole intra-op thread pool (all
    cores this process may use), so it measures the process, not one virtual device.
    device: a jax.Device (default jax.local_devices()[0]).
    """
    import jax
    import jax.numpy as jnp

    _check_timing(size, seconds)
    _check_dtype(dtype)
    device = device or jax.local_devices()[0]
    keys = jax.random.split(jax.random.PRNGKey(0))
    a, b = (jax.device_put(jax.random.normal(k, (size, size), jnp.float32).astype(dtype), device)
            for k in keys)
    if dtype == "float32":
        matmul = jax.jit(lambda x, y: jnp.matmul(x, y, precision=jax.lax.Precision.HIGHEST))
    else:
        matmul = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))

    def timed(reps: int) -> float:
        start = time.perf_counter()
        for _ in range(reps):
            out = matmul(a, b)
        out.block_until_ready()
        return time.perf_counter() - start

    flops_per_s = _median_rate(timed, size=size, seconds=seconds, min_samples=min_samples)
    where = "" if device.platform == "cpu" else f":{device.device_kind}"
    return PeakMeasurement(
        flops_per_s=flops_per_s,
        source=f"{device.platform}_gemm_calibration:jax:{_DTYPE_TAGS[dtype]}:{size}^3{where}")


def calibrate_cpu_peak_flops(*, size: int = 1024, seconds: float = 1.0,
                             dtype="float32") -> PeakMeasurement:
    """Measure this process's torch GEMM peak on CPU with its current threads and affinity.

    Machines are shared and noisy: compare runs measured side by side, not remembered numbers.
    """
    return measure_gemm_flops_per_s(device="cpu", size=size, seconds=seconds, dtype=dtype)


__all__ = [
    "ACCELERATOR_ALIASES", "ACCELERATOR_TYPES", "CHIP_SPECS", "ChipSpec", "ComputeDType",
    "HBM_BYTES_PER_CHIP", "PEAK_BF16_DENSE_FLOPS_PER_CHIP", "PEAK_DTYPES", "PeakMeasurement",
    "accelerator_type_from_device_name", "calibrate_cpu_peak_flops",
    "canonical_accelerator_type", "device_mismatch", "hbm_bandwidth_per_chip",
    "hbm_bytes_per_chip",
    "measure_gemm_flops_per_s", "measure_jax_gemm_flops_per_s", "LINK_PRIORS", "LinkPrior",
    "link_prior",
    "peak_flops_per_chip", "peak_source",
]
