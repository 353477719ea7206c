"""Scaffolding shared by the sequence-sharded CP modes (p2p, all_gather, log_scan).

Each of those modes does the same three things around one exchange of affine pairs:
  1. prepare this shard's chunk terms once and fold its chunks into one pair (A, b),
     A [B, H, K, K], b [B, H, K, V] (float32): the shard maps h ↦ A h + b;
  2. (mode-specific, an `Exchange`) turn the pairs of ranks < r into this rank's incoming
     state h_in (and, if asked, the state after the global sequence);
  3. replay the shard's chunks from h_in, reusing the same chunk terms (no recomputation).
Pairs travel packed as P = [A | b] along the last dim: [B, H, K, K+V].

Backward (`_ReplayThroughExchange`, as the JAX side's replay_through_exchange): whatever the
exchange does with P, its outputs are compositions of pairs applied to h0, so its cotangent
on this shard's pair is (λ h_inᵀ, λ). Through the fold that equals the replay scan's backward
with λ added to its final-state cotangent. So the fold keeps no running product per chunk
(autograd of the fold would: one [A | b] per chunk, ~+24% of the rule's saved bytes at a
4096-token shard); only A_n and the replayed states (which the outputs need anyway) are saved,
plus the exchange's own small graph (pairs, independent of the shard length).
"""

from __future__ import annotations

from typing import Callable

import torch

from ..chunk import chunk_outputs, fold_chunk_pairs, prepare_chunks, scan_chunk_states

# The implementation signature every mode in the registry follows.
CPRule = Callable[..., tuple[torch.Tensor, "torch.Tensor | None"]]
# exchange(P_BHKW, h0_BHKV, *, group, output_final_state) -> (h_in_BHKV, final_BHKV | None),
# differentiable (built from comm.py's collectives); every rank calls it with its own pair.
Exchange = Callable[..., tuple[torch.Tensor, "torch.Tensor | None"]]


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
    """(A_n [N,B,H,K,K], b_n [N,B,H,K,V], h0 [B,H,K,V]) → (S_n entering each chunk, final).

    Forward: fold, `exchange` (its differentiable graph kept on ctx: pairs, not chunks), replay.
    Backward: ḡ = ∂L/∂h_in through this shard's outputs; the exchange's graph backward from
    (ḡ, ∂L/∂final) gives ∂L/∂h0 and λ = ∂L/∂b_fold; then one reverse scan with λ as the final
    state's cotangent gives ∂A_n, ∂b_n. No double backward.
    """

    @staticmethod
    def forward(ctx, A_NBHKK, b_NBHKV, h0_BHKV, exchange):
        A_BHKK, b_BHKV = fold_chunk_pairs(A_NBHKK, b_NBHKV)
        P_BHKW = torch.cat([A_BHKK, b_BHKV], dim=-1).requires_grad_()
        h0_leaf = h0_BHKV.detach().requires_grad_()
        # Identity saved-tensor hooks: under activation checkpointing the kept exchange graph
        # must hold its own (pair-sized) tensors, or backward's autograd.grad on it (a new
        # graph task) would re-run the whole checkpointed region, exchanges included, again.
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_keep, _keep):
            h_in_BHKV, final_BHKV = exchange(P_BHKW, h0_leaf)
        states_NBHKV, _ = scan_chunk_states(A_NBHKK, b_NBHKV, h_in_BHKV.detach())
        ctx.save_for_backward(A_NBHKK, states_NBHKV)
        ctx.graph = (P_BHKW, h0_leaf, h_in_BHKV, final_BHKV)
        return states_NBHKV, None if final_BHKV is None else final_BHKV.detach()

    @staticmethod
    def backward(ctx, d_states_NBHKV, d_final_BHKV):
        A_NBHKK, states_NBHKV = ctx.saved_tensors
        P_BHKW, h0_leaf, h_in_BHKV, final_BHKV = ctx.graph
        del ctx.graph  # free the exchange's graph with this backward
        zeros_BHKV = torch.zeros_like(h_in_BHKV)
        g_BHKV, _ = reverse_state_scan(A_NBHKK, states_NBHKV, d_states_NBHKV, zeros_BHKV,
                                       with_pairs=False)
        outputs, cotangents = [h_in_BHKV], [g_BHKV]
        if final_BHKV is not None:  # every rank backpropagates it: its collectives wait on all
            outputs.append(final_BHKV)
            cotangents.append(zeros_BHKV if d_final_BHKV is None else d_final_BHKV)
        dP_BHKW, dh0_BHKV = torch.autograd.grad(outputs, (P_BHKW, h0_leaf), cotangents,
                                                allow_unused=True)
        K = A_NBHKK.shape[-1]
        lam_BHKV = zeros_BHKV if dP_BHKW is None else dP_BHKW[..., K:]
        _, (dA_NBHKK, db_NBHKV) = reverse_state_scan(A_NBHKK, states_NBHKV, d_states_NBHKV,
                                                     lam_BHKV, with_pairs=True)
        return dA_NBHKK, db_NBHKV, dh0_BHKV, None


def replay_through_exchange(exchange: Exchange, A_NBHKK, b_NBHKV, h0_BHKV):
    """The shard's chunk-entry states [N,B,H,K,V] and the final state (or None), h_in from
    `exchange(P_BHKW, h0_BHKV)`; differentiable in A_n, b_n and h0 (see the module doc)."""
    if torch.is_grad_enabled() and any(x.requires_grad for x in (A_NBHKK, b_NBHKV, h0_BHKV)):
        return _ReplayThroughExchange.apply(A_NBHKK, b_NBHKV, h0_BHKV, exchange)
    A_BHKK, b_BHKV = fold_chunk_pairs(A_NBHKK, b_NBHKV)
    h_in_BHKV, final_BHKV = exchange(torch.cat([A_BHKK, b_BHKV], dim=-1), h0_BHKV)
    return scan_chunk_states(A_NBHKK, b_NBHKV, h_in_BHKV)[0], final_BHKV


def sequence_sharded(exchange: Exchange) -> CPRule:
    """Make a mode's rule (the CP registry's entries) from its Exchange."""

    def rule(q, k, v, g, beta, *, group, h0_BHKV: torch.Tensor, output_final_state: bool,
             use_qk_l2norm: bool, chunk_size: int):
        terms = prepare_chunks(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm,
                               chunk_size=chunk_size)

        def bound(P_BHKW, h0):
            return exchange(P_BHKW, h0, group=group, output_final_state=output_final_state)

        states_NBHKV, final_BHKV = replay_through_exchange(bound, terms.A_NBHKK, terms.b_NBHKV,
                                                           h0_BHKV)
        return chunk_outputs(terms, states_NBHKV), final_BHKV

    name = exchange.__name__.removesuffix("_exchange")
    rule.__name__ = rule.__qualname__ = f"chunk_gated_delta_rule_{name}"
    rule.__doc__ = (f"This rank's shard of o (float32 [B, T/D, Hv, Dv]) and the global final "
                    f"state (or None), h_in from the {name} exchange.")
    return rule
