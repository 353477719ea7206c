"""Context-parallel JAX training: the whole model in one shard_map over the sequence axis.

Every chip holds the whole model (params and AdamW state replicated) and a contiguous sequence
shard of the batch (tokens [B, T] split on T over `axis`). Its loss is (sum of its token
losses) / (global token count), so the chips' losses and parameter gradients each sum to the
single-chip ones: the step psums the loss and — once, as train.build_step_fn's grad_transform —
the gradient tree, after which every chip applies the same AdamW update.

The shard_map runs with check_vma=False: with the check on, JAX would sum each replicated
parameter's gradient itself (the transpose of its implicit per-chip cast, one psum per use),
and the gradient sync would be neither explicit nor separable from the CP exchanges.
Legend: B batch, T global tokens, t = T/D tokens per chip.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ...config import ModelConfig
from ...cp_modes import CPMode, check_mode
from ...data import synthetic_tokens
from ...testing import max_verify_error
from ...train_config import CPTrainReport, TrainConfig
from ..hlo_comm import received_bytes_per_chip
from ..model import model_loss
from ..params import init_model_params
from ..train import (
    MEMORY_SOURCE,
    StepFn,
    build_step_fn,
    compiled_peak_bytes,
    make_optimizer,
    run_timed_steps,
)
from .common import AxisName
from .layer import check_layer_shape, cp_layer_fn
from .common import mesh_chip_count

COMM_SOURCE = "xla_hlo"


def _check(model_cfg: ModelConfig, train_cfg: TrainConfig, mesh, axis: AxisName, mode: str):
    """Validate mode, axis and shape; return (axis as a name or tuple, chips D)."""
    check_mode(mode)
    D = mesh_chip_count(mesh, axis)
    check_layer_shape(model_cfg.gdn, mode=mode, chips=D, seq_len=train_cfg.seq_len)
    return (axis if isinstance(axis, str) else tuple(axis)), D


def build_cp_step_fn(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh, axis: AxisName,
                     mode: CPMode, sync_grads: bool = True) -> StepFn:
    """The un-jitted, shard_mapped step; see make_cp_train_step.

    sync_grads=False leaves out the gradient psum (each chip updates with its own share): only
    for counting what the sync costs, never for training.
    """
    axis, _ = _check(model_cfg, train_cfg, mesh, axis, mode)
    step = build_step_fn(
        model_cfg, train_cfg, global_tokens=train_cfg.batch_size * train_cfg.seq_len,
        grad_transform=(lambda grads: lax.psum(grads, axis)) if sync_grads else None,
        gdn_layer_fn=cp_layer_fn(axis=axis, mode=mode))

    def shard_step(params, opt_state, inputs_Bt, targets_Bt):
        params, opt_state, loss_share = step(params, opt_state, inputs_Bt, targets_Bt)
        return params, opt_state, lax.psum(loss_share, axis)

    seq = P(None, axis)
    return jax.shard_map(shard_step, mesh=mesh, in_specs=(P(), P(), seq, seq),
                         out_specs=(P(), P(), P()), check_vma=False)


def make_cp_train_step(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh,
                       axis: AxisName, mode: CPMode) -> StepFn:
    """Jitted step(params, opt_state, inputs_BT, targets_BT) -> (params, opt_state, loss).

    params, opt_state: replicated over `mesh` (donated: do not reuse the passed-in ones).
    inputs_BT, targets_BT: int [B, T] global, T split over mesh axis `axis` (a name or a tuple
    flattened major-to-minor; D = the product of their sizes). loss: the global mean loss
    (float32, replicated). Every chip applies the same AdamW update to the summed gradients.
    The same arguments return the same jitted function, so `.lower(...).compile()` of equal
    shapes and shardings compiles once per process (compile_cp_train_step relies on it).
    Raises ValueError naming the numbers when `mode` cannot split train_cfg's shape over D.
    """
    axis, _ = _check(model_cfg, train_cfg, mesh, axis, mode)
    return _jitted_step(model_cfg, train_cfg, mesh, axis, mode)


@functools.lru_cache(maxsize=16)
def _jitted_step(model_cfg, train_cfg, mesh, axis, mode):
    step = build_cp_step_fn(model_cfg, train_cfg, mesh=mesh, axis=axis, mode=mode)
    return jax.jit(step, donate_argnums=(0, 1))


def _global(tree, sharding):
    """Global arrays from host values that every process holds in full.

    make_array_from_callback asks each process only for its own devices' shards, so the same
    code feeds a single- or multi-process mesh.
    """
    def one(x):
        x_np = np.asarray(x)
        return jax.make_array_from_callback(x_np.shape, sharding, lambda index: x_np[index])

    return jax.tree.map(one, tree)


def _host(tree):
    """numpy copies of replicated global arrays (this process's first shard holds the value)."""
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)


def synthetic_batch(model_cfg: ModelConfig, train_cfg: TrainConfig) -> np.ndarray:
    """The run's token ids [B, T+1] (int32, host): gdn_core.data.synthetic_tokens of the config."""
    return synthetic_tokens(batch_size=train_cfg.batch_size, seq_len=train_cfg.seq_len,
                            vocab_size=model_cfg.vocab_size, seed=train_cfg.seed)


def cp_training_inputs(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh,
                       axis: AxisName):
    """(params, opt_state, inputs_BT, targets_BT) as global arrays for make_cp_train_step.

    Fresh weights (seed train_cfg.seed) and AdamW state, replicated; the synthetic batch's
    inputs tokens[:, :-1] and targets tokens[:, 1:] [B, T], T split over `axis`. Call on every
    process of a multi-process mesh (each feeds only its own devices).
    """
    axis = axis if isinstance(axis, str) else tuple(axis)
    replicated, seq = NamedSharding(mesh, P()), NamedSharding(mesh, P(None, axis))
    tokens_BT1 = synthetic_batch(model_cfg, train_cfg)
    params = init_model_params(model_cfg, jax.random.PRNGKey(train_cfg.seed))
    opt_state = make_optimizer(train_cfg).init(params)
    return (*_global((params, opt_state), replicated),
            *_global((tokens_BT1[:, :-1], tokens_BT1[:, 1:]), seq))


def cp_step_shapes(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh, axis: AxisName):
    """cp_training_inputs as jax.ShapeDtypeStruct (shapes, dtypes, shardings; no data)."""
    axis = axis if isinstance(axis, str) else tuple(axis)
    replicated, seq = NamedSharding(mesh, P()), NamedSharding(mesh, P(None, axis))
    params = jax.eval_shape(functools.partial(init_model_params, model_cfg),
                            jax.random.PRNGKey(train_cfg.seed))
    opt_state = jax.eval_shape(make_optimizer(train_cfg).init, params)
    tokens_BT = jax.ShapeDtypeStruct((train_cfg.batch_size, train_cfg.seq_len), jnp.int32,
                                     sharding=seq)
    return (*jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated),
                          (params, opt_state)), tokens_BT, tokens_BT)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CompiledCPStep:
    """make_cp_train_step compiled for cp_training_inputs' shapes, and what XLA says of it."""

    compiled: Any
    """The jax Compiled step: call it as the jitted step (params and opt_state donated)."""
    peak_memory_bytes: int | None
    """Per chip, compiled_peak_bytes (XLA memory analysis)."""
    cp_comm_bytes_per_step: int
    """Most bytes any chip receives per step outside the gradient sync (comm_bytes_per_chip)."""
    grad_sync_bytes_per_step: int
    """Most bytes any chip receives per step in the gradient psum."""


def compile_cp_train_step(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh,
                          axis: AxisName, mode: CPMode,
                          compiler_options: dict | None = None) -> CompiledCPStep:
    """Compile the CP step without allocating anything, and read its memory and bytes.

    For sizing (memory, comm) without running, and for run_cp_training. Equal arguments reuse
    the compile within a process. compiler_options: XLA options (e.g. a lower backend
    optimisation level for quick tests); they change code generation, not the collectives.
    """
    axis, _ = _check(model_cfg, train_cfg, mesh, axis, mode)
    shapes = cp_step_shapes(model_cfg, train_cfg, mesh=mesh, axis=axis)
    lowered = make_cp_train_step(model_cfg, train_cfg, mesh=mesh, axis=axis,
                                 mode=mode).lower(*shapes)
    compiled = lowered.compile(compiler_options)
    without_sync = jax.jit(build_cp_step_fn(model_cfg, train_cfg, mesh=mesh, axis=axis,
                                            mode=mode, sync_grads=False)).lower(*shapes)
    cp_bytes, sync_bytes = comm_bytes_per_chip(compiled, lowered, without_sync,
                                               mesh.devices.size)
    return CompiledCPStep(compiled=compiled, peak_memory_bytes=compiled_peak_bytes(compiled),
                          cp_comm_bytes_per_step=cp_bytes, grad_sync_bytes_per_step=sync_bytes)


def comm_bytes_per_chip(compiled, lowered_with_sync, lowered_without_sync, num_chips: int):
    """(cp bytes, grad-sync bytes): the most any chip receives per step in each.

    The gradient sync is the difference between the step lowered with and without its
    gradient psum, read from the unoptimised HLO (same program otherwise; XLA may later fuse
    or combine the psum with other all-reduces, but not change its ring bytes). CP bytes are
    the compiled step's per-chip total minus that: the mode's exchanges, the conv halo and the
    loss psum, as XLA really runs them.
    """
    def per_chip(program):
        return np.asarray(received_bytes_per_chip(program, num_chips)["per_chip"])

    sync_per_chip = per_chip(lowered_with_sync.as_text(dialect="hlo")) - per_chip(
        lowered_without_sync.as_text(dialect="hlo"))
    cp_per_chip = per_chip(compiled) - sync_per_chip
    if (sync_per_chip < 0).any() or (cp_per_chip < 0).any():
        raise RuntimeError(f"could not separate the gradient sync: per chip {sync_per_chip} "
                           f"of {per_chip(compiled)} received")
    return int(cp_per_chip.max()), int(sync_per_chip.max())


def verify_against_single_chip(params, tokens_BT1, model_cfg: ModelConfig,
                               train_cfg: TrainConfig, *, mesh, axis: AxisName,
                               mode: CPMode) -> float:
    """Max relative error of the CP loss and summed gradients against one chip, same data.

    params: replicated global arrays; tokens_BT1: host int [B, T+1] (inputs [:, :-1], targets
    [:, 1:]), the same on every process. The reference is model_loss under jax.value_and_grad
    on this process's first device. Each gradient's error is relative to max(its norm,
    testing.VERIFY_GRAD_FLOOR × the whole reference gradient's norm). Every process returns the same.
    """
    axis, _ = _check(model_cfg, train_cfg, mesh, axis, mode)
    dtype, global_tokens = jnp.dtype(train_cfg.dtype), train_cfg.batch_size * train_cfg.seq_len
    inputs_BT, targets_BT = tokens_BT1[:, :-1], tokens_BT1[:, 1:]

    def cp_loss_and_grads(params, inputs_Bt, targets_Bt):
        share, grads = jax.value_and_grad(model_loss)(
            params, inputs_Bt, targets_Bt, model_cfg, global_tokens=global_tokens, dtype=dtype,
            gdn_layer_fn=cp_layer_fn(axis=axis, mode=mode))
        return lax.psum(share, axis), lax.psum(grads, axis)

    seq = P(None, axis)
    cp_loss, cp_grads = _host(jax.jit(jax.shard_map(
        cp_loss_and_grads, mesh=mesh, in_specs=(P(), seq, seq), out_specs=(P(), P()),
        check_vma=False))(params, *_global((inputs_BT, targets_BT), NamedSharding(mesh, seq))))
    device = jax.local_devices()[0]
    ref_loss, ref_grads = jax.jit(jax.value_and_grad(
        lambda p, i, t: model_loss(p, i, t, model_cfg, global_tokens=global_tokens,
                                   dtype=dtype)))(*jax.device_put(
                                       (_host(params), inputs_BT, targets_BT), device))
    return max_verify_error(ref_loss, cp_loss, jax.tree.leaves(ref_grads),
                            jax.tree.leaves(cp_grads))


def run_cp_training(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh, axis: AxisName,
                    mode: CPMode, steps: int, warmup_steps: int = 1,
                    verify: bool = False) -> CPTrainReport:
    """Train under CP on one fixed synthetic batch; call on every process of `mesh`.

    Every process builds the same weights (seed train_cfg.seed) and tokens, and feeds only its
    own devices' shards. warmup_steps untimed, then `steps` timed steps (outputs blocked on).
    Peak memory per chip: XLA's memory analysis of the compiled step. Comm per chip per step:
    from the step's HLO (compile_cp_train_step). verify=True first compares loss and gradients
    at the initial weights against one chip (max_rel_err). Losses: every step, global mean.
    Raises ValueError naming the numbers when `mode` cannot split the shape over the mesh.
    """
    if not isinstance(steps, int) or not isinstance(warmup_steps, int) or steps < 1 \
            or warmup_steps < 0:
        raise ValueError(f"steps={steps!r} must be >= 1 and warmup_steps={warmup_steps!r} >= 0")
    axis, D = _check(model_cfg, train_cfg, mesh, axis, mode)
    params, opt_state, inputs_BT, targets_BT = cp_training_inputs(model_cfg, train_cfg,
                                                                  mesh=mesh, axis=axis)
    max_rel_err = None
    if verify:
        max_rel_err = verify_against_single_chip(
            params, synthetic_batch(model_cfg, train_cfg), model_cfg, train_cfg, mesh=mesh,
            axis=axis, mode=mode)
    program = compile_cp_train_step(model_cfg, train_cfg, mesh=mesh, axis=axis, mode=mode)
    compiled, peak_bytes = program.compiled, program.peak_memory_bytes

    losses, step_times_s = run_timed_steps(compiled, params, opt_state, inputs_BT, targets_BT,
                                           steps=steps, warmup_steps=warmup_steps,
                                           loss_to_host=lambda loss: float(_host(loss)))
    return CPTrainReport(
        losses=losses, step_times_s=step_times_s, peak_memory_bytes=peak_bytes,
        memory_source=MEMORY_SOURCE if peak_bytes is not None else "unknown", mode=mode,
        chips=D, cp_comm_bytes_per_step=program.cp_comm_bytes_per_step,
        grad_sync_bytes_per_step=program.grad_sync_bytes_per_step,
        comm_source=COMM_SOURCE, max_rel_err=max_rel_err)
