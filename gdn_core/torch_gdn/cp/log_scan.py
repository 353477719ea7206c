"""CP mode `log_scan`: Hillis–Steele prefix over the ranks' (A, b) pairs in ⌈log2 D⌉ rounds.

Rank r starts with its inclusive pair I = P_r ([A | b], [B, H, K, K+V], float32) and the
exclusive pair E = identity. Round d = 1, 2, 4, … < D: send I to r+d, receive R = I_{r−d}
(the segment of ranks r−2d+1 … r−d; nothing when r < d), then
    E ← E ∘ R   (R covers earlier positions than E: apply R first),
    I ← I ∘ R   (what is sent on in the next round).
After the last round E covers ranks 0 … r−1, so h_in = E(h0) with no extra round; the last
rank's I covers everything, final = I(h0) broadcast from rank D−1 (only if asked).
Each round is a differentiable shift (`comm.shift`): backward sends the gradient of R back to
r−d and receives the gradient of the sent I from r+d. Rank r receives in the rounds with
d ≤ r: at most ⌈log2 D⌉·B·H·K·(K+V)·4 bytes per direction.
"""

from __future__ import annotations

import torch

from .comm import broadcast, keep_in_backward, rank_size, shift
from .common import apply_pair, compose_pairs, sequence_sharded

_TAG = 40  # round i uses tags _TAG + 2i (forward) and _TAG + 2i + 1 (backward)


def log_scan_exchange(P_BHKW: torch.Tensor, h0_BHKV: torch.Tensor, *, group,
                      output_final_state: bool):
    """(h_in, final state or None) by ⌈log2 D⌉ rounds of shifted inclusive pairs."""
    rank, D = rank_size(group)
    I_BHKW, E_BHKW, received = P_BHKW, None, []
    d, round_idx = 1, 0
    while d < D:
        R_BHKW = shift(I_BHKW, d, group=group, tag=_TAG + 2 * round_idx, op="log_scan")
        received.append(R_BHKW)
        if rank >= d:  # else nothing arrived (zeros): E and I stay as they are
            E_BHKW = R_BHKW if E_BHKW is None else compose_pairs(R_BHKW, E_BHKW)
            if 2 * d < D or output_final_state:
                I_BHKW = compose_pairs(R_BHKW, I_BHKW)
        d, round_idx = 2 * d, round_idx + 1
    h_in_BHKV = h0_BHKV if E_BHKW is None else apply_pair(E_BHKW, h0_BHKV)
    # Every round's shift must run its backward on every rank (its peer r+d waits for it), also
    # where nothing arrived: tie the received tensors to h_in, which always reaches the loss.
    h_in_BHKV = keep_in_backward(h_in_BHKV, *received)
    if not output_final_state:
        return h_in_BHKV, None
    # Every rank passes its own I(h0), tied to every round's output, so that on every rank the
    # broadcast's backward (a collective) runs before any round's backward (point-to-point).
    final_BHKV = keep_in_backward(apply_pair(I_BHKW, h0_BHKV), *received)
    return h_in_BHKV, broadcast(final_BHKV, src=D - 1, group=group, op="log_scan_final_state")


chunk_gated_delta_rule_log_scan = sequence_sharded(log_scan_exchange)
