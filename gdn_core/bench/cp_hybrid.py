"""`bench cp --layers hybrid`: the hybrid decoder per (GDN mode, attention CP mode) pair —
what one chip holds, receives and computes, how the step splits between GDN and attention
layers, and how evenly causal attention spreads over the chips under each layout.

ANALYTIC columns (nothing compiled; the hybrid's whole CP step is compared against measurement
by the sweep, `gdn-sweep run` with layers: hybrid, attn_cps, layouts). Per (mode, attn_cp, D),
whole model, one training step:
  memory/chip    gdn_core.memory.step.predict_step_memory at the fixed local shard
  recv/chip      bytes a chip receives: the GDN layers by docs/architecture.md's table (forward and
                 backward, conv halo included) + the attention layers'
                 (torch_gdn.cp.attention.attention_comm_bytes)
  flops ratio    hardware FLOPs of the CP step ÷ those of one chip over the whole sequence
                 (gdn_core.flops.executed: GDN CP work + attention CP's extra pairs)
  attn flop      attention layers' share of the token-mixer FLOPs, n_attn·F_attn ÷
                 (n_gdn·F_gdn + n_attn·F_attn) (model FLOPs: GDN projections, conv and rule;
                 attention projections and causal QKᵀ, AV): the time split if both kinds of
                 layer ran at the same FLOP rate
  imbal          max / min over chips of per-chip causal attention FLOPs
                 (flops.attention.attention_imbalance), contiguous and zigzag

MEASURED columns (unless --no-measure), JAX on D chips: virtual CPU chips unless
JAX_PLATFORMS says otherwise (jax_num_cpu_devices), which share this host's cores, so a wall
time is the work of all D chips on those cores, not one chip's speed; the table's MEASURED
line names what ran. Per GDN mode and per attn_cp at each D, under --layout:
  gdn ms         one GDN layer's forward + backward (cp_gdn_layer inside a shard_map;
                 D = 1: the single-chip gdn_layer), gradients w.r.t. its input and parameters
  attn ms        one gated attention layer's forward + backward (gated_attention with
                 cp/attention.attend_fn(attn_cp); D = 1: the one-chip blockwise causal_attention)
  attn time      n_attn·attn ms ÷ (n_gdn·gdn ms + n_attn·attn ms) over the model's layer
                 pattern: the measured counterpart of "attn flop"
Each program is compiled once, run once to warm up, then timed `repeats` times (outputs
blocked on); the median is reported. The measured split includes what the FLOP share leaves
out (how the CP attention treats key blocks a query cannot see, the GDN rule's scans and
solves, collectives, per-op overhead on small shapes), so the two can differ widely.
After the table, also unless --no-measure, torch's attention kernels side by side at the same
(attn_cp, D) points: ms reference, ms fused and their ratio (cp_attention_kernels.py; D gloo
processes on this host).
"""

from __future__ import annotations

import math
import os
import statistics
import time

from ..config import FULL_ATTENTION, LINEAR_ATTENTION, ModelConfig
from ..flops.attention import attention_imbalance
from ..flops.executed import hardware_flops_per_step
from ..flops.model import model_flops_per_step
from ..memory.activations import COMPUTE_BYTES
from ..memory.step import predict_step_memory
from ..train_config import TrainConfig

MIB = 2 ** 20


def gdn_received_bytes(model_cfg: ModelConfig, *, mode: str, chips: int, batch: int,
                       local_tokens: int, itemsize: int) -> int:
    """Bytes the busiest chip receives for the GDN layers in one step (forward + backward),
    by docs/architecture.md's table: p2p one fp32 state, all_gather (D−1) (A, B) pairs, log_scan
    at most log2 D pairs, ulysses q, k, v, g, β to head shards and o back; plus the conv halo
    (K−1 tokens × conv channels) in the sequence-sharded modes."""
    if chips == 1:
        return 0
    gdn = model_cfg.gdn
    B, H, Dk, Dv = batch, gdn.num_v_heads, gdn.head_k_dim, gdn.head_v_dim
    state, pair = B * H * Dk * Dv * 4, B * H * Dk * (Dk + Dv) * 4
    if mode == "ulysses":
        per_token = (gdn.conv_dim + 2 * H) * itemsize + gdn.value_dim * itemsize
        # each chip keeps 1/D of every other chip's t tokens' channels (its head shard)
        per_direction = (chips - 1) * B * local_tokens * per_token // chips
    else:
        per_direction = {"p2p": state, "all_gather": (chips - 1) * pair,
                         "log_scan": math.ceil(math.log2(chips)) * pair}[mode]
        per_direction += B * (gdn.conv_kernel_size - 1) * gdn.conv_dim * itemsize
    return 2 * per_direction * model_cfg.layer_pattern.count(LINEAR_ATTENTION)


def attention_received_bytes(model_cfg: ModelConfig, *, attn_cp: str, chips: int, batch: int,
                             local_tokens: int, itemsize: int) -> int:
    """Bytes a chip receives for the attention layers in one step (forward + backward)."""
    if chips == 1:
        return 0
    from ..torch_gdn.cp.attention import attention_comm_bytes

    a = model_cfg.attention
    forward, backward = attention_comm_bytes(
        attn_cp, chips=chips, batch=batch, local_tokens=local_tokens, num_heads=a.num_heads,
        num_kv_heads=a.num_kv_heads, head_dim=a.head_dim, itemsize=itemsize)
    return (forward + backward) * model_cfg.layer_pattern.count(FULL_ATTENTION)


def _measured_on() -> str:
    """What the measured columns ran on, for their label."""
    import jax

    device = jax.devices()[0]
    if device.platform == "cpu":
        return f"jax cpu, D virtual chips sharing {len(os.sched_getaffinity(0))} cores"
    return f"jax {device.platform}, D x {device.device_kind}"


def _timed_median_s(compiled, args, repeats: int) -> float:
    """Median wall seconds of `repeats` runs of a compiled program after one warm-up run."""
    import jax

    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _fwd_bwd(layer, chips: int):
    """jit of (params, x) -> (d params, d x) for the loss Σ layer(params, x)², x [B, T, hidden]
    split on T over `chips` virtual chips (one chip: no shard_map)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, PartitionSpec as P

    def grads(params, x_BTD):
        return jax.grad(lambda p, x: jnp.sum(layer(p, x).astype(jnp.float32) ** 2),
                        argnums=(0, 1))(params, x_BTD)

    if chips == 1:
        return jax.jit(grads)
    mesh = Mesh(np.array(jax.devices()[:chips]), ("cp",))
    # check_vma=False, as the CP train step: each chip keeps its own parameter-gradient
    # contribution (no psum), which the attention CP modes require.
    return jax.jit(jax.shard_map(grads, mesh=mesh, in_specs=(P(), P(None, "cp")),
                                 out_specs=(P(), P(None, "cp")), check_vma=False))


def measure_layer_s(model_cfg: ModelConfig, *, kind: str, cp_mode: str | None, chips: int,
                    local_tokens: int, batch: int, dtype: str, layout: str = "contiguous",
                    repeats: int = 5) -> float:
    """Median wall seconds of one layer's forward + backward on `chips` virtual JAX chips.

    kind: LINEAR_ATTENTION (a GDN layer under CP mode `cp_mode`) or FULL_ATTENTION (a gated
    attention layer under attn_cp `cp_mode`); chips = 1 runs the single-chip layer (cp_mode
    unused). The global sequence is local_tokens × chips, in `layout`'s shard order.
    Raises ValueError naming the numbers when cp_mode cannot split the shape.
    """
    import jax
    import jax.numpy as jnp

    from ..jax_gdn.attention import causal_attention, gated_attention, rotary_cos_sin
    from ..jax_gdn.cp.attention import attend_fn, local_token_positions
    from ..jax_gdn.cp.layer import cp_gdn_layer
    from ..jax_gdn.layer import gdn_layer
    from ..jax_gdn.params import cast_floating, init_attention_params, init_layer_params

    compute = jnp.dtype(dtype)
    seq_len, key = local_tokens * chips, jax.random.PRNGKey(0)
    if kind == LINEAR_ATTENTION:
        params = init_layer_params(model_cfg.gdn, key)
        if chips == 1:
            layer = lambda p, x: gdn_layer(p, x, model_cfg.gdn, dtype=compute)  # noqa: E731
        else:
            layer = lambda p, x: cp_gdn_layer(  # noqa: E731
                p, x, model_cfg.gdn, axis="cp", mode=cp_mode, layout=layout, dtype=compute)
    elif kind == FULL_ATTENTION:
        a = model_cfg.attention
        params = init_attention_params(a, model_cfg.hidden_size, key)
        attend = causal_attention if chips == 1 else attend_fn(axis="cp", mode=cp_mode,
                                                               layout=layout)

        def layer(p, x_BtD):
            positions = (jnp.arange(seq_len) if chips == 1
                         else local_token_positions("cp", local_tokens, layout))
            cos_TR, sin_TR = rotary_cos_sin(positions, a)
            return gated_attention(cast_floating(p, compute), x_BtD.astype(compute), a,
                                   eps=model_cfg.gdn.rms_norm_eps, cos_TR=cos_TR,
                                   sin_TR=sin_TR, attend=attend)
    else:
        raise ValueError(f"kind={kind!r} is not one of: {LINEAR_ATTENTION}, {FULL_ATTENTION}")
    x_BTD = jax.random.normal(jax.random.PRNGKey(1), (batch, seq_len, model_cfg.hidden_size),
                              jnp.float32)
    compiled = _fwd_bwd(layer, chips).lower(params, x_BTD).compile()
    return _timed_median_s(compiled, (params, x_BTD), repeats)


def report(model_cfg: ModelConfig, *, modes, attn_cps, chips_list, local_tokens: int,
           batch: int, dtype: str, framework: str = "jax", measure: bool = True,
           layout: str = "contiguous", repeats: int = 5, out=print) -> None:
    """Print the table of the module docstring for every (mode, attn_cp, D); measure=False
    leaves the measured columns empty ("-")."""
    if measure and repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1 to measure")
    itemsize = COMPUTE_BYTES[dtype]
    pattern = model_cfg.layer_pattern
    n_gdn, n_attn = pattern.count(LINEAR_ATTENTION), pattern.count(FULL_ATTENTION)
    out(f"preset={model_cfg.name} hybrid decoder: {n_gdn} GDN + {n_attn} gated-attention "
        f"layers ({model_cfg.attention.num_heads}/{model_cfg.attention.num_kv_heads} heads, "
        f"head_dim {model_cfg.attention.head_dim}); local shard {local_tokens} tokens x batch "
        f"{batch}; {dtype}")
    out("ANALYTIC (memory, flops, docs/architecture.md's comm table; not measured): "
        "memory/chip, recv/chip, flops ratio, attn flop (attention's share of the mixer "
        "FLOPs), imbal (max/min per-chip attention FLOPs); whole-model training step per chip")
    if measure:
        out(f"MEASURED ({_measured_on()}): gdn ms, attn ms = "
            f"wall time of ONE layer's fwd+bwd over all D chips, layout {layout}, median of "
            f"{repeats} runs after a warm-up; attn time = {n_attn}*attn ms / ({n_gdn}*gdn ms + "
            f"{n_attn}*attn ms)")
    else:
        out("measured columns skipped (--no-measure)")
    if model_cfg.moe is not None:
        out(f"note: {model_cfg.note}")
    out(f"{'mode':<11}{'attn_cp':<14}{'D':>3}{'memory/chip MiB':>17}{'recv/chip MiB':>15}"
        f"{'flops ratio':>13}{'attn flop':>11}{'gdn ms':>10}{'attn ms':>10}{'attn time':>11}"
        f"{'imbal contig':>14}{'imbal zigzag':>14}")
    timed: dict[tuple[str, str, int], float] = {}  # (kind, cp mode, D) -> seconds

    def layer_ms(kind: str, cp_mode: str, chips: int) -> float:
        if (kind, cp_mode, chips) not in timed:
            timed[kind, cp_mode, chips] = measure_layer_s(
                model_cfg, kind=kind, cp_mode=cp_mode, chips=chips, local_tokens=local_tokens,
                batch=batch, dtype=dtype, layout=layout, repeats=repeats)
        return 1e3 * timed[kind, cp_mode, chips]

    for chips in sorted(chips_list):
        seq_len = local_tokens * chips
        train_cfg = TrainConfig(batch_size=batch, seq_len=seq_len, dtype=dtype)
        model = model_flops_per_step(model_cfg, batch=batch, seq_len=seq_len)
        attn_flops = model.attention_projections + model.attention_core
        flop_share = attn_flops / (attn_flops + model.gdn_rule + model.gdn_projections
                                   + model.conv)
        imbalance = {lay: attention_imbalance(chips=chips, seq_len=seq_len, layout=lay)
                     if seq_len % (2 * chips) == 0 or lay == "contiguous" else math.nan
                     for lay in ("contiguous", "zigzag")}
        one_chip = hardware_flops_per_step(model_cfg, mode="p2p", chips=1, batch=batch,
                                           seq_len=seq_len, framework=framework).total
        # one chip: no CP, the same step whatever the modes (one row, mode "none")
        pairs = [(m, a) for m in modes for a in attn_cps] if chips > 1 else [
            (modes[0], attn_cps[0])]
        for mode, attn_cp in pairs:
            try:
                memory = predict_step_memory(model_cfg.stand_in, train_cfg, mode=mode,
                                             chips=chips, framework=framework,
                                             attn_cp=attn_cp).total
                hardware = hardware_flops_per_step(
                    model_cfg, mode=mode, chips=chips, batch=batch, seq_len=seq_len,
                    framework=framework, attn_cp=attn_cp).total
                measured = f"{'-':>10}{'-':>10}{'-':>11}"
                if measure:
                    gdn_ms = layer_ms(LINEAR_ATTENTION, mode, chips)
                    attn_ms = layer_ms(FULL_ATTENTION, attn_cp, chips)
                    time_share = n_attn * attn_ms / (n_gdn * gdn_ms + n_attn * attn_ms)
                    measured = f"{gdn_ms:10.2f}{attn_ms:10.2f}{time_share:11.3f}"
            except ValueError as err:
                out(f"{mode:<11}{attn_cp:<14}{chips:>3}  skipped: {err}")
                continue
            recv = (gdn_received_bytes(model_cfg, mode=mode, chips=chips, batch=batch,
                                       local_tokens=local_tokens, itemsize=itemsize)
                    + attention_received_bytes(model_cfg, attn_cp=attn_cp, chips=chips,
                                               batch=batch, local_tokens=local_tokens,
                                               itemsize=itemsize))
            shown = (mode, attn_cp) if chips > 1 else ("none", "-")
            out(f"{shown[0]:<11}{shown[1]:<14}{chips:>3}{memory / MIB:17.1f}{recv / MIB:15.3f}"
                f"{hardware / one_chip:13.4f}{flop_share:11.3f}{measured}"
                f"{imbalance['contiguous']:14.3f}{imbalance['zigzag']:14.3f}")
    if measure:
        from .cp_attention_kernels import report as attention_kernels_report

        attention_kernels_report(model_cfg, attn_cps=attn_cps, chips_list=chips_list,
                                 local_tokens=local_tokens, batch=batch, dtype=dtype,
                                 layout=layout, repeats=repeats, out=out)


__all__ = ["attention_received_bytes", "gdn_received_bytes", "measure_layer_s", "report"]
