"""Attention under context parallelism (jax_gdn.cp.attention) against the one-chip attention:
outputs and gradients for every attn_cp × layout (at tile sizes that cut segments into several
tiles, padded ones included), the (query tile, key tile) pairs each chip computes (counted as
they run), the bytes each chip receives (from the compiled HLO, against the formulas of the
module docstring) and per-chip memory (XLA's memory analysis: flat in D at a fixed local
shard, linear in the local shard at a fixed tile size).

Legend: B batch, t local tokens, T global tokens, D chips, H query heads, G KV heads, E head_dim.
"""

from __future__ import annotations

import collections
import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from gdn_core.cp_layout import LAYOUTS, local_positions, segments, shard_order
from gdn_core.cp_modes import ATTN_CP_MODES
from gdn_core.jax_gdn.attention import ATTENTION_BLOCK, causal_attention, tile_size
from gdn_core.jax_gdn.cp.attention import attention_cp
from gdn_core.jax_gdn.hlo_comm import received_bytes_per_chip
from gdn_core.testing import assert_close

from .attention_probes import count_tile_calls, through_layers

TOL = 1e-4


def mesh_of(D):
    return Mesh(np.array(jax.devices()[:D]), ("cp",))


def cp_attention(mesh, mode, layout, block=ATTENTION_BLOCK, layers=1):
    """attention_cp on global arrays [B, T, heads, E] (T in the layout's shard order);
    layers > 1: run that many times in a layer scan (through_layers), as the decoder does."""
    seq = P(None, "cp")
    attend = functools.partial(attention_cp, axis="cp", mode=mode, layout=layout, block=block)
    return jax.shard_map(attend if layers == 1 else through_layers(attend, layers), mesh=mesh,
                         in_specs=(seq,) * 3, out_specs=seq, check_vma=False)


def attention_inputs(B, T, H, G, E, seed=0):
    """q, k, v and an output weight w; keys share a direction (cosine ≈ 0.6), so softmax rows
    are peaked as a trained model's, not near-uniform as i.i.d. keys give."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, H, E))
    direction = rng.standard_normal(E)
    k = 0.6 * direction * np.sqrt(E) / np.linalg.norm(direction) + 0.8 * rng.standard_normal(
        (B, T, G, E))
    v = rng.standard_normal((B, T, G, E))
    w = rng.standard_normal((B, T, H, E))
    return [x.astype(np.float32) for x in (q, k, v, w)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("D, block", [(2, 12), pytest.param(4, 4, marks=pytest.mark.slow),
                                      pytest.param(8, ATTENTION_BLOCK, marks=pytest.mark.slow)])
def test_every_mode_and_layout_equals_one_chip(D, block):
    """B 2, T 64, H 4 (8 at D = 8) : G 2; D ≥ 4 > G, so ulysses replicates KV heads. All
    modes and layouts in one compiled program per D: outputs and ∂/∂q, k, v of Σ o·w. Tiles:
    D = 2 at block 12, 3 tiles of 11 per 32-token shard (contiguous, one padding token) and
    2 of 8 per 16-token segment (zigzag); D = 4 at block 4, 4 or 2 tiles per segment; D = 8
    one tile per segment."""
    H = 8 if D == 8 else 4
    q, k, v, w = attention_inputs(2, 64, H, 2, 16)
    ref_o, ref_grads = jax.jit(lambda q, k, v: (causal_attention(q, k, v), jax.grad(
        lambda q, k, v: jnp.sum(causal_attention(q, k, v) * w), argnums=(0, 1, 2))(q, k, v)))(
        q, k, v)
    mesh = mesh_of(D)
    cases = [(mode, layout) for mode in ATTN_CP_MODES for layout in LAYOUTS]
    orders = {layout: shard_order(chips=D, seq_len=64, layout=layout) for layout in LAYOUTS}

    def all_cases(q, k, v, w):
        out = {}
        for mode, layout in cases:
            attend = cp_attention(mesh, mode, layout, block)
            args = [x[:, orders[layout]] for x in (q, k, v)]
            w_l = w[:, orders[layout]]
            out[mode, layout] = (attend(*args), jax.grad(
                lambda q, k, v, attend=attend, w_l=w_l: jnp.sum(attend(q, k, v) * w_l),
                argnums=(0, 1, 2))(*args))
        return out

    results = jax.jit(all_cases).lower(q, k, v, w).compile()(q, k, v, w)
    for (mode, layout), (o, grads) in results.items():
        order = orders[layout]
        assert_close(f"{mode}/{layout} D={D} o", np.asarray(ref_o)[:, order], o, TOL)
        for name, ref, got in zip("qkv", ref_grads, grads):
            assert_close(f"{mode}/{layout} D={D} d{name}", np.asarray(ref)[:, order], got, TOL)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("H, D, match", [
    (4, 8, r"query heads \(4\) divisible by chips=8: more chips \(8\) than query heads \(4\)"),
    (6, 4, r"query heads \(6\) divisible by chips=4: chips must be one of 1, 2, 3, 6"),
])
def test_ulysses_refuses_heads_it_cannot_split(H, D, match):
    q, k, v, _ = attention_inputs(1, 16, H, 2, 8)
    with pytest.raises(ValueError, match=match):
        jax.jit(cp_attention(mesh_of(D), "ulysses", "contiguous")).lower(q, k, v)


def expected_tiles(D, t, layout, block):
    """Per chip, the (query tile, key tile) pairs with some query seeing some key, split into
    those seen wholly ("full") and partly ("masked"), from the layout's positions alone (tiles:
    each segment cut into tiles of tile_size(segment, block)); and how many pairs there are in
    all (what masking without skipping computes)."""
    def tiles(chip):
        segs = np.split(local_positions(chip=chip, chips=D, seq_len=D * t, layout=layout),
                        len(segments(chip=chip, chips=D, layout=layout)))
        return [tile for seg in segs
                for tile in np.split(seg, len(seg) // tile_size(len(seg), block))]

    chip_tiles = [tiles(r) for r in range(D)]
    keys = [k for ts in chip_tiles for k in ts]
    counts = []
    for ts in chip_tiles:
        seen = [(k[None, :] <= q[:, None]) for q in ts for k in keys]
        counts.append({"full": sum(bool(m.all()) for m in seen),
                       "masked": sum(bool(m.any() and not m.all()) for m in seen)})
    return counts, len(chip_tiles[0]) * len(keys)


@pytest.mark.timeout(240)
# 4 compiles a mode, never cached (host callbacks): all_gather_kv's in the slow tier.
@pytest.mark.parametrize("mode", ["ring", pytest.param("all_gather_kv", marks=pytest.mark.slow)])
def test_chips_skip_the_tiles_no_query_sees(mode, monkeypatch):
    """D = 4, T = 64: run forward and backward, counting on the host (jax.debug.callback in the
    tile functions) every (query tile, key tile) pair each chip computes, forward and backward.
    Tiles as large as a segment (the default block): contiguous, chip r computes r + 1 of its
    D pairs (the first chip 1, the last D); zigzag, every chip 2D + 1 of its 4D quarter-size
    pairs. Tiles of 4 tokens: what the positions say each chip sees (expected_tiles). Both:
    the visible tiles, nothing more, and the masked path only where a tile is partly
    visible."""
    D, t = 4, 16
    counts = collections.Counter()
    count_tile_calls(monkeypatch, lambda name, kind: jax.debug.callback(
        lambda chip: counts.update([(name, int(chip), kind)]), jax.lax.axis_index("cp")))
    q, k, v, w = attention_inputs(1, D * t, 2, 1, 8)
    for layout in LAYOUTS:
        for block in (ATTENTION_BLOCK, 4):
            counts.clear()
            attend = cp_attention(mesh_of(D), mode, layout, block)
            loss = lambda q, k, v, attend=attend: jnp.sum(attend(q, k, v) * w)
            jax.block_until_ready(jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v))
            jax.effects_barrier()
            expected, all_tiles = expected_tiles(D, t, layout, block)
            for chip, want in enumerate(expected):
                for name in ("forward", "backward"):
                    got = {kind: counts.get((name, chip, kind), 0) for kind in ("full", "masked")}
                    assert got == want, (layout, block, name, chip, got, want)
            done = [sum(c.values()) for c in expected]
            if block == 4:  # over all chips: the global 16 × 16 grid's lower triangle
                n = D * t // 4
                assert sum(done) == n * (n + 1) // 2 and all_tiles == 4 * n, (done, all_tiles)
            elif layout == "contiguous":
                assert done == [r + 1 for r in range(D)] and all_tiles == D, done
            else:
                assert done == [2 * D + 1] * D and all_tiles == 4 * D, done


# ---- bytes and memory: grad of Σ o² w.r.t. q, k, v, compiled only (never run) -------------
B, T_LOCAL, H_MEM, G_MEM, E_MEM = 1, 64, 16, 8, 16  # G divisible by D ≤ 8: no KV copies


@functools.cache
def compiled_grad(mode, D):
    mesh, T = mesh_of(D), D * T_LOCAL
    attend = cp_attention(mesh, mode, "contiguous")
    shapes = [(B, T, H_MEM, E_MEM), (B, T, G_MEM, E_MEM), (B, T, G_MEM, E_MEM)]
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    return jax.jit(jax.grad(lambda q, k, v: jnp.sum(attend(q, k, v) ** 2),
                            argnums=(0, 1, 2))).lower(*args).compile()


def bytes_per_chip(mode, D):
    m = compiled_grad(mode, D).memory_analysis()
    return (m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
            - m.alias_size_in_bytes)


def received(mode, D):
    per_chip = received_bytes_per_chip(compiled_grad(mode, D), D)["per_chip"]
    assert len(set(per_chip)) == 1, per_chip
    return per_chip[0]


KV_SHARD = B * T_LOCAL * G_MEM * E_MEM * 4  # one chip's K (or V) shard, float32
Q_SHARD = B * T_LOCAL * H_MEM * E_MEM * 4


@pytest.mark.timeout(180)
@pytest.mark.parametrize("D", [2, 4, pytest.param(8, marks=pytest.mark.slow)])
def test_received_bytes_match_the_formulas(D):
    """ring: 2(D−1) K/V blocks forward; backward the blocks again with their float32 dK/dV
    (D−1 hops) and one last hop of dK/dV home — (6D − 4) shards, where autodiff of the
    forward would send 4(D−1) (and at D = 2 too: no hop of the backward merged with the
    forward's). all_gather_kv: the gather 2(D−1) and the dK/dV accumulators' ring 2(D−1) (a
    reduce-scatter's bytes). ulysses: (D−1)/D of q, k, v and o shards, forward and again
    backward."""
    X = KV_SHARD
    assert received("ring", D) == (6 * D - 4) * X
    assert received("all_gather_kv", D) == 4 * (D - 1) * X
    assert received("ulysses", D) == 2 * (D - 1) * (2 * Q_SHARD + 2 * X) // D


@pytest.mark.timeout(180)
def test_memory_flat_in_chips_for_ring_and_ulysses():
    """At a fixed local shard, per-chip memory does not grow with D (D = 2, 4, 8): ring's is
    flat within 2%; ulysses' at most 2% above the D before it — its sequence-sized buffers
    (the whole sequence of H/D heads) are flat, and its score tiles, [B, G/D, r, b, b] of
    fixed b, shrink as D grows."""
    ring = [bytes_per_chip("ring", D) for D in (2, 4, 8)]
    assert max(ring) <= 1.02 * min(ring), ring
    ulysses = [bytes_per_chip("ulysses", D) for D in (2, 4, 8)]
    assert all(b <= 1.02 * a for a, b in itertools.pairwise(ulysses)), ulysses


@pytest.mark.timeout(180)
def test_all_gather_kv_grows_by_exactly_the_gathered_kv():
    """all_gather_kv holds the gathered K, V [B, T, G, E] and nothing else of the global
    sequence (dK, dV go round as per-block accumulators, never whole): each added chip adds
    exactly its K and V shards, from D = 3 on (D = 3 → 6, 4 → 8); D = 2, whose one-hop
    accumulator ring XLA inlines, lies below that line."""
    for D in (3, 4):
        growth = bytes_per_chip("all_gather_kv", 2 * D) - bytes_per_chip("all_gather_kv", D)
        assert growth == 2 * D * KV_SHARD, (D, growth, KV_SHARD)
    assert bytes_per_chip("all_gather_kv", 2) <= (bytes_per_chip("all_gather_kv", 4)
                                                  - 2 * 2 * KV_SHARD)


def grad_bytes_at_local_tokens(mode, layout, t, block, D=2, H=2, G=1, E=16):
    """Per-chip bytes of the compiled gradient of Σ o² at t local tokens, attention run in a
    layer scan of two (compiled only)."""
    attend = cp_attention(mesh_of(D), mode, layout, block, layers=2)
    args = [jax.ShapeDtypeStruct((1, D * t, heads, E), jnp.float32) for heads in (H, G, G)]
    m = jax.jit(jax.grad(lambda q, k, v: jnp.sum(attend(q, k, v) ** 2), argnums=(0, 1, 2))
                ).lower(*args).compile().memory_analysis()
    return (m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
            - m.alias_size_in_bytes)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", [  # ring by default; each other mode is two more compiles
    pytest.param(mode, marks=[] if mode == "ring" else pytest.mark.slow)
    for mode in ATTN_CP_MODES])
def test_memory_grows_linearly_in_local_tokens(mode):
    """D = 2, tiles of 256: doubling the local shard from 1024 to 2048 tokens at most 2.2×
    the per-chip bytes, either layout — score tiles are fixed, everything else linear in t
    ([t, t] scores would grow 4×)."""
    for layout in LAYOUTS:
        growth = (grad_bytes_at_local_tokens(mode, layout, 2048, 256)
                  / grad_bytes_at_local_tokens(mode, layout, 1024, 256))
        assert growth <= 2.2, (mode, layout, growth)
