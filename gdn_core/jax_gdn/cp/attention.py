"""Causal attention under context parallelism: this chip's queries against the whole sequence.

Call inside a shard_map binding `axis` (D chips) with check_vma=False, as the CP step's is. Each chip holds its local shard of q
[B, t, H, E] and k, v [B, t, G, E] (t = T/D), at the global positions
cp_layout.local_positions(chip, D, T, layout) — contiguous, or zigzag (segments r and 2D−1−r);
masks compare global positions, so both layouts need nothing else. Returns o [B, t, H, E] for
this chip's queries, equal to the one-chip attention.causal_attention's rows.

    all_gather_kv  all_gather K and V (the whole sequence, in shard order), then attend to
                   them block by block (the Llama 3 / torchtitan scheme). Receives per chip
                   2(D−1)·B·t·G·E·|kv| forward; backward reduce-scatters dK, dV
                   (2(D−1)/D·B·T·G·E·|kv|); one dependent round each way. Holds the
                   gathered K/V and, in backward, their gradient: grows with T.
    ring           D rounds: attend to the K/V block held, pass it to the next chip (ppermute)
                   and merge by online softmax (float32 max and sum). A custom VJP: forward
                   saves only the local q, k, v, o and the log-sum-exp; backward passes the
                   K/V blocks around again with their dK/dV accumulators (float32), which
                   arrive home after a last hop. Receives 2(D−1)·B·t·G·E·|kv| forward and
                   2(D−1)·B·t·G·E·(|kv| + 4) + 2·B·t·G·E·4 backward; D−1 dependent rounds
                   forward, D backward. Memory flat in D (at D = 2 XLA inlines the one-trip
                   loop and keeps its two blocks' buffers apart: a fixed ~25% more).
    ulysses        all_to_all to head shards (every chip: the whole sequence of H/D query
                   heads and the KV heads they read, replicated when G < D, as
                   cp_modes.UlyssesHeads plans it), local attention, all_to_all back.
                   Receives (D−1)/D·B·t·(2·H·E + 2·D·Gl·E)·|x| forward (q and o; k and v
                   with Gl KV heads per chip) and as much backward; 2 dependent rounds each
                   way. Needs H divisible by D. Memory flat in D while D divides G (the
                   copies of replicated KV heads cover the whole sequence).

Local attention (all_gather_kv, ulysses) runs over key blocks of t tokens with an online
softmax and a custom VJP that recomputes each block's probabilities in backward, so no chip
holds a [T, T] or [t, T] score matrix: per-block scores are [t, t] (all_gather_kv, ring) or
[T, t] for H/D heads (ulysses). Blocks a query cannot see are masked, not skipped.
Legend: B batch, t local tokens, T global tokens, H query heads, G KV heads, r = H/G,
E head_dim, n key blocks, s block tokens, q query tokens of a computation.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...cp_layout import Layout, check_layout, local_positions
from ...cp_modes import AttnCPMode, UlyssesHeads, check_attn_cp
from ..attention import MASKED, precision
from .common import AxisName, chip_count, chip_index, permute
from .ulysses import key_heads_for_chips


def check_attention_shape(*, attn_cp: str, chips: int, seq_len: int, num_heads: int,
                          num_kv_heads: int, layout: str = "contiguous") -> None:
    """Raise ValueError naming the numbers when `attn_cp` cannot split this attention over
    `chips` (ulysses: query heads must divide by chips)."""
    check_attn_cp(attn_cp)
    check_layout(layout, chips=chips, seq_len=seq_len)
    if attn_cp == "ulysses" and num_heads % chips:
        divisors = [d for d in range(1, num_heads + 1) if num_heads % d == 0]
        more = f"more chips ({chips}) than query heads ({num_heads}); " if chips > num_heads \
            else ""
        raise ValueError(f"attn_cp='ulysses' needs query heads ({num_heads}) divisible by "
                         f"chips={chips}: {more}chips must be one of "
                         f"{', '.join(map(str, divisors))}")
    del num_kv_heads  # any G: KV heads are replicated when G < chips


def positions_table(chips: int, t: int, layout: Layout) -> np.ndarray:
    """Global positions of every chip's local shard: int32 [D, t] (row r: chip r's)."""
    return np.stack([local_positions(chip=r, chips=chips, seq_len=chips * t, layout=layout)
                     for r in range(chips)]).astype(np.int32)


def local_token_positions(axis: AxisName, t: int, layout: Layout):
    """This chip's global token positions [t] (int32), inside the shard_map."""
    return jnp.asarray(positions_table(chip_count(axis), t, layout))[chip_index(axis)]


# ---- one key block: forward merge and backward, float32 statistics -------------------------

def _scores(q_BGrqE, k_BsGE, q_pos, k_pos):
    """Masked, scaled scores [B, G, r, q, s] in float32 and the mask [q, s]."""
    E = q_BGrqE.shape[-1]
    s = jnp.einsum("bgrqe,bsge->bgrqs", q_BGrqE, k_BsGE, precision=precision(q_BGrqE.dtype),
                   preferred_element_type=jnp.float32) * E ** -0.5
    mask_qs = k_pos[None, :] <= q_pos[:, None]
    return jnp.where(mask_qs, s, MASKED), mask_qs


def _merge_block(stats, q_BGrqE, k_BsGE, v_BsGE, q_pos, k_pos):
    """Online softmax: fold one key block into (max m, sum l, weighted sum acc), float32."""
    m_BGrq, l_BGrq, acc_BGrqE = stats
    s, mask = _scores(q_BGrqE, k_BsGE, q_pos, k_pos)
    m_new = jnp.maximum(m_BGrq, s.max(-1))
    alpha = jnp.exp(m_BGrq - m_new)
    p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
    pv = jnp.einsum("bgrqs,bsge->bgrqe", p.astype(v_BsGE.dtype), v_BsGE,
                    precision=precision(v_BsGE.dtype), preferred_element_type=jnp.float32)
    return m_new, alpha * l_BGrq + p.sum(-1), alpha[..., None] * acc_BGrqE + pv


def _empty_stats(q_BGrqE):
    shape = q_BGrqE.shape[:-1]
    return (jnp.full(shape, MASKED, jnp.float32), jnp.zeros(shape, jnp.float32),
            jnp.zeros(q_BGrqE.shape, jnp.float32))


def _finish(stats, dtype):
    """(o [B, G, r, q, E] in dtype, log-sum-exp [B, G, r, q] float32)."""
    m, l, acc = stats
    return (acc / l[..., None]).astype(dtype), m + jnp.log(l)


def _block_grads(q_BGrqE, k_BsGE, v_BsGE, do_BGrqE, lse_BGrq, delta_BGrq, q_pos, k_pos):
    """One key block's (dq [B,G,r,q,E], dk, dv [B,s,G,E]) in float32, probabilities recomputed."""
    E = q_BGrqE.shape[-1]
    s, mask = _scores(q_BGrqE, k_BsGE, q_pos, k_pos)
    p = jnp.where(mask, jnp.exp(s - lse_BGrq[..., None]), 0.0)
    hi = precision(q_BGrqE.dtype)
    dv = jnp.einsum("bgrqs,bgrqe->bsge", p.astype(do_BGrqE.dtype), do_BGrqE, precision=hi,
                    preferred_element_type=jnp.float32)
    dp = jnp.einsum("bgrqe,bsge->bgrqs", do_BGrqE, v_BsGE, precision=hi,
                    preferred_element_type=jnp.float32)
    ds = (p * (dp - delta_BGrq[..., None]) * E ** -0.5).astype(q_BGrqE.dtype)
    dq = jnp.einsum("bgrqs,bsge->bgrqe", ds, k_BsGE, precision=hi,
                    preferred_element_type=jnp.float32)
    dk = jnp.einsum("bgrqs,bgrqe->bsge", ds, q_BGrqE, precision=hi,
                    preferred_element_type=jnp.float32)
    return dq, dk, dv


def _grouped(x_BqHE, G):
    B, q, H, E = x_BqHE.shape
    return jnp.transpose(x_BqHE.reshape(B, q, G, H // G, E), (0, 2, 3, 1, 4))


def _ungrouped(x_BGrqE):
    B, G, r, q, E = x_BGrqE.shape
    return jnp.transpose(x_BGrqE, (0, 3, 1, 2, 4)).reshape(B, q, G * r, E)


def _delta(o_BGrqE, do_BGrqE):
    return jnp.sum(o_BGrqE.astype(jnp.float32) * do_BGrqE.astype(jnp.float32), axis=-1)


# ---- local blockwise attention (all_gather_kv, ulysses) -------------------------------------

@jax.custom_vjp
def blockwise_attention(q_BqHE, k_nBsGE, v_nBsGE, q_pos, k_pos_ns):
    """Causal attention of queries q [B, q, H, E] at positions q_pos [q] to n key blocks
    k, v [n, B, s, G, E] at positions k_pos [n, s]: o [B, q, H, E] in q's dtype. A scan over
    the blocks (online softmax) whose backward recomputes each block: no [q, n·s] buffer."""
    return _blockwise_fwd(q_BqHE, k_nBsGE, v_nBsGE, q_pos, k_pos_ns)[0]


def _blockwise_fwd(q_BqHE, k_nBsGE, v_nBsGE, q_pos, k_pos_ns):
    q_BGrqE = _grouped(q_BqHE, k_nBsGE.shape[3])

    def step(stats, block):
        k_BsGE, v_BsGE, k_pos = block
        return _merge_block(stats, q_BGrqE, k_BsGE, v_BsGE, q_pos, k_pos), None

    stats, _ = lax.scan(step, _empty_stats(q_BGrqE), (k_nBsGE, v_nBsGE, k_pos_ns))
    o_BGrqE, lse = _finish(stats, q_BqHE.dtype)
    return _ungrouped(o_BGrqE), (q_BqHE, k_nBsGE, v_nBsGE, q_pos, k_pos_ns, o_BGrqE, lse)


def _blockwise_bwd(residuals, do_BqHE):
    q_BqHE, k_nBsGE, v_nBsGE, q_pos, k_pos_ns, o_BGrqE, lse = residuals
    G = k_nBsGE.shape[3]
    q_BGrqE, do_BGrqE = _grouped(q_BqHE, G), _grouped(do_BqHE.astype(q_BqHE.dtype), G)
    delta = _delta(o_BGrqE, do_BGrqE)

    def step(dq, block):
        k_BsGE, v_BsGE, k_pos = block
        dq_b, dk, dv = _block_grads(q_BGrqE, k_BsGE, v_BsGE, do_BGrqE, lse, delta, q_pos, k_pos)
        return dq + dq_b, (dk.astype(k_BsGE.dtype), dv.astype(v_BsGE.dtype))

    dq, (dk, dv) = lax.scan(step, jnp.zeros(q_BGrqE.shape, jnp.float32),
                            (k_nBsGE, v_nBsGE, k_pos_ns))
    return _ungrouped(dq).astype(q_BqHE.dtype), dk, dv, None, None


blockwise_attention.defvjp(_blockwise_fwd, _blockwise_bwd)


def _blocks(x_BTGE, n):
    """[B, n·s, G, E] → [n, B, s, G, E]."""
    B, T, G, E = x_BTGE.shape
    return jnp.moveaxis(x_BTGE.reshape(B, n, T // n, G, E), 1, 0)


def all_gather_kv_attention(q_BtHE, k_BtGE, v_BtGE, *, axis: AxisName, layout: Layout):
    """all_gather K and V, then this chip's queries against every chip's block."""
    D, t = chip_count(axis), q_BtHE.shape[1]
    table = jnp.asarray(positions_table(D, t, layout))
    k_BTGE, v_BTGE = (lax.all_gather(x, axis, axis=1, tiled=True) for x in (k_BtGE, v_BtGE))
    return blockwise_attention(q_BtHE, _blocks(k_BTGE, D), _blocks(v_BTGE, D),
                               table[chip_index(axis)], table)


def ulysses_attention(q_BtHE, k_BtGE, v_BtGE, *, axis: AxisName, layout: Layout):
    """all_to_all to H/D query heads (and their KV heads) over the whole sequence, attend,
    all_to_all back."""
    D, t = chip_count(axis), q_BtHE.shape[1]
    H, G = q_BtHE.shape[2], k_BtGE.shape[2]
    check_attention_shape(attn_cp="ulysses", chips=D, seq_len=D * t, num_heads=H,
                          num_kv_heads=G, layout=layout)
    plan = UlyssesHeads(num_k_heads=G, num_v_heads=H, chips=D)

    def to_heads(x):  # [B, t, D·h, E] -> [B, T, h, E], T in shard order
        return lax.all_to_all(x, axis, split_axis=2, concat_axis=1, tiled=True)

    q_BTHE = to_heads(q_BtHE)
    k_BTGE, v_BTGE = (to_heads(key_heads_for_chips(x, plan)) for x in (k_BtGE, v_BtGE))
    table = jnp.asarray(positions_table(D, t, layout))
    o_BTHE = blockwise_attention(q_BTHE, _blocks(k_BTGE, D), _blocks(v_BTGE, D),
                                 table.reshape(-1), table)
    return lax.all_to_all(o_BTHE, axis, split_axis=1, concat_axis=2, tiled=True)


# ---- ring -------------------------------------------------------------------------------------

def _to_next(x, axis: AxisName):
    D = chip_count(axis)
    return permute(x, axis, [(i, (i + 1) % D) for i in range(D)])


@partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _ring(q_BtHE, k_BtGE, v_BtGE, axis, layout):
    return _ring_fwd(q_BtHE, k_BtGE, v_BtGE, axis, layout)[0]


def _ring_fwd(q_BtHE, k_BtGE, v_BtGE, axis, layout):
    D, me, t = chip_count(axis), chip_index(axis), q_BtHE.shape[1]
    table = jnp.asarray(positions_table(D, t, layout))
    q_pos = table[me]
    q_BGrqE = _grouped(q_BtHE, k_BtGE.shape[2])
    stats = _merge_block(_empty_stats(q_BGrqE), q_BGrqE, k_BtGE, v_BtGE, q_pos, q_pos)

    def step(carry, s):  # round s: the block of chip me − s arrives, is merged
        stats, k_blk, v_blk = carry
        k_blk, v_blk = _to_next(k_blk, axis), _to_next(v_blk, axis)
        stats = _merge_block(stats, q_BGrqE, k_blk, v_blk, q_pos, table[(me - s) % D])
        return (stats, k_blk, v_blk), None

    (stats, _, _), _ = lax.scan(step, (stats, k_BtGE, v_BtGE), jnp.arange(1, D))
    o_BGrqE, lse = _finish(stats, q_BtHE.dtype)
    return _ungrouped(o_BGrqE), (q_BtHE, k_BtGE, v_BtGE, o_BGrqE, lse)


def _ring_bwd(axis, layout, residuals, do_BtHE):
    q_BtHE, k_BtGE, v_BtGE, o_BGrqE, lse = residuals
    D, me, t = chip_count(axis), chip_index(axis), q_BtHE.shape[1]
    table = jnp.asarray(positions_table(D, t, layout))
    q_pos = table[me]
    G = k_BtGE.shape[2]
    q_BGrqE, do_BGrqE = _grouped(q_BtHE, G), _grouped(do_BtHE.astype(q_BtHE.dtype), G)
    delta = _delta(o_BGrqE, do_BGrqE)

    def visit(dq, k_blk, v_blk, dk_blk, dv_blk, src):
        dq_b, dk, dv = _block_grads(q_BGrqE, k_blk, v_blk, do_BGrqE, lse, delta, q_pos,
                                    table[src])
        return dq + dq_b, dk_blk + dk, dv_blk + dv

    zeros_kv = jnp.zeros(k_BtGE.shape, jnp.float32)
    dq, dk_blk, dv_blk = visit(jnp.zeros(q_BGrqE.shape, jnp.float32), k_BtGE, v_BtGE,
                               zeros_kv, zeros_kv, me)

    def step(carry, s):  # the block of chip me − s arrives with its gradients so far
        dq, k_blk, v_blk, dk_blk, dv_blk = carry
        k_blk, v_blk, dk_blk, dv_blk = (_to_next(x, axis) for x in (k_blk, v_blk, dk_blk,
                                                                     dv_blk))
        dq, dk_blk, dv_blk = visit(dq, k_blk, v_blk, dk_blk, dv_blk, (me - s) % D)
        return (dq, k_blk, v_blk, dk_blk, dv_blk), None

    (dq, _, _, dk_blk, dv_blk), _ = lax.scan(step, (dq, k_BtGE, v_BtGE, dk_blk, dv_blk),
                                             jnp.arange(1, D))
    # After D − 1 hops chip me holds block me + 1's gradients: one more hop takes them home.
    dk, dv = (_to_next(x, axis) if D > 1 else x for x in (dk_blk, dv_blk))
    return (_ungrouped(dq).astype(q_BtHE.dtype), dk.astype(k_BtGE.dtype),
            dv.astype(v_BtGE.dtype))


_ring.defvjp(_ring_fwd, _ring_bwd)


def ring_attention(q_BtHE, k_BtGE, v_BtGE, *, axis: AxisName, layout: Layout):
    """K/V blocks passed around the chips, merged by online softmax (module docstring)."""
    return _ring(q_BtHE, k_BtGE, v_BtGE, axis if isinstance(axis, str) else tuple(axis), layout)


ATTENTION_CP = {"all_gather_kv": all_gather_kv_attention, "ring": ring_attention,
                "ulysses": ulysses_attention}


def attention_cp(q_BtHE, k_BtGE, v_BtGE, *, axis: AxisName, mode: AttnCPMode,
                 layout: Layout = "contiguous"):
    """Causal attention of this chip's queries q [B, t, H, E] over the global sequence whose
    local K, V [B, t, G, E] shards the chips hold; o [B, t, H, E] in q's dtype. Call inside a
    shard_map binding `axis`. Raises ValueError naming the numbers (unknown mode or layout,
    ulysses query heads not divisible by the chips)."""
    check_attn_cp(mode)
    check_layout(layout)
    return ATTENTION_CP[mode](q_BtHE, k_BtGE, v_BtGE, axis=axis, layout=layout)


def attend_fn(*, axis: AxisName, mode: AttnCPMode, layout: Layout = "contiguous"):
    """attention_cp bound to (axis, mode, layout): model.hidden_states' `attend_fn` under CP."""
    check_attn_cp(mode)
    check_layout(layout)
    return partial(attention_cp, axis=axis, mode=mode, layout=layout)

