"""Chunked gated delta rule in PyTorch, written as an affine scan over chunks.

Inside a chunk of C tokens (cumulative log decay G_i, WY form with T = (I + L)⁻¹,
L_ij = β_i (k_i·k_j) e^{G_i−G_j} for i > j) the state update is affine:

    S_{n+1} = A_n S_n + b_n,   A_n = e^{G_C} I − k̃ᵀ w,   b_n = k̃ᵀ u,
    w = T (β k e^{G}),  u = T (β v),  k̃ = k e^{G_C − G}.

All chunk-local work (the triangular solve, A_n, b_n, intra-chunk attention) is batched over
chunks; only S_{n+1} = A_n S_n + b_n runs sequentially. Outputs then follow in one batch:
    o = (q e^{G}) S_n + attn (u − w S_n).
Context parallelism reuses the same pieces: fold the (A_n, b_n) of a shard into one pair,
exchange pairs, then scan from the incoming state.

Packed documents (cu_seqlens; documents.py). Chunks need not align with documents: a chunk
is cut by the document starts inside it into segments, and exactly (no large-negative decay
standing in for a reset) G restarts at each start, decay and L are zero between segments (T
is then block diagonal), the incoming state S_n reaches only the first segment (q̃ and w are
zero elsewhere), b_n is built from the last segment alone, and A_n = 0 when the chunk holds a
start: the state leaving it no longer depends on the state entering it. The CP modes fold
these pairs unchanged, so a shard holding a start has a zero transition too.

Precision. float32 inputs: everything is float32. bfloat16 (or float16) inputs: the matmuls
that only feed the output — q kᵀ, q̃ S and attn (u − w S) — take bf16 operands (bf16 tensors:
float32 accumulation inside the GEMM, the product rounded to bf16, then summed in float32);
βKKᵀ, the triangular solve, w, u, the (A, b) pairs, their composition and the state S stay
float32 (in bf16 they bring back the failure on keys that share a direction). Tolerances
against the float32 rule on the same bf16-rounded inputs, keys at cosine up to 0.97 (relative
Frobenius; tests/gdn_core/test_correlated_keys.py): output and every input gradient ≤ 2e-2
(measured ≤ 9e-3), final state ≤ 1e-5 (float32 math on both sides; measured equal).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from ..shapes import check_rule_args
from .documents import check_cu_seqlens, document_starts, sequence_positions
from .naive import l2norm


@dataclasses.dataclass(frozen=True, slots=True)
class ChunkTerms:
    """Chunk-local terms of the rule (chunk axis leading: [N, B, H, ...]); float32 except
    q_NBHCK and attn_NBHCC, in compute_dtype of the inputs (they only feed the output)."""

    q_NBHCK: torch.Tensor  # q · Dk^-½ · e^{G}
    attn_NBHCC: torch.Tensor  # (q kᵀ) ⊙ e^{G_i−G_j}, causal incl. diagonal
    w_NBHCK: torch.Tensor
    u_NBHCV: torch.Tensor
    A_NBHKK: torch.Tensor
    b_NBHKV: torch.Tensor
    seq_len: int  # tokens before padding to a multiple of C


@dataclasses.dataclass(frozen=True, slots=True)
class DocumentSegments:
    """Segment masks of the chunks under packed documents (segment 0 of a chunk: the tokens
    before its first document start; broadcastable to [N, B, H, ...])."""

    same_N11CC: torch.Tensor  # tokens i, j in the same segment
    first_N11C: torch.Tensor  # token in segment 0 (reached by the incoming state)
    last_N11C: torch.Tensor  # token in the chunk's last segment (reaches the leaving state)
    whole_N1111: torch.Tensor  # the chunk holds no document start

    @classmethod
    def of(cls, doc_starts_T: torch.Tensor, N: int, C: int) -> DocumentSegments:
        T = doc_starts_T.shape[0]
        pad_T = doc_starts_T.new_zeros(N * C - T, dtype=torch.bool)
        starts_NC = torch.cat([doc_starts_T.bool(), pad_T]).view(N, C)
        seg_NC = starts_NC.long().cumsum(-1)
        return cls(same_N11CC=(seg_NC[:, :, None] == seg_NC[:, None, :])[:, None, None],
                   first_N11C=(seg_NC == 0)[:, None, None],
                   last_N11C=(seg_NC == seg_NC[:, -1:])[:, None, None],
                   whole_N1111=~starts_NC.any(-1)[:, None, None, None, None])


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Operand dtype of the output-only matmuls for inputs of `dtype` (see the module doc)."""
    return dtype if dtype in (torch.bfloat16, torch.float16) else torch.float32


def prepare_chunks(q, k, v, g, beta, *, use_qk_l2norm=False, chunk_size=64,
                   doc_starts_T: torch.Tensor | None = None) -> ChunkTerms:
    """Compute every chunk-local term of the rule. Shapes as in chunk_gated_delta_rule;
    doc_starts_T (bool [T], documents.document_starts) marks the tokens whose entering state is
    zero: the chunk terms then follow the segment masks of the module doc."""
    B, T, Hk, Hv, Dk, Dv = check_rule_args(
        q.shape, k.shape, v.shape, g.shape, beta.shape, None, chunk_size)
    C, r, low = chunk_size, Hv // Hk, compute_dtype(q.dtype)
    q, k = q.float(), k.float()
    if r > 1:
        q, k = q.repeat_interleave(r, dim=2), k.repeat_interleave(r, dim=2)
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = q * Dk ** -0.5
    pad = (-T) % C
    N = (T + pad) // C

    def chunked(x):  # [B, T, H, D] -> [N, B, H, C, D]
        x = F.pad(x.float(), (0, 0, 0, 0, 0, pad))
        return x.reshape(B, N, C, Hv, x.shape[-1]).permute(1, 0, 3, 2, 4)

    q_NBHCK, k_NBHCK, v_NBHCV = chunked(q), chunked(k), chunked(v)
    g_NBHC, beta_NBHC = (chunked(x[..., None])[..., 0] for x in (g, beta))
    causal_CC = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    seg = None if doc_starts_T is None else DocumentSegments.of(doc_starts_T, N, C)
    if seg is None:
        G_NBHC = g_NBHC.cumsum(-1)
        visible = causal_CC
    else:  # G restarts at every document start: sums run only over the token's own document
        visible = causal_CC & seg.same_N11CC
        G_NBHC = (g_NBHC[..., None, :] * visible).sum(-1)
    # Mask before exp: above the diagonal G_i − G_j > 0 and would overflow under strong decay.
    decay_NBHCC = ((G_NBHC[..., :, None] - G_NBHC[..., None, :])
                   .masked_fill(~visible, -torch.inf).exp())

    kbeta_NBHCK = k_NBHCK * beta_NBHC[..., None]
    L_NBHCC = (kbeta_NBHCK @ k_NBHCK.transpose(-1, -2)) * decay_NBHCC
    # The incoming state reaches only the chunk's first segment (the document it continues).
    state_decay_NBHC = G_NBHC.exp() if seg is None else G_NBHC.exp() * seg.first_N11C
    rhs = torch.cat([v_NBHCV * beta_NBHC[..., None], kbeta_NBHCK * state_decay_NBHC[..., None]],
                    dim=-1)
    # unitriangular: only the strictly lower part of L is read, the diagonal is taken as 1.
    solved = torch.linalg.solve_triangular(L_NBHCC, rhs, upper=False, unitriangular=True)
    u_NBHCV, w_NBHCK = solved[..., :Dv], solved[..., Dv:]

    G_last_NBH = G_NBHC[..., -1]
    to_end_NBHC = G_last_NBH[..., None] - G_NBHC
    if seg is not None:  # only the chunk's last segment reaches the state leaving it
        to_end_NBHC = to_end_NBHC.masked_fill(~seg.last_N11C, -torch.inf)
    kdec_NBHCK = k_NBHCK * to_end_NBHC.exp()[..., None]
    eye_KK = torch.eye(Dk, dtype=torch.float32, device=q.device)
    A_NBHKK = G_last_NBH.exp()[..., None, None] * eye_KK - kdec_NBHCK.transpose(-1, -2) @ w_NBHCK
    if seg is not None:  # a chunk holding a document start forgets the state entering it
        A_NBHKK = torch.where(seg.whole_N1111, A_NBHKK, 0.0)
    b_NBHKV = kdec_NBHCK.transpose(-1, -2) @ u_NBHCV
    qk_NBHCC = q_NBHCK.to(low) @ k_NBHCK.transpose(-1, -2).to(low)
    attn_NBHCC = (qk_NBHCC.float() * decay_NBHCC).to(low)
    q_tilde_NBHCK = (q_NBHCK * state_decay_NBHC[..., None]).to(low)
    return ChunkTerms(q_tilde_NBHCK, attn_NBHCC, w_NBHCK, u_NBHCV,
                      A_NBHKK.contiguous(), b_NBHKV.contiguous(), T)


def scan_chunk_states(A_NBHKK, b_NBHKV, h0_BHKV):
    """S_0 = h0, S_{n+1} = A_n S_n + b_n. Returns (S_n entering each chunk [N,B,H,K,V], S_N)."""
    states = []
    h_BHKV = h0_BHKV
    for A_BHKK, b_BHKV in zip(A_NBHKK.unbind(0), b_NBHKV.unbind(0)):
        states.append(h_BHKV)
        h_BHKV = torch.baddbmm(b_BHKV.flatten(0, 1), A_BHKK.flatten(0, 1),
                               h_BHKV.flatten(0, 1)).view_as(b_BHKV)
    return torch.stack(states), h_BHKV


def fold_chunk_pairs(A_NBHKK, b_NBHKV):
    """Compose all chunks into one affine map h ↦ A h + b (chunk 0 applied first)."""
    A_BHKK, b_BHKV = A_NBHKK[0], b_NBHKV[0]
    for A_next, b_next in zip(A_NBHKK[1:].unbind(0), b_NBHKV[1:].unbind(0)):
        A_BHKK, b_BHKV = compose_affine(A_BHKK, b_BHKV, A_next, b_next)
    return A_BHKK, b_BHKV


def compose_affine(A_first, b_first, A_then, b_then):
    """The map 'apply (A_first, b_first), then (A_then, b_then)': (A_then A_first, A_then b_first + b_then)."""
    return A_then @ A_first, A_then @ b_first + b_then


def chunk_outputs(terms: ChunkTerms, states_NBHKV) -> torch.Tensor:
    """o = q̃ S_n + attn (u − w S_n) for every chunk at once; returns float32 [B, T, H, V].

    u − w S_n is float32; the two output matmuls run in the dtype of q̃ and attn.
    """
    low = terms.q_NBHCK.dtype
    v_new_NBHCV = terms.u_NBHCV - terms.w_NBHCK @ states_NBHKV
    o_NBHCV = ((terms.q_NBHCK @ states_NBHKV.to(low)).float()
               + (terms.attn_NBHCC @ v_new_NBHCV.to(low)).float())
    N, B, H, C, V = o_NBHCV.shape
    return o_NBHCV.permute(1, 0, 3, 2, 4).reshape(B, N * C, H, V)[:, :terms.seq_len]


def initial_state_or_zeros(initial_state, B, H, K, V, device):
    if initial_state is None:
        return torch.zeros(B, H, K, V, dtype=torch.float32, device=device)
    return initial_state.float()


def chunk_gated_delta_rule(q, k, v, g, beta, *, initial_state=None, output_final_state=False,
                           use_qk_l2norm=False, chunk_size=64, cu_seqlens=None):
    """Gated delta rule over a whole sequence, chunked.

    Args:
        q, k: [B, T, Hk, Dk]. v: [B, T, Hv, Dv], Hv a multiple of Hk (key head i serves value
            heads i·r … i·r+r−1). g: log decay ≤ 0, [B, T, Hv]. beta: [B, T, Hv].
        initial_state: [B, Hv, Dk, Dv] or None (zeros).
        use_qk_l2norm: L2-normalise q and k (eps 1e-6, float32) before the Dk^-½ scale.
        chunk_size: one of 16, 32, 64, 128; T need not be a multiple of it.
        cu_seqlens: None, or packed documents (int [N+1], 0 … T, flash-linear-attention's
            convention, all rows): the state is zero entering each document after the first.
            Unlike fla's, initial_state is one state (the first document's) and final_state
            the state after token T−1 (the last document's), not one per document.
    Returns:
        o [B, T, Hv, Dv] in q's dtype, and the float32 final state [B, Hv, Dk, Dv] if asked.
    """
    check_rule_args(q.shape, k.shape, v.shape, g.shape, beta.shape,
                    None if initial_state is None else initial_state.shape, chunk_size)
    B, T, _, Dk = q.shape
    Hv, Dv = v.shape[2:]
    doc_starts_T = None
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, seq_len=T)
        doc_starts_T = document_starts(cu_seqlens, sequence_positions(T, q.device))
    if T == 0:
        h = initial_state_or_zeros(initial_state, B, Hv, Dk, Dv, q.device)
        return v.new_zeros(B, 0, Hv, Dv, dtype=q.dtype), (h if output_final_state else None)
    terms = prepare_chunks(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm, chunk_size=chunk_size,
                           doc_starts_T=doc_starts_T)
    h0 = initial_state_or_zeros(initial_state, B, Hv, Dk, Dv, q.device)
    states_NBHKV, final_BHKV = scan_chunk_states(terms.A_NBHKK, terms.b_NBHKV, h0)
    o = chunk_outputs(terms, states_NBHKV).to(q.dtype)
    return o, (final_BHKV if output_final_state else None)
