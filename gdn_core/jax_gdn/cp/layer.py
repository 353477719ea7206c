"""Context-parallel GDN layer: the single-chip layer's pieces around a CP exchange.

`cp_gdn_layer` maps this chip's sequence shard [B, t, D] to [B, t, D] (t = T/D; the tokens
cp_layout.local_positions names under `layout`: contiguous, chip order along `axis` = sequence
order; zigzag, segments r and 2D−1−r on chip r) inside an enclosing shard_map; `gdn_layer_cp`
wraps it for global arrays. Two ways to split the work, as in docs/architecture.md (and
torch_gdn.cp.layer):

  sequence-sharded (p2p, all_gather, log_scan): the single-chip layer's pieces, each of the
    chip's segments convolved after its own halo (halo.segment_halos: the last K−1 pre-conv
    tokens of the segment before it, wherever it is), rule = chunk_gated_delta_rule_cp_shard
    (rule_kernel given: kernel_rule.kernel_cp_rule_shard, every rule step a kernel call)
  ulysses (head-sharded rule):
    project → one all-to-all of the pre-conv q, k, v channels and a, b: [B, t, all heads] →
    [B, T, value heads of chip j and the key heads they use (cp_modes.UlyssesHeads: copies
    when Hk < D)] → (zigzag: segments into sequence order, locally) → causal conv with the
    conv weight of those channels (no halo: the chip holds the whole sequence) → split_heads
    with A_log, dt_bias of those heads → the single-chip rule (or rule_kernel) → (zigzag:
    back to shard order) → all-to-all o back → output (z never moves)

rule_kernel: None runs this package's reference chunk rule; otherwise a one-chip rule kernel
with the state in and out (kernel_rule.StateKernel: the Pallas chunk rule under
kernels="fused", jax_gdn.kernels.jax_gdn_rule_kernel). A Pallas kernel needs the enclosing
shard_map's check_vma=False, as the CP train step runs it.

Parameters are replicated; under jax.grad each chip gets its own contribution to a parameter's
gradient when the enclosing shard_map has check_vma=False (the CP train step sums them with
one psum), and the summed gradient when check_vma=True (JAX inserts the psum).
Legend: B batch, t local tokens, T global tokens, D hidden (x) / chips (count), C conv
channels, G key heads, H value heads, K key dim, V value dim, P per-chip packed channels.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from ...config import GDNConfig
from ...cp_layout import Layout, check_layout
from ...cp_modes import CPMode, UlyssesHeads, check_cp_shape, check_mode
from ..chunk import chunk_gated_delta_rule
from ..layer import causal_conv, output, project, run_rule, split_heads
from ..model import GDNLayerFn
from ..params import Params, cast_floating
from ..documents import check_cu_seqlens, tokens_since_start
from .common import (AxisName, batch_as_segments, chip_count, chip_index, mesh_chip_count,
                     place_on_mesh, segment_positions, segments_as_batch, vary_like)
from .halo import segment_halos
from .kernel_rule import StateKernel, kernel_cp_rule_shard
from .rule import cp_rule_shard_unchecked
from .ulysses import key_heads_for_chips, segments_in_sequence_order


def _local_heads(params: Params, cfg: GDNConfig, me, plan: UlyssesHeads):
    """Chip me's conv weight [P, 1, K] (its q | k | v channels) and gate params [H/D].

    Value heads me·H/D … and the key heads they use (plan.key_heads: copies when Hk < D), in
    the single-chip rule's GQA order.
    """
    rows_DP = np.stack([cfg.conv_channels(plan.key_heads(j), plan.value_heads(j))
                        for j in range(plan.chips)])
    w_local = jnp.take(params["conv1d"]["weight"], jnp.asarray(rows_DP)[me], axis=0)
    Hl = plan.value_heads_per_chip
    gates = {name: lax.dynamic_slice_in_dim(params[name], me * Hl, Hl, axis=0)
             for name in ("A_log", "dt_bias")}
    return w_local, gates


def _segmented_conv(conv_weight, mixed_BtC, halos_SBKC, since_start_Ss=None):
    """causal_conv of each of the chip's S segments after its own halo; [B, t, C].
    since_start_Ss: [S, s] tokens since each token's document start (packed documents)."""
    S = halos_SBKC.shape[0]
    B = mixed_BtC.shape[0]
    since = None if since_start_Ss is None else jnp.repeat(since_start_Ss, B, axis=0)
    conv_BsC = causal_conv(conv_weight, segments_as_batch(mixed_BtC, S),
                           halos_SBKC.reshape(-1, *halos_SBKC.shape[2:]), since)
    return batch_as_segments(conv_BsC, S)


def _sequence_sharded_layer(params: Params, x_BtD, cfg: GDNConfig, *, axis: AxisName,
                            mode: CPMode, layout: Layout, dtype, cu_seqlens=None,
                            rule_kernel: StateKernel | None = None):
    """layer.gdn_layer's pieces with each segment's own conv halo and the CP rule."""
    params = cast_floating(params, dtype)
    mixed_BtC, z_BtHV, b_BtH, a_BtH = project(params, x_BtD.astype(dtype))
    halos_SBKC = segment_halos(mixed_BtC, halo=cfg.conv_kernel_size - 1, axis=axis,
                               layout=layout)
    since_Ss = None if cu_seqlens is None else tokens_since_start(cu_seqlens, segment_positions(
        axis=axis, layout=layout, seq_len=x_BtD.shape[1] * chip_count(axis)))
    conv_BtC = _segmented_conv(params["conv1d"]["weight"], mixed_BtC, halos_SBKC, since_Ss)
    q, k, v, g, beta = split_heads(params, conv_BtC, a_BtH, b_BtH, cfg)
    documents = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
    rule = (cp_rule_shard_unchecked if rule_kernel is None
            else partial(kernel_cp_rule_shard, kernel=rule_kernel))
    o_BtHV = run_rule(q, k, v, g, beta, cfg, rule=partial(
        rule, axis=axis, mode=mode, layout=layout, **documents))
    return output(params, o_BtHV, z_BtHV, cfg)


def _ulysses_layer(params: Params, x_BtD, cfg: GDNConfig, *, axis: AxisName, layout: Layout,
                   dtype, cu_seqlens=None, rule_kernel: StateKernel | None = None):
    """The ulysses layout (module docstring) on this chip's shard; [B, t, D] -> [B, t, D]."""
    D, me = chip_count(axis), chip_index(axis)
    plan = UlyssesHeads(num_k_heads=cfg.num_k_heads, num_v_heads=cfg.num_v_heads, chips=D)
    params = cast_floating(params, dtype)
    mixed_BtC, z_BtHV, b_BtH, a_BtH = project(params, x_BtD.astype(dtype))
    B, t, _ = mixed_BtC.shape
    kd, Dk = cfg.key_dim, cfg.head_k_dim
    G, Hl = plan.key_heads_per_chip, plan.value_heads_per_chip

    def key_heads(x_BtC):  # [B, t, Hk·Dk] -> [B, t, D·G·Dk], chip j's key heads in block j
        return key_heads_for_chips(x_BtC.reshape(B, t, -1, Dk), plan).reshape(B, t, -1)

    # Pack, per destination chip j, [q_j | k_j | v_j | b_j | a_j] along a D-sized axis, so one
    # all-to-all moves everything (q/k/v pre-conv: the conv is depthwise, it commutes with
    # moving channels, and after the move the chip convolves the whole sequence, no halo).
    parts = (key_heads(mixed_BtC[..., :kd]), key_heads(mixed_BtC[..., kd:2 * kd]),
             mixed_BtC[..., 2 * kd:], b_BtH, a_BtH)
    packed_BtDP = jnp.concatenate([p.reshape(B, t, D, -1) for p in parts], axis=-1)
    local_BTP = segments_in_sequence_order(
        lax.all_to_all(packed_BtDP, axis, split_axis=2, concat_axis=1, tiled=True)[:, :, 0],
        chips=D, layout=layout)
    conv_channels = 2 * G * Dk + Hl * cfg.head_v_dim
    w_local, gates = _local_heads(params, cfg, me, plan)
    since_T = None if cu_seqlens is None else tokens_since_start(
        cu_seqlens, jnp.arange(local_BTP.shape[1]))
    conv_BTC = causal_conv(w_local, local_BTP[..., :conv_channels], None, since_T)
    b_BTH = local_BTP[..., conv_channels:conv_channels + Hl]
    a_BTH = local_BTP[..., conv_channels + Hl:]
    local_cfg = dataclasses.replace(cfg, num_k_heads=G, num_v_heads=Hl)
    q, k, v, g, beta = split_heads(gates, conv_BTC, a_BTH, b_BTH, local_cfg)
    # The rule's default zero state would be replicated while q … beta vary per chip, and a
    # scan carry must keep one type under shard_map's check: start from a per-chip zero state.
    h0_BHKV = vary_like(jnp.zeros((B, Hl, Dk, cfg.head_v_dim), jnp.float32),
                        g[:, 0, :, None, None])
    documents = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
    one_chip_rule = chunk_gated_delta_rule if rule_kernel is None else rule_kernel
    o_BTHV = run_rule(q, k, v, g, beta, local_cfg,
                      rule=partial(one_chip_rule, initial_state=h0_BHKV, **documents))
    o_BtHV = lax.all_to_all(segments_in_sequence_order(o_BTHV, chips=D, layout=layout,
                                                       inverse=True),
                            axis, split_axis=1, concat_axis=2, tiled=True)
    return output(params, o_BtHV, z_BtHV, cfg)


def cp_gdn_layer(params: Params, x_BtD, cfg: GDNConfig, *, axis: AxisName, mode: CPMode,
                 layout: Layout = "contiguous", dtype=jnp.float32, cu_seqlens=None,
                 rule_kernel: StateKernel | None = None):
    """Run one GDN layer on this chip's sequence shard; call inside a shard_map binding `axis`.

    Args:
        params: the layer's parameters (params.init_layer_params layout), replicated.
        x_BtD: [B, T/D, hidden], the tokens cp_layout.local_positions(chip=j, chips=D,
            seq_len=T, layout=layout) on chip j (j = position along `axis`, a name or a tuple
            flattened major-to-minor): contiguous, j·T/D … (j+1)·T/D − 1; zigzag, segments j
            and 2D−1−j of T/(2D) tokens.
        mode: ulysses, p2p, all_gather or log_scan. layout: contiguous or zigzag.
        cu_seqlens: None, or the GLOBAL packed-document boundaries (int [N+1], 0 … T, all rows),
            replicated: each document mixed as if alone (the halo, exchanged as ever, is
            masked past a document start; the state resets at each start).
        rule_kernel: None (this package's chunk rule) or a one-chip rule kernel with the state
            in and out (module docstring: the Pallas chunk rule under kernels="fused").
    Returns: [B, T/D, hidden] in dtype — this chip's shard of the single-chip gdn_layer output.
    Raises ValueError naming the numbers: unknown mode or layout, ulysses value heads not
        divisible by D, a local shard (zigzag: a segment) shorter than the conv halo (K−1
        tokens), T not divisible by 2D under zigzag.
    """
    D = chip_count(axis)
    check_cp_shape(mode=mode, chips=D, seq_len=x_BtD.shape[1] * D, num_k_heads=cfg.num_k_heads,
                   num_v_heads=cfg.num_v_heads, conv_kernel_size=cfg.conv_kernel_size,
                   layout=layout)
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, seq_len=x_BtD.shape[1] * D)
    return cp_gdn_layer_unchecked(params, x_BtD, cfg, axis=axis, mode=mode, layout=layout,
                                  dtype=dtype, cu_seqlens=cu_seqlens, rule_kernel=rule_kernel)


def cp_gdn_layer_unchecked(params: Params, x_BtD, cfg: GDNConfig, *, axis: AxisName,
                           mode: CPMode, layout: Layout = "contiguous", dtype=jnp.float32,
                           cu_seqlens=None, rule_kernel: StateKernel | None = None):
    """cp_gdn_layer without its checks: for a step that validated mode, layout and shape once
    (cp/step.py's mesh_cp), so its layers do not check them again at every trace."""
    if mode == "ulysses":
        return _ulysses_layer(params, x_BtD, cfg, axis=axis, layout=layout, dtype=dtype,
                              cu_seqlens=cu_seqlens, rule_kernel=rule_kernel)
    return _sequence_sharded_layer(params, x_BtD, cfg, axis=axis, mode=mode, layout=layout,
                                   dtype=dtype, cu_seqlens=cu_seqlens, rule_kernel=rule_kernel)


def cp_layer_fn(*, axis: AxisName, mode: CPMode, layout: Layout = "contiguous") -> GDNLayerFn:
    """cp_gdn_layer bound to (axis, mode, layout): model_forward's `gdn_layer_fn` under CP."""
    check_mode(mode)
    check_layout(layout)
    return partial(cp_gdn_layer, axis=axis, mode=mode, layout=layout)


def gdn_layer_cp(params: Params, x_BTD, cfg: GDNConfig, *, mesh, axis: AxisName, mode: CPMode,
                 layout: Layout = "contiguous", dtype=jnp.float32, cu_seqlens=None):
    """cp_gdn_layer on global arrays: x [B, T, hidden] split on T (dim 1) over mesh axis `axis`.

    layout="zigzag": dim 1 holds the sequence in shard order (x[:, cp_layout.shard_order(
    chips=D, seq_len=T, layout="zigzag")]), and the output comes back in that order.
    params are replicated. Returns [B, T, hidden] in dtype, sequence-sharded over `axis`;
    jit- and grad-able (parameter gradients come back summed over the chips).
    Raises ValueError naming the numbers (unknown mode, layout or axis, T not divisible by D
    (2D under zigzag), …).
    """
    D = mesh_chip_count(mesh, axis)
    axis = axis if isinstance(axis, str) else tuple(axis)
    check_cp_shape(mode=mode, chips=D, seq_len=x_BTD.shape[1], num_k_heads=cfg.num_k_heads,
                   num_v_heads=cfg.num_v_heads, conv_kernel_size=cfg.conv_kernel_size,
                   layout=layout)
    seq_spec = P(None, axis)
    layer = partial(cp_gdn_layer_unchecked, cfg=cfg, axis=axis, mode=mode, layout=layout,
                    dtype=dtype)  # checked above, once
    if cu_seqlens is None:
        return jax.shard_map(layer, mesh=mesh, in_specs=(P(), seq_spec), out_specs=seq_spec)(
            place_on_mesh(params, mesh, P(), axis), place_on_mesh(x_BTD, mesh, seq_spec, axis))
    check_cu_seqlens(cu_seqlens, seq_len=x_BTD.shape[1])
    return jax.shard_map(lambda p, x, cu: layer(p, x, cu_seqlens=cu), mesh=mesh,
                         in_specs=(P(), seq_spec, P()), out_specs=seq_spec)(
        place_on_mesh(params, mesh, P(), axis), place_on_mesh(x_BTD, mesh, seq_spec, axis),
        place_on_mesh(cu_seqlens, mesh, P(), axis))
