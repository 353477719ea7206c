"""Context-parallel GDN layer: the single-chip layer's pieces around a CP exchange.

`cp_gdn_layer` maps this chip's sequence shard [B, t, D] to [B, t, D] (t = T/D, chip order along
`axis` = sequence order) inside an enclosing shard_map; `gdn_layer_cp` wraps it for global
arrays. Two layouts, as in ARCHITECTURE.md (and torch_gdn.cp.layer):

  sequence-sharded (p2p, all_gather, log_scan): layer.gdn_layer with
    halo_fn = conv_halo (the previous chip's last K−1 pre-conv tokens) and
    rule = chunk_gated_delta_rule_cp_shard(mode)
  ulysses (head-sharded rule):
    project → one all-to-all of the pre-conv q, k, v channels and a, b: [B, t, all heads] →
    [B, T, value heads of chip j and the key heads they use (cp_modes.UlyssesHeads: copies
    when Hk < D)] → causal conv with the conv weight of those channels (no halo: the
    chip holds the whole sequence) → split_heads with A_log, dt_bias of those heads → the
    single-chip rule → all-to-all o back → output (z never moves)

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
from ...cp_modes import CPMode, UlyssesHeads, check_cp_shape, check_mode
from ..chunk import chunk_gated_delta_rule
from ..layer import causal_conv, gdn_layer, output, project, run_rule, split_heads
from ..model import GDNLayerFn
from ..params import Params, cast_floating
from .common import AxisName, chip_count, chip_index, vary_like
from .halo import conv_halo
from .common import mesh_chip_count, place_on_mesh
from .rule import chunk_gated_delta_rule_cp_shard
from .ulysses import key_heads_for_chips


def check_layer_shape(cfg: GDNConfig, *, mode: str, chips: int, seq_len: int) -> None:
    """Raise ValueError naming the numbers when `mode` cannot split the layer's seq_len tokens
    (global) over `chips`: check_cp_shape with the conv halo."""
    check_cp_shape(mode=mode, chips=chips, seq_len=seq_len,
                   num_k_heads=cfg.num_k_heads, num_v_heads=cfg.num_v_heads,
                   conv_kernel_size=cfg.conv_kernel_size)


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


def _ulysses_layer(params: Params, x_BtD, cfg: GDNConfig, *, axis: AxisName, dtype):
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
    local_BTP = lax.all_to_all(packed_BtDP, axis, split_axis=2, concat_axis=1,
                               tiled=True)[:, :, 0]
    conv_channels = 2 * G * Dk + Hl * cfg.head_v_dim
    w_local, gates = _local_heads(params, cfg, me, plan)
    conv_BTC = causal_conv(w_local, local_BTP[..., :conv_channels])
    b_BTH = local_BTP[..., conv_channels:conv_channels + Hl]
    a_BTH = local_BTP[..., conv_channels + Hl:]
    local_cfg = dataclasses.replace(cfg, num_k_heads=G, num_v_heads=Hl)
    q, k, v, g, beta = split_heads(gates, conv_BTC, a_BTH, b_BTH, local_cfg)
    # The rule's default zero state would be replicated while q … beta vary per chip, and a
    # scan carry must keep one type under shard_map's check: start from a per-chip zero state.
    h0_BHKV = vary_like(jnp.zeros((B, Hl, Dk, cfg.head_v_dim), jnp.float32),
                        g[:, 0, :, None, None])
    o_BTHV = run_rule(q, k, v, g, beta, local_cfg,
                      rule=partial(chunk_gated_delta_rule, initial_state=h0_BHKV))
    o_BtHV = lax.all_to_all(o_BTHV, axis, split_axis=1, concat_axis=2, tiled=True)
    return output(params, o_BtHV, z_BtHV, cfg)


def cp_gdn_layer(params: Params, x_BtD, cfg: GDNConfig, *, axis: AxisName, mode: CPMode,
                 dtype=jnp.float32):
    """Run one GDN layer on this chip's sequence shard; call inside a shard_map binding `axis`.

    Args:
        params: the layer's parameters (params.init_layer_params layout), replicated.
        x_BtD: [B, T/D, hidden], tokens j·T/D … (j+1)·T/D − 1 on chip j (j = position along
            `axis`, a name or a tuple flattened major-to-minor).
        mode: ulysses, p2p, all_gather or log_scan.
    Returns: [B, T/D, hidden] in dtype — this chip's shard of the single-chip gdn_layer output.
    Raises ValueError naming the numbers: unknown mode, ulysses value heads not divisible by D,
        a local shard shorter than the conv halo (K−1 tokens).
    """
    check_mode(mode)
    D = chip_count(axis)
    check_layer_shape(cfg, mode=mode, chips=D, seq_len=x_BtD.shape[1] * D)
    if mode == "ulysses":
        return _ulysses_layer(params, x_BtD, cfg, axis=axis, dtype=dtype)
    return gdn_layer(params, x_BtD, cfg, dtype=dtype,
                     rule=partial(chunk_gated_delta_rule_cp_shard, axis=axis, mode=mode),
                     halo_fn=partial(conv_halo, halo=cfg.conv_kernel_size - 1, axis=axis))


def cp_layer_fn(*, axis: AxisName, mode: CPMode) -> GDNLayerFn:
    """cp_gdn_layer bound to (axis, mode): model_forward's `gdn_layer_fn` under CP."""
    check_mode(mode)
    return partial(cp_gdn_layer, axis=axis, mode=mode)


def gdn_layer_cp(params: Params, x_BTD, cfg: GDNConfig, *, mesh, axis: AxisName, mode: CPMode,
                 dtype=jnp.float32):
    """cp_gdn_layer on global arrays: x [B, T, hidden] split on T (dim 1) over mesh axis `axis`.

    params are replicated. Returns [B, T, hidden] in dtype, sequence-sharded over `axis`;
    jit- and grad-able (parameter gradients come back summed over the chips).
    Raises ValueError naming the numbers (unknown mode or axis, T not divisible by D, …).
    """
    check_mode(mode)
    D = mesh_chip_count(mesh, axis)
    axis = axis if isinstance(axis, str) else tuple(axis)
    check_layer_shape(cfg, mode=mode, chips=D, seq_len=x_BTD.shape[1])
    seq_spec = P(None, axis)
    layer = partial(cp_gdn_layer, cfg=cfg, axis=axis, mode=mode, dtype=dtype)
    return jax.shard_map(layer, mesh=mesh, in_specs=(P(), seq_spec), out_specs=seq_spec)(
        place_on_mesh(params, mesh, P(), axis), place_on_mesh(x_BTD, mesh, seq_spec, axis))
