"""Measured GEMM peaks, in torch and in JAX: the MFU denominator where no datasheet has one.

A virtual CPU chip (and a GPU the datasheet table lacks) has no published peak; its peak is a
GEMM calibration in the trial's dtype, with the trial's own framework, under the trial's
affinity (docs/architecture.md, Metrics), recorded with how it was measured.

torch and jax are imported inside the functions that use them, so importing this module costs
neither.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

from .datasheets import check_compute_dtype


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
    check_compute_dtype(dtype)
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


__all__ = ["CALIBRATION_GEMM_SIZE", "PeakMeasurement", "calibrate_cpu_peak_flops",
           "measure_gemm_flops_per_s", "measure_jax_gemm_flops_per_s"]
