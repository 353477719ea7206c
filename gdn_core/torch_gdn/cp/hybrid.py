"""The hybrid decoder's pieces under context parallelism: the gated-attention layer on a sequence
shard and the decoder's rotary positions.

`ContextParallelGatedAttention` is a GatedAttention sharing the layer's Parameters (same
names) whose `attend` is cp.attention.attention_cp(attn_cp, layout, kernel: the attention
kernel of each segment pair, "tiles" or "sdpa"); project and output act per token and run
unchanged on the shard. `shard_positions(group, layout)` gives the decoder
(HybridDecoder.sequence_positions) the GLOBAL positions of its local tokens
(cp_layout.local_positions), so the rotary of a shard is the one-chip model's.
Legend: B batch, t local tokens, H query heads, G key/value heads, E head_dim.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from torch import nn

from ...cp_layout import Layout, check_layout, local_positions
from ...cp_modes import AttnCPMode, check_attention_cp_shape, check_attn_cp
from ..attention import GatedAttention
from ..attention_kernels import AttentionKernelName, attention_kernel
from .attention import attention_cp
from .comm import rank_size


class ContextParallelGatedAttention(GatedAttention):
    """A GatedAttention on this rank's shard [B, t, hidden] → [B, t, hidden]; cos/sin must be
    those of the tokens' global positions (the hybrid decoder's sequence_positions)."""

    def __init__(self, layer: GatedAttention, *, group, attn_cp: AttnCPMode,
                 layout: Layout = "contiguous", kernel: AttentionKernelName = "tiles") -> None:
        check_attn_cp(attn_cp)
        check_layout(layout)
        attention_kernel(kernel)  # raises ValueError for an unknown kernel name
        if isinstance(layer, ContextParallelGatedAttention):
            raise ValueError(  # noqa: TRY004 (the right type in the wrong state)
                f"layer is already context-parallel (attn_cp={layer.attn_cp!r})")
        # Skip GatedAttention.__init__ (fresh weights); adopt the layer's modules instead.
        nn.Module.__init__(self)
        self.cfg = layer.cfg
        for name, child in layer.named_children():
            self.add_module(name, child)
        self.train(layer.training)
        self.group, self.attn_cp, self.layout, self.kernel = group, attn_cp, layout, kernel

    def extra_repr(self) -> str:
        return (f"attn_cp={self.attn_cp!r}, layout={self.layout!r}, kernel={self.kernel!r}, "
                f"chips={rank_size(self.group)[1]}")

    def forward(self, hidden_BtD: torch.Tensor, cos_BtR: torch.Tensor,
                sin_BtR: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """Every rank of the group must call it, with the same B and t (it exchanges)."""
        _, D = rank_size(self.group)
        # Validate before any exchange, so every rank raises and none waits on a peer.
        check_attention_cp_shape(attn_cp=self.attn_cp, chips=D, num_heads=self.cfg.num_heads,
                                 num_kv_heads=self.cfg.num_kv_heads,
                                 seq_len=hidden_BtD.shape[1] * D, layout=self.layout)
        return super().forward(hidden_BtD, cos_BtR, sin_BtR, cu_seqlens)

    def attend(self, q_BtHE: torch.Tensor, k_BtGE: torch.Tensor, v_BtGE: torch.Tensor,
               cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """cu_seqlens: the GLOBAL packed-document boundaries, the same on every rank."""
        return attention_cp(q_BtHE, k_BtGE, v_BtGE, group=self.group, mode=self.attn_cp,
                            layout=self.layout, scale=self.cfg.head_dim ** -0.5,
                            kernel=self.kernel, cu_seqlens=cu_seqlens)


def _positions_of_shard(t: int, *, group, layout: Layout) -> np.ndarray:
    rank, D = rank_size(group)
    return local_positions(chip=rank, chips=D, seq_len=t * D, layout=layout)


def shard_positions(*, group, layout: Layout):
    """t ↦ the global positions int64 [t] of this rank's t local tokens under `layout`."""
    return functools.partial(_positions_of_shard, group=group, layout=layout)
