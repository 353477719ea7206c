"""CP mode `all_gather`: one all-gather of every rank's packed (A, b), then a local prefix.

Rank r folds its chunks into P_r = [A_r | b_r] ([B, H, K, K+V], float32), all ranks gather
P_0 … P_{D−1} in one collective, and every rank applies them to h0 in sequence order:
    h_in(r) = P_{r−1}(… P_0(h0)),     final = P_{D−1}(… P_0(h0))   (identical on every rank).
Received per rank and direction: (D−1)·B·H·K·(K+V)·4 bytes; one dependent round.

Under layout='zigzag' every rank gathers both pairs of every rank (one collective, twice the
bytes: 2(D−1)·B·H·K·(K+V)·4) and applies the 2D pairs in sequence order: the first segments'
P_0 … P_{D−1}, then the second segments' of ranks D−1 … 0.
"""

from __future__ import annotations

import torch

from .comm import all_gather, keep_in_backward, rank_size
from .common import apply_pair, sequence_sharded


def all_gather_exchange(P_BHKW: torch.Tensor, h0_BHKV: torch.Tensor, *, group,
                        output_final_state: bool):
    """(h_in, final state or None) from every rank's packed pair, gathered in one collective."""
    rank, _ = rank_size(group)
    P_DBHKW = all_gather(P_BHKW, group=group, op="all_gather")
    h_BHKV = h0_BHKV
    for P_r in P_DBHKW[:rank]:
        h_BHKV = apply_pair(P_r, h_BHKV)
    # Rank 0 (and any rank without the final state) leaves some of P unused: keep all of it in
    # the graph so that every rank joins the all-gather's backward.
    h_BHKV = keep_in_backward(h_BHKV, *P_DBHKW)
    if not output_final_state:
        return h_BHKV, None
    final_BHKV = h_BHKV
    for P_r in P_DBHKW[rank:]:
        final_BHKV = apply_pair(P_r, final_BHKV)
    return h_BHKV, final_BHKV


def all_gather_zigzag_exchange(pairs: tuple[torch.Tensor, torch.Tensor], h0_BHKV: torch.Tensor,
                               *, group, output_final_state: bool):
    """((h_in1, h_in2), final or None) from both pairs of every rank, gathered at once."""
    rank, D = rank_size(group)
    gathered = all_gather(torch.stack(pairs), group=group, op="all_gather")
    in_sequence_order = [P[0] for P in gathered] + [P[1] for P in reversed(gathered)]
    first, second = rank, 2 * D - 1 - rank  # this rank's segments in sequence order
    # states[i]: the state entering segment i (as far as this rank needs them)
    states = [h0_BHKV]
    for P in in_sequence_order[:2 * D if output_final_state else second]:
        states.append(apply_pair(P, states[-1]))
    # Keep every gathered pair in the graph so that every rank joins the all-gather's backward.
    h_in1 = keep_in_backward(states[first], *gathered)
    return (h_in1, states[second]), (states[-1] if output_final_state else None)


chunk_gated_delta_rule_all_gather = sequence_sharded(all_gather_exchange,
                                                     all_gather_zigzag_exchange)
