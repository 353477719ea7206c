"""Context-parallel JAX training: the whole model in one shard_map over the sequence axis.

Every chip holds a sequence shard of the batch (tokens [B, T] split on T over `axis`; under
layout="zigzag" the global arrays hold the sequence in cp_layout.shard_order, so chip r's shard
is segments r and 2D−1−r — laid out once by whoever feeds the step, as cp_training_inputs does) and the weights laid out by train_cfg.param_sharding (param_sharding.py: replicated,
zero1 or fsdp over the same chips). Its loss is (sum of its token losses) / (global token
count), so the chips' losses and parameter gradients each sum to the single-chip ones: the step
psums the loss and reduces the gradients once (WeightLayout.reduce_grads, as
train.build_step_fn's grad_transform), then applies AdamW (zero1: to its slice).

The shard_map runs with check_vma=False: with the check on, JAX would sum each replicated
parameter's gradient itself (the transpose of its implicit per-chip cast, one psum per use),
and the gradient sync would be neither explicit nor separable from the CP exchanges.
A hybrid model (params.is_hf_tree, ModelConfig.layers "hybrid") runs its GDN layers with the
GDN `mode` and its attention layers with `attn_cp` (cp/attention.py), on the same chips, the
rotary embedding at each token's global position.
Legend: B batch, T global tokens, t = T/D tokens per chip.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ... import device_memory
from ...config import FULL_ATTENTION, ModelConfig
from ...cp_layout import Layout, check_layout, shard_order
from ...cp_modes import AttnCPMode, CPMode, CPSettings, check_attn_cp, check_mode
from ...data import synthetic_tokens
from ...memory_model import verify_seq_len
from ...testing import max_verify_error
from ...train_config import CPTrainReport, TrainConfig
from ..hlo_comm import received_bytes_per_chip
from ..model import model_loss
from ..params import init_model_params
from ..train import (
    ESTIMATE_SOURCE,
    StepFn,
    build_step_fn,
    compiled_peak_bytes,
    make_optimizer,
    run_timed_steps,
)
from .attention import attend_fn, check_attention_shape, local_token_positions
from .common import AxisName, mesh_chip_count
from .layer import check_layer_shape, cp_layer_fn
from .param_sharding import WeightLayout, weight_layout

COMM_SOURCE = "xla_hlo"


FAST = {"xla_backend_optimization_level": 0}
"""Compiler options of the reference program that is only inspected (same HLO, collectives)."""


def _check(model_cfg: ModelConfig, train_cfg: TrainConfig, mesh, axis: AxisName, mode: str,
           attn_cp: str = "all_gather_kv", layout: str = "contiguous"):
    """Validate mode, attn_cp, layout, axis and shape; return (axis as a name or tuple, D)."""
    check_mode(mode)
    check_attn_cp(attn_cp)
    check_layout(layout)
    D = mesh_chip_count(mesh, axis)
    check_layer_shape(model_cfg.gdn, mode=mode, chips=D, seq_len=train_cfg.seq_len,
                      layout=layout)
    if FULL_ATTENTION in model_cfg.layer_pattern:
        check_attention_shape(attn_cp=attn_cp, chips=D, seq_len=train_cfg.seq_len,
                              num_heads=model_cfg.attention.num_heads,
                              num_kv_heads=model_cfg.attention.num_kv_heads, layout=layout)
    return (axis if isinstance(axis, str) else tuple(axis)), D


def _model_hooks(axis, D: int, seq_len: int, *, mode: str, attn_cp: str, layout: str) -> dict:
    """The CP layers of build_step_fn / model_loss: GDN under `mode`, attention under
    `attn_cp`, and this chip's global token positions (rotary)."""
    return {"gdn_layer_fn": cp_layer_fn(axis=axis, mode=mode, layout=layout),
            "attend_fn": attend_fn(axis=axis, mode=attn_cp, layout=layout),
            "positions_fn": lambda: local_token_positions(axis, seq_len // D, layout)}


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
                     mode: CPMode, sync_grads: bool = True, attn_cp: AttnCPMode = "all_gather_kv",
                     layout: Layout = "contiguous") -> StepFn:
    """The un-jitted, shard_mapped step; see make_cp_train_step.

    sync_grads=False builds the reference that prices the weights' traffic: replicated weights
    (whatever train_cfg.param_sharding says) and no gradient reduction, each chip updating with
    its own share — only for counting bytes, never for training.
    """
    axis, D = _check(model_cfg, train_cfg, mesh, axis, mode, attn_cp, layout)
    if not sync_grads:
        train_cfg = dataclasses.replace(train_cfg, param_sharding="replicated")
    weights, param_specs, opt_specs = _specs(model_cfg, train_cfg, axis, D)
    step = build_step_fn(
        model_cfg, train_cfg, global_tokens=train_cfg.batch_size * train_cfg.seq_len,
        grad_transform=weights.reduce_grads if sync_grads else None, fetch=weights.fetch(),
        apply_update=weights.apply_update(make_optimizer(train_cfg)),
        **_model_hooks(axis, D, train_cfg.seq_len, mode=mode, attn_cp=attn_cp, layout=layout))

    def shard_step(params, opt_state, inputs_Bt, targets_Bt):
        params, opt_state, loss_share = step(params, opt_state, inputs_Bt, targets_Bt)
        return params, opt_state, lax.psum(loss_share, axis)

    seq = P(None, axis)
    return jax.shard_map(shard_step, mesh=mesh, in_specs=(param_specs, opt_specs, seq, seq),
                         out_specs=(param_specs, opt_specs, P()), check_vma=False)


def make_cp_train_step(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh,
                       axis: AxisName, mode: CPMode, attn_cp: AttnCPMode = "all_gather_kv",
                       layout: Layout = "contiguous") -> StepFn:
    """Jitted step(params, opt_state, inputs_BT, targets_BT) -> (params, opt_state, loss).

    params, opt_state: global arrays laid out as cp_training_inputs makes them (per
    train_cfg.param_sharding; donated: do not reuse the passed-in ones). inputs_BT,
    targets_BT: int [B, T] global, T split over mesh axis `axis` (a name or a tuple flattened
    major-to-minor; D = the product of their sizes), in cp_layout.shard_order(layout) (the
    identity for contiguous). attn_cp: the attention layers' CP mode (hybrid models). loss: the global mean loss (float32,
    replicated). The update equals one chip's AdamW step on the summed gradients.
    The same arguments return the same jitted function, so `.lower(...).compile()` of equal
    shapes and shardings compiles once per process (compile_cp_train_step relies on it).
    Raises ValueError naming the numbers when `mode` cannot split train_cfg's shape over D.
    """
    axis, _ = _check(model_cfg, train_cfg, mesh, axis, mode, attn_cp, layout)
    return _jitted_step(model_cfg, train_cfg, mesh, axis, mode, True, attn_cp, layout)


@functools.lru_cache(maxsize=32)
def _jitted_step(model_cfg, train_cfg, mesh, axis, mode, sync_grads, attn_cp="all_gather_kv",
                 layout="contiguous"):
    step = build_cp_step_fn(model_cfg, train_cfg, mesh=mesh, axis=axis, mode=mode,
                            sync_grads=sync_grads, attn_cp=attn_cp, layout=layout)
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
                       axis: AxisName, params=None, layout: Layout = "contiguous"):
    """(params, opt_state, inputs_BT, targets_BT) as global arrays for make_cp_train_step.

    Fresh weights (seed train_cfg.seed), or the host pytree `params` given (e.g.
    params.from_state_dict of a checkpoint), and fresh AdamW state, laid out by
    train_cfg.param_sharding; the synthetic batch's inputs tokens[:, :-1] and targets
    tokens[:, 1:] [B, T], T split over `axis` in cp_layout.shard_order(layout). Call on every
    process of a multi-process mesh
    (each feeds only its own devices).
    """
    axis = axis if isinstance(axis, str) else tuple(axis)
    D = mesh_chip_count(mesh, axis)
    _, param_specs, opt_specs = _specs(model_cfg, train_cfg, axis, D)
    tokens_BT1 = synthetic_batch(model_cfg, train_cfg)
    order = shard_order(chips=D, seq_len=train_cfg.seq_len, layout=layout)
    if params is None:
        params = init_model_params(model_cfg, jax.random.PRNGKey(train_cfg.seed))
    opt_state = make_optimizer(train_cfg).init(params)
    return (_global(params, _named(mesh, param_specs)), _global(opt_state, _named(mesh, opt_specs)),
            *_global((tokens_BT1[:, :-1][:, order], tokens_BT1[:, 1:][:, order]),
                     NamedSharding(mesh, P(None, axis))))


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
                          axis: AxisName, mode: CPMode,
                          compiler_options: dict | None = None,
                          attn_cp: AttnCPMode = "all_gather_kv",
                          layout: Layout = "contiguous") -> CompiledCPStep:
    """Compile the CP step without allocating anything, and read its memory and bytes.

    For sizing (memory, comm) without running, and for run_cp_training. Equal arguments reuse
    the compile within a process. compiler_options: XLA options (e.g. a lower backend
    optimisation level for quick tests); they change code generation, not the collectives.
    The bytes also compile the sync_grads=False reference (at FAST).
    """
    axis, _ = _check(model_cfg, train_cfg, mesh, axis, mode, attn_cp, layout)
    start = time.perf_counter()
    shapes = cp_step_shapes(model_cfg, train_cfg, mesh=mesh, axis=axis)
    compiled = _jitted_step(model_cfg, train_cfg, mesh, axis, mode, True, attn_cp,
                            layout).lower(*shapes).compile(compiler_options)
    reference_cfg = dataclasses.replace(train_cfg, param_sharding="replicated")
    reference = _jitted_step(model_cfg, reference_cfg, mesh, axis, mode, False, attn_cp,
                             layout).lower(
        *cp_step_shapes(model_cfg, reference_cfg, mesh=mesh, axis=axis)).compile(FAST)
    compile_time_s = time.perf_counter() - start
    cp_bytes, sync_bytes = comm_bytes_per_chip(compiled, reference, mesh.devices.size)
    return CompiledCPStep(compiled=compiled,
                          estimated_memory_bytes=compiled_peak_bytes(compiled),
                          cp_comm_bytes_per_step=cp_bytes, grad_sync_bytes_per_step=sync_bytes,
                          compile_time_s=compile_time_s)


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
                               mode: CPMode, attn_cp: AttnCPMode = "all_gather_kv",
                               layout: Layout = "contiguous") -> float:
    """Max relative error of the CP loss and summed gradients against one chip, same data.

    params: global arrays as cp_training_inputs lays them out; tokens_BT1: host int [B, T+1]
    (inputs [:, :-1], targets [:, 1:]), the same on every process, T = train_cfg.seq_len (a
    prefix of the run's sequence is verified by passing its tokens and seq_len). The CP side
    runs the step's own loss (param_sharding, remat) and gradient reduction; the reference is
    model_loss under jax.value_and_grad on this process's first device, no remat. Each
    gradient's error is relative to max(its norm, testing.VERIFY_GRAD_FLOOR × the whole
    reference gradient's norm). Every process returns the same.
    """
    return _verify(params, tokens_BT1, model_cfg, train_cfg, mesh=mesh, axis=axis,
                   mode=mode, attn_cp=attn_cp, layout=layout)[0]


def _verify(params, tokens_BT1, model_cfg, train_cfg, *, mesh, axis, mode,
            attn_cp="all_gather_kv", layout="contiguous"):
    """verify_against_single_chip's (error, seconds spent lowering and compiling)."""
    axis, D = _check(model_cfg, train_cfg, mesh, axis, mode, attn_cp, layout)
    dtype, global_tokens = jnp.dtype(train_cfg.dtype), train_cfg.batch_size * train_cfg.seq_len
    inputs_BT, targets_BT = tokens_BT1[:, :-1], tokens_BT1[:, 1:]
    cp_loss_and_grads = cp_loss_and_grads_fn(model_cfg, train_cfg, mesh=mesh, axis=axis,
                                             mode=mode, attn_cp=attn_cp, layout=layout)

    def reference_loss_and_grads(params, inputs_BT, targets_BT):
        return jax.value_and_grad(model_loss)(params, inputs_BT, targets_BT, model_cfg,
                                              global_tokens=global_tokens, dtype=dtype)

    order = shard_order(chips=D, seq_len=train_cfg.seq_len, layout=layout)
    cp_args = (params, *_global((inputs_BT[:, order], targets_BT[:, order]),
                                NamedSharding(mesh, P(None, axis))))
    start = time.perf_counter()
    cp_program = jax.jit(cp_loss_and_grads).lower(*cp_args).compile()
    compile_time_s = time.perf_counter() - start
    cp_loss, cp_grads = _host(cp_program(*cp_args), mesh)
    del cp_args
    ref_args = jax.device_put((_host(params, mesh), inputs_BT, targets_BT),
                              jax.local_devices()[0])
    start = time.perf_counter()
    ref_program = jax.jit(reference_loss_and_grads).lower(*ref_args).compile()
    compile_time_s += time.perf_counter() - start
    ref_loss, ref_grads = ref_program(*ref_args)
    error = max_verify_error(ref_loss, cp_loss, jax.tree.leaves(ref_grads),
                             jax.tree.leaves(cp_grads))
    return error, compile_time_s


def cp_loss_and_grads_fn(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh,
                         axis: AxisName, mode: CPMode, attn_cp: AttnCPMode = "all_gather_kv",
                         layout: Layout = "contiguous"):
    """The step's loss and reduced gradients, without the update: a shard_mapped
    f(params, inputs_BT, targets_BT) -> (global mean loss, gradients laid out as the step's
    reduced ones: WeightLayout.grad_specs). Arguments as make_cp_train_step's."""
    axis, D = _check(model_cfg, train_cfg, mesh, axis, mode, attn_cp, layout)
    dtype, global_tokens = jnp.dtype(train_cfg.dtype), train_cfg.batch_size * train_cfg.seq_len
    weights, param_specs, _ = _specs(model_cfg, train_cfg, axis, D)
    hooks = _model_hooks(axis, D, train_cfg.seq_len, mode=mode, attn_cp=attn_cp, layout=layout)
    positions_fn = hooks.pop("positions_fn")

    def loss_and_grads(params, inputs_Bt, targets_Bt):
        share, grads = jax.value_and_grad(model_loss)(
            params, inputs_Bt, targets_Bt, model_cfg, global_tokens=global_tokens, dtype=dtype,
            fetch=weights.fetch(), remat=train_cfg.remat, positions=positions_fn(), **hooks)
        return lax.psum(share, axis), weights.reduce_grads(grads)

    seq = P(None, axis)
    return jax.shard_map(loss_and_grads, mesh=mesh, in_specs=(param_specs, seq, seq),
                         out_specs=(P(), weights.grad_specs()), check_vma=False)


def _local_devices(mesh) -> list:
    """This process's devices of the mesh (its chips)."""
    return [d for d in mesh.devices.flat if d.process_index == jax.process_index()]


def _verify_budget(devices, budget_bytes: int | None) -> int | None:
    """The one-chip memory budget every process agrees on: the smallest one's (given, or the
    chip's capacity: device_memory.jax_chip_capacity); None when no process knows one."""
    if budget_bytes is None:
        budget_bytes, _ = device_memory.jax_chip_capacity(devices)
    if jax.process_count() == 1:
        return budget_bytes
    from jax.experimental import multihost_utils

    known = multihost_utils.process_allgather(np.int64(-1 if budget_bytes is None
                                                       else budget_bytes))
    known = [int(b) for b in np.ravel(known) if b >= 0]
    return min(known) if known else None


def run_cp_training(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh, axis: AxisName,
                    cp: CPSettings, steps: int, warmup_steps: int = 1, verify: bool = False,
                    verify_memory_budget_bytes: int | None = None) -> CPTrainReport:
    """Train under CP (`cp`) on one fixed synthetic batch; call on every process of `mesh`.

    Every process builds the same weights (seed train_cfg.seed) and tokens, and feeds only its
    own devices' shards. warmup_steps untimed, then `steps` timed steps (outputs blocked on).
    Peak memory per chip is measured over the whole run (device_memory.jax_peak_memory of this
    process's chips: the device allocator's peak, on CPU the process RSS / its chips); XLA's
    memory analysis of the compiled step is the separate estimate. Comm per chip per step:
    from the step's HLO (compile_cp_train_step). verify=True first compares loss and gradients
    at the initial weights against one chip (max_rel_err) on as much of the sequence as one
    chip holds beside the step's state (memory_model.verify_seq_len within
    verify_memory_budget_bytes, default the chip's capacity; verified_seq_len). Losses: every
    step, global mean. Raises ValueError naming the numbers when `axis` is not cp.chips
    chips, or when cp's modes or layout cannot split the shape over them.
    """
    if not isinstance(steps, int) or not isinstance(warmup_steps, int) or steps < 1 \
            or warmup_steps < 0:
        raise ValueError(f"steps={steps!r} must be >= 1 and warmup_steps={warmup_steps!r} >= 0")
    axis, D = _check(model_cfg, train_cfg, mesh, axis, cp.mode, cp.attn_cp, cp.layout)
    if D != cp.chips:
        raise ValueError(f"cp.chips={cp.chips} but mesh axis {axis!r} spans {D} chips")
    devices = _local_devices(mesh)
    baseline = device_memory.jax_reset_peak(devices)
    params, opt_state, inputs_BT, targets_BT = cp_training_inputs(
        model_cfg, train_cfg, mesh=mesh, axis=axis, layout=cp.layout)
    max_rel_err = verified_seq_len = None
    compile_time_s = 0.0
    if verify:
        budget = _verify_budget(devices, verify_memory_budget_bytes)
        verified_seq_len = train_cfg.seq_len if budget is None else verify_seq_len(
            model_cfg, train_cfg, mode=cp.mode, chips=D, framework="jax", budget_bytes=budget)
        if verified_seq_len is not None and cp.layout == "zigzag":  # 2D segments of the prefix
            verified_seq_len = verified_seq_len - verified_seq_len % (2 * D) or None
        if verified_seq_len is not None:
            prefix_cfg = dataclasses.replace(train_cfg, seq_len=verified_seq_len)
            tokens_BT1 = synthetic_batch(model_cfg, train_cfg)[:, :verified_seq_len + 1]
            max_rel_err, compile_time_s = _verify(params, tokens_BT1, model_cfg, prefix_cfg,
                                                  mesh=mesh, axis=axis, mode=cp.mode,
                                                  attn_cp=cp.attn_cp, layout=cp.layout)
    program = compile_cp_train_step(model_cfg, train_cfg, mesh=mesh, axis=axis, mode=cp.mode,
                                    attn_cp=cp.attn_cp, layout=cp.layout)
    estimate = program.estimated_memory_bytes

    losses, step_times_s = run_timed_steps(program.compiled, params, opt_state, inputs_BT,
                                           targets_BT, steps=steps, warmup_steps=warmup_steps,
                                           loss_to_host=lambda loss: float(_host(loss)))
    peak_bytes, memory_source = device_memory.jax_peak_memory(devices, baseline=baseline)
    return CPTrainReport(
        losses=losses, step_times_s=step_times_s, peak_memory_bytes=peak_bytes,
        memory_source=memory_source, estimated_memory_bytes=estimate,
        estimated_memory_source=ESTIMATE_SOURCE if estimate is not None else None,
        compile_time_s=compile_time_s + program.compile_time_s, mode=cp.mode, chips=D,
        cp_comm_bytes_per_step=program.cp_comm_bytes_per_step,
        grad_sync_bytes_per_step=program.grad_sync_bytes_per_step,
        comm_source=COMM_SOURCE, max_rel_err=max_rel_err, verified_seq_len=verified_seq_len,
        attn_cp=cp.attn_cp if FULL_ATTENTION in model_cfg.layer_pattern else None, layout=cp.layout)
