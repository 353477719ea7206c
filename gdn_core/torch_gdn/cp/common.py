"""Scaffolding shared by the sequence-sharded CP modes (p2p, all_gather, log_scan).

Each of those modes does the same three things around one exchange of affine pairs:
  1. prepare this shard's chunk terms once and fold its chunks into one pair (A, b),
     A [B, H, K, K], b [B, H, K, V] (float32): the shard maps h ↦ A h + b;
  2. (mode-specific) turn the pairs of ranks < r into this rank's incoming state h_in;
  3. replay the shard's chunks from h_in, reusing the same chunk terms (no recomputation).
Pairs travel packed as P = [A | b] along the last dim: [B, H, K, K+V].
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from ..chunk import ChunkTerms, chunk_outputs, fold_chunk_pairs, prepare_chunks, scan_chunk_states

# The implementation signature every mode in the registry follows.
CPRule = Callable[..., tuple[torch.Tensor, "torch.Tensor | None"]]


@dataclasses.dataclass(frozen=True, slots=True)
class ShardPair:
    """This shard's chunk terms and its folded affine pair, packed as P [B, H, K, K+V]."""

    terms: ChunkTerms
    P_BHKW: torch.Tensor  # W = K + V

    @property
    def Dk(self) -> int:
        return self.P_BHKW.shape[-2]


def shard_pair(q, k, v, g, beta, *, use_qk_l2norm: bool, chunk_size: int) -> ShardPair:
    """Step 1: chunk terms of this shard and the fold of its chunks, h ↦ A h + b, packed."""
    terms = prepare_chunks(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm, chunk_size=chunk_size)
    A_BHKK, b_BHKV = fold_chunk_pairs(terms.A_NBHKK, terms.b_NBHKV)
    return ShardPair(terms, torch.cat([A_BHKK, b_BHKV], dim=-1).contiguous())


def apply_pair(P_BHKW: torch.Tensor, h_BHKV: torch.Tensor) -> torch.Tensor:
    """A h + b for a packed pair P = [A | b]: [B, H, K, K+V] × [B, H, K, V] → [B, H, K, V]."""
    K = P_BHKW.shape[-2]
    return torch.baddbmm(P_BHKW[..., K:].flatten(0, 1), P_BHKW[..., :K].flatten(0, 1),
                         h_BHKV.flatten(0, 1)).view_as(h_BHKV)


def compose_pairs(P_first: torch.Tensor, P_then: torch.Tensor) -> torch.Tensor:
    """Packed pair of 'apply P_first, then P_then': [A_t A_f | A_t b_f + b_t], [B, H, K, K+V]."""
    K = P_then.shape[-2]
    A_then = P_then[..., :K]
    out = A_then @ P_first
    return torch.cat([out[..., :K], out[..., K:] + P_then[..., K:]], dim=-1)


def replay_from(pair: ShardPair, h_in_BHKV: torch.Tensor) -> torch.Tensor:
    """Step 3: the shard's output from its incoming state, float32 [B, T_local, H, V]."""
    states_NBHKV, _ = scan_chunk_states(pair.terms.A_NBHKK, pair.terms.b_NBHKV, h_in_BHKV)
    return chunk_outputs(pair.terms, states_NBHKV)
