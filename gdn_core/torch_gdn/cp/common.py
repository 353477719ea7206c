"""Scaffolding shared by the sequence-sharded CP modes (p2p, all_gather, log_scan).

Each of those modes does the same three things around one exchange of affine pairs:
  1. prepare this shard's chunk terms once and fold its chunks into one pair (A, b),
     A [B, H, K, K], b [B, H, K, V] (float32): the shard maps h ↦ A h + b;
  2. (mode-specific, an `Exchange`) turn the pairs of ranks < r into this rank's incoming
     state h_in (and, if asked, the state after the global sequence);
  3. replay the shard's chunks from h_in, reusing the same chunk terms (no recomputation).
Pairs travel packed as P = [A | b] along the last dim: [B, H, K, K+V]. Under layout='zigzag'
(gdn_core.cp_layout) a shard is two segments, r and 2D−1−r: each is folded into its own pair,
the mode's `ZigzagExchange` gives each its incoming state, and each is replayed from it.

Backward (`_ReplayThroughExchange`, as the JAX side's replay_through_exchange): whatever the
exchange does with P, its outputs are compositions of pairs applied to h0, so its cotangent
on this shard's pair is (λ h_inᵀ, λ). Through the fold that equals the replay scan's backward
with λ added to its final-state cotangent. So the fold keeps no running product per chunk
(autograd of the fold would: one [A | b] per chunk, ~+24% of the rule's saved bytes at a
4096-token shard); only A_n and the replayed states (which the outputs need anyway) are saved,
plus the exchange's own small graph (pairs, independent of the shard length).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ...cp_layout import Layout, local_positions
from ..chunk import chunk_outputs, fold_chunk_pairs, prepare_chunks, scan_chunk_states
from ..device_index import device_index
from .comm import rank_size

# The implementation signature every mode in the registry follows.
CPRule = Callable[..., tuple[torch.Tensor, "torch.Tensor | None"]]
# exchange(P_BHKW, h0_BHKV, *, group, output_final_state) -> (h_in_BHKV, final_BHKV | None),
# differentiable (built from comm.py's collectives); every rank calls it with its own pair.
Exchange = Callable[..., tuple[torch.Tensor, "torch.Tensor | None"]]
# The same under layout='zigzag': ((P_first, P_second), h0) -> ((h_in_first, h_in_second),
# final | None); rank r's segments are r and 2D−1−r, replayed in the sequence order
# 0, 1, …, D−1 (first segments), then D−1, …, 0 (second segments).
ZigzagExchange = Callable[..., tuple[tuple[torch.Tensor, torch.Tensor], "torch.Tensor | None"]]


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


def reverse_state_scan(A_NBHKK, states_NBHKV, d_states_NBHKV, d_last_BHKV, *,
                       with_pairs: bool):
    """Backward of S_{n+1} = A_n S_n + b_n given cotangents of every S_n and of S_N.

    μ_N = d_last; μ_n = d_states_n + A_nᵀ μ_{n+1}; ∂A_n = μ_{n+1} S_nᵀ, ∂b_n = μ_{n+1}.
    Returns μ_0 (∂L/∂S_0) and, if with_pairs, (∂A [N,B,H,K,K], ∂b [N,B,H,K,V]).
    """
    mu_BHKV, dA, db = d_last_BHKV, [], []
    for n in range(A_NBHKK.shape[0] - 1, -1, -1):
        if with_pairs:
            dA.append(mu_BHKV @ states_NBHKV[n].transpose(-1, -2))
            db.append(mu_BHKV)
        mu_BHKV = d_states_NBHKV[n] + A_NBHKK[n].transpose(-1, -2) @ mu_BHKV
    if not with_pairs:
        return mu_BHKV, None
    return mu_BHKV, (torch.stack(dA[::-1]), torch.stack(db[::-1]))


def _keep(x: torch.Tensor) -> torch.Tensor:
    return x


class _ReplayThroughExchange(torch.autograd.Function):
    """(exchange, h0 [B,H,K,V], A_n, b_n of each segment…) → (S_n entering each chunk of each
    segment [N,B,H,K,V]…, final).

    Forward: fold each segment, `exchange` (its differentiable graph kept on ctx: pairs, not
    chunks), replay each segment from its incoming state. Backward: ḡ_i = ∂L/∂h_in_i through
    segment i's outputs; the exchange's graph backward from (ḡ, ∂L/∂final) gives ∂L/∂h0 and
    λ_i = ∂L/∂b_fold_i; then one reverse scan per segment with λ_i as its final state's
    cotangent gives ∂A_n, ∂b_n. No double backward.
    """

    @staticmethod
    def forward(ctx, exchange, h0_BHKV, *chunk_pairs):
        As, bs = chunk_pairs[0::2], chunk_pairs[1::2]
        Ps = [torch.cat(fold_chunk_pairs(A, b), dim=-1).requires_grad_() for A, b in zip(As, bs)]
        h0_leaf = h0_BHKV.detach().requires_grad_()
        # Identity saved-tensor hooks: under activation checkpointing the kept exchange graph
        # must hold its own (pair-sized) tensors, or backward's autograd.grad on it (a new
        # graph task) would re-run the whole checkpointed region, exchanges included, again.
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_keep, _keep):
            h_ins, final_BHKV = exchange(Ps, h0_leaf)
        states = [scan_chunk_states(A, b, h_in.detach())[0] for A, b, h_in in zip(As, bs, h_ins)]
        ctx.save_for_backward(*As, *states)
        ctx.graph = (Ps, h0_leaf, h_ins, final_BHKV)
        return (*states, None if final_BHKV is None else final_BHKV.detach())

    @staticmethod
    def backward(ctx, *grads):
        Ps, h0_leaf, h_ins, final_BHKV = ctx.graph
        del ctx.graph  # free the exchange's graph with this backward
        n, saved = len(Ps), ctx.saved_tensors  # unpack once (checkpointing allows no more)
        As, states = saved[:n], saved[n:]
        d_states, d_final_BHKV = grads[:n], grads[n]
        zeros_BHKV = torch.zeros_like(h_ins[0])
        outputs, cotangents = list(h_ins), []
        for A, S, dS in zip(As, states, d_states):
            cotangents.append(reverse_state_scan(A, S, dS, zeros_BHKV, with_pairs=False)[0])
        if final_BHKV is not None:  # every rank backpropagates it: its collectives wait on all
            outputs.append(final_BHKV)
            cotangents.append(zeros_BHKV if d_final_BHKV is None else d_final_BHKV)
        *dPs, dh0_BHKV = torch.autograd.grad(outputs, (*Ps, h0_leaf), cotangents,
                                             allow_unused=True)
        K = As[0].shape[-1]
        d_pairs = []
        for A, S, dS, dP in zip(As, states, d_states, dPs):
            lam_BHKV = zeros_BHKV if dP is None else dP[..., K:]
            d_pairs.extend(reverse_state_scan(A, S, dS, lam_BHKV, with_pairs=True)[1])
        return (None, dh0_BHKV, *d_pairs)


def replay_through_exchange(exchange: Exchange, segments, h0_BHKV):
    """Chunk-entry states [N,B,H,K,V] of each segment and the final state (or None), the
    segments' incoming states from `exchange([P_BHKW per segment], h0_BHKV)`; `segments` is a
    list of (A_n, b_n); differentiable in every A_n, b_n and h0 (see the module doc)."""
    flat = [x for pair in segments for x in pair]
    if torch.is_grad_enabled() and any(x.requires_grad for x in (*flat, h0_BHKV)):
        *states, final_BHKV = _ReplayThroughExchange.apply(exchange, h0_BHKV, *flat)
        return states, final_BHKV
    Ps = [torch.cat(fold_chunk_pairs(A, b), dim=-1) for A, b in segments]
    h_ins, final_BHKV = exchange(Ps, h0_BHKV)
    return [scan_chunk_states(A, b, h)[0] for (A, b), h in zip(segments, h_ins)], final_BHKV


def shard_positions_tensor(*, group, seq_len: int, layout: Layout, device) -> torch.Tensor:
    """Global positions of this rank's tokens, in local order (cp_layout.local_positions):
    int64 [T/D] on `device`, built once (device_index)."""
    rank, D = rank_size(group)
    return device_index(_local_positions, rank, D, seq_len, layout, device=device)


def _local_positions(chip: int, chips: int, seq_len: int, layout: Layout):
    return local_positions(chip=chip, chips=chips, seq_len=seq_len, layout=layout)


def sequence_sharded(contiguous: Exchange, zigzag: ZigzagExchange) -> CPRule:
    """Make a mode's rule (the CP registry's entries) from its two Exchanges (one per layout).

    Under layout='zigzag' the shard is two segments (cp_layout): each gets its own chunk terms
    and pair, and is replayed from its own incoming state. doc_starts_t (bool [T/D], local
    order; packed documents): the tokens whose entering state is zero (chunk.py's segment
    masks), a pair holding one has A = 0, so the exchanges pass nothing across it.
    """

    def rule(q, k, v, g, beta, *, group, h0_BHKV: torch.Tensor, output_final_state: bool,
             use_qk_l2norm: bool, chunk_size: int, layout: Layout = "contiguous",
             doc_starts_t: torch.Tensor | None = None):
        parts = 2 if layout == "zigzag" else 1
        pieces = zip(*(x.chunk(parts, dim=1) for x in (q, k, v, g, beta)))
        starts = [None] * parts if doc_starts_t is None else doc_starts_t.chunk(parts)
        terms = [prepare_chunks(*xs, use_qk_l2norm=use_qk_l2norm, chunk_size=chunk_size,
                                doc_starts_T=st) for xs, st in zip(pieces, starts)]

        def bound(Ps, h0):
            if layout == "zigzag":
                h_ins, final = zigzag(tuple(Ps), h0, group=group,
                                      output_final_state=output_final_state)
                return list(h_ins), final
            h_in, final = contiguous(Ps[0], h0, group=group, output_final_state=output_final_state)
            return [h_in], final

        states, final_BHKV = replay_through_exchange(
            bound, [(t.A_NBHKK, t.b_NBHKV) for t in terms], h0_BHKV)
        o = [chunk_outputs(t, S) for t, S in zip(terms, states)]
        return (o[0] if parts == 1 else torch.cat(o, dim=1)), final_BHKV

    name = contiguous.__name__.removesuffix("_exchange")
    rule.__name__ = rule.__qualname__ = f"chunk_gated_delta_rule_{name}"
    rule.__doc__ = (f"This rank's shard of o (float32 [B, T/D, Hv, Dv]) and the global final "
                    f"state (or None), incoming states from the {name} exchange.")
    return rule
