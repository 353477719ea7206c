"""Gated DeltaNet layer in the Qwen3.5 layout (weights interchangeable with transformers').

    x ─┬─ in_proj_qkv ─ causal depthwise conv ─ SiLU ─ split → q, k, v ─┐
       ├─ in_proj_b ─ sigmoid ─────────────────────────────→ β ─────────┤ gated delta rule → o
       ├─ in_proj_a ─ g = −exp(A_log)·softplus(a + dt_bias) ─→ g ─────────┘
       └─ in_proj_z ─────────────────────── z ── norm(o)·silu(z) ── out_proj

forward is composed of small methods (project, causal_conv, split_heads, rule, output) so that a
context-parallel wrapper can swap one piece (the rule, or the conv's halo) without copying math.

Shape legend (as gdn_core.shapes) plus: C conv channels = 2·Hk·Dk + Hv·Dv laid out
[q (Hk·Dk) | k (Hk·Dk) | v (Hv·Dv)]; in halo_BKC, K is the K−1 tokens before a shard; D hidden.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

from ..config import GDNConfig
from .chunk import chunk_gated_delta_rule
from .device_index import device_index
from .documents import check_cu_seqlens, sequence_positions, tokens_since_start


def causal_conv1d(x_BTC: torch.Tensor, weight_CK: torch.Tensor,
                  halo_BKC: torch.Tensor | None = None,
                  since_start_T: torch.Tensor | None = None) -> torch.Tensor:
    """Apply a depthwise causal conv + SiLU over T to x [B, T, C]; returns [B, T, C], x's dtype.

    halo_BKC [B, K−1, C] holds the tokens just before x (zeros when None), so a sequence shard
    convolves exactly. weight_CK [C, K] may be any channel subset of a layer's weight.
    since_start_T (int [T], documents.tokens_since_start; packed documents): token i sees the
    j-th token before it (halo included) only where j ≤ since_start_T[i].
    """
    C, K = weight_CK.shape
    if x_BTC.shape[-1] != C:
        raise ValueError(f"x has {x_BTC.shape[-1]} channels but the conv weight has {C}")
    if halo_BKC is None:
        x_BCT = F.pad(x_BTC.transpose(1, 2), (K - 1, 0))
    else:
        if tuple(halo_BKC.shape) != (x_BTC.shape[0], K - 1, C):
            raise ValueError(f"halo_BKC {tuple(halo_BKC.shape)} must be [B, K-1, C] = "
                             f"{(x_BTC.shape[0], K - 1, C)}")
        x_BCT = torch.cat([halo_BKC.to(x_BTC.dtype), x_BTC], dim=1).transpose(1, 2)
    # Same dtype handling as transformers' causal_conv1d_fn: compute in the weight's dtype.
    x_BCT = x_BCT.to(weight_CK.dtype)
    if since_start_T is None:
        y_BCT = F.conv1d(x_BCT, weight_CK[:, None, :], groups=C)
    else:  # tap m reads the token K−1−m before; masked where that is in an earlier document
        T = x_BTC.shape[1]
        y_BCT = sum(weight_CK[:, m, None] * x_BCT[..., m:m + T]
                    * (since_start_T >= K - 1 - m).to(x_BCT.dtype) for m in range(K))
    return F.silu(y_BCT).transpose(1, 2).to(x_BTC.dtype)


class GatedRMSNorm(nn.Module):
    """RMSNorm over Dv, then times silu(z): transformers' Qwen3_5RMSNormGated semantics."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, o_BTHV: torch.Tensor, z_BTHV: torch.Tensor) -> torch.Tensor:
        """Return weight · rms_norm(o) · silu(z), [..., Dv] in o's dtype (norm and gate in fp32)."""
        dtype = o_BTHV.dtype
        o32 = o_BTHV.float()
        normed = (o32 * torch.rsqrt(o32.pow(2).mean(-1, keepdim=True) + self.eps)).to(dtype)
        return (self.weight * normed * F.silu(z_BTHV.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    """One Gated DeltaNet layer: [B, T, D] → [B, T, D]; state_dict keys as transformers' layer."""

    def __init__(self, cfg: GDNConfig) -> None:
        super().__init__()
        self.cfg = cfg
        D, Hv = cfg.hidden_size, cfg.num_v_heads
        # Registered in transformers' order, so state_dict keys come out in the same order.
        # Padding is applied by causal_conv (zeros or a halo); the module only holds the weight.
        self.conv1d = nn.Conv1d(cfg.conv_dim, cfg.conv_dim, cfg.conv_kernel_size,
                                groups=cfg.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(Hv))
        self.A_log = nn.Parameter(torch.empty(Hv))
        self.norm = GatedRMSNorm(cfg.head_v_dim, eps=cfg.rms_norm_eps)
        self.out_proj = nn.Linear(cfg.value_dim, D, bias=False)
        self.in_proj_qkv = nn.Linear(D, cfg.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(D, cfg.value_dim, bias=False)
        self.in_proj_b = nn.Linear(D, Hv, bias=False)
        self.in_proj_a = nn.Linear(D, Hv, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None, std: float | None = None):
        """Initialise as transformers: dt_bias 1, A ~ U(0.01, 16), norm 1, linears N(0, std).

        With std None the linears keep torch's default (kaiming-uniform) init.
        """
        self.dt_bias.fill_(1.0)
        # Lower bound 0.01 keeps log(A) finite.
        self.A_log.copy_(torch.empty_like(self.A_log).uniform_(0.01, 16, generator=generator).log())
        self.norm.weight.fill_(1.0)
        for lin in (self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a, self.out_proj):
            if std is None:
                nn.init.kaiming_uniform_(lin.weight, a=math.sqrt(5), generator=generator)
            else:
                nn.init.normal_(lin.weight, 0.0, std, generator=generator)
        # torch's Conv1d default (uniform ±1/√K), not transformers' N(0, 0.02): that would start
        # q, k, v at ~1/15 of the scale this init gives.
        bound = 1.0 / math.sqrt(self.cfg.conv_kernel_size)
        nn.init.uniform_(self.conv1d.weight, -bound, bound, generator=generator)

    @property
    def conv_weight_CK(self) -> torch.Tensor:
        """The depthwise conv weight as [C, K] (a view of conv1d.weight [C, 1, K])."""
        return self.conv1d.weight[:, 0, :]

    def conv_channels(self, k_heads, v_heads: range) -> torch.Tensor:
        """Return the conv channels of key heads `k_heads` (q and k; repeats allowed) and value
        heads `v_heads` (GDNConfig.conv_channels), as an index tensor on the weights' device
        (built once: device_index)."""
        return device_index(self.cfg.conv_channels, tuple(k_heads), v_heads,
                            device=self.conv1d.weight.device)

    def project(self, hidden_BTD: torch.Tensor):
        """Return (mixed_qkv_BTC pre-conv, z_BTHV, b_BTH, a_BTH)."""
        B, T, _ = hidden_BTD.shape
        z_BTHV = self.in_proj_z(hidden_BTD).reshape(B, T, -1, self.cfg.head_v_dim)
        return (self.in_proj_qkv(hidden_BTD), z_BTHV, self.in_proj_b(hidden_BTD),
                self.in_proj_a(hidden_BTD))

    def causal_conv(self, mixed_qkv_BTC: torch.Tensor, halo_BKC: torch.Tensor | None = None,
                    since_start_T: torch.Tensor | None = None) -> torch.Tensor:
        """Conv + SiLU the pre-conv channels [B, T, C]; halo_BKC = K−1 previous tokens or None;
        since_start_T as in causal_conv1d (packed documents) or None."""
        return causal_conv1d(mixed_qkv_BTC, self.conv_weight_CK, halo_BKC, since_start_T)

    def gates(self, a_BTH: torch.Tensor, b_BTH: torch.Tensor, heads: range | None = None):
        """Return (g_BTH = −exp(A_log)·softplus(a + dt_bias) in fp32, beta_BTH = sigmoid(b))."""
        A_log, dt_bias = self.A_log, self.dt_bias
        if heads is not None:
            A_log, dt_bias = A_log[heads.start:heads.stop], dt_bias[heads.start:heads.stop]
        g_BTH = -A_log.float().exp() * F.softplus(a_BTH.float() + dt_bias.float())
        return g_BTH, b_BTH.sigmoid()

    def split_heads(self, conv_BTC: torch.Tensor, a_BTH: torch.Tensor, b_BTH: torch.Tensor,
                    heads: range | None = None):
        """Split post-conv channels into q, k [B,T,G,K], v [B,T,H,V]; add g, beta [B,T,H].

        `heads` names the value heads a_BTH/b_BTH/conv_BTC hold (all when None), so a head shard
        (with conv_channels' layout) splits the same way.
        """
        B, T, C = conv_BTC.shape
        Hv = a_BTH.shape[-1]
        Hk = Hv * self.cfg.num_k_heads // self.cfg.num_v_heads
        Dk, Dv = self.cfg.head_k_dim, self.cfg.head_v_dim
        if C != 2 * Hk * Dk + Hv * Dv:
            raise ValueError(f"conv channels {C} != 2·Hk·Dk + Hv·Dv = {2 * Hk * Dk + Hv * Dv} "
                             f"for Hk={Hk}, Hv={Hv}")
        q, k, v = torch.split(conv_BTC, [Hk * Dk, Hk * Dk, Hv * Dv], dim=-1)
        g_BTH, beta_BTH = self.gates(a_BTH, b_BTH, heads)
        return (q.reshape(B, T, Hk, Dk), k.reshape(B, T, Hk, Dk), v.reshape(B, T, Hv, Dv),
                g_BTH, beta_BTH)

    def rule(self, q, k, v, g, beta, *, initial_state=None, output_final_state=False,
             cu_seqlens=None):
        """Run the gated delta rule (chunked, q/k L2-normalised); a CP wrapper overrides this."""
        documents = {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}
        return chunk_gated_delta_rule(q, k, v, g, beta, initial_state=initial_state,
                                      output_final_state=output_final_state, use_qk_l2norm=True,
                                      chunk_size=self.cfg.chunk_size, **documents)

    def output(self, o_BTHV: torch.Tensor, z_BTHV: torch.Tensor) -> torch.Tensor:
        """Gated RMSNorm of the rule's output, then out_proj: [B, T, D]."""
        B, T = o_BTHV.shape[:2]
        return self.out_proj(self.norm(o_BTHV, z_BTHV).reshape(B, T, -1))

    recompute_core: bool = False
    """remat 'gdn': recompute the core (conv, gates, rule) in backward, keeping the projections'
    outputs; set by model.set_remat."""

    def core(self, mixed_qkv_BTC: torch.Tensor, a_BTH: torch.Tensor, b_BTH: torch.Tensor,
             cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """conv, gates and the rule on the projections' outputs; returns o [B, T, H, V]."""
        since_T = None
        if cu_seqlens is not None:
            check_cu_seqlens(cu_seqlens, seq_len=mixed_qkv_BTC.shape[1])
            since_T = tokens_since_start(
                cu_seqlens, sequence_positions(mixed_qkv_BTC.shape[1], mixed_qkv_BTC.device))
        conv_BTC = self.causal_conv(mixed_qkv_BTC, since_start_T=since_T)
        q, k, v, g, beta = self.split_heads(conv_BTC, a_BTH, b_BTH)
        # Under autocast the rule's matmuls would drop to bf16; it must accumulate in fp32.
        with torch.autocast(device_type=mixed_qkv_BTC.device.type, enabled=False):
            o_BTHV, _ = self.rule(q, k, v, g, beta,
                                  **({} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}))
        return o_BTHV

    def forward(self, hidden_BTD: torch.Tensor,
                cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """Map hidden states [B, T, D] to [B, T, D]; cu_seqlens (int [N+1], all rows): packed
        documents, each mixed as if alone (conv and state reset at each start)."""
        mixed_qkv_BTC, z_BTHV, b_BTH, a_BTH = self.project(hidden_BTD)
        core = self.core
        if self.recompute_core:
            o_BTHV = recomputed(core, mixed_qkv_BTC, a_BTH, b_BTH, cu_seqlens)
        else:
            o_BTHV = core(mixed_qkv_BTC, a_BTH, b_BTH, cu_seqlens)
        return self.output(o_BTHV, z_BTHV)


def recomputed(function, *args):
    """function(*args) under non-reentrant checkpoint, recomputing all of it in backward."""
    # Early stop would end the recomputation once every saved tensor is back; a collective
    # after the last one would then run in forward but not in its recomputation.
    with set_checkpoint_early_stop(False):
        return checkpoint(function, *args, use_reentrant=False)
