"""Measured memory of this process's chips, and how much one chip can hold.

Measured figures only (the estimates live elsewhere: XLA's memory analysis in jax_gdn.train,
the analytic predictor in gdn_core.memory). Sources, as stored with every result:
    cuda_max_allocated          torch.cuda.max_memory_allocated since the run's reset
    jax_peak_bytes_in_use       max over this process's devices of memory_stats()
                                ["peak_bytes_in_use"], a new high set during the run
    jax_peak_bytes_in_use_process_lifetime
                                the same figure when the run set no new high: JAX cannot reset
                                it, so it may belong to an earlier, larger run in this process
    process_rss_peak            CPU: this process's resident-set high-water mark (VmHWM) since
                                the run reset it
    process_rss_peak/{n}_chips  CPU, one JAX process driving n chips: that mark divided by n
    process_rss_peak_lifetime   CPU without a resettable mark (not Linux): ru_maxrss
Framework modules are imported inside the functions, so a torch-only or JAX-only process
loads only its own.
"""

from __future__ import annotations

import os
import resource
import sys
from pathlib import Path

RSS_SOURCE = "process_rss_peak"


def status_kib(field: str) -> int | None:
    """A /proc/self/status field in KiB (VmHWM, VmSize, …); None where it cannot be read."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset this process's resident-set high-water mark (Linux); False where unsupported."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss() -> tuple[int, str]:
    """(bytes, source) of this process's resident-set high-water mark (module docstring)."""
    hwm_kib = status_kib("VmHWM")
    if hwm_kib is not None:
        return hwm_kib * 1024, RSS_SOURCE
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return int(rss if sys.platform == "darwin" else rss * 1024), f"{RSS_SOURCE}_lifetime"


def per_chip_rss(chips: int) -> tuple[int, str]:
    """peak_rss shared out over the `chips` chips one process drives, labelled so."""
    peak, source = peak_rss()
    if chips <= 1:
        return peak, source
    return peak // chips, f"{source}/{chips}_chips"


def host_available_bytes() -> int | None:
    """MemAvailable of /proc/meminfo: what this host could give without swapping (Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


# --------------------------------------------------------------------------- torch

def torch_reset_peak(device) -> None:
    """Start a run's measurement on a torch device: CUDA's peak stats, or the process RSS mark."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        reset_peak_rss()


def torch_peak_memory(device) -> tuple[int, str]:
    """(bytes, source) measured since torch_reset_peak: CUDA's allocator peak, else RSS."""
    import torch

    if torch.device(device).type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_allocated"
    return peak_rss()


def torch_chip_capacity(device, *, chips_on_host: int = 1) -> tuple[int | None, str]:
    """(bytes one chip can hold, source): the GPU's total memory, or on CPU the host's
    MemAvailable shared over chips_on_host chips."""
    import torch

    if torch.device(device).type == "cuda":
        return int(torch.cuda.mem_get_info(device)[1]), "cuda_mem_get_info_total"
    return _cpu_share(chips_on_host)


def _cpu_share(chips: int) -> tuple[int | None, str]:
    available = host_available_bytes()
    if available is None:
        return None, "unknown"
    return available // max(chips, 1), f"mem_available/{max(chips, 1)}_chips"


# --------------------------------------------------------------------------- JAX

def _device_stats(device) -> dict | None:
    try:
        return device.memory_stats()
    except Exception:  # some backends raise instead of returning None
        return None


def _device_peak(devices) -> int | None:
    peaks = [(_device_stats(d) or {}).get("peak_bytes_in_use") for d in devices]
    return max(peaks) if peaks and all(p is not None for p in peaks) else None


def jax_reset_peak(devices) -> int | None:
    """Start a run's measurement over this process's JAX devices; return the baseline.

    CPU: resets the process RSS mark (returns None). Accelerators: returns the peak so far,
    which JAX cannot reset, so jax_peak_memory can tell whether the run set a new high.
    """
    if devices[0].platform == "cpu":
        reset_peak_rss()
        return None
    return _device_peak(devices)


def jax_peak_memory(devices, *, baseline: int | None = None) -> tuple[int | None, str]:
    """(bytes per chip, source) measured over this process's devices (module docstring).

    devices: this process's JAX devices (jax.local_devices()); baseline: jax_reset_peak's
    return. CPU: the process RSS mark / len(devices). Accelerators: the largest device peak,
    or (None, "unknown") where memory_stats says nothing.
    """
    if devices[0].platform == "cpu":
        return per_chip_rss(len(devices))
    peak = _device_peak(devices)
    if peak is None:
        return None, "unknown"
    new_high = baseline is None or peak > baseline
    return peak, "jax_peak_bytes_in_use" if new_high else \
        "jax_peak_bytes_in_use_process_lifetime"


JAX_GPU_MEMORY_FRACTION = 0.95
"""The share of a GPU's memory a JAX trial process may allocate
(XLA_PYTHON_CLIENT_MEM_FRACTION; JAX's default is 0.75, preallocated at start)."""
CUDA_CONTEXT_RESERVE_BYTES = 1 << 30
"""What a torch process on a GPU cannot give its caching allocator: the CUDA context and the
cuBLAS, cuDNN and NCCL workspaces. Assumed (typically 0.5–1 GiB), not measured here."""


def jax_gpu_allocator_env() -> dict[str, str]:
    """The environment of a JAX process measuring on a GPU: no preallocation (so
    peak_bytes_in_use is the run's own, not 75% of the GPU taken at start) and a stated limit
    (JAX_GPU_MEMORY_FRACTION, what usable_chip_bytes admits against)."""
    return {"XLA_PYTHON_CLIENT_PREALLOCATE": "false",
            "XLA_PYTHON_CLIENT_MEM_FRACTION": str(JAX_GPU_MEMORY_FRACTION)}


def usable_chip_bytes(hbm_bytes: int, *, framework: str, accelerator_kind: str) -> int:
    """What a trial of `framework` can allocate on one chip of `hbm_bytes`: on a GPU, JAX's
    stated fraction of it (jax_gpu_allocator_env) or, for torch, all but the CUDA context's
    reserve; on a TPU the whole HBM (the runtime's own reserve is not known here). From the
    datasheet's figure this is the fallback where the device cannot be asked
    (gpu_usable_bytes_here): a card reports a little less (an H100 80GB about 79.6 GiB)."""
    if accelerator_kind != "gpu":
        return hbm_bytes
    if framework == "jax":
        return int(hbm_bytes * JAX_GPU_MEMORY_FRACTION)
    return hbm_bytes - CUDA_CONTEXT_RESERVE_BYTES


def torch_gpu_usable_bytes(device=0) -> tuple[int, str]:
    """(bytes, source) a torch trial can allocate on this CUDA device, as the device reports
    it: torch.cuda.mem_get_info's total less CUDA_CONTEXT_RESERVE_BYTES. Creates this process's
    CUDA context if it has none: call it where the GPU is used anyway."""
    import torch

    total = int(torch.cuda.mem_get_info(device)[1])
    return total - CUDA_CONTEXT_RESERVE_BYTES, (
        f"torch.cuda.mem_get_info total {total / 2**30:.1f} GiB of "
        f"{torch.cuda.get_device_name(device)!r}, less the assumed "
        f"{CUDA_CONTEXT_RESERVE_BYTES / 2**30:g} GiB CUDA context reserve")


def jax_gpu_usable_bytes(device) -> tuple[int, str] | None:
    """(bytes, source) a JAX trial can allocate on this GPU device, as JAX reports it: its
    memory_stats()["bytes_limit"], when this process runs JAX at the trials' fraction
    (JAX_GPU_MEMORY_FRACTION); None where it runs at another or JAX does not say."""
    fraction = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION")
    if fraction is None or float(fraction) != JAX_GPU_MEMORY_FRACTION:
        return None  # this process's limit is not what a trial's would be
    limit = (_device_stats(device) or {}).get("bytes_limit")
    if limit is None:
        return None
    return int(limit), (f"jax memory_stats bytes_limit of {device.device_kind!r} "
                        f"(XLA_PYTHON_CLIENT_MEM_FRACTION={fraction})")


def gpu_usable_bytes_here(framework: str, accelerator_type: str) -> tuple[int, str] | None:
    """What a `framework` trial can allocate on one `accelerator_type` GPU, read from this
    process's first GPU where the process already runs `framework` on one of that type, else
    None (the caller falls back on the datasheet). Never starts a CUDA context or a JAX
    backend for the asking: a driver that admits a sweep keeps its GPU memory untouched."""
    from .datasheets import canonical_accelerator_type
    from .device_names import accelerator_type_from_device_name

    wanted = canonical_accelerator_type(accelerator_type)
    try:
        if framework == "torch" and "torch" in sys.modules:
            import torch

            if torch.cuda.is_initialized() and accelerator_type_from_device_name(
                    torch.cuda.get_device_name(0)) == wanted:
                return torch_gpu_usable_bytes(0)
        elif framework == "jax" and "jax" in sys.modules:
            from jax._src import xla_bridge  # private: whether JAX has started its backends

            if xla_bridge.backends_are_initialized():
                import jax

                gpus = [d for d in jax.local_devices() if d.platform == "gpu"]
                if gpus and accelerator_type_from_device_name(gpus[0].device_kind) == wanted:
                    return jax_gpu_usable_bytes(gpus[0])
    except Exception:  # noqa: BLE001 - a device that cannot say leaves the datasheet's figure
        return None
    return None


def jax_chip_capacity(devices) -> tuple[int | None, str]:
    """(bytes one chip can hold, source): memory_stats' bytes_limit on GPU/TPU, else the
    host's MemAvailable shared over this process's chips."""
    if devices[0].platform == "cpu":
        return _cpu_share(len(devices))
    limits = [(_device_stats(d) or {}).get("bytes_limit") for d in devices]
    if all(limit is not None for limit in limits):
        return int(min(limits)), "jax_bytes_limit"
    return None, "unknown"


__all__ = ["CUDA_CONTEXT_RESERVE_BYTES", "JAX_GPU_MEMORY_FRACTION", "RSS_SOURCE",
           "gpu_usable_bytes_here", "host_available_bytes", "jax_chip_capacity",
           "jax_gpu_allocator_env", "jax_gpu_usable_bytes", "jax_peak_memory", "jax_reset_peak",
           "peak_rss", "per_chip_rss", "reset_peak_rss", "torch_chip_capacity",
           "torch_gpu_usable_bytes", "torch_peak_memory", "torch_reset_peak",
           "usable_chip_bytes"]
