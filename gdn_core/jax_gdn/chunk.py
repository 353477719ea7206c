"""Chunked gated delta rule in JAX, written as an affine scan over chunks (see torch_gdn.chunk).

    S_{n+1} = A_n S_n + b_n,   A_n = e^{G_C} I − k̃ᵀ w,   b_n = k̃ᵀ u,
    w = T (β k e^{G}),  u = T (β v),  k̃ = k e^{G_C − G},  T = (I + L)⁻¹.

T is built blockwise (`unit_lower_inverse`, the shape of flash-linear-attention's solve_tril):
forward substitution inside 16×16 diagonal blocks, then merges 16→32→…→C with
inv([[A, 0], [C, B]]) = [[A⁻¹, 0], [−B⁻¹ C A⁻¹, B⁻¹]]. It is exact to fp32 round-off for any
L the rule produces (β ≤ 1, |k| = 1), keys sharing a direction included, where the product form
(I − L)(I + L²)(I + L⁴)… needs terms near 1e17 to cancel. No LAPACK call: the project's CPU hosts
hang on `jax.scipy.linalg.solve_triangular` inside jit once the batch of blocks is large.
Only S_{n+1} = A_n S_n + b_n runs sequentially (lax.scan); everything else is batched.

Precision. float32 inputs: every matmul is float32 at HIGHEST precision (no bf16 passes or TF32
on TPU/GPU). bfloat16 (or float16) inputs: the chunk-local matmuls that only feed the output —
q kᵀ, q̃ S and attn (u − w S) — take bf16 operands with float32 accumulation
(preferred_element_type); βKKᵀ, T, w, u, the (A, b) pairs, their composition and the state S
stay float32 (in bf16 they bring the correlated-key failure back). Tolerances against the
float32 rule on the same bf16-rounded inputs, keys at cosine up to 0.97 (relative Frobenius;
tests/gdn_core/test_correlated_keys.py): output and every input gradient ≤ 2e-2 (measured
≤ 9e-3: bf16 operands of the output matmuls, bf16 results), final state ≤ 1e-5 (float32 math
on both sides; measured equal).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ..shapes import check_rule_args
from .documents import check_cu_seqlens, document_starts
from .naive import HIGHEST, l2norm


class ChunkTerms(NamedTuple):
    """Chunk-local terms of the rule (chunk axis leading: [N, B, H, ...]); float32 except
    q_NBHCK and attn_NBHCC, which are in compute_dtype of the inputs (output-only work)."""

    q_NBHCK: jax.Array  # q · Dk^-½ · e^{G}
    attn_NBHCC: jax.Array  # (q kᵀ) ⊙ e^{G_i−G_j}, causal incl. diagonal
    w_NBHCK: jax.Array
    u_NBHCV: jax.Array
    A_NBHKK: jax.Array
    b_NBHKV: jax.Array


def mm(a, b):
    """float32 matmul at HIGHEST precision (the state chain and everything feeding it)."""
    return jnp.matmul(a, b, precision=HIGHEST)


def local_mm(a, b):
    """Matmul of output-only chunk work: HIGHEST in float32, else low-precision operands with
    float32 accumulation (the way MaxText / torchtitan run bf16 training)."""
    if a.dtype == jnp.float32 and b.dtype == jnp.float32:
        return mm(a, b)
    return jnp.matmul(a, b, preferred_element_type=jnp.float32)


def compute_dtype(dtype):
    """Operand dtype of the output-only matmuls for inputs of `dtype` (see the module doc)."""
    return dtype if dtype in (jnp.bfloat16, jnp.float16) else jnp.float32


def strictly_lower(x_CC):
    """x with its diagonal and everything above set to 0 (last two dims)."""
    C = x_CC.shape[-1]
    return jnp.where(jnp.tril(jnp.ones((C, C), dtype=bool), -1), x_CC, 0.0)


SUBSTITUTION_BLOCK = 16
"""Side of the diagonal blocks solved by forward substitution before the blockwise merges."""


def _diagonal_block_inverses(L_MCC, block: int):
    """(I + L_d)⁻¹ of each block×block diagonal block by forward substitution: [..., C/block, b, b].

    Row i of T = I − L T is e_i − L_i,: T; rows above i are final and rows below are still e_j,
    which the strictly-lower row L_i,: does not read.
    """
    m = L_MCC.shape[-1] // block
    lead = L_MCC.shape[:-2]
    L_Mmbmb = L_MCC.reshape(*lead, m, block, m, block)
    L_Mmbb = jnp.diagonal(L_Mmbmb, axis1=-4, axis2=-2)  # [..., b, b, m]
    L_Mmbb = jnp.moveaxis(L_Mmbb, -1, -3)
    eye_bb = jnp.eye(block, dtype=L_MCC.dtype)

    def substitute_row(i, T_Mmbb):
        L_row_Mmb = jax.lax.dynamic_index_in_dim(L_Mmbb, i, axis=-2, keepdims=True)
        eye_row = jax.lax.dynamic_index_in_dim(eye_bb, i, axis=0, keepdims=True)
        T_row = eye_row - mm(L_row_Mmb, T_Mmbb)
        return jax.lax.dynamic_update_index_in_dim(T_Mmbb, T_row, i, axis=-2)

    # Built from L (not broadcast) so that under shard_map the carry varies over the same axes.
    T0_Mmbb = eye_bb + jnp.zeros_like(L_Mmbb)
    return jax.lax.fori_loop(1, block, substitute_row, T0_Mmbb)


def _merge_block_pairs(T_Mmss, L_MCC):
    """Inverses of 2s×2s diagonal blocks from those of s×s: [[A⁻¹,0],[−B⁻¹ C A⁻¹, B⁻¹]]."""
    *lead, m, s, _ = T_Mmss.shape
    L_Mmsms = L_MCC.reshape(*lead, m, s, m, s)
    # Block (2p+1, 2p) of L, for every pair p: the sub-diagonal of the block grid, every other.
    C_Mqss = jnp.moveaxis(jnp.diagonal(L_Mmsms, offset=-1, axis1=-4, axis2=-2), -1, -3)
    C_Mpss = C_Mqss[..., ::2, :, :]
    Ainv_Mpss, Binv_Mpss = T_Mmss[..., 0::2, :, :], T_Mmss[..., 1::2, :, :]
    lower_Mpss = -mm(mm(Binv_Mpss, C_Mpss), Ainv_Mpss)
    top = jnp.concatenate([Ainv_Mpss, jnp.zeros_like(Ainv_Mpss)], axis=-1)
    bottom = jnp.concatenate([lower_Mpss, Binv_Mpss], axis=-1)
    return jnp.concatenate([top, bottom], axis=-2)


@jax.custom_vjp
def unit_lower_inverse(L_CC):
    """(I + L)⁻¹ for the strictly lower part of L [..., C, C], C = 16·2^j; float32.

    Exact to fp32 round-off for the L of the rule: substitution on 16×16 diagonal blocks, then
    log2(C/16) blockwise merges. Backward: dL = −Tᵀ dT Tᵀ, strictly lower (custom VJP: the
    residual is T alone, not the substitution loop's 15 intermediate blocks).
    MACs per C×C block: 240·C (substitution: C/16 blocks × 15 rows × 16·16) + C·(C² − 256)/3
    (merges: C·s² at each s = 16 … C/2); 97,280 at C = 64, 27× fewer than the product form.
    Backward: 2·C³.
    """
    C = L_CC.shape[-1]
    L_CC = strictly_lower(L_CC)
    T = _diagonal_block_inverses(L_CC, min(SUBSTITUTION_BLOCK, C))
    while T.shape[-1] < C:
        T = _merge_block_pairs(T, L_CC)
    return T[..., 0, :, :]


def _inverse_fwd(L_CC):
    T_CC = unit_lower_inverse(L_CC)
    return T_CC, T_CC


def _inverse_bwd(T_CC, dT_CC):
    Tt_CC = jnp.swapaxes(T_CC, -1, -2)
    return (strictly_lower(-mm(mm(Tt_CC, dT_CC), Tt_CC)),)


unit_lower_inverse.defvjp(_inverse_fwd, _inverse_bwd)


def document_segments(doc_starts_BT, N: int, C: int):
    """Segment masks of the chunks (torch_gdn.chunk.DocumentSegments): doc_starts_BT bool
    [B', T] (B' = 1 or B) → (same [N,B',1,C,C], first [N,B',1,C], last [N,B',1,C],
    whole [N,B',1,1,1]); segment 0 of a chunk: the tokens before its first document start."""
    Bs, T = doc_starts_BT.shape
    starts_BNC = jnp.pad(doc_starts_BT.astype(bool), ((0, 0), (0, N * C - T))).reshape(Bs, N, C)
    starts_NBC = jnp.swapaxes(starts_BNC, 0, 1)[:, :, None]  # [N, B', 1, C]
    seg_NBC = jnp.cumsum(starts_NBC.astype(jnp.int32), axis=-1)
    return (seg_NBC[..., :, None] == seg_NBC[..., None, :], seg_NBC == 0,
            seg_NBC == seg_NBC[..., -1:], ~jnp.any(starts_NBC, axis=-1)[..., None, None])


def prepare_chunks(q, k, v, g, beta, *, use_qk_l2norm=False, chunk_size=64,
                   doc_starts_BT=None) -> ChunkTerms:
    """Compute every chunk-local term of the rule. Shapes as in chunk_gated_delta_rule.

    Everything is float32 except q_NBHCK and attn_NBHCC, which are in compute_dtype(q.dtype):
    they only feed the output matmuls (see the module doc). doc_starts_BT (bool [1 or B, T];
    packed documents): the tokens whose entering state is zero, handled exactly by segment
    masks as in torch_gdn.chunk (G restarts at each start; decay and L zero across segments;
    the incoming state reaches only a chunk's first segment; b from its last; A = 0 when the
    chunk holds a start).
    """
    B, T, Hk, Hv, Dk, Dv = check_rule_args(
        q.shape, k.shape, v.shape, g.shape, beta.shape, None, chunk_size)
    C, r, low = chunk_size, Hv // Hk, compute_dtype(q.dtype)
    q, k = q.astype(jnp.float32), k.astype(jnp.float32)
    if r > 1:
        q, k = jnp.repeat(q, r, axis=2), jnp.repeat(k, r, axis=2)
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = q * Dk ** -0.5
    pad = (-T) % C
    N = (T + pad) // C

    def chunked(x):  # [B, T, H, D] -> [N, B, H, C, D]
        x = jnp.pad(x.astype(jnp.float32), ((0, 0), (0, pad), (0, 0), (0, 0)))
        return x.reshape(B, N, C, Hv, x.shape[-1]).transpose(1, 0, 3, 2, 4)

    q_NBHCK, k_NBHCK, v_NBHCV = chunked(q), chunked(k), chunked(v)
    g_NBHC, beta_NBHC = (chunked(x[..., None])[..., 0] for x in (g, beta))
    causal_CC = jnp.tril(jnp.ones((C, C), dtype=bool))
    if doc_starts_BT is None:
        G_NBHC = jnp.cumsum(g_NBHC, axis=-1)
        visible = causal_CC
    else:  # G restarts at every document start: sums run only over the token's own document
        same, first, last, whole = document_segments(doc_starts_BT, N, C)
        visible = causal_CC & same
        G_NBHC = jnp.sum(jnp.where(visible, g_NBHC[..., None, :], 0.0), axis=-1)
    # Mask before exp: above the diagonal G_i − G_j > 0 and would overflow under strong decay.
    diff = G_NBHC[..., :, None] - G_NBHC[..., None, :]
    decay_NBHCC = jnp.where(visible, jnp.exp(jnp.where(visible, diff, 0.0)), 0.0)

    kbeta_NBHCK = k_NBHCK * beta_NBHC[..., None]
    L_NBHCC = mm(kbeta_NBHCK, jnp.swapaxes(k_NBHCK, -1, -2)) * decay_NBHCC  # read strictly lower
    T_NBHCC = unit_lower_inverse(L_NBHCC)
    u_NBHCV = mm(T_NBHCC, v_NBHCV * beta_NBHC[..., None])
    # The incoming state reaches only the chunk's first segment (the document it continues).
    state_decay_NBHC = jnp.exp(G_NBHC)
    if doc_starts_BT is not None:
        state_decay_NBHC = jnp.where(first, state_decay_NBHC, 0.0)
    w_NBHCK = mm(T_NBHCC, kbeta_NBHCK * state_decay_NBHC[..., None])

    G_last_NBH = G_NBHC[..., -1]
    to_end_NBHC = G_last_NBH[..., None] - G_NBHC
    if doc_starts_BT is not None:  # only the last segment reaches the state leaving the chunk
        to_end_NBHC = jnp.where(last, to_end_NBHC, -jnp.inf)
    kdecT_NBHKC = jnp.swapaxes(k_NBHCK * jnp.exp(to_end_NBHC)[..., None], -1, -2)
    A_NBHKK = (jnp.exp(G_last_NBH)[..., None, None] * jnp.eye(Dk, dtype=jnp.float32)
               - mm(kdecT_NBHKC, w_NBHCK))
    if doc_starts_BT is not None:  # a chunk holding a document start forgets the entering state
        A_NBHKK = jnp.where(whole, A_NBHKK, 0.0)
    b_NBHKV = mm(kdecT_NBHKC, u_NBHCV)
    qk_NBHCC = local_mm(q_NBHCK.astype(low), jnp.swapaxes(k_NBHCK, -1, -2).astype(low))
    attn_NBHCC = (qk_NBHCC * decay_NBHCC).astype(low)
    q_tilde_NBHCK = (q_NBHCK * state_decay_NBHC[..., None]).astype(low)
    return ChunkTerms(q_tilde_NBHCK, attn_NBHCC, w_NBHCK, u_NBHCV, A_NBHKK, b_NBHKV)


def reverse_state_scan(A_NBHKK, states_NBHKV, d_states_NBHKV, d_last_BHKV, *,
                       with_pairs: bool = True):
    """Backward of S_{n+1} = A_n S_n + b_n given cotangents of every S_n and of S_N.

    μ_N = d_last; μ_n = d_states_n + A_nᵀ μ_{n+1}; ∂A_n = μ_{n+1} S_nᵀ, ∂b_n = μ_{n+1}.
    Returns μ_0 (∂L/∂S_0) and, if with_pairs, (∂A [N,B,H,K,K], ∂b [N,B,H,K,V]).
    """
    def step(mu_BHKV, xs):
        A_BHKK, S_BHKV, dS_BHKV = xs
        grads = (mm(mu_BHKV, jnp.swapaxes(S_BHKV, -1, -2)), mu_BHKV) if with_pairs else None
        return dS_BHKV + mm(jnp.swapaxes(A_BHKK, -1, -2), mu_BHKV), grads

    mu0_BHKV, grads = jax.lax.scan(step, d_last_BHKV, (A_NBHKK, states_NBHKV, d_states_NBHKV),
                                   reverse=True)
    return mu0_BHKV, grads


def _forward_state_scan(A_NBHKK, b_NBHKV, h0_BHKV):
    def step(h_BHKV, pair):
        A_BHKK, b_BHKV = pair
        return mm(A_BHKK, h_BHKV) + b_BHKV, h_BHKV

    final_BHKV, states_NBHKV = jax.lax.scan(step, h0_BHKV, (A_NBHKK, b_NBHKV))
    return states_NBHKV, final_BHKV


@jax.custom_vjp
def scan_chunk_states(A_NBHKK, b_NBHKV, h0_BHKV):
    """S_0 = h0, S_{n+1} = A_n S_n + b_n. Returns (S_n entering each chunk [N,B,H,K,V], S_N).

    The backward is written out (reverse_state_scan): its residuals are A_n and the states this
    scan returns anyway, where autodiff of the scan keeps its own copies.
    """
    return _forward_state_scan(A_NBHKK, b_NBHKV, h0_BHKV)


def _scan_fwd(A_NBHKK, b_NBHKV, h0_BHKV):
    states_NBHKV, final_BHKV = _forward_state_scan(A_NBHKK, b_NBHKV, h0_BHKV)
    return (states_NBHKV, final_BHKV), (A_NBHKK, states_NBHKV)


def _scan_bwd(residuals, cotangents):
    A_NBHKK, states_NBHKV = residuals
    d_states_NBHKV, d_final_BHKV = cotangents
    dh0_BHKV, (dA_NBHKK, db_NBHKV) = reverse_state_scan(A_NBHKK, states_NBHKV, d_states_NBHKV,
                                                         d_final_BHKV)
    return dA_NBHKK, db_NBHKV, dh0_BHKV


scan_chunk_states.defvjp(_scan_fwd, _scan_bwd)


def compose_affine(A_first, b_first, A_then, b_then):
    """The map 'apply (A_first, b_first), then (A_then, b_then)'."""
    return mm(A_then, A_first), mm(A_then, b_first) + b_then


def fold_chunk_pairs(A_NBHKK, b_NBHKV):
    """Compose all chunks into one affine map h ↦ A h + b, by a sequential scan.

    The body is checkpointed so the backward recomputes each running product rather than
    keeping a K×K product per chunk beyond the carried pair.
    """
    @jax.checkpoint
    def step(carry, pair):
        return compose_affine(*carry, *pair), None

    (A_BHKK, b_BHKV), _ = jax.lax.scan(step, (A_NBHKK[0], b_NBHKV[0]), (A_NBHKK[1:], b_NBHKV[1:]))
    return A_BHKK, b_BHKV


def chunk_outputs(terms: ChunkTerms, states_NBHKV, seq_len: int):
    """o = q̃ S_n + attn (u − w S_n) for every chunk at once; returns float32 [B, T, H, V].

    u − w S_n is float32; the two output matmuls run in the dtype of q̃ and attn.
    """
    low = terms.q_NBHCK.dtype
    v_new_NBHCV = terms.u_NBHCV - mm(terms.w_NBHCK, states_NBHKV)
    o_NBHCV = (local_mm(terms.q_NBHCK, states_NBHKV.astype(low))
               + local_mm(terms.attn_NBHCC, v_new_NBHCV.astype(low)))
    N, B, H, C, V = o_NBHCV.shape
    return o_NBHCV.transpose(1, 0, 3, 2, 4).reshape(B, N * C, H, V)[:, :seq_len]


def initial_state_or_zeros(initial_state, B, H, K, V):
    if initial_state is None:
        return jnp.zeros((B, H, K, V), jnp.float32)
    return initial_state.astype(jnp.float32)


def chunk_gated_delta_rule(q, k, v, g, beta, *, initial_state=None, output_final_state=False,
                           use_qk_l2norm=False, chunk_size=64, cu_seqlens=None):
    """Gated delta rule over a whole sequence, chunked; jit- and grad-able.

    Args:
        q, k: [B, T, Hk, Dk]. v: [B, T, Hv, Dv], Hv a multiple of Hk (key head i serves value
            heads i·r … i·r+r−1). g: log decay ≤ 0, [B, T, Hv]. beta: [B, T, Hv].
        initial_state: [B, Hv, Dk, Dv] or None (zeros).
        use_qk_l2norm: L2-normalise q and k (eps 1e-6, float32) before the Dk^-½ scale.
        chunk_size: one of 16, 32, 64, 128; T need not be a multiple of it.
        cu_seqlens: None, or packed documents (int [N+1], 0 … T, all rows; may be traced), as in
            torch_gdn.chunk_gated_delta_rule: the state is zero entering each document after
            the first; initial_state is the first document's, final_state the last's.
    Returns:
        o [B, T, Hv, Dv] in q's dtype, and the float32 final state [B, Hv, Dk, Dv] if asked.
    """
    B, T, _, _, Dk, Dv = check_rule_args(
        q.shape, k.shape, v.shape, g.shape, beta.shape,
        None if initial_state is None else initial_state.shape, chunk_size)
    doc_starts_BT = None
    if cu_seqlens is not None:
        check_cu_seqlens(cu_seqlens, seq_len=T)
        doc_starts_BT = document_starts(cu_seqlens, jnp.arange(T))[None]
    Hv = v.shape[2]
    h0 = initial_state_or_zeros(initial_state, B, Hv, Dk, Dv)
    if T == 0:
        return jnp.zeros((B, 0, Hv, Dv), q.dtype), (h0 if output_final_state else None)
    terms = prepare_chunks(q, k, v, g, beta, use_qk_l2norm=use_qk_l2norm, chunk_size=chunk_size,
                           doc_starts_BT=doc_starts_BT)
    states_NBHKV, final_BHKV = scan_chunk_states(terms.A_NBHKK, terms.b_NBHKV, h0)
    o = chunk_outputs(terms, states_NBHKV, T).astype(q.dtype)
    return o, (final_BHKV if output_final_state else None)
