"""The CP step checked against one chip: loss and summed gradients on the same data.

`verify_against_single_chip` compares the CP step's own loss and reduced gradients
(`cp_loss_and_grads_fn`: param_sharding, remat and gradient reduction as the step runs them)
with model_loss under jax.value_and_grad on one device, no remat. `verify_budget` is the
one-chip memory every process agrees the reference may use (memory.verify picks the prefix
of the sequence that fits).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from ... import device_memory
from ...config import ModelConfig
from ...cp_layout import shard_order
from ...cp_modes import CPSettings
from ...testing import max_verify_error
from ...train_config import TrainConfig
from ..model import model_loss
from ..train import packed_boundaries
from .common import AxisName
from .step import MeshCP, mesh_cp, global_arrays, host_copy, model_hooks, weight_specs


def verify_against_single_chip(params, tokens_BT1, model_cfg: ModelConfig,
                               train_cfg: TrainConfig, *, mesh, axis: AxisName,
                               cp: CPSettings, batch_axis: str | None = None) -> float:
    """Max relative error of the CP loss and summed gradients against one chip, same data.

    params: global arrays as cp_training_inputs lays them out; tokens_BT1: host int [B, T+1]
    (inputs [:, :-1], targets [:, 1:]), the same on every process, T = train_cfg.seq_len (a
    prefix of the run's sequence is verified by passing its tokens and seq_len). The CP side
    runs the step's own loss (param_sharding, remat) and gradient reduction; the reference is
    model_loss under jax.value_and_grad on this process's first device, no remat. Each
    gradient's error is relative to max(its norm, testing.VERIFY_GRAD_FLOOR × the whole
    reference gradient's norm). Every process returns the same. batch_axis (dp replicas):
    tokens_BT1 is the global batch [dp·B, T+1] (step.synthetic_batch(…, dp)), rows over
    batch_axis on the CP side; the one chip runs all dp·B sequences.
    """
    return verify_error(params, tokens_BT1, model_cfg, train_cfg, mesh_cp(
        model_cfg, train_cfg.seq_len, mesh=mesh, axis=axis, cp=cp, dtype=train_cfg.dtype,
        batch_axis=batch_axis))[0]


def verify_error(params, tokens_BT1, model_cfg: ModelConfig, train_cfg: TrainConfig,
                 cp: MeshCP) -> tuple[float, float]:
    """verify_against_single_chip for validated settings: (error, seconds spent lowering and
    compiling)."""
    rows = cp.dp * train_cfg.batch_size
    if tokens_BT1.shape != (rows, train_cfg.seq_len + 1):
        raise ValueError(f"tokens_BT1 has shape {tokens_BT1.shape}; the global batch is "
                         f"({rows}, {train_cfg.seq_len + 1}): dp={cp.dp} × batch_size="
                         f"{train_cfg.batch_size} sequences of seq_len + 1 tokens")
    dtype, global_tokens = jnp.dtype(train_cfg.dtype), rows * train_cfg.seq_len
    inputs_BT, targets_BT = tokens_BT1[:, :-1], tokens_BT1[:, 1:]
    cp_loss_and_grads = _loss_and_grads_fn(model_cfg, train_cfg, cp)

    def reference_loss_and_grads(params, inputs_BT, targets_BT):
        return jax.value_and_grad(model_loss)(params, inputs_BT, targets_BT, model_cfg,
                                              global_tokens=global_tokens, dtype=dtype,
                                              cu_seqlens=packed_boundaries(train_cfg))

    order = shard_order(chips=cp.chips, seq_len=train_cfg.seq_len, layout=cp.layout)
    cp_args = (params, *global_arrays((inputs_BT[:, order], targets_BT[:, order]),
                                      NamedSharding(cp.mesh, cp.token_spec)))
    start = time.perf_counter()
    cp_program = jax.jit(cp_loss_and_grads).lower(*cp_args).compile()
    compile_time_s = time.perf_counter() - start
    cp_loss, cp_grads = host_copy(cp_program(*cp_args), cp.mesh)
    del cp_args
    ref_args = jax.device_put((host_copy(params, cp.mesh), inputs_BT, targets_BT),
                              jax.local_devices()[0])
    start = time.perf_counter()
    ref_program = jax.jit(reference_loss_and_grads).lower(*ref_args).compile()
    compile_time_s += time.perf_counter() - start
    ref_loss, ref_grads = ref_program(*ref_args)
    error = max_verify_error(ref_loss, cp_loss, jax.tree.leaves(ref_grads),
                             jax.tree.leaves(cp_grads))
    return error, compile_time_s


def cp_loss_and_grads_fn(model_cfg: ModelConfig, train_cfg: TrainConfig, *, mesh,
                         axis: AxisName, cp: CPSettings, batch_axis: str | None = None):
    """The step's loss and reduced gradients, without the update: a shard_mapped
    f(params, inputs_BT, targets_BT) -> (global mean loss, gradients laid out as the step's
    reduced ones: WeightLayout.grad_specs). Arguments as make_cp_train_step's."""
    return _loss_and_grads_fn(model_cfg, train_cfg, mesh_cp(
        model_cfg, train_cfg.seq_len, mesh=mesh, axis=axis, cp=cp, dtype=train_cfg.dtype,
        batch_axis=batch_axis))


def _loss_and_grads_fn(model_cfg: ModelConfig, train_cfg: TrainConfig, cp: MeshCP):
    dtype = jnp.dtype(train_cfg.dtype)
    global_tokens = cp.dp * train_cfg.batch_size * train_cfg.seq_len
    weights, param_specs, _ = weight_specs(model_cfg, train_cfg, cp.weight_axis, cp.mesh_chips)
    hooks = model_hooks(cp, train_cfg.seq_len)
    positions_fn = hooks.pop("positions_fn")

    def loss_and_grads(params, inputs_Bt, targets_Bt):
        share, grads = jax.value_and_grad(model_loss)(
            params, inputs_Bt, targets_Bt, model_cfg, global_tokens=global_tokens, dtype=dtype,
            fetch=weights.fetch(), remat=train_cfg.remat, positions=positions_fn(),
            cu_seqlens=packed_boundaries(train_cfg), **hooks)
        return lax.psum(share, cp.weight_axis), weights.reduce_grads(grads)

    seq = cp.token_spec
    return jax.shard_map(loss_and_grads, mesh=cp.mesh, in_specs=(param_specs, seq, seq),
                         out_specs=(P(), weights.grad_specs()), check_vma=False)


def verify_budget(devices, budget_bytes: int | None) -> int | None:
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
