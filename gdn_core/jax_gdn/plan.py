"""Compile-only plans of the JAX CP training step: what D chips would need, without running it.

`plan_cp_step` compiles the full step (forward, backward, gradient reduction, AdamW; the
trial's param_sharding and remat) for D devices at the real shapes — nothing is allocated —
and reads per chip: XLA's memory analysis, the matmul FLOPs of the partitioned program
(hlo_flops, loop trips counted) and the bytes received in collectives (hlo_comm).
`largest_fitting_seq_len` bisects over such compiles for the longest sequence that fits a
memory budget.

On a CPU host the devices are virtual CPU chips (`python -m gdn_core.jax_gdn.plan` sets their
count in a fresh process), so the figures are XLA:CPU's: the program and its collectives are
the ones a TPU or GPU would run, but buffer sizes and fusion differ by backend (XLA:CPU widens
some bf16 buffers) — an estimate of TPU/GPU memory, to be compared with measured trials.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

ESTIMATE_SOURCE = "xla_memory_analysis"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class StepPlan:
    """What XLA says of one compiled CP step, per chip."""

    chips: int
    """All chips of the mesh (dp × the CP group's)."""
    seq_len: int
    estimated_memory_bytes: int
    """compiled_peak_bytes: arguments + outputs + temporaries − aliased (donated)."""
    argument_bytes: int
    temp_bytes: int
    matmul_flops_per_chip: int
    """hlo_flops.matmul_flops_per_chip of the partitioned program (one chip's)."""
    trip_count_unknown: bool
    cp_comm_bytes_per_step: int
    grad_sync_bytes_per_step: int
    compile_time_s: float
    backend: str
    """The platform compiled for (cpu, gpu, tpu) and its device kind."""
    dp: int = 1
    """Data-parallel replicas (CPSettings.dp): a dp × chips/dp mesh."""

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def plan_cp_step(model_cfg, train_cfg, *, mode: str, chips: int, devices=None,
                 dp: int = 1) -> StepPlan:
    """Compile the CP step for `chips` of this process's devices (the first ones by default)
    and read its memory, FLOPs and collective bytes; nothing runs. dp > 1: a ("dp", "cp") mesh
    of dp replicas of chips/dp CP chips, train_cfg.batch_size sequences each. Raises
    ValueError naming the numbers when the mode cannot split the shape, dp does not divide
    chips, or there are fewer devices."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    from ..cp_modes import CPSettings
    from .cp.train import compile_cp_train_step
    from .hlo_flops import matmul_flops_per_chip

    cp = CPSettings(mode=mode, chips=chips, dp=dp)  # checks the mode and that dp divides chips

    devices = list(jax.devices() if devices is None else devices)
    if len(devices) < chips:
        raise ValueError(f"chips={chips} needs {chips} devices, this process has "
                         f"{len(devices)}: run `python -m gdn_core.jax_gdn.plan`, which gives "
                         "a fresh process that many virtual CPU chips")
    if dp == 1:
        mesh, batch_axis = Mesh(np.array(devices[:chips]), ("cp",)), None
    else:
        mesh = Mesh(np.array(devices[:chips]).reshape(dp, chips // dp), ("dp", "cp"))
        batch_axis = "dp"
    start = time.perf_counter()
    program = compile_cp_train_step(model_cfg, train_cfg, mesh=mesh, axis="cp", cp=cp,
                                    batch_axis=batch_axis)
    compile_time_s = time.perf_counter() - start
    stats = program.compiled.memory_analysis()
    flops = matmul_flops_per_chip(program.compiled)
    return StepPlan(
        chips=chips, seq_len=train_cfg.seq_len,
        estimated_memory_bytes=int(program.estimated_memory_bytes),
        argument_bytes=int(stats.argument_size_in_bytes), temp_bytes=int(stats.temp_size_in_bytes),
        matmul_flops_per_chip=flops["flops"], trip_count_unknown=flops["trip_count_unknown"],
        cp_comm_bytes_per_step=program.cp_comm_bytes_per_step,
        grad_sync_bytes_per_step=program.grad_sync_bytes_per_step,
        compile_time_s=compile_time_s,
        backend=f"{devices[0].platform} ({devices[0].device_kind})", dp=dp)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class FitSearch:
    """The longest seq_len (a multiple of `granule`) whose plan fits `budget_bytes`."""

    budget_bytes: int
    granule: int
    fits: StepPlan | None
    """The longest fitting plan; None when even one granule does not fit."""
    exceeds: StepPlan | None
    """The plan one granule longer, over the budget; None when max_seq_len fits."""
    probes: tuple[StepPlan, ...]
    """Every compile the search made, in order."""


def seq_len_granule(model_cfg, *, chips: int) -> int:
    """Step of the seq_len search: every chip holds whole chunks."""
    return chips * model_cfg.gdn.chunk_size


def largest_fitting_seq_len(model_cfg, train_cfg, *, mode: str, chips: int, budget_bytes: int,
                            max_seq_len: int, devices=None, dp: int = 1) -> FitSearch:
    """Bisect compile-only plans over seq_len = k · granule, 1 ≤ k ≤ max_seq_len // granule,
    for the largest k whose XLA memory estimate per chip is within budget_bytes (dp: as
    plan_cp_step's; the granule is one replica's chips/dp × chunk).

    Assumes memory grows with seq_len (activations do; weights do not shrink), and confirms
    the boundary by the two compiles either side of it (`fits`, `exceeds`).
    """
    if budget_bytes <= 0:
        raise ValueError(f"budget_bytes={budget_bytes} must be positive")
    granule = seq_len_granule(model_cfg, chips=chips // dp)
    top = max_seq_len // granule
    if top < 1:
        raise ValueError(f"max_seq_len={max_seq_len} is below one granule ({granule} tokens: "
                         f"{chips // dp} chips × chunk {model_cfg.gdn.chunk_size})")
    probes: list[StepPlan] = []
    plans: dict[int, StepPlan] = {}

    def plan(k: int) -> StepPlan:
        if k not in plans:
            cfg = dataclasses.replace(train_cfg, seq_len=k * granule)
            plans[k] = plan_cp_step(model_cfg, cfg, mode=mode, chips=chips, devices=devices,
                                    dp=dp)
            probes.append(plans[k])
        return plans[k]

    def fits(k: int) -> bool:
        return plan(k).estimated_memory_bytes <= budget_bytes

    if not fits(1):
        return FitSearch(budget_bytes=budget_bytes, granule=granule, fits=None,
                         exceeds=plan(1), probes=tuple(probes))
    if fits(top):
        return FitSearch(budget_bytes=budget_bytes, granule=granule, fits=plan(top),
                         exceeds=None, probes=tuple(probes))
    low, high = 1, top  # fits(low), not fits(high)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return FitSearch(budget_bytes=budget_bytes, granule=granule, fits=plan(low),
                     exceeds=plan(high), probes=tuple(probes))


def _configs(request: dict):
    from ..presets import get_preset
    from ..train_config import TrainConfig

    model_cfg = get_preset(request["preset"], num_layers=request.get("num_layers"),
                           vocab_size=request.get("vocab_size"))
    train_cfg = TrainConfig(batch_size=request.get("batch_size", 1), seq_len=request["seq_len"],
                            dtype=request.get("dtype", "bfloat16"),
                            param_sharding=request.get("param_sharding", "replicated"),
                            remat=request.get("remat", "none"),
                            documents=request.get("documents", "single"))
    return model_cfg, train_cfg


def _die_with_parent() -> None:
    """Be killed with the process that started this one (a cancelled plan trial's Ray
    worker): Linux's PR_SET_PDEATHSIG; elsewhere nothing."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    """`python -m gdn_core.jax_gdn.plan --request '{"preset": …, "seq_len": …, "mode": …,
    "chips": D, "dp": 1, …}' [--budget-bytes N --max-seq-len M]`: one JSON object on stdout
    (a StepPlan, or with a budget a FitSearch), compiled for D virtual CPU chips of this fresh
    process (dp of them replicas of D/dp CP chips each)."""
    parser = argparse.ArgumentParser(prog="python -m gdn_core.jax_gdn.plan")
    parser.add_argument("--request", required=True, help="JSON: preset, seq_len, mode, chips, "
                        "dp, batch_size, dtype, param_sharding, remat, documents, num_layers, "
                        "vocab_size")
    parser.add_argument("--budget-bytes", type=int, help="bisect seq_len for this budget")
    parser.add_argument("--max-seq-len", type=int, help="upper end of the search (with a budget)")
    args = parser.parse_args(argv)
    _die_with_parent()
    request = json.loads(args.request)
    chips, dp = int(request["chips"]), int(request.get("dp", 1))
    from .virtual_chips import ensure_virtual_chips

    ensure_virtual_chips(chips, fresh_process="python -m gdn_core.jax_gdn.plan")
    model_cfg, train_cfg = _configs(request)
    if args.budget_bytes is None:
        out = plan_cp_step(model_cfg, train_cfg, mode=request["mode"], chips=chips,
                           dp=dp).to_json()
    else:
        search = largest_fitting_seq_len(
            model_cfg, train_cfg, mode=request["mode"], chips=chips, dp=dp,
            budget_bytes=args.budget_bytes, max_seq_len=args.max_seq_len or train_cfg.seq_len)
        out = {"budget_bytes": search.budget_bytes, "granule": search.granule,
               "fits": search.fits and search.fits.to_json(),
               "exceeds": search.exceeds and search.exceeds.to_json(),
               "probes": [p.to_json() for p in search.probes]}
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
