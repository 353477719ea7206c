"""CP mode `all_gather`: one all-gather of every rank's packed (A, b), then a local prefix.

Rank r folds its chunks into P_r = [A_r | b_r] ([B, H, K, K+V], float32), all ranks gather
P_0 … P_{D−1} in one collective, and every rank applies them to h0 in sequence order:
    h_in(r) = P_{r−1}(… P_0(h0)),     final = P_{D−1}(… P_0(h0))   (identical on every rank).
Received per rank and direction: (D−1)·B·H·K·(K+V)·4 bytes; one dependent round.
"""

from __future__ import annotations

import torch

from .comm import all_gather, keep_in_backward, rank_size
from .common import apply_pair, replay_from, shard_pair


def chunk_gated_delta_rule_all_gather(q, k, v, g, beta, *, group, h0_BHKV: torch.Tensor,
                                      output_final_state: bool, use_qk_l2norm: bool,
                                      chunk_size: int):
    """This rank's shard of o (float32 [B, T/D, Hv, Dv]) and the global final state (or None)."""
    rank, D = rank_size(group)
    pair = shard_pair(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm, chunk_size=chunk_size)
    P_DBHKW = all_gather(pair.P_BHKW, group=group, op="all_gather")
    h_BHKV = h0_BHKV
    for P_BHKW in P_DBHKW[:rank]:
        h_BHKV = apply_pair(P_BHKW, h_BHKV)
    # Rank 0 (and any rank without the final state) leaves some of P unused: keep all of it in
    # the graph so that every rank joins the all-gather's backward.
    h_BHKV = keep_in_backward(h_BHKV, *P_DBHKW)
    o = replay_from(pair, h_BHKV)
    if not output_final_state:
        return o, None
    for P_BHKW in P_DBHKW[rank:]:
        h_BHKV = apply_pair(P_BHKW, h_BHKV)
    return o, h_BHKV
