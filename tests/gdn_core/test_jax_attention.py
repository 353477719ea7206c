"""The one-chip blockwise (flash) attention, attention.causal_attention, at small tile sizes:
equal to dense softmax attention (outputs and gradients, padded tiles and arbitrary positions
included), computing only the tiles some query sees (counted as they run), and per-chip memory
growing linearly in T, not as T² (XLA's memory analysis of the gradient).

Legend: B batch, T tokens, H query heads, G KV heads, E head_dim.
"""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gdn_core.jax_gdn.attention import causal_attention, tile_size
from gdn_core.testing import assert_close

from .attention_probes import count_tile_calls, through_layers

TOL = 1e-4


def dense_attention(q_BTHE, k_BSGE, v_BSGE, q_pos_T, k_pos_S):
    """The [T, S] softmax written out (float32, HIGHEST): the reference."""
    B, T, H, E = q_BTHE.shape
    G = k_BSGE.shape[2]
    q = q_BTHE.reshape(B, T, G, H // G, E)
    s = jnp.einsum("btgre,bsge->bgrts", q, k_BSGE, precision="highest") * E ** -0.5
    p = jax.nn.softmax(jnp.where(k_pos_S[None, :] <= q_pos_T[:, None], s, -1e30), axis=-1)
    return jnp.einsum("bgrts,bsge->btgre", p, v_BSGE, precision="highest").reshape(B, T, H, E)


def inputs(T, seed=0, B=2, H=4, G=2, E=16):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32)
            for shape in ((B, T, H, E), (B, T, G, E), (B, T, G, E), (B, T, H, E))]


def test_tile_size_is_at_most_the_block_with_the_fewest_tiles():
    assert [tile_size(n, 512) for n in (39, 512, 513, 1000, 1024, 1537)] == [
        39, 512, 257, 500, 512, 385]
    assert all(tile_size(n, b) <= b and -(-n // tile_size(n, b)) == -(-n // b)
               for n in range(1, 70) for b in (1, 4, 7, 16))


@pytest.mark.timeout(180)
def test_tiles_equal_dense_attention():
    """Outputs and ∂/∂q, k, v of Σ o·w against the dense softmax: one tile (T 40, block 512),
    whole tiles (64 at 16), padded tiles (37 at 8: 5 tiles of 8, 3 padding tokens), and
    shuffled positions (a zigzag-like order, 48 at 8), all in one compiled program."""
    zigzag = np.concatenate([np.arange(0, 12), np.arange(36, 48), np.arange(12, 36)])
    cases = [(40, 512, None), (64, 16, None), (37, 8, None), (48, 8, zigzag)]
    data = [inputs(T, seed=T) for T, _, _ in cases]

    def run(data):
        out = []
        for (T, block, positions), (q, k, v, w) in zip(cases, data):
            pos = jnp.arange(T) if positions is None else jnp.asarray(positions)
            for attend in (lambda q, k, v, block=block, pos=pos: causal_attention(
                               q, k, v, pos, pos, block=block),
                           lambda q, k, v, pos=pos: dense_attention(q, k, v, pos, pos)):
                out.append((attend(q, k, v), jax.grad(
                    lambda q, k, v, attend=attend, w=w: jnp.sum(attend(q, k, v) * w),
                    argnums=(0, 1, 2))(q, k, v)))
        return out

    results = jax.jit(run).lower(data).compile()(data)
    for i, (T, block, positions) in enumerate(cases):
        (o, grads), (ref_o, ref_grads) = results[2 * i], results[2 * i + 1]
        name = f"T={T} block={block}{' shuffled' if positions is not None else ''}"
        assert_close(f"{name} o", ref_o, o, TOL)
        for d, ref, got in zip("qkv", ref_grads, grads):
            assert_close(f"{name} d{d}", ref, got, TOL)


@pytest.mark.timeout(120)
def test_only_tiles_some_query_sees_are_computed(monkeypatch):
    """T 64 in tiles of 16: 4 × 4 tile pairs, of which the 6 below the diagonal run unmasked,
    the 4 on it masked and the 6 above it not at all — forward and backward, counted on the
    host (jax.debug.callback in the tile functions)."""
    counts = collections.Counter()
    count_tile_calls(monkeypatch, lambda name, kind: jax.debug.callback(
        lambda: counts.update([(name, kind)])))
    q, k, v, w = inputs(64, B=1, H=2, G=1, E=8)
    loss = lambda q, k, v: jnp.sum(causal_attention(q, k, v, block=16) * w)
    jax.block_until_ready(jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v))
    jax.effects_barrier()
    assert counts == {(name, kind): n for name in ("forward", "backward")
                      for kind, n in (("full", 6), ("masked", 4))}, counts


def grad_bytes(T, block, H=2, G=1, E=16):
    """XLA's per-chip bytes (temporaries + arguments + outputs) of the compiled gradient of
    Σ o² w.r.t. q, k, v at T tokens, attention run in a layer scan of two (compiled only,
    never run)."""
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in ((1, T, H, E), (1, T, G, E),
                                                          (1, T, G, E))]
    attend = through_layers(functools.partial(causal_attention, block=block))
    compiled = jax.jit(jax.grad(lambda q, k, v: jnp.sum(attend(q, k, v) ** 2),
                                argnums=(0, 1, 2))).lower(*args).compile()
    m = compiled.memory_analysis()
    return (m.temp_size_in_bytes + m.argument_size_in_bytes + m.output_size_in_bytes
            - m.alias_size_in_bytes)


@pytest.mark.timeout(120)
def test_memory_grows_linearly_in_tokens():
    """Tiles of 256: doubling T from 1024 to 2048 at most 2.2× the bytes (score tiles are
    fixed, the rest is linear in T); one tile as large as T (block ≥ T: [T, T] scores) grows
    3.5× or more — the measurement sees quadratic growth where there is some."""
    tiled = grad_bytes(2048, 256) / grad_bytes(1024, 256)
    whole = grad_bytes(2048, 2048) / grad_bytes(1024, 1024)
    assert tiled <= 2.2 and whole >= 3.5, (tiled, whole)
