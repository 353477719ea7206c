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

Under layout='zigzag' (rank r holds segments r and 2D−1−r) the same scan runs twice: up the
first segments (rank r's pair P1_r, shifts r → r+d), which leaves the pair of all first
segments on rank D−1; then down the second ones (shifts r → r−d, so that rank r receives from
r+d, the segments before its own), starting from X_{D−1} = P2_{D−1} ∘ (all first segments)
and X_r = P2_r elsewhere. 2⌈log2 D⌉ dependent rounds; rank r receives in the forward pass
#{d ≤ r} + #{d ≤ D−1−r} pairs, at most 2⌈log2 D⌉ (as many in backward); the final state is
rank 0's inclusive pair applied to h0, broadcast from rank 0.
"""

from __future__ import annotations

import torch

from .comm import broadcast, keep_in_backward, rank_size, shift
from .common import apply_pair, compose_pairs, sequence_sharded

_TAG = 40  # round i uses tags _TAG + 2i (forward) and _TAG + 2i + 1 (backward)
_TAG_DOWN = 60  # the same for zigzag's scan down the second segments


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


def _scan(P_BHKW: torch.Tensor, *, up: bool, keep_inclusive: bool, received: list, group):
    """One Hillis–Steele scan over the ranks, in rank order (`up`) or reversed: (exclusive pair
    or None, inclusive pair). Appends what arrives to `received`; each round's send is tied to
    the previous round's arrival so that every rank runs the rounds' backwards in one order
    (point-to-point backward exchanges in different orders on two ranks would deadlock)."""
    rank, D = rank_size(group)
    position = rank if up else D - 1 - rank
    I_BHKW, E_BHKW = P_BHKW, None
    d, round_idx = 1, 0
    while d < D:
        send = keep_in_backward(I_BHKW, received[-1]) if received else I_BHKW
        R_BHKW = shift(send, d if up else -d, group=group,
                       tag=(_TAG if up else _TAG_DOWN) + 2 * round_idx, op="log_scan")
        received.append(R_BHKW)
        if position >= d:  # else nothing arrived (zeros)
            E_BHKW = R_BHKW if E_BHKW is None else compose_pairs(R_BHKW, E_BHKW)
            if 2 * d < D or keep_inclusive:
                I_BHKW = compose_pairs(R_BHKW, I_BHKW)
        d, round_idx = 2 * d, round_idx + 1
    return E_BHKW, I_BHKW


def log_scan_zigzag_exchange(pairs: tuple[torch.Tensor, torch.Tensor], h0_BHKV: torch.Tensor,
                             *, group, output_final_state: bool):
    """((h_in1, h_in2), final or None): a scan up the first segments, then down the second."""
    rank, D = rank_size(group)
    received: list[torch.Tensor] = []
    E1, I1 = _scan(pairs[0], up=True, keep_inclusive=rank == D - 1, received=received,
                   group=group)
    last = rank == D - 1  # holds segment D−1, whose end state (all first segments) turns round
    X = compose_pairs(I1, pairs[1]) if last else pairs[1]
    E2, I2 = _scan(X, up=False, keep_inclusive=output_final_state, received=received,
                   group=group)
    h_in1 = h0_BHKV if E1 is None else apply_pair(E1, h0_BHKV)
    h_in2 = apply_pair(I1 if last else E2, h0_BHKV)
    # Tie every round's arrival to h_in1 (which always reaches the loss): every rank then runs
    # every round's backward, also where nothing arrived.
    h_in1 = keep_in_backward(h_in1, *received)
    if not output_final_state:
        return (h_in1, h_in2), None
    # As in the contiguous exchange: the broadcast's backward (a collective) runs first.
    final_BHKV = keep_in_backward(apply_pair(I2, h0_BHKV), *received)
    return (h_in1, h_in2), broadcast(final_BHKV, src=0, group=group,
                                     op="log_scan_final_state")


chunk_gated_delta_rule_log_scan = sequence_sharded(log_scan_exchange,
                                                   log_scan_zigzag_exchange)
