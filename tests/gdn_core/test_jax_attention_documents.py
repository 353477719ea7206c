"""Packed documents (cu_seqlens) in JAX attention: one chip (attention.causal_attention) and
context parallelism (cp.attention.attention_cp) for every attn_cp × layout on virtual CPU chips,
reference and xla pair kernels, against each document run alone through one chip's attention;
the tiles between documents skipped (counted as they run); cudnn / splash refused.

cu_seqlens is a traced input, so one compiled program serves every boundary case (all padded
to the same N + 1 with empty documents at the end). Boundaries (DOCS, T = 24·D; zigzag
segments of 12): inside a shard, at the shard edge (a zigzag segment edge too), a document
spanning every shard, 1-token documents, an empty one.
Legend: B batch, T tokens, D chips, H query heads, G KV heads, E head_dim.
"""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from gdn_core.attention_documents import document_starts
from gdn_core.cp_layout import LAYOUTS, local_positions, segments, shard_order
from gdn_core.cp_modes import ATTN_CP_MODES
from gdn_core.jax_gdn.attention import causal_attention, tile_size
from gdn_core.jax_gdn.cp.attention import attention_cp
from gdn_core.kernels import KernelUnavailable
from gdn_core.testing import assert_close, rel_err

from .attention_probes import count_tile_calls

TOL = 1e-4
BF16_TOL = 3e-2  # bf16 q, k, v against float32 on the bf16-rounded inputs
B, T_LOCAL, H, G, E = 1, 24, 4, 2, 8
BLOCK = 4  # reference tiles of 4 tokens: several per segment, none padded
CU_LEN = 8  # every case padded to 8 boundaries


def docs(D: int) -> dict[str, np.ndarray]:
    """cu_seqlens per case for T = 24·D, each [CU_LEN] (empty documents pad the end)."""
    T = D * T_LOCAL
    cases = {"edges": (0, 5, 6, T // D, T),  # inside shard 0, a 1-token document, the edge
             "spanning": (0, 2, 2, T - 3, T - 2, T),  # one over every shard and segment
             "short": (0, 3, 10, 17, 27, 33, 40, T)}  # boundaries off every edge
    return {name: np.array(cu + (T,) * (CU_LEN - len(cu)), np.int32)
            for name, cu in cases.items()}


def inputs(D: int, seed=0):
    """q, k, v, w float32; keys share a direction (peaked softmax rows)."""
    rng = np.random.default_rng(seed + D)
    T = D * T_LOCAL
    k = 2.4 * rng.standard_normal((1, 1, G, E)) + 0.6 * rng.standard_normal((B, T, G, E))
    return [x.astype(np.float32) for x in (
        rng.standard_normal((B, T, H, E)), k, rng.standard_normal((B, T, G, E)),
        rng.standard_normal((B, T, H, E)))]


def each_document_alone(q, k, v, w, cu):
    """The oracle: every document through one chip's causal attention alone (the library's,
    jax.nn.dot_product_attention's xla implementation); (o, ∂/∂q, k, v of Σ o·w)."""
    return _each_document_alone(q, k, v, w, tuple(int(c) for c in cu))


@functools.partial(jax.jit, static_argnums=4)
def _each_document_alone(q, k, v, w, cu: tuple[int, ...]):
    def attend(q, k, v):
        return jnp.concatenate([jax.nn.dot_product_attention(
            q[:, a:b], k[:, a:b], v[:, a:b], is_causal=True, implementation="xla")
            for a, b in zip(cu[:-1], cu[1:]) if b > a], axis=1)

    o, vjp = jax.vjp(attend, q, k, v)
    return o, vjp(w)


def mesh_of(D):
    return Mesh(np.array(jax.devices()[:D]), ("cp",))


def cp_attention(D, mode, layout, kernel="reference", block=BLOCK):
    """attention_cp with cu_seqlens on global arrays (T in the layout's shard order)."""
    seq = P(None, "cp")

    def attend(q, k, v, cu):
        return attention_cp(q, k, v, axis="cp", mode=mode, layout=layout, block=block,
                            kernel=kernel, cu_seqlens=cu)

    return jax.shard_map(attend, mesh=mesh_of(D), in_specs=(seq, seq, seq, P()),
                         out_specs=seq, check_vma=False)


# ---- one chip ----------------------------------------------------------------------------------

@pytest.mark.timeout(120)
def test_single_chip_equals_each_document_alone():
    """causal_attention with cu_seqlens (tiles of 4 and of 512, one compiled program, cu
    traced) equals each document alone: outputs and ∂/∂q, k, v of Σ o·w, float32 1e-4."""
    q, k, v, w = inputs(2)

    @jax.jit
    def run(q, k, v, cu):
        out = {}
        for block in (BLOCK, 512):
            f = functools.partial(causal_attention, block=block, cu_seqlens=cu)
            o, vjp = jax.vjp(f, q, k, v)
            out[block] = (o, vjp(w))
        return out

    for case, cu in docs(2).items():
        ref_o, ref_grads = each_document_alone(q, k, v, w, cu)
        causal_o = each_document_alone(q, k, v, w, (0, q.shape[1]))[0]
        assert rel_err(ref_o, causal_o) > 100 * TOL  # documents matter
        for block, (o, grads) in run(q, k, v, jnp.asarray(cu)).items():
            assert_close(f"{case} block {block}: o", ref_o, o, TOL)
            for name, ref, got in zip("qkv", ref_grads, grads):
                assert_close(f"{case} block {block}: d{name}", ref, got, TOL)


# ---- context parallelism -----------------------------------------------------------------------

@functools.cache
def compiled_cases(D: int, kernel: str, dtype: str, cases: tuple):
    """One program: each (mode, layout)'s o and ∂/∂q, k, v of Σ o·w at cu (traced)."""
    orders = {layout: shard_order(chips=D, seq_len=D * T_LOCAL, layout=layout)
              for layout in LAYOUTS}

    def run(q, k, v, w, cu):
        out = {}
        for mode, layout in cases:
            attend = cp_attention(D, mode, layout, kernel)
            args = [x[:, orders[layout]].astype(dtype) for x in (q, k, v)]
            o, vjp = jax.vjp(lambda q, k, v, attend=attend: attend(q, k, v, cu), *args)
            out[mode, layout] = (o, vjp(w[:, orders[layout]].astype(dtype)))
        return out

    args = [jax.ShapeDtypeStruct(x.shape, jnp.float32) for x in inputs(D)]
    return jax.jit(run).lower(*args, jax.ShapeDtypeStruct((CU_LEN,), jnp.int32)).compile(), orders


def check_cases(D: int, kernel: str, dtype: str, cases) -> None:
    """These (mode, layout)s, every boundary case, against each document alone."""
    run, orders = compiled_cases(D, kernel, dtype, tuple(cases))
    q, k, v, w = inputs(D)
    if dtype == "bfloat16":  # the oracle on the bf16-rounded inputs
        q, k, v, w = (np.asarray(jnp.asarray(x, jnp.bfloat16).astype(jnp.float32))
                      for x in (q, k, v, w))
    tol = TOL if dtype == "float32" else BF16_TOL
    for case, cu in docs(D).items():
        ref_o, ref_grads = each_document_alone(q, k, v, w, cu)
        for (mode, layout), (o, grads) in run(q, k, v, w, jnp.asarray(cu)).items():
            order, name = orders[layout], f"{mode}/{layout} D={D} {case} {kernel} {dtype}"
            assert_close(f"{name} o", np.asarray(ref_o)[:, order], o, tol)
            for x, ref, got in zip("qkv", ref_grads, grads):
                assert_close(f"{name} d{x}", np.asarray(ref)[:, order], got, tol)


EVERY_MODE = [(mode, layout) for mode in ATTN_CP_MODES for layout in LAYOUTS]
BF16_CASES = [("all_gather_kv", "contiguous"), ("ring", "zigzag"), ("ulysses", "zigzag")]
"""bf16 at D = 2: every attn_cp once (the other layouts under slow, at D = 4)."""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kernel", ["reference", "xla"])
def test_cp_documents_equal_each_document_alone(kernel, layout):
    """D = 2: every attn_cp in this layout, float32, within 1e-4 of each document alone."""
    check_cases(2, kernel, "float32", [(mode, layout) for mode in ATTN_CP_MODES])


@pytest.mark.timeout(300)
def test_cp_documents_bf16():
    """D = 2, reference pairs in bf16: within BF16_TOL of float32 on the rounded inputs."""
    check_cases(2, "reference", "bfloat16", BF16_CASES)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("kernel, dtype", [("reference", "float32"), ("xla", "float32"),
                                           ("reference", "bfloat16"), ("xla", "bfloat16")])
def test_cp_documents_on_4_chips(kernel, dtype):
    """D = 4: every attn_cp × layout (ulysses replicates KV heads: G = 2 < D)."""
    check_cases(4, kernel, dtype, EVERY_MODE)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kernel", ["cudnn", "splash"])
def test_kernels_without_a_mask_refuse_documents(kernel):
    """A fused kernel that takes no mask raises KernelUnavailable under documents while the
    step is traced, never falling back to another kernel."""
    q, k, v, _ = inputs(2)
    with pytest.raises(KernelUnavailable, match="cannot serve packed documents"):
        jax.jit(cp_attention(2, "ring", "contiguous", kernel)).lower(
            q, k, v, jnp.asarray(docs(2)["edges"]))


def expected_tiles(D, layout, cu, block):
    """Per chip, its (query tile, key tile) pairs some query sees some key of under the
    documents, split into wholly ("full") and partly ("masked") seen, from the positions."""
    def tiles(chip):
        segs = np.split(local_positions(chip=chip, chips=D, seq_len=D * T_LOCAL,
                                        layout=layout),
                        len(segments(chip=chip, chips=D, layout=layout)))
        return [tile for seg in segs
                for tile in np.split(seg, len(seg) // tile_size(len(seg), block))]

    chip_tiles = [tiles(r) for r in range(D)]
    keys = [k for ts in chip_tiles for k in ts]
    counts = []
    for ts in chip_tiles:
        seen = [(k[None, :] <= q[:, None]) & (k[None, :] >= document_starts(cu, q)[:, None])
                for q in ts for k in keys]
        counts.append({"full": sum(bool(m.all()) for m in seen),
                       "masked": sum(bool(m.any() and not m.all()) for m in seen)})
    return counts


@pytest.mark.timeout(240)
def test_chips_skip_the_tiles_between_documents(monkeypatch):
    """ring, D = 2, tiles of 4: the (query tile, key tile) pairs each chip computes, forward and
    backward (counted on the host as they run), are exactly those some query sees some key of
    under the documents — the tiles and segment pairs between documents are skipped — and the
    mask is applied only where a tile is partly seen; fewer than the causal run computes."""
    D, cu = 2, docs(2)["short"]
    counts = collections.Counter()
    count_tile_calls(monkeypatch, lambda name, kind: jax.debug.callback(
        lambda chip: counts.update([(name, int(chip), kind)]), jax.lax.axis_index("cp")))
    q, k, v, w = inputs(D)
    for layout in LAYOUTS:
        counts.clear()
        attend = cp_attention(D, "ring", layout)
        order = shard_order(chips=D, seq_len=D * T_LOCAL, layout=layout)
        loss = lambda q, k, v, attend=attend: jnp.sum(attend(q, k, v, jnp.asarray(cu)) * w)
        jax.block_until_ready(jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(
            *(x[:, order] for x in (q, k, v))))
        jax.effects_barrier()
        expected = expected_tiles(D, layout, cu, BLOCK)
        causal = expected_tiles(D, layout, np.array([0, D * T_LOCAL]), BLOCK)
        for chip, want in enumerate(expected):
            for name in ("forward", "backward"):
                got = {kind: counts.get((name, chip, kind), 0) for kind in ("full", "masked")}
                assert got == want, (layout, name, chip, got, want)
        assert sum(sum(c.values()) for c in expected) < sum(sum(c.values()) for c in causal)
