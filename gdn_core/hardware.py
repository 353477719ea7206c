"""Per-chip hardware figures: peak bf16 dense FLOP/s, HBM capacity, and a measured GEMM peak.

The peak table is the denominator of MFU (ARCHITECTURE.md, Metrics). On CPU hosts there is no
datasheet figure, so the peak is measured with a GEMM calibration and its source is recorded.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import torch

TFLOPS = 10 ** 12
GIB = 2 ** 30

PEAK_BF16_DENSE_FLOPS_PER_CHIP: dict[str, float] = {
    "v4": 275 * TFLOPS,
    "v5e": 197 * TFLOPS,
    "v5p": 459 * TFLOPS,
    "v6e": 918 * TFLOPS,
    "a100": 312 * TFLOPS,
    "h100": 989 * TFLOPS,
    "h200": 989 * TFLOPS,
    "b200": 2250 * TFLOPS,
}
"""Datasheet peak bf16 dense (no structured sparsity) FLOP/s per chip, by accelerator type."""

HBM_BYTES_PER_CHIP: dict[str, int] = {
    "v4": 32 * GIB,
    "v5e": 16 * GIB,
    "v5p": 95 * GIB,
    "v6e": 32 * GIB,
    "a100": 80 * GIB,
    "h100": 80 * GIB,
    "h200": 141 * GIB,
    "b200": 192 * GIB,
}
"""Nominal HBM capacity per chip in bytes, taking the vendors' figures as GiB (2**30 bytes).

Vendors write "GB" for these numbers; the usable memory a runtime reports is somewhat lower
(e.g. an H200 reports about 140 GiB, a B200 about 179 GiB). Use for capacity planning, not as
an allocation limit.
"""

ACCELERATOR_TYPES: tuple[str, ...] = tuple(PEAK_BF16_DENSE_FLOPS_PER_CHIP)

# Device names as runtimes spell them (torch.cuda.get_device_name, jax device_kind), lower case.
_DEVICE_NAME_ALIASES: tuple[tuple[str, str], ...] = (
    ("v5 lite", "v5e"), ("v5litepod", "v5e"), ("v6 lite", "v6e"), ("v5p", "v5p"), ("v5e", "v5e"),
    ("v6e", "v6e"), ("v4", "v4"), ("a100", "a100"), ("h100", "h100"), ("h200", "h200"),
    ("b200", "b200"),
)


def _normalise(accelerator_type: str) -> str:
    name = str(accelerator_type).strip().lower()
    for prefix in ("tpu-", "tpu ", "tpu_", "nvidia-", "nvidia ", "nvidia_"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    if name not in PEAK_BF16_DENSE_FLOPS_PER_CHIP:
        raise ValueError(f"accelerator_type={accelerator_type!r} is not one of: "
                         f"{', '.join(ACCELERATOR_TYPES)} (case-insensitive)")
    return name


def peak_flops_per_chip(accelerator_type: str) -> float:
    """Return the datasheet peak bf16 dense FLOP/s of one chip ("v5p", "H100", "tpu-v4", …)."""
    return PEAK_BF16_DENSE_FLOPS_PER_CHIP[_normalise(accelerator_type)]


def hbm_bytes_per_chip(accelerator_type: str) -> int:
    """Return the nominal HBM capacity of one chip in bytes (vendor figure read as GiB)."""
    return HBM_BYTES_PER_CHIP[_normalise(accelerator_type)]


def accelerator_type_from_device_name(device_name: str) -> str | None:
    """Map a runtime's device name ("NVIDIA H100 80GB HBM3", "TPU v5 lite") to a table key.

    Returns None for a device the tables do not know (a CPU, another GPU).
    """
    name = device_name.lower()
    for needle, key in _DEVICE_NAME_ALIASES:
        if needle in name:
            return key
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class PeakMeasurement:
    """A measured GEMM throughput and where it came from."""

    flops_per_s: float
    """Median FLOP/s of the timed GEMMs (2·n³ FLOPs per n×n×n GEMM)."""
    source: str
    """How it was measured, e.g. 'cpu_gemm_calibration:fp32:1024^3:torch.get_num_threads()=2'."""


_DTYPE_TAGS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}


def measure_gemm_flops_per_s(*, device: str | torch.device = "cpu", size: int = 1024,
                             seconds: float = 1.0, dtype: torch.dtype = torch.float32,
                             min_samples: int = 5) -> PeakMeasurement:
    """Time repeated size×size×size torch GEMMs on `device`; return the median FLOP/s.

    Each sample times enough back-to-back GEMMs to last about seconds / 10 (one GEMM on a CPU,
    many on a GPU, where one is microseconds), with the device synchronised; sampling stops
    once `seconds` have passed and at least `min_samples` samples exist.
    """
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"size={size!r} must be a positive integer")
    if not seconds > 0:
        raise ValueError(f"seconds={seconds!r} must be positive")
    if str(device).split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r} is not one of: cpu, cuda (optionally cuda:N)")
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

    first = max(timed(1), timed(1))  # warm-up (allocations, kernel selection)
    reps = max(1, int(seconds / 10 / max(first, 1e-9)))
    samples, deadline = [], time.perf_counter() + seconds
    while len(samples) < min_samples or time.perf_counter() < deadline:
        samples.append(timed(reps) / reps)
    flops_per_s = 2 * size ** 3 / statistics.median(samples)
    tag = _DTYPE_TAGS.get(str(dtype).removeprefix("torch."), str(dtype))
    where = (f"torch.get_num_threads()={torch.get_num_threads()}" if dev.type == "cpu"
             else torch.cuda.get_device_name(dev))
    return PeakMeasurement(flops_per_s=flops_per_s,
                           source=f"{dev.type}_gemm_calibration:{tag}:{size}^3:{where}")


def calibrate_cpu_peak_flops(*, size: int = 1024, seconds: float = 1.0,
                             dtype: torch.dtype = torch.float32) -> PeakMeasurement:
    """Measure this host's GEMM peak through torch (the MFU denominator on CPU hosts).

    Machines are shared and noisy: compare runs measured side by side, not remembered numbers.
    """
    return measure_gemm_flops_per_s(device="cpu", size=size, seconds=seconds, dtype=dtype)


__all__ = [
    "ACCELERATOR_TYPES", "HBM_BYTES_PER_CHIP", "PEAK_BF16_DENSE_FLOPS_PER_CHIP", "PeakMeasurement",
    "accelerator_type_from_device_name", "calibrate_cpu_peak_flops", "hbm_bytes_per_chip",
    "measure_gemm_flops_per_s", "peak_flops_per_chip",
]
