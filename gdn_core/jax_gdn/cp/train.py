"""Context-parallel JAX training: compile the step (cp/step.py), read what XLA says of it, run it.

`compile_cp_train_step` compiles the step without allocating anything and reads its memory
and the bytes each chip receives (the CP exchanges apart from the weights' traffic);
`run_cp_training` is one trial: validate the settings once (step.mesh_cp), optionally
verify against one chip (verify.py), compile, run the timed steps, measure peak memory.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ... import device_memory
from ...config import FULL_ATTENTION, ModelConfig
from ...cp_modes import CPSettings
from ...memory.verify import verify_seq_len
from ...train_config import CPTrainReport, TrainConfig
from ..hlo_comm import received_bytes_per_chip
from ..train import ESTIMATE_SOURCE, compiled_peak_bytes, one_more_step, run_timed_steps
from .common import AxisName
from .param_sharding import WEIGHT_SYNC_SCOPE
from .step import (LOSS_SUM_SCOPE, MeshCP, cp_step_shapes, cp_training_inputs, host_copy,
                   jitted_step, mesh_cp, synthetic_batch)
from .verify import verify_budget, verify_error

COMM_SOURCE = "xla_hlo"


FAST = {"xla_backend_optimization_level": 0}
"""Compiler options of the reference program that is only inspected (same HLO, collectives)."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CompiledCPStep:
    """make_cp_train_step compiled for cp_training_inputs' shapes, and what XLA says of it."""

    compiled: Any
    """The jax Compiled step: call it as the jitted step (params and opt_state donated)."""
    estimated_memory_bytes: int | None
    """Per chip, compiled_peak_bytes (XLA's memory analysis: an estimate, not a measurement)."""
    cp_comm_bytes_per_step: int
    """Most bytes any chip receives per step outside the weights' traffic (comm_bytes_per_chip)."""
    grad_sync_bytes_per_step: int
    """Most bytes any chip receives per step for the weights: gradient reduction + gathers."""
    compile_time_s: float
    """Seconds spent lowering and compiling the step and its comm reference here (a compile
    this process already did, or JAX's persistent cache, makes it short)."""


def compile_cp_train_step(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh,
                          axis: AxisName, cp: CPSettings,
                          compiler_options: dict | None = None,
                          batch_axis: str | None = None) -> CompiledCPStep:
    """Compile the CP step without allocating anything, and read its memory and bytes.

    For sizing (memory, comm) without running, and for run_cp_training. Equal arguments reuse
    the compile within a process. compiler_options: XLA options (e.g. a lower backend
    optimisation level for quick tests); they change code generation, not the collectives.
    One compile: the bytes are read from this program (comm_bytes_per_chip). batch_axis: the
    mesh axis of data-parallel replicas (step.make_cp_train_step).
    """
    return _compile(model_cfg, train_cfg, mesh_cp(
        model_cfg, train_cfg.seq_len, mesh=mesh, axis=axis, cp=cp, dtype=train_cfg.dtype,
        batch_axis=batch_axis), compiler_options)


def _compile(model_cfg: ModelConfig, train_cfg: TrainConfig, cp: MeshCP,
             compiler_options: dict | None = None) -> CompiledCPStep:
    start = time.perf_counter()
    shapes = cp_step_shapes(model_cfg, train_cfg, mesh=cp.mesh, axis=cp.axis,
                            batch_axis=cp.batch_axis)
    compiled = jitted_step(model_cfg, train_cfg, cp).lower(*shapes).compile(
        compiler_options)
    compile_time_s = time.perf_counter() - start
    cp_bytes, sync_bytes = comm_bytes_per_chip(compiled, cp.mesh.devices.size)
    return CompiledCPStep(compiled=compiled,
                          estimated_memory_bytes=compiled_peak_bytes(compiled),
                          cp_comm_bytes_per_step=cp_bytes, grad_sync_bytes_per_step=sync_bytes,
                          compile_time_s=compile_time_s)


def comm_bytes_per_chip(compiled, num_chips: int) -> tuple[int, int]:
    """(cp bytes, weight-traffic bytes): the most any chip receives per step in each, from the
    step's own compiled program. A collective under param_sharding.WEIGHT_SYNC_SCOPE moves
    weights or their gradients (the gradient all-reduce or reduce-scatter, zero1's and fsdp's
    all-gathers, loops counted per trip); every other one is CP traffic: the modes'
    exchanges, the conv halo and the loss sum (step.LOSS_SUM_SCOPE). num_chips: every chip of
    the mesh; on a dp × CP mesh a CP collective has one replica group per replica, and each
    chip is charged for its own group's share only (hlo_comm). XLA's combiners merge
    collectives (the loss sum into the gradient all-reduce, say) and join their source paths
    with ":" in operand order, so a merged one is split by operand, each as if sent alone.
    """
    ops = received_bytes_per_chip(compiled, num_chips)["ops"]
    if ops and not any(LOSS_SUM_SCOPE in op["op_name"] for op in ops):
        raise RuntimeError(
            "the compiled step's collectives carry none of this code's named scopes: an "
            "executable from JAX's persistent cache compiled from other source (its metadata "
            "is stale); set jax_compilation_cache_include_metadata_in_key (env "
            "JAX_COMPILATION_CACHE_INCLUDE_METADATA_IN_KEY=true) where the cache is on")
    cp, weights = np.zeros(num_chips, np.int64), np.zeros(num_chips, np.int64)
    for op in ops:
        for is_weights, per_chip in _parts(op):
            if is_weights:
                weights += per_chip
            else:
                cp += per_chip
    return int(cp.max()), int(weights.max())


def _parts(op: dict) -> list[tuple[bool, list[int]]]:
    """(moves weights, bytes per chip) of each part of a collective (an entry of
    hlo_comm.received_bytes_per_chip's ops): its operands when it merges several."""
    names = op["op_name"].split(":")
    if len(op["operands"]) > 1 and len(names) == len(op["operands"]):
        return [(WEIGHT_SYNC_SCOPE in name, operand["per_chip"])
                for name, operand in zip(names, op["operands"])]
    if WEIGHT_SYNC_SCOPE in op["op_name"] and len(set(
            WEIGHT_SYNC_SCOPE in name for name in names)) > 1:
        raise RuntimeError(f"collective {op['name']} merges weight traffic with other traffic "
                           f"and its {len(names)} source paths do not match its "
                           f"{len(op['operands'])} operands: cannot separate CP bytes")
    return [(WEIGHT_SYNC_SCOPE in op["op_name"], op["per_chip"])]


def _local_devices(mesh) -> list:
    """This process's devices of the mesh (its chips)."""
    return [d for d in mesh.devices.flat if d.process_index == jax.process_index()]


def run_cp_training(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh, axis: AxisName,
                    cp: CPSettings, steps: int, warmup_steps: int = 1, verify: bool = False,
                    verify_memory_budget_bytes: int | None = None,
                    batch_axis: str | None = None,
                    after_timed_steps: Callable[[Callable[[], None]], None] | None = None
                    ) -> CPTrainReport:
    """Train under CP (`cp`) on one fixed synthetic batch; call on every process of `mesh`.

    Every process creates only its own devices' shards of the weights and AdamW state (seed
    train_cfg.seed; step.sharded_init: never a whole copy of what is sharded) and feeds them
    their shards of the tokens. warmup_steps untimed, then `steps` timed steps (outputs
    blocked on).
    Peak memory per chip is measured over the whole run (device_memory.jax_peak_memory of this
    process's chips: the device allocator's peak, on CPU the process RSS / its chips); XLA's
    memory analysis of the compiled step is the separate estimate. Comm per chip per step:
    from the step's HLO (compile_cp_train_step). verify=True first compares loss and gradients
    at the initial weights against one chip (max_rel_err) on as much of the sequence as one
    chip holds beside the step's state (memory.verify.verify_seq_len within
    verify_memory_budget_bytes, default the chip's capacity; verified_seq_len). Losses: every
    step, global mean. Data parallel (cp.dp > 1): batch_axis names the mesh axis of the
    cp.dp replicas, `axis` then spans cp.cp_chips; the global batch is cp.dp ×
    train_cfg.batch_size sequences (step.synthetic_batch), verify compares one chip on all of
    it, and the report's chips are all cp.chips of the mesh. Raises ValueError naming the
    numbers when `axis` is not cp.cp_chips chips or batch_axis not cp.dp (or is missing with
    cp.dp > 1), or when cp's modes or layout cannot split the shape over them;
    KernelUnavailable with the reason when cp.kernels="fused" cannot serve the point.
    after_timed_steps: called once after everything is measured with a callable that runs one
    more step (outputs blocked on; in no figure of the report), e.g. to wrap it in a profiler.
    Every process must call that callable: the step's collectives span the mesh.
    """
    if not isinstance(steps, int) or not isinstance(warmup_steps, int) or steps < 1 \
            or warmup_steps < 0:
        raise ValueError(f"steps={steps!r} must be >= 1 and warmup_steps={warmup_steps!r} >= 0")
    step_cp = mesh_cp(model_cfg, train_cfg.seq_len, mesh=mesh, axis=axis, cp=cp,
                      dtype=train_cfg.dtype, batch_axis=batch_axis)  # the trial's one check
    D, dp = step_cp.chips, step_cp.dp
    devices = _local_devices(mesh)
    baseline = device_memory.jax_reset_peak(devices)
    params, opt_state, inputs_BT, targets_BT = cp_training_inputs(
        model_cfg, train_cfg, mesh=mesh, axis=step_cp.axis, layout=cp.layout,
        batch_axis=batch_axis)
    max_rel_err = verified_seq_len = None
    compile_time_s = 0.0
    if verify:
        budget = verify_budget(devices, verify_memory_budget_bytes)
        # The reference runs the whole global batch on one chip, beside the step's resident
        # state laid out over all dp·D chips.
        global_cfg = dataclasses.replace(train_cfg, batch_size=dp * train_cfg.batch_size)
        verified_seq_len = train_cfg.seq_len if budget is None else verify_seq_len(
            model_cfg, global_cfg, mode=cp.mode, chips=D, framework="jax", budget_bytes=budget,
            attn_cp=cp.attn_cp, layout=cp.layout, dp=dp)  # a prefix cp's layout can split
        if verified_seq_len is not None:
            # A valid CP length by construction (verify_seq_len): the settings hold for it too.
            prefix_cfg = dataclasses.replace(train_cfg, seq_len=verified_seq_len)
            tokens_BT1 = synthetic_batch(model_cfg, train_cfg, dp)[:, :verified_seq_len + 1]
            max_rel_err, compile_time_s = verify_error(params, tokens_BT1, model_cfg,
                                                       prefix_cfg, step_cp)
    program = _compile(model_cfg, train_cfg, step_cp)
    estimate = program.estimated_memory_bytes

    timed = run_timed_steps(program.compiled, params, opt_state, inputs_BT, targets_BT,
                            steps=steps, warmup_steps=warmup_steps,
                            loss_to_host=lambda loss: float(host_copy(loss)))
    losses, step_times_s = timed.losses, timed.step_times_s
    peak_bytes, memory_source = device_memory.jax_peak_memory(devices, baseline=baseline)
    if after_timed_steps is not None:  # after the peak is read: the extra step is in no figure
        after_timed_steps(one_more_step(program.compiled, timed, inputs_BT, targets_BT))
    return CPTrainReport(
        losses=losses, step_times_s=step_times_s, peak_memory_bytes=peak_bytes,
        memory_source=memory_source, estimated_memory_bytes=estimate,
        estimated_memory_source=ESTIMATE_SOURCE if estimate is not None else None,
        compile_time_s=compile_time_s + program.compile_time_s, mode=cp.mode, chips=dp * D,
        dp=dp,
        cp_comm_bytes_per_step=program.cp_comm_bytes_per_step,
        grad_sync_bytes_per_step=program.grad_sync_bytes_per_step,
        comm_source=COMM_SOURCE, max_rel_err=max_rel_err, verified_seq_len=verified_seq_len,
        attn_cp=cp.attn_cp if FULL_ATTENTION in model_cfg.layer_pattern else None, layout=cp.layout,
        gdn_kernel=step_cp.resolved.gdn, attention_kernel=step_cp.resolved.attention)
