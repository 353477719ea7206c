"""Memory admission: will a trial's step fit its chip? Run by workers.grid.expand_trials, so
every way a sweep comes in (the API, `gdn-sweep run`, the JSONL path) is checked the same.

A measured point whose predicted memory per chip (gdn_core.memory) exceeds the chip's
(chip_memory_bytes) is kept as skipped with the prediction, unless the sweep sets
`admit_over_memory`; on a GPU the trial's own process asks again, of the memory its device
reports (device_memory_problem), before the step is built. (Not service.runs.admission: what every way in refuses beyond the
SweepSpec's own checks, the grid cap.)
"""

from __future__ import annotations

import os

from gdn_core import datasheets
from gdn_core.config import ModelConfig
from gdn_core.cp_modes import CPSettings
from gdn_core.device_memory import gpu_usable_bytes_here, usable_chip_bytes
from gdn_core.memory.step import predict_step_memory
from gdn_core.train_config import TrainConfig

from .sweep_spec import AcceleratorSpec


def host_memory_bytes() -> int | None:
    """Physical memory of the host this process runs on (None where the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def chip_memory_bytes(accelerator: AcceleratorSpec, chips: int,
                      framework: str | None = None) -> tuple[int | None, str]:
    """(bytes, what they are) of one chip of a `chips`-chip trial: the HBM of a GPU/TPU type
    (gdn_core.datasheets.CHIP_SPECS), or with `framework` what a trial of it can allocate there.
    On a GPU that figure is read from the device where this process already runs `framework`
    on one of the type (gdn_core.device_memory.gpu_usable_bytes_here: torch.cuda.mem_get_info's
    total, JAX's bytes_limit: a card reports less than its datasheet's round figure, ~79.6 of
    "80 GB"), else computed from the datasheet (usable_chip_bytes: JAX's stated fraction,
    torch's all but the CUDA context), the text naming which. For CPU chips, the physical
    memory of the host that expands the sweep (the service's, or `gdn-sweep run`'s) shared by
    the trial's chips, virtual CPU chips being partitions of one host. None: unknown, nothing
    is refused."""
    if accelerator.kind != "cpu":
        hbm = datasheets.hbm_bytes_per_chip(accelerator.type)
        nominal = f"the {_gib(hbm)} HBM of one {accelerator.type} chip"
        if framework is None:
            return hbm, nominal
        measured = (gpu_usable_bytes_here(framework, accelerator.type)
                    if accelerator.kind == "gpu" else None)
        if measured is not None:
            usable, source = measured
            return usable, (f"the {_gib(usable)} a {framework} trial can allocate on one "
                            f"{accelerator.type} chip, as this process's device reports it "
                            f"({source})")
        usable = usable_chip_bytes(hbm, framework=framework, accelerator_kind=accelerator.kind)
        return usable, (f"the {_gib(usable)} a {framework} trial can allocate of {nominal} "
                        "(datasheet, gdn_core.datasheets.CHIP_SPECS: no such device in use by "
                        "this process to ask)")
    host = host_memory_bytes()
    if host is None:
        return None, "unknown"
    return host // chips, (f"{_gib(host // chips)} per chip: this host's {_gib(host)} of RAM "
                           f"shared by {chips} CPU chip(s)")


def _gib(n: int) -> str:
    return f"{n / datasheets.GIB:.1f} GiB"


def memory_problem(model_cfg: ModelConfig, train_cfg: TrainConfig, cp: CPSettings, *,
                   framework: str, accelerator: AcceleratorSpec) -> str | None:
    """Why the step is predicted not to fit one of the accelerator's chips (None: it fits, or
    the chip's memory is unknown)."""
    available, what = chip_memory_bytes(accelerator, cp.chips, framework)
    if available is None:
        return None
    return _over(model_cfg, train_cfg, cp, framework=framework, available=available,
                 what=what)


def device_memory_problem(model_cfg: ModelConfig, train_cfg: TrainConfig, cp: CPSettings, *,
                          framework: str, accelerator_type: str) -> str | None:
    """The same question on a trial's own GPU process, against what its device reports usable
    (gdn_core.device_memory.gpu_usable_bytes_here: a card's real total, JAX's real limit),
    which the sweep's expansion, on a host without the GPU, could only take from the
    datasheet. None: it fits, or the device says nothing (CPU, TPU, not yet in use)."""
    usable = gpu_usable_bytes_here(framework, accelerator_type)
    if usable is None:
        return None
    available, source = usable
    return _over(model_cfg, train_cfg, cp, framework=framework, available=available,
                 what=f"the {_gib(available)} this {accelerator_type} reports usable "
                      f"({source})")


def _over(model_cfg, train_cfg, cp, *, framework: str, available: int, what: str) -> str | None:
    # What the trial allocates: a MoE preset's dense stand-in (the planner counts the experts).
    predicted = predict_step_memory(model_cfg.stand_in, train_cfg, mode=cp.mode,
                                    chips=cp.cp_chips, dp=cp.dp, framework=framework,
                                    attn_cp=cp.attn_cp, layout=cp.layout,
                                    kernels=cp.kernels).total
    if predicted <= available:
        return None
    return (f"predicted memory {_gib(predicted)} per chip ({predicted} bytes, "
            f"gdn_core.memory.step.predict_step_memory) exceeds {what}; set "
            "admit_over_memory: true to run it anyway")


__all__ = ["chip_memory_bytes", "device_memory_problem", "host_memory_bytes", "memory_problem"]
