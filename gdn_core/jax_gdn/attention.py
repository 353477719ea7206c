"""Functional gated full attention (transformers' Qwen3_5Attention math, as torch_gdn.attention).

    x ─┬─ q_proj ─ per head [query | gate] ─ query: q_norm ─ rotary ─┐
       ├─ k_proj ─ k_norm ─ rotary ─────────────────────────────────┤ causal GQA softmax → o
       └─ v_proj ───────────────────────────────────────────────────┘
    o · sigmoid(gate) ─ o_proj

project → attend → output, so that context parallelism swaps `attend` (the only step that
mixes tokens) and nothing else. Rotary angles come from the tokens' global positions, which a
sequence shard passes in (gdn_core.cp_layout). `causal_attention` is blockwise (flash
attention): query tiles × key tiles of at most ATTENTION_BLOCK tokens, an online softmax with
float32 statistics, tiles no query sees skipped, and a custom VJP that recomputes each tile's
probabilities from the saved log-sum-exp — score temporaries are [B, G, r, b, c] and
nothing grows with T². The CP modes (cp/attention.py) run the same tile loops (merge_keys,
add_key_grads) on each chip's queries against each key block.
Packed documents (`cu_seqlens`, gdn_core.attention_documents): each query also carries the
first position of its document (document_starts, traced from the global cu_seqlens and the
tokens' global positions) and sees key j only where start ≤ k_pos[j] ≤ q_pos; a tile whose
keys all lie before its queries' earliest document start is skipped like a future one. Rotary
positions stay global (the packed sequence's), as the published packed training does.
Params (torch/HF layout): q_proj {"weight": [2·H·E, D]}, k_proj, v_proj {"weight": [G·E, D]},
o_proj {"weight": [D, H·E]} (each with "bias" when attention_bias), q_norm, k_norm
{"weight": [E]} (zero-centred: the scale is 1 + weight).
Legend: B batch, T tokens (S keys), D hidden, H query heads, G key/value heads, r = H/G,
E head_dim, R rotated channels, X = H·E, n tiles, b query and c key tokens of a tile.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ..config import AttentionConfig
from .linear import linear, precision
from .params import Params

MASKED = -1e30
"""Score of a masked (future) key: finite, so a row with no key yet gives 0 weights, not NaN."""


def zero_centered_rms_norm(weight, x, eps: float):
    """x · rsqrt(mean(x²) + eps) · (1 + weight) over the last dim, in float32, returned in x's
    dtype (transformers' Qwen3_5RMSNorm: the weight is stored centred on zero)."""
    x32 = x.astype(jnp.float32)
    y = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return (y * (1.0 + weight.astype(jnp.float32))).astype(x.dtype)


def rotary_cos_sin(positions, cfg: AttentionConfig):
    """(cos, sin) [T, R] float32 for integer positions [T]: frequencies θ^(−2i/R), each used
    twice (rotate-half layout), as transformers' default rotary."""
    R = cfg.rotary_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, R, 2, dtype=jnp.float32) / R))
    freqs = jnp.asarray(positions).astype(jnp.float32)[:, None] * inv_freq
    angles = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rotary(x_BTHE, cos_TR, sin_TR):
    """Rotate the first R channels of each head of x [B, T, heads, E]; the rest pass through.
    cos/sin are cast to x's dtype first (as transformers does)."""
    R = cos_TR.shape[-1]
    cos, sin = (c.astype(x_BTHE.dtype)[:, None, :] for c in (cos_TR, sin_TR))
    rot, rest = x_BTHE[..., :R], x_BTHE[..., R:]
    rotated = jnp.concatenate([-rot[..., R // 2:], rot[..., :R // 2]], axis=-1)
    return jnp.concatenate([rot * cos + rotated * sin, rest], axis=-1)


def _linear(params: Params, x):
    y = linear(x, params["weight"])
    return y + params["bias"].astype(y.dtype) if "bias" in params else y


def project(params: Params, x_BTD, cos_TR, sin_TR, cfg: AttentionConfig, eps: float):
    """q [B, T, H, E], k, v [B, T, G, E] (q, k normed and rotated), gate logits [B, T, X]."""
    B, T, _ = x_BTD.shape
    E = cfg.head_dim
    qg_BTH2E = _linear(params["q_proj"], x_BTD).reshape(B, T, -1, 2 * E)
    q_BTHE, gate_BTHE = qg_BTH2E[..., :E], qg_BTH2E[..., E:]
    k_BTGE = _linear(params["k_proj"], x_BTD).reshape(B, T, -1, E)
    v_BTGE = _linear(params["v_proj"], x_BTD).reshape(B, T, -1, E)
    q_BTHE = apply_rotary(zero_centered_rms_norm(params["q_norm"]["weight"], q_BTHE, eps),
                          cos_TR, sin_TR)
    k_BTGE = apply_rotary(zero_centered_rms_norm(params["k_norm"]["weight"], k_BTGE, eps),
                          cos_TR, sin_TR)
    return q_BTHE, k_BTGE, v_BTGE, gate_BTHE.reshape(B, T, -1)


def output(params: Params, o_BTHE, gate_BTX):
    """o · sigmoid(gate), then o_proj: [B, T, D] in o's dtype."""
    B, T = o_BTHE.shape[:2]
    return _linear(params["o_proj"], o_BTHE.reshape(B, T, -1) * jax.nn.sigmoid(gate_BTX))


# ---- blockwise (flash) attention: fixed tiles, online softmax, probabilities recomputed ----

ATTENTION_BLOCK = 512
"""Largest tile edge, in query and in key tokens: score temporaries are [B, G, r, 512, 512]
float32 whatever the sequence length (tile_size: min with the length)."""

NO_KEY, ALL_KEYS, SOME_KEYS = range(3)
"""What the queries of a tile see of its keys (`_visibility`): the lax.switch branch index."""

PAST_EVERY_QUERY = np.iinfo(np.int32).max
"""Position of a padding key: no query sees it."""


def tile_size(length: int, block: int = ATTENTION_BLOCK) -> int:
    """Tile edge ≤ block cutting `length` tokens into the fewest tiles, padded least (a length
    ≤ block is one tile; 1000 at 512 is two of 500)."""
    tiles = -(-length // block)
    return -(-length // tiles)


def tile_loop(count: int, body, init):
    """body(i, carry) for i = 0 … count − 1, as a while loop. Not lax.fori_loop: with a static
    count that is a scan, and under an enclosing scan's autodiff (the decoder's layer scan) a
    scan in the backward is split into what depends on the residuals alone and what on the
    cotangent, the first stacking every tile's probabilities and mask as [tiles, …, c, c]
    buffers: the T² memory the tiles are there to avoid. A while loop is not split."""
    def step(state):
        i, carry = state
        return i + 1, body(i, carry)

    return lax.while_loop(lambda state: state[0] < count, step, (jnp.int32(0), init))[1]


def _pad(x, axis: int, size: int, value=0):
    """x padded with `value` at the end of `axis` to `size`."""
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def _tiled_length(length: int, tile: int) -> int:
    return -(-length // tile) * tile


def query_tiles(x_BTHE, G: int, tile: int):
    """[B, T, H, E] → [n, B, G, r, b, E]: n tiles of b = tile queries (T padded with zeros),
    grouped by KV head."""
    B, T, H, E = x_BTHE.shape
    x = _pad(x_BTHE, 1, _tiled_length(T, tile))
    return jnp.transpose(x.reshape(B, -1, tile, G, H // G, E), (1, 0, 3, 4, 2, 5))


def from_query_tiles(x_nBGrbE, T: int):
    """query_tiles undone: [B, T, H, E]."""
    n, B, G, r, b, E = x_nBGrbE.shape
    return jnp.transpose(x_nBGrbE, (1, 0, 4, 2, 3, 5)).reshape(B, n * b, G * r, E)[:, :T]


def query_position_tiles(pos_T, tile: int):
    """[T] → [n, b] int32; padding queries take the last query's position, so they see keys
    and their statistics stay finite (their do is 0: they add no gradient)."""
    pos = jnp.asarray(pos_T).astype(jnp.int32)
    return _pad(pos, 0, _tiled_length(pos.shape[0], tile), pos[-1]).reshape(-1, tile)


def _padded_keys(tile: int, k_pos_S, *xs_BSGE):
    """Keys (and arrays laid out as keys) padded to whole tiles; padding keys sit past every
    query."""
    size = _tiled_length(k_pos_S.shape[0], tile)
    pos = _pad(jnp.asarray(k_pos_S).astype(jnp.int32), 0, size, PAST_EVERY_QUERY)
    return (pos,) + tuple(_pad(x, 1, size) for x in xs_BSGE)


def _key_tile(j, tile: int, *xs, axis: int = 1):
    return tuple(lax.dynamic_slice_in_dim(x, j * tile, tile, axis=axis) for x in xs)


def document_starts(cu_seqlens, positions):
    """The first position of each position's document, int32 like positions: cu[doc(p)],
    doc(p) = max{i : cu_i ≤ p} (gdn_core.attention_documents), from the global cu_seqlens
    (int [N+1], traced or not) and global positions (traced or not)."""
    cu = jnp.asarray(cu_seqlens).astype(jnp.int32)
    pos = jnp.asarray(positions).astype(jnp.int32)
    return cu[jnp.searchsorted(cu, pos, side="right") - 1]


def _visibility(q_pos, k_pos, q_start=None):
    """NO_KEY when every key comes after every query, or (q_start, packed documents: each
    query's document start) every key lies before the earliest document start of the tile's
    queries — its documents all ended before theirs began (the tile is skipped); ALL_KEYS when
    every query sees every key (no mask), else SOME_KEYS (masked) — int32, from the
    positions' extremes, so right for any position sets."""
    skip = k_pos.min() > q_pos.max()
    whole = k_pos.max() <= q_pos.min()
    if q_start is not None:
        skip = skip | (k_pos.max() < q_start.min())
        whole = whole & (k_pos.min() >= q_start.max())
    return jnp.where(skip, NO_KEY, jnp.where(whole, ALL_KEYS, SOME_KEYS)).astype(jnp.int32)


def _scores(q_BGrbE, k_BcGE, q_pos, k_pos, q_start=None):
    """Scaled scores [B, G, r, b, c] in float32 and the mask [b, c]; q_pos None: no mask;
    q_start (each query's document start): keys before it masked too."""
    E = q_BGrbE.shape[-1]
    s = jnp.einsum("bgrqe,bsge->bgrqs", q_BGrbE, k_BcGE, precision=precision(q_BGrbE.dtype),
                   preferred_element_type=jnp.float32) * E ** -0.5
    if q_pos is None:
        return s, None
    mask_bc = k_pos[None, :] <= q_pos[:, None]
    if q_start is not None:
        mask_bc = mask_bc & (k_pos[None, :] >= q_start[:, None])
    return jnp.where(mask_bc, s, MASKED), mask_bc


def _merge_tile(stats, q_BGrbE, k_BcGE, v_BcGE, q_pos, k_pos, q_start=None):
    """Online softmax: fold one key tile into a query tile's (max m, sum l, weighted sum acc),
    float32. q_pos, k_pos None: every query sees every key."""
    m_BGrb, l_BGrb, acc_BGrbE = stats
    s, mask = _scores(q_BGrbE, k_BcGE, q_pos, k_pos, q_start)
    m_new = jnp.maximum(m_BGrb, s.max(-1))
    alpha = jnp.exp(m_BGrb - m_new)
    p = jnp.exp(s - m_new[..., None])
    if mask is not None:
        p = jnp.where(mask, p, 0.0)
    pv = jnp.einsum("bgrqs,bsge->bgrqe", p.astype(v_BcGE.dtype), v_BcGE,
                    precision=precision(v_BcGE.dtype), preferred_element_type=jnp.float32)
    return m_new, alpha * l_BGrb + p.sum(-1), alpha[..., None] * acc_BGrbE + pv


def _tile_grads(q_BGrbE, k_BcGE, v_BcGE, do_BGrbE, lse_BGrb, delta_BGrb, q_pos, k_pos,
                q_start=None):
    """One tile's (dq [B, G, r, b, E], dk, dv [B, c, G, E]) in float32, probabilities
    recomputed from the log-sum-exp; q_pos, k_pos None: every query sees every key."""
    E = q_BGrbE.shape[-1]
    s, mask = _scores(q_BGrbE, k_BcGE, q_pos, k_pos, q_start)
    p = jnp.exp(s - lse_BGrb[..., None])
    if mask is not None:
        p = jnp.where(mask, p, 0.0)
    hi = precision(q_BGrbE.dtype)
    dv = jnp.einsum("bgrqs,bgrqe->bsge", p.astype(do_BGrbE.dtype), do_BGrbE, precision=hi,
                    preferred_element_type=jnp.float32)
    dp = jnp.einsum("bgrqe,bsge->bgrqs", do_BGrbE, v_BcGE, precision=hi,
                    preferred_element_type=jnp.float32)
    ds = (p * (dp - delta_BGrb[..., None]) * E ** -0.5).astype(q_BGrbE.dtype)
    dq = jnp.einsum("bgrqs,bsge->bgrqe", ds, k_BcGE, precision=hi,
                    preferred_element_type=jnp.float32)
    dk = jnp.einsum("bgrqs,bgrqe->bsge", ds, q_BGrbE, precision=hi,
                    preferred_element_type=jnp.float32)
    return dq, dk, dv


def _add_tile_grads(grads, *args):
    return tuple(acc + g for acc, g in zip(grads, _tile_grads(*args)))


def empty_stats(q_nBGrbE):
    """Online-softmax statistics of query tiles before any key: (m, l [n, B, G, r, b],
    acc [n, B, G, r, b, E]), float32."""
    shape = q_nBGrbE.shape[:-1]
    return (jnp.full(shape, MASKED, jnp.float32), jnp.zeros(shape, jnp.float32),
            jnp.zeros(q_nBGrbE.shape, jnp.float32))


def finish(stats, dtype, empty_rows: bool = False):
    """(o tiles [n, B, G, r, b, E] in dtype, log-sum-exp [n, B, G, r, b] float32).
    empty_rows: queries may have seen no key (a segment pair under packed documents): theirs
    are o 0 and log-sum-exp MASKED, which a merge by log-sum-exp weighs 0."""
    m, l, acc = stats
    if not empty_rows:
        return (acc / l[..., None]).astype(dtype), m + jnp.log(l)
    seen = l > 0
    safe_l = jnp.where(seen, l, 1.0)
    return ((acc / safe_l[..., None]).astype(dtype),
            jnp.where(seen, m + jnp.log(safe_l), MASKED))


def tile_delta(o_nBGrbE, do_nBGrbE):
    """rowsum(o · do) per query, float32 [n, B, G, r, b]."""
    return jnp.sum(o_nBGrbE.astype(jnp.float32) * do_nBGrbE.astype(jnp.float32), axis=-1)


def merge_keys(stats, q_nBGrbE, q_pos_nb, k_BSGE, v_BSGE, k_pos_S, key_tile: int,
               q_start_nb=None):
    """Fold keys k, v [B, S, G, E] at positions k_pos [S] into the statistics of query tiles
    q [n, B, G, r, b, E] at positions [n, b]: a loop over query tiles, in it a loop over key
    tiles of key_tile keys whose body (lax.switch: only the taken branch runs) skips a tile
    no query sees, leaves the mask out of one wholly seen and masks the rest. q_start_nb
    [n, b]: the queries' document starts (packed documents), or None."""
    k_pos, k, v = _padded_keys(key_tile, k_pos_S, k_BSGE, v_BSGE)

    def per_query_tile(i, stats):
        q, q_pos = q_nBGrbE[i], q_pos_nb[i]
        q_start = None if q_start_nb is None else q_start_nb[i]

        def per_key_tile(j, st):
            kp, = _key_tile(j, key_tile, k_pos, axis=0)
            kt, vt = _key_tile(j, key_tile, k, v)
            return lax.switch(_visibility(q_pos, kp, q_start), (
                lambda st, *_: st,
                lambda st, q, kt, vt, *_: _merge_tile(st, q, kt, vt, None, None),
                lambda *args: _merge_tile(*args)), st, q, kt, vt, q_pos, kp, q_start)

        st = tile_loop(k.shape[1] // key_tile, per_key_tile, tuple(x[i] for x in stats))
        return tuple(lax.dynamic_update_index_in_dim(x, y, i, 0) for x, y in zip(stats, st))

    return tile_loop(q_nBGrbE.shape[0], per_query_tile, tuple(stats))


def add_key_grads(grads, q_nBGrbE, do_nBGrbE, lse_nBGrb, delta_nBGrb, q_pos_nb, k_BSGE,
                  v_BSGE, k_pos_S, key_tile: int, q_start_nb=None):
    """grads = (dq [n, B, G, r, b, E], dk, dv [B, S, G, E]), float32, plus the gradients of
    these keys' attention, tile by tile as merge_keys (invisible tiles skipped)."""
    dq_n, dk_BSGE, dv_BSGE = grads
    S = k_BSGE.shape[1]
    k_pos, k, v, dk, dv = _padded_keys(key_tile, k_pos_S, k_BSGE, v_BSGE, dk_BSGE, dv_BSGE)
    per_query = (q_nBGrbE, do_nBGrbE, lse_nBGrb, delta_nBGrb, q_pos_nb)

    def per_query_tile(i, grads):
        dq_n, dk, dv = grads
        q, do, lse, delta, q_pos = (x[i] for x in per_query)
        q_start = None if q_start_nb is None else q_start_nb[i]

        def per_key_tile(j, acc):
            dq, dk, dv = acc
            kp, = _key_tile(j, key_tile, k_pos, axis=0)
            kt, vt, dkt, dvt = _key_tile(j, key_tile, k, v, dk, dv)
            dq, dkt, dvt = lax.switch(_visibility(q_pos, kp, q_start), (
                lambda g, *_: g,
                lambda g, q, kt, vt, do, lse, delta, *_: _add_tile_grads(
                    g, q, kt, vt, do, lse, delta, None, None),
                lambda *args: _add_tile_grads(*args)),
                (dq, dkt, dvt), q, kt, vt, do, lse, delta, q_pos, kp, q_start)
            return (dq,) + tuple(lax.dynamic_update_slice_in_dim(x, y, j * key_tile, axis=1)
                                 for x, y in ((dk, dkt), (dv, dvt)))

        dq, dk, dv = tile_loop(k.shape[1] // key_tile, per_key_tile, (dq_n[i], dk, dv))
        return lax.dynamic_update_index_in_dim(dq_n, dq, i, 0), dk, dv

    dq_n, dk, dv = tile_loop(q_nBGrbE.shape[0], per_query_tile, (dq_n, dk, dv))
    return dq_n, dk[:, :S], dv[:, :S]


def causal_attention(q_BTHE, k_BSGE, v_BSGE, q_pos_T=None, k_pos_S=None, *,
                     block: int = ATTENTION_BLOCK, cu_seqlens=None):
    """Softmax attention, query i reading key j where k_pos[j] ≤ q_pos[i] (default: the
    positions 0 … T−1), query head h reading key/value head h // (H/G): o [B, T, H, E] in q's
    dtype. Flash-style, in tiles of tile_size(·, block) queries × keys with float32
    statistics; a custom VJP saves q, k, v, o and the log-sum-exp, and backward recomputes
    each tile's probabilities: no buffer grows with T². cu_seqlens: None (exactly the causal
    attention above), or packed documents (int [N+1], 0 … T, the GLOBAL boundaries, traced or
    not): query i then also needs k_pos[j] ≥ the start of its document (block-diagonal
    causal), and tiles between documents are skipped (_visibility). Positions are global, so
    a CP chip passes its own with the whole cu_seqlens."""
    T, S = q_BTHE.shape[1], k_BSGE.shape[1]
    q_pos_T = jnp.arange(T) if q_pos_T is None else q_pos_T
    k_pos_S = jnp.arange(S) if k_pos_S is None else k_pos_S
    q_pos_T = jnp.asarray(q_pos_T).astype(jnp.int32)
    q_start_T = None if cu_seqlens is None else document_starts(cu_seqlens, q_pos_T)
    return _causal_attention(q_BTHE, k_BSGE, v_BSGE, q_pos_T,
                             jnp.asarray(k_pos_S).astype(jnp.int32), q_start_T,
                             tile_size(T, block), tile_size(S, block))


def _start_tiles(q_start_T, tile: int):
    return None if q_start_T is None else query_position_tiles(q_start_T, tile)


@partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _causal_attention(q_BTHE, k_BSGE, v_BSGE, q_pos_T, k_pos_S, q_start_T, q_tile, k_tile):
    return _causal_attention_fwd(q_BTHE, k_BSGE, v_BSGE, q_pos_T, k_pos_S, q_start_T, q_tile,
                                 k_tile)[0]


def _causal_attention_fwd(q_BTHE, k_BSGE, v_BSGE, q_pos_T, k_pos_S, q_start_T, q_tile, k_tile):
    q_n = query_tiles(q_BTHE, k_BSGE.shape[2], q_tile)
    stats = merge_keys(empty_stats(q_n), q_n, query_position_tiles(q_pos_T, q_tile), k_BSGE,
                       v_BSGE, k_pos_S, k_tile, _start_tiles(q_start_T, q_tile))
    o_n, lse_n = finish(stats, q_BTHE.dtype)
    o_BTHE = from_query_tiles(o_n, q_BTHE.shape[1])
    return o_BTHE, (q_BTHE, k_BSGE, v_BSGE, q_pos_T, k_pos_S, q_start_T, o_BTHE, lse_n)


def _causal_attention_bwd(q_tile, k_tile, residuals, do_BTHE):
    q_BTHE, k_BSGE, v_BSGE, q_pos_T, k_pos_S, q_start_T, o_BTHE, lse_n = residuals
    G = k_BSGE.shape[2]
    q_n, do_n, o_n = (query_tiles(x.astype(q_BTHE.dtype), G, q_tile)
                      for x in (q_BTHE, do_BTHE, o_BTHE))
    zeros_kv = jnp.zeros(k_BSGE.shape, jnp.float32)
    dq_n, dk, dv = add_key_grads((jnp.zeros(q_n.shape, jnp.float32), zeros_kv, zeros_kv), q_n,
                                 do_n, lse_n, tile_delta(o_n, do_n),
                                 query_position_tiles(q_pos_T, q_tile), k_BSGE, v_BSGE,
                                 k_pos_S, k_tile, _start_tiles(q_start_T, q_tile))
    return (from_query_tiles(dq_n, q_BTHE.shape[1]).astype(q_BTHE.dtype),
            dk.astype(k_BSGE.dtype), dv.astype(v_BSGE.dtype), None, None, None)


_causal_attention.defvjp(_causal_attention_fwd, _causal_attention_bwd)


def gated_attention(params: Params, x_BTD, cfg: AttentionConfig, *, eps: float, cos_TR, sin_TR,
                    attend=causal_attention, cu_seqlens=None):
    """One gated attention layer on x [B, T, D] (params already in x's dtype) at the positions
    of cos/sin [T, R] (global positions, packed documents too); attend(q, k, v) -> o is the
    token-mixing step (a CP mode swaps it), given cu_seqlens=… when packed documents are."""
    q_BTHE, k_BTGE, v_BTGE, gate_BTX = project(params, x_BTD, cos_TR, sin_TR, cfg, eps)
    o_BTHE = (attend(q_BTHE, k_BTGE, v_BTGE) if cu_seqlens is None
              else attend(q_BTHE, k_BTGE, v_BTGE, cu_seqlens=cu_seqlens))
    return output(params, o_BTHE, gate_BTX)
