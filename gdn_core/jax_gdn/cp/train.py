"""Context-parallel JAX training: the whole model in one shard_map over the sequence axis.

Every chip holds a contiguous sequence shard of the batch (tokens [B, T] split on T over
`axis`) and the weights laid out by train_cfg.param_sharding (param_sharding.py: replicated,
zero1 or fsdp over the same chips). Its loss is (sum of its token losses) / (global token
count), so the chips' losses and parameter gradients each sum to the single-chip ones: the step
psums the loss and reduces the gradients once (WeightLayout.reduce_grads, as
train.build_step_fn's grad_transform), then applies AdamW (zero1: to its slice).

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
from .common import AxisName, mesh_chip_count
from .layer import check_layer_shape, cp_layer_fn
from .param_sharding import WeightLayout, weight_layout

COMM_SOURCE = "xla_hlo"


FAST = {"xla_backend_optimization_level": 0}
"""Compiler options of the reference program that is only inspected (same HLO, collectives)."""


def _check(model_cfg: ModelConfig, train_cfg: TrainConfig, mesh, axis: AxisName, mode: str):
    """Validate mode, axis and shape; return (axis as a name or tuple, chips D)."""
    check_mode(mode)
    D = mesh_chip_count(mesh, axis)
    check_layer_shape(model_cfg.gdn, mode=mode, chips=D, seq_len=train_cfg.seq_len)
    return (axis if isinstance(axis, str) else tuple(axis)), D


@functools.lru_cache(maxsize=16)
def _param_shapes(model_cfg: ModelConfig):
    return jax.eval_shape(lambda: init_model_params(model_cfg, jax.random.PRNGKey(0)))


def _layout(model_cfg: ModelConfig, train_cfg: TrainConfig, axis, D: int) -> WeightLayout:
    return weight_layout(train_cfg.param_sharding, _param_shapes(model_cfg), chips=D, axis=axis)


def _specs(model_cfg: ModelConfig, train_cfg: TrainConfig, axis, D: int):
    """(layout, param specs, opt_state specs) of the step's weights."""
    layout = _layout(model_cfg, train_cfg, axis, D)
    optimizer = make_optimizer(train_cfg)
    opt_shapes = jax.eval_shape(optimizer.init, _param_shapes(model_cfg))
    return layout, layout.param_specs(), layout.opt_state_specs(optimizer, opt_shapes)


def build_cp_step_fn(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh, axis: AxisName,
                     mode: CPMode, sync_grads: bool = True) -> StepFn:
    """The un-jitted, shard_mapped step; see make_cp_train_step.

    sync_grads=False builds the reference that prices the weights' traffic: replicated weights
    (whatever train_cfg.param_sharding says) and no gradient reduction, each chip updating with
    its own share — only for counting bytes, never for training.
    """
    axis, D = _check(model_cfg, train_cfg, mesh, axis, mode)
    if not sync_grads:
        train_cfg = dataclasses.replace(train_cfg, param_sharding="replicated")
    layout, param_specs, opt_specs = _specs(model_cfg, train_cfg, axis, D)
    step = build_step_fn(
        model_cfg, train_cfg, global_tokens=train_cfg.batch_size * train_cfg.seq_len,
        grad_transform=layout.reduce_grads if sync_grads else None,
        gdn_layer_fn=cp_layer_fn(axis=axis, mode=mode), fetch=layout.fetch(),
        apply_update=layout.apply_update(make_optimizer(train_cfg)))

    def shard_step(params, opt_state, inputs_Bt, targets_Bt):
        params, opt_state, loss_share = step(params, opt_state, inputs_Bt, targets_Bt)
        return params, opt_state, lax.psum(loss_share, axis)

    seq = P(None, axis)
    return jax.shard_map(shard_step, mesh=mesh, in_specs=(param_specs, opt_specs, seq, seq),
                         out_specs=(param_specs, opt_specs, P()), check_vma=False)


def make_cp_train_step(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh,
                       axis: AxisName, mode: CPMode) -> StepFn:
    """Jitted step(params, opt_state, inputs_BT, targets_BT) -> (params, opt_state, loss).

    params, opt_state: global arrays laid out as cp_training_inputs makes them (per
    train_cfg.param_sharding; donated: do not reuse the passed-in ones). inputs_BT,
    targets_BT: int [B, T] global, T split over mesh axis `axis` (a name or a tuple flattened
    major-to-minor; D = the product of their sizes). loss: the global mean loss (float32,
    replicated). The update equals one chip's AdamW step on the summed gradients.
    The same arguments return the same jitted function, so `.lower(...).compile()` of equal
    shapes and shardings compiles once per process (compile_cp_train_step relies on it).
    Raises ValueError naming the numbers when `mode` cannot split train_cfg's shape over D.
    """
    axis, _ = _check(model_cfg, train_cfg, mesh, axis, mode)
    return _jitted_step(model_cfg, train_cfg, mesh, axis, mode, True)


@functools.lru_cache(maxsize=32)
def _jitted_step(model_cfg, train_cfg, mesh, axis, mode, sync_grads):
    step = build_cp_step_fn(model_cfg, train_cfg, mesh=mesh, axis=axis, mode=mode,
                            sync_grads=sync_grads)
    return jax.jit(step, donate_argnums=(0, 1) if sync_grads else ())


def _global(tree, shardings):
    """Global arrays from host values that every process holds in full.

    make_array_from_callback asks each process only for its own devices' shards, so the same
    code feeds a single- or multi-process mesh. shardings: one, or a tree matching `tree`.
    """
    def one(x, sharding):
        x_np = np.asarray(x)
        return jax.make_array_from_callback(x_np.shape, sharding, lambda index: x_np[index])

    if isinstance(shardings, NamedSharding):
        return jax.tree.map(lambda x: one(x, shardings), tree)
    return jax.tree.map(one, tree, shardings)


def _host(tree, mesh=None):
    """numpy copies of global arrays; sharded ones (pass their mesh) are gathered first."""
    if mesh is not None:
        tree = jax.jit(lambda t: t, out_shardings=NamedSharding(mesh, P()))(tree)
    return jax.tree.map(lambda x: np.asarray(x.addressable_data(0)), tree)


def synthetic_batch(model_cfg: ModelConfig, train_cfg: TrainConfig) -> np.ndarray:
    """The run's token ids [B, T+1] (int32, host): gdn_core.data.synthetic_tokens of the config."""
    return synthetic_tokens(batch_size=train_cfg.batch_size, seq_len=train_cfg.seq_len,
                            vocab_size=model_cfg.vocab_size, seed=train_cfg.seed)


def _named(mesh, specs):
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs,
                        is_leaf=lambda x: isinstance(x, P))


def cp_training_inputs(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh,
                       axis: AxisName, params=None):
    """(params, opt_state, inputs_BT, targets_BT) as global arrays for make_cp_train_step.

    Fresh weights (seed train_cfg.seed), or the host pytree `params` given (e.g.
    params.from_state_dict of a checkpoint), and fresh AdamW state, laid out by
    train_cfg.param_sharding; the synthetic batch's inputs tokens[:, :-1] and targets
    tokens[:, 1:] [B, T], T split over `axis`. Call on every process of a multi-process mesh
    (each feeds only its own devices).
    """
    axis = axis if isinstance(axis, str) else tuple(axis)
    _, param_specs, opt_specs = _specs(model_cfg, train_cfg, axis, mesh_chip_count(mesh, axis))
    tokens_BT1 = synthetic_batch(model_cfg, train_cfg)
    if params is None:
        params = init_model_params(model_cfg, jax.random.PRNGKey(train_cfg.seed))
    opt_state = make_optimizer(train_cfg).init(params)
    return (_global(params, _named(mesh, param_specs)), _global(opt_state, _named(mesh, opt_specs)),
            *_global((tokens_BT1[:, :-1], tokens_BT1[:, 1:]), NamedSharding(mesh, P(None, axis))))


def cp_step_shapes(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh, axis: AxisName):
    """cp_training_inputs as jax.ShapeDtypeStruct (shapes, dtypes, shardings; no data)."""
    axis = axis if isinstance(axis, str) else tuple(axis)
    _, param_specs, opt_specs = _specs(model_cfg, train_cfg, axis, mesh_chip_count(mesh, axis))
    params = _param_shapes(model_cfg)
    opt_state = jax.eval_shape(make_optimizer(train_cfg).init, params)

    def shaped(tree, specs):
        return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                            tree, _named(mesh, specs))

    tokens_BT = jax.ShapeDtypeStruct((train_cfg.batch_size, train_cfg.seq_len), jnp.int32,
                                     sharding=NamedSharding(mesh, P(None, axis)))
    return shaped(params, param_specs), shaped(opt_state, opt_specs), tokens_BT, tokens_BT


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class CompiledCPStep:
    """make_cp_train_step compiled for cp_training_inputs' shapes, and what XLA says of it."""

    compiled: Any
    """The jax Compiled step: call it as the jitted step (params and opt_state donated)."""
    peak_memory_bytes: int | None
    """Per chip, compiled_peak_bytes (XLA memory analysis)."""
    cp_comm_bytes_per_step: int
    """Most bytes any chip receives per step outside the weights' traffic (comm_bytes_per_chip)."""
    grad_sync_bytes_per_step: int
    """Most bytes any chip receives per step for the weights: gradient reduction + gathers."""


def compile_cp_train_step(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh,
                          axis: AxisName, mode: CPMode,
                          compiler_options: dict | None = None) -> CompiledCPStep:
    """Compile the CP step without allocating anything, and read its memory and bytes.

    For sizing (memory, comm) without running, and for run_cp_training. Equal arguments reuse
    the compile within a process. compiler_options: XLA options (e.g. a lower backend
    optimisation level for quick tests); they change code generation, not the collectives.
    The bytes also compile the sync_grads=False reference (at FAST).
    """
    axis, _ = _check(model_cfg, train_cfg, mesh, axis, mode)
    shapes = cp_step_shapes(model_cfg, train_cfg, mesh=mesh, axis=axis)
    compiled = _jitted_step(model_cfg, train_cfg, mesh, axis, mode, True).lower(
        *shapes).compile(compiler_options)
    reference_cfg = dataclasses.replace(train_cfg, param_sharding="replicated")
    reference = _jitted_step(model_cfg, reference_cfg, mesh, axis, mode, False).lower(
        *cp_step_shapes(model_cfg, reference_cfg, mesh=mesh, axis=axis)).compile(FAST)
    cp_bytes, sync_bytes = comm_bytes_per_chip(compiled, reference, mesh.devices.size)
    return CompiledCPStep(compiled=compiled, peak_memory_bytes=compiled_peak_bytes(compiled),
                          cp_comm_bytes_per_step=cp_bytes, grad_sync_bytes_per_step=sync_bytes)


def comm_bytes_per_chip(compiled, reference, num_chips: int):
    """(cp bytes, weight-traffic bytes): the most any chip receives per step in each.

    reference: the same step compiled with sync_grads=False (replicated weights, no gradient
    reduction), so it runs the mode's exchanges, the conv halo and the loss psum exactly as
    the step does (remat included) and nothing else. CP bytes are its per-chip total; the
    weights' traffic (gradient all-reduce or reduce-scatter, zero1's and fsdp's all-gathers,
    loops counted per trip) is what the step receives beyond it.
    """
    def per_chip(program):
        return np.asarray(received_bytes_per_chip(program, num_chips)["per_chip"])

    cp_per_chip = per_chip(reference)
    sync_per_chip = per_chip(compiled) - cp_per_chip
    if (sync_per_chip < 0).any():
        raise RuntimeError(f"could not separate the weights' traffic: per chip {sync_per_chip} "
                           f"of {per_chip(compiled)} received")
    return int(cp_per_chip.max()), int(sync_per_chip.max())


def verify_against_single_chip(params, tokens_BT1, model_cfg: ModelConfig,
                               train_cfg: TrainConfig, *, mesh, axis: AxisName,
                               mode: CPMode) -> float:
    """Max relative error of the CP loss and summed gradients against one chip, same data.

    params: global arrays as cp_training_inputs lays them out; tokens_BT1: host int [B, T+1]
    (inputs [:, :-1], targets [:, 1:]), the same on every process. The CP side runs the step's
    own loss (param_sharding, remat) and gradient reduction; the reference is model_loss under
    jax.value_and_grad on this process's first device, no remat. Each gradient's error is
    relative to max(its norm, testing.VERIFY_GRAD_FLOOR × the whole reference gradient's
    norm). Every process returns the same.
    """
    axis, D = _check(model_cfg, train_cfg, mesh, axis, mode)
    dtype, global_tokens = jnp.dtype(train_cfg.dtype), train_cfg.batch_size * train_cfg.seq_len
    inputs_BT, targets_BT = tokens_BT1[:, :-1], tokens_BT1[:, 1:]
    layout, param_specs, _ = _specs(model_cfg, train_cfg, axis, D)

    def cp_loss_and_grads(params, inputs_Bt, targets_Bt):
        share, grads = jax.value_and_grad(model_loss)(
            params, inputs_Bt, targets_Bt, model_cfg, global_tokens=global_tokens, dtype=dtype,
            gdn_layer_fn=cp_layer_fn(axis=axis, mode=mode), fetch=layout.fetch(),
            remat=train_cfg.remat)
        return lax.psum(share, axis), layout.reduce_grads(grads)

    seq = P(None, axis)
    cp_loss, cp_grads = _host(jax.jit(jax.shard_map(
        cp_loss_and_grads, mesh=mesh, in_specs=(param_specs, seq, seq),
        out_specs=(P(), layout.grad_specs()), check_vma=False))(
            params, *_global((inputs_BT, targets_BT), NamedSharding(mesh, seq))), mesh)
    device = jax.local_devices()[0]
    ref_loss, ref_grads = jax.jit(jax.value_and_grad(
        lambda p, i, t: model_loss(p, i, t, model_cfg, global_tokens=global_tokens,
                                   dtype=dtype)))(*jax.device_put(
                                       (_host(params, mesh), inputs_BT, targets_BT), device))
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
