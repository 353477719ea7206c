"""Context-parallel GatedDeltaNet: the layer's own pieces around a CP exchange.

`context_parallel(module, *, group, cp)` turns a GatedDeltaNet (or every GatedDeltaNet inside
a model) into a layer whose forward maps this rank's sequence shard [B, t, D] to [B, t, D]
(t = T/D; `layout` as in gdn_core.cp_layout: contiguous, rank order = sequence order, or
zigzag, segments r and 2D−1−r of 2D). Two ways of running the rule, as in docs/architecture.md:

  sequence-sharded (p2p, all_gather, log_scan):
    project → halo (the K−1 pre-conv tokens before each segment, from whichever rank holds
    them: halo.py) → causal_conv(halo) per segment → split_heads
    → chunk_gated_delta_rule_cp(mode, layout) → output
  ulysses (head-sharded rule):
    project → all-to-all q, k, v channels (pre-conv) and a, b: [B, t, all heads] → [B, T, value
    heads of rank j and the key heads they use (cp_modes.UlyssesHeads: copies when Hk < D)],
    put in sequence order (zigzag: a local permutation) → causal conv with the conv weight of
    those channels → gates (A_log, dt_bias of those heads) → single-chip rule → all-to-all o
    back → output (z never moves)

Parameters are the original layer's objects (no copies) under the same names, so optimizers,
state_dicts and checkpoints written for the plain model apply unchanged. Parameter gradients
are this rank's contribution: their sum over the ranks is the single-chip gradient.
Legend: B batch, t local tokens, T global tokens, C conv channels, H heads, K/V head dims.
"""

from __future__ import annotations

import torch
from torch import nn

from ...cp_layout import Layout, check_layout
from ...cp_modes import CPMode, CPSettings, UlyssesHeads, check_cp_shape, check_mode
from ..attention import GatedAttention
from ..attention_kernels import ATTENTION_KERNEL_FOR
from ..gdn_kernels import FUSED_GDN_KERNEL, GDNKernelName, GDNRuleKernel, gdn_rule_kernel
from ..hybrid import HybridDecoder
from ..layer import GatedDeltaNet, causal_conv1d
from ..documents import check_cu_seqlens, sequence_positions, tokens_since_start
from .comm import rank_size
from .common import shard_positions_tensor
from .halo import exchange_conv_halo, exchange_conv_halo_zigzag
from .hybrid import ContextParallelGatedAttention, shard_positions
from .rule import chunk_gated_delta_rule_cp
from .ulysses import heads_to_seq, key_heads_for_chips, seq_to_heads


class ContextParallelGatedDeltaNet(GatedDeltaNet):
    """A GatedDeltaNet that runs on this rank's sequence shard [B, t, D] → [B, t, D].

    Built from an existing layer: shares its Parameters and submodules (same names), so it is
    a GatedDeltaNet whose pieces (project, causal_conv, gates, split_heads, rule, output) act on
    the original weights; only forward changes. `gdn_kernel` (gdn_kernels.GDNRuleKernel, e.g.
    fla-core's under kernels="fused") runs every rule step through its public call, composed
    with the exchanges (cp.kernel_rule); None keeps this package's CP rule.
    """

    def __init__(self, layer: GatedDeltaNet, *, group, mode: CPMode,
                 layout: Layout = "contiguous", gdn_kernel: GDNRuleKernel | None = None) -> None:
        check_mode(mode)
        check_layout(layout)
        if isinstance(layer, ContextParallelGatedDeltaNet):
            # The right type in the wrong state: ValueError, as context_parallel documents.
            raise ValueError(  # noqa: TRY004
                f"layer is already context-parallel (mode={layer.mode!r})")
        # Skip GatedDeltaNet.__init__: it would allocate fresh weights; adopt the layer's instead.
        nn.Module.__init__(self)
        self.cfg = layer.cfg
        for name, child in layer.named_children():
            self.add_module(name, child)
        for name, param in layer.named_parameters(recurse=False):
            self.register_parameter(name, param)
        self.train(layer.training)
        self.recompute_core = layer.recompute_core
        self.group, self.mode, self.layout = group, mode, layout
        self.gdn_kernel = gdn_kernel

    def extra_repr(self) -> str:
        kernel = "cp rule" if self.gdn_kernel is None else self.gdn_kernel.name
        return (f"mode={self.mode!r}, layout={self.layout!r}, gdn_kernel={kernel!r}, "
                f"chips={rank_size(self.group)[1]}")

    def check_shape(self, t: int) -> None:
        """Raise ValueError naming the numbers when this mode cannot split t·D tokens."""
        cfg, (_, D) = self.cfg, rank_size(self.group)
        check_cp_shape(mode=self.mode, chips=D, seq_len=t * D, num_k_heads=cfg.num_k_heads,
                       num_v_heads=cfg.num_v_heads, conv_kernel_size=cfg.conv_kernel_size,
                       layout=self.layout)

    def forward(self, hidden_BtD: torch.Tensor,
                cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """Map this rank's shard [B, t, D] (cp_layout.local_positions of this rank) to [B, t, D].

        cu_seqlens: None, or the GLOBAL packed-document boundaries (int [N+1], 0 … T, all rows),
        the same on every rank: each document mixed as if alone (the conv halo, received as
        ever, is masked past a document start; the state resets at each start).
        Every rank of the group must call it (it exchanges), with the same B and t.
        """
        # Validate before any exchange, so that every rank raises and none waits on a peer.
        self.check_shape(hidden_BtD.shape[1])
        if cu_seqlens is not None:
            check_cu_seqlens(cu_seqlens, seq_len=hidden_BtD.shape[1] * rank_size(self.group)[1])
        return super().forward(hidden_BtD, cu_seqlens)

    def core(self, mixed_qkv_BtC: torch.Tensor, a_BtH: torch.Tensor, b_BtH: torch.Tensor,
             cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """GatedDeltaNet.core on this rank's shard, exchanges included: o [B, t, H, V]. On one
        rank it is GatedDeltaNet.core itself (no halo, no fold, one rule or kernel call)."""
        if rank_size(self.group)[1] == 1:
            return super().core(mixed_qkv_BtC, a_BtH, b_BtH, cu_seqlens)
        if self.mode == "ulysses":
            return self._core_ulysses(mixed_qkv_BtC, a_BtH, b_BtH, cu_seqlens)
        halo = self.cfg.conv_kernel_size - 1
        since_t = None if cu_seqlens is None else tokens_since_start(
            cu_seqlens, shard_positions_tensor(group=self.group,
                                               seq_len=mixed_qkv_BtC.shape[1] * rank_size(
                                                   self.group)[1],
                                               layout=self.layout, device=mixed_qkv_BtC.device))
        if self.layout == "zigzag":
            halos = exchange_conv_halo_zigzag(mixed_qkv_BtC, halo=halo, group=self.group)
            since = (None, None) if since_t is None else since_t.chunk(2)
            conv_BtC = torch.cat([self.causal_conv(segment, halo_BKC, since_s) for
                                  segment, halo_BKC, since_s
                                  in zip(mixed_qkv_BtC.chunk(2, dim=1), halos, since)], dim=1)
        else:
            halo_BKC = exchange_conv_halo(mixed_qkv_BtC, halo=halo, group=self.group)
            conv_BtC = self.causal_conv(mixed_qkv_BtC, halo_BKC, since_t)
        q, k, v, g, beta = self.split_heads(conv_BtC, a_BtH, b_BtH)
        # As GatedDeltaNet.core: the rule accumulates in fp32 even under autocast.
        with torch.autocast(device_type=mixed_qkv_BtC.device.type, enabled=False):
            o_BtHV, _ = chunk_gated_delta_rule_cp(
                q, k, v, g, beta, group=self.group, mode=self.mode, layout=self.layout,
                use_qk_l2norm=True, chunk_size=self.cfg.chunk_size, kernel=self.gdn_kernel,
                cu_seqlens=cu_seqlens)
        return o_BtHV

    def rule(self, q, k, v, g, beta, *, initial_state=None, output_final_state=False,
             cu_seqlens=None):
        """The one-chip rule over a whole sequence (one rank, or ulysses' heads): this
        package's, or one call of gdn_kernel."""
        if self.gdn_kernel is None:
            return super().rule(q, k, v, g, beta, initial_state=initial_state,
                                output_final_state=output_final_state, cu_seqlens=cu_seqlens)
        return self.gdn_kernel(q, k, v, g, beta, initial_state=initial_state,
                               output_final_state=output_final_state,
                               use_qk_l2norm_in_kernel=True, cu_seqlens=cu_seqlens)

    def _core_ulysses(self, mixed_qkv_BtC: torch.Tensor, a_BtH: torch.Tensor,
                      b_BtH: torch.Tensor, cu_seqlens: torch.Tensor | None) -> torch.Tensor:
        cfg = self.cfg
        rank, D = rank_size(self.group)
        plan = UlyssesHeads(num_k_heads=cfg.num_k_heads, num_v_heads=cfg.num_v_heads, chips=D)
        B, t, _ = mixed_qkv_BtC.shape
        Hk, Hv, Dk, Dv = cfg.num_k_heads, cfg.num_v_heads, cfg.head_k_dim, cfg.head_v_dim
        q_pre, k_pre, v_pre = torch.split(mixed_qkv_BtC, [Hk * Dk, Hk * Dk, Hv * Dv], dim=-1)
        # The conv is depthwise, so it commutes with moving channels: move pre-conv channels
        # (one all-to-all for q, k, v, a, b) and convolve the full sequence locally, no halo.
        # q, k go as the key heads each rank's value heads use (copies when Hk < D).
        q_BTGK, k_BTGK, v_BTHV, b_BTH1, a_BTH1 = seq_to_heads(
            [key_heads_for_chips(q_pre.reshape(B, t, Hk, Dk), plan),
             key_heads_for_chips(k_pre.reshape(B, t, Hk, Dk), plan),
             v_pre.reshape(B, t, Hv, Dv), b_BtH[..., None], a_BtH[..., None]], group=self.group,
            layout=self.layout)
        B, T, G, _ = q_BTGK.shape
        k_heads, v_heads = plan.key_heads(rank), plan.value_heads(rank)
        mixed_local_BTC = torch.cat([q_BTGK.reshape(B, T, -1), k_BTGK.reshape(B, T, -1),
                                     v_BTHV.reshape(B, T, -1)], dim=-1)
        weight_CK = self.conv_weight_CK[self.conv_channels(k_heads, v_heads)]
        since_T = None if cu_seqlens is None else tokens_since_start(
            cu_seqlens, sequence_positions(T, mixed_local_BTC.device))
        conv_BTC = causal_conv1d(mixed_local_BTC, weight_CK, since_start_T=since_T)
        q, k, v = torch.split(conv_BTC, [G * Dk, G * Dk, len(v_heads) * Dv], dim=-1)
        g, beta = self.gates(a_BTH1[..., 0], b_BTH1[..., 0], heads=v_heads)
        rule_args = (q.reshape(B, T, G, Dk), k.reshape(B, T, G, Dk), v.reshape(B, T, -1, Dv),
                     g, beta)
        with torch.autocast(device_type=mixed_qkv_BtC.device.type, enabled=False):
            # One call on this rank's heads over the whole sequence.
            o_BTHV, _ = self.rule(*rule_args, cu_seqlens=cu_seqlens)
        return heads_to_seq(o_BTHV, group=self.group, layout=self.layout)


def context_parallel(module: nn.Module, *, group, cp: CPSettings,
                     gdn_kernel: GDNKernelName | None = None) -> nn.Module:
    """Make `module` run on this rank's sequence shard (in cp.layout) over `group`, one CP
    group of cp.cp_chips ranks (a replica's, under cp.dp > 1): GDN layers under CP cp.mode,
    gated full-attention layers under cp.attn_cp (cp.attention) with the attention kernel of
    cp.kernels (attention_kernels.ATTENTION_KERNEL_FOR: reference → tiles, fused → sdpa).
    GDN layers under kernels="reference" run this package's CP rule; under
    "fused" the rule kernel `gdn_kernel` (gdn_kernels: default fla-core's, "fla"; "reference"
    is its CPU stand-in through the same composition), built per layer at its chunk size and
    composed with the exchanges (cp.kernel_rule). Which kernel can serve a device and dtype
    is resolve_torch_gdn_kernel's to say (run_cp_training asks it first); the fla kernel
    raises KernelUnavailable if called where it cannot run.

    A GatedDeltaNet or GatedAttention: returns a new context-parallel layer sharing its
    Parameters (the argument itself is left unchanged). Any other module (GDNLanguageModel,
    HybridLanguageModel): IN PLACE, every GatedDeltaNet and GatedAttention inside is replaced
    by its CP version (same parameter names, same Parameter objects, so an optimizer built
    before or after the call is the same), and a hybrid decoder takes its rotary at the tokens'
    global positions (HybridDecoder.sequence_positions); returns `module`. Per-token modules
    (norms, MLP, embeddings, LM head) run unchanged on the shard. Raises ValueError for a
    module without such layers, or one already made context-parallel (the settings
    themselves were checked when `cp` was built); the group is not touched here. Shapes are
    checked at each forward over `group`'s ranks (the sequence length is known only then).
    """
    mode, attn_cp, layout, kernels = cp.mode, cp.attn_cp, cp.layout, cp.kernels
    if kernels == "reference" and gdn_kernel is not None:
        raise ValueError(f"gdn_kernel={gdn_kernel!r} is for kernels='fused'; kernels='reference' "
                         "runs this package's CP rule")
    fused_gdn = (gdn_kernel or FUSED_GDN_KERNEL) if kernels == "fused" else None

    def parallel(layer: nn.Module) -> nn.Module:
        if isinstance(layer, GatedAttention):
            return ContextParallelGatedAttention(layer, group=group, attn_cp=attn_cp,
                                                 layout=layout,
                                                 kernel=ATTENTION_KERNEL_FOR[kernels])
        kernel = None if fused_gdn is None else gdn_rule_kernel(
            fused_gdn, chunk_size=layer.cfg.chunk_size)
        return ContextParallelGatedDeltaNet(layer, group=group, mode=mode, layout=layout,
                                            gdn_kernel=kernel)

    if isinstance(module, (GatedDeltaNet, GatedAttention)):
        return parallel(module)
    mixers = (GatedDeltaNet, GatedAttention)
    swaps = [(parent, name, child) for parent in module.modules()
             for name, child in parent.named_children() if isinstance(child, mixers)]
    if not swaps:
        raise ValueError(f"{type(module).__name__} contains no GatedDeltaNet (or GatedAttention) "
                         "layer to make context-parallel")
    done = [name for _, name, child in swaps
            if isinstance(child, (ContextParallelGatedDeltaNet, ContextParallelGatedAttention))]
    if done:  # checked before swapping anything, so a failed call leaves the model unchanged
        raise ValueError(f"{type(module).__name__} has {len(done)} layer(s) already "
                         f"context-parallel (e.g. {done[0]!r}); call context_parallel once")
    for parent, name, child in swaps:
        setattr(parent, name, parallel(child))
    for decoder in module.modules():
        if isinstance(decoder, HybridDecoder):
            decoder.sequence_positions = shard_positions(group=group, layout=layout)
    return module
