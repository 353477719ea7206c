"""The step table's memory plan: each row's predicted memory per chip against the GPUs a device
check may be lent, and the check a row makes before it runs.

    python -m gdn_core.bench step --plan [the step options]

prints, without a GPU, torch's CUDA or a JAX compile (shapes and arithmetic only), one line per
row the step table would run (framework × kernels at its preset, layers, seq_len, remat and
dtype) with gdn_core.memory.step.predict_step_memory's figure (kernels-aware: fused torch GDN
adds fla-core's workspace, an estimate until measured on a chip) beside what the row's framework
can allocate on an H100 80GB and an H200 141GB (PLAN_GPUS; from the datasheet HBM through
gdn_core.device_memory.usable_chip_bytes: JAX's stated fraction, torch's all but the CUDA
context; a card reports a little less than its datasheet's round figure, which the run itself
reads: usable_here).

When the table runs, each row's child asks its own device first (usable_here) and a row
predicted over it is `skipped` with "predicted X GiB > usable Y GiB (source)", never started.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from ..cp_modes import ONE_CHIP_CP_MODE

PLAN_GPUS = (("h100-sxm", "H100 80GB"), ("h200-sxm", "H200 141GB"))
"""(gdn_core.datasheets chip type, label) of the GPUs a device check may be lent."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class PlannedRow:
    framework: str
    kernels: str
    preset: str
    layers: int
    seq_len: int
    batch: int
    remat: str
    dtype: str
    predicted_bytes: int
    kernel_workspace_bytes: int
    kernel_workspace_source: str
    usable: dict[str, int]
    """PLAN_GPUS label → bytes the row's framework can allocate there (datasheet)."""

    def fits(self, gpu_label: str) -> bool:
        return self.predicted_bytes <= self.usable[gpu_label]


def predicted_memory(model_cfg, *, batch: int, seq_len: int, dtype: str, remat: str,
                     framework: str, kernels: str):
    """predict_step_memory of a step table row: the sweep's one-chip step of what it runs (a
    MoE preset's dense stand-in), replicated weights, AdamW."""
    from ..memory.step import predict_step_memory
    from ..train_config import TrainConfig

    train_cfg = TrainConfig(batch_size=batch, seq_len=seq_len, dtype=dtype, remat=remat)
    return predict_step_memory(model_cfg.stand_in, train_cfg, mode=ONE_CHIP_CP_MODE, chips=1,
                               framework=framework, kernels=kernels)


def datasheet_usable_bytes(accelerator_type: str, framework: str) -> int:
    """What a `framework` trial can allocate on one `accelerator_type` GPU, by its datasheet."""
    from ..device_memory import usable_chip_bytes
    from ..datasheets import hbm_bytes_per_chip

    return usable_chip_bytes(hbm_bytes_per_chip(accelerator_type), framework=framework,
                             accelerator_kind="gpu")


def plan_rows(model_cfg, *, preset: str, batch: int, seq_len: int, remat: str,
              dtypes: Sequence[str], frameworks: Sequence[str],
              kernels: Sequence[str]) -> list[PlannedRow]:
    """The rows in the table's order (dtype, framework, kernels), each with its prediction."""
    rows = []
    for dtype in dtypes:
        for framework in frameworks:
            for kernel in kernels:
                memory = predicted_memory(model_cfg, batch=batch, seq_len=seq_len, dtype=dtype,
                                          remat=remat, framework=framework, kernels=kernel)
                rows.append(PlannedRow(
                    framework=framework, kernels=kernel, preset=preset,
                    layers=model_cfg.num_layers, seq_len=seq_len, batch=batch, remat=remat,
                    dtype=dtype, predicted_bytes=memory.total,
                    kernel_workspace_bytes=memory.kernel_workspace,
                    kernel_workspace_source=memory.kernel_workspace_source,
                    usable={label: datasheet_usable_bytes(kind, framework)
                            for kind, label in PLAN_GPUS}))
    return rows


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}"


def format_plan(rows: Sequence[PlannedRow]) -> str:
    """The plan as an aligned table, then how each figure was reached."""
    from ..kernels import FLA_HOPPER_BAD_TRITON

    head = ["framework", "kernels", "preset", "layers", "seq_len", "remat", "dtype",
            "predicted GiB"]
    for _, label in PLAN_GPUS:
        head += [f"{label} usable GiB", "fits"]
    cells = [head]
    for row in rows:
        line = [row.framework, row.kernels, row.preset, str(row.layers), str(row.seq_len),
                row.remat, row.dtype, _gib(row.predicted_bytes)]
        for _, label in PLAN_GPUS:
            line += [_gib(row.usable[label]), "yes" if row.fits(label) else "NO"]
        cells.append(line)
    widths = [max(len(line[i]) for line in cells) for i in range(len(head))]
    text = ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells]
    text.append("predicted: gdn_core.memory.step.predict_step_memory (one chip, replicated "
                "weights, AdamW); usable: the datasheet HBM less what the framework cannot "
                "allocate (gdn_core.device_memory.usable_chip_bytes); each row re-checks "
                "against its own device before it runs")
    for row in rows:
        label = f"{row.framework} {row.kernels} {row.dtype}"
        if row.kernel_workspace_bytes:
            text.append(f"{label}: includes {_gib(row.kernel_workspace_bytes)} GiB of kernel "
                        f"workspace ({row.kernel_workspace_source})")
        elif row.kernels == "fused":
            text.append(f"{label}: no kernel workspace added (no GDN layers; blockwise "
                        "fused attention as the reference's)")
        if row.framework == "torch" and row.kernels == "fused":
            low, high = FLA_HOPPER_BAD_TRITON
            text.append(f"{label}: on Hopper with {low} <= Triton < {high} and no tilelang "
                        "fla-core refuses its gated backward (fla #640): the row then reports "
                        "skipped with fla's reason")
    return "\n".join(text)


def usable_here(device: str, framework: str) -> tuple[int | None, str]:
    """(bytes, source) a `framework` step can allocate on this process's device (a step table
    row's child, which uses the device anyway): the GPU's own figure (torch's mem_get_info
    total, JAX's bytes_limit), else the datasheet of the GPU it names; on CPU the host's
    MemAvailable."""
    from .. import device_memory
    from ..device_names import accelerator_type_from_device_name

    if device == "cpu":
        available = device_memory.host_available_bytes()
        return available, "host MemAvailable (/proc/meminfo)"
    if framework == "torch":
        return device_memory.torch_gpu_usable_bytes(0)
    import jax

    try:
        gpu = jax.devices("gpu")[0]
    except RuntimeError as err:  # the row itself then says why, in its own words
        return None, f"unknown: JAX has no gpu device ({err})"
    measured = device_memory.jax_gpu_usable_bytes(gpu)
    if measured is not None:
        return measured
    kind = accelerator_type_from_device_name(gpu.device_kind)
    if kind is None:
        return None, f"unknown: JAX does not say, and {gpu.device_kind!r} is not in the table"
    return datasheet_usable_bytes(kind, "jax"), f"datasheet of {kind} (JAX does not say)"


def memory_refusal(predicted: int, usable: int | None, source: str) -> str | None:
    """Why a row must not run (predicted over usable), or None."""
    if usable is None or predicted <= usable:
        return None
    return (f"predicted {_gib(predicted)} GiB > usable {_gib(usable)} GiB ({source}; "
            "gdn_core.memory.step.predict_step_memory)")


__all__ = ["PLAN_GPUS", "PlannedRow", "datasheet_usable_bytes", "format_plan",
           "memory_refusal", "plan_rows", "predicted_memory", "usable_here"]
