"""Causal attention under context parallelism (cp.attention.attention_cp), every attn_cp mode ×
layout, on real gloo process groups.

The oracle is one chip's causal GQA attention (scaled_dot_product_attention) on the whole
sequence. One spawned job per D runs every case on every rank and returns numpy arrays; the
tests only compare. Legend: D ranks, t tokens per rank, T = D·t, B batch, H query heads,
G key/value heads, E head_dim.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from gdn_core.cp_layout import LAYOUTS, local_positions
from gdn_core.cp_modes import ATTN_CP_MODES, check_attention_cp_shape
from gdn_core.testing import assert_close, rel_err
from gdn_core.torch_gdn.attention_kernels import attention_kernel, tile_pairs
from gdn_core.torch_gdn.cp import count_comm
from gdn_core.torch_gdn.cp.attention import (
    BLOCK_TOKENS,
    _GatheredAttention,
    _visible_pairs,
    attention_cp,
    ring_saved_bytes_bound,
)

from .test_torch_cp_attention_memory import memory_job

# D = 2 in the default tier; D = 4 and 8 in the slow tier (test_torch_cp.py keeps D = 4 at the
# rule level: p2p's multi-hop wavefront and log_scan's second round).
DS = [2, pytest.param(4, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.slow)]
B, T_LOCAL, E, TOL = 2, 12, 8, 1e-4  # zigzag: two segments of 6 tokens per rank
BLOCK = 4  # tile tokens: 3 tiles per contiguous segment, 4 + 2 per zigzag one


def heads(D: int) -> tuple[int, int]:
    """(H, G): GQA 2:1 with fewer KV heads than ranks at D = 4 (ulysses replicates them)."""
    return (4, 2) if D <= 4 else (8, 2)


def data(D: int) -> dict[str, np.ndarray]:
    """q [B, T, H, E], k, v [B, T, G, E] and loss weights W like q, float32; k shares one
    direction per head (cosine ≈ 0.8) so the softmax is peaked, not uniform."""
    rng = np.random.default_rng(100 + D)
    H, G = heads(D)
    T = D * T_LOCAL
    shared = rng.standard_normal((1, 1, G, E))
    k = 0.8 * 3 * shared + 0.6 * rng.standard_normal((B, T, G, E))
    return {"q": rng.standard_normal((B, T, H, E)).astype(np.float32),
            "k": k.astype(np.float32),
            "v": rng.standard_normal((B, T, G, E)).astype(np.float32),
            "W": rng.standard_normal((B, T, H, E)).astype(np.float32)}


def positions(rank: int, D: int, layout: str) -> np.ndarray:
    return local_positions(chip=rank, chips=D, seq_len=D * T_LOCAL, layout=layout)


def run_case(rank: int, D: int, mode: str, layout: str, group=None) -> dict:
    """One rank (its position in `group`, of D): o, dq, dk, dv of its shard, counted bytes and
    the bytes autograd saved."""
    x, pos = data(D), positions(rank, D, layout)
    q, k, v = (torch.tensor(x[n][:, pos]).requires_grad_() for n in ("q", "k", "v"))
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with count_comm() as comm:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            o = attention_cp(q, k, v, group=group, mode=mode, layout=layout, block=BLOCK)
        (o * torch.tensor(x["W"][:, pos])).sum().backward()
    return {"o": o.detach().numpy(), "dq": q.grad.numpy(), "dk": k.grad.numpy(),
            "dv": v.grad.numpy(), "forward": comm.forward_bytes,
            "backward": comm.backward_bytes, "saved": sum(saved)}


def error_of(D: int) -> str:
    """attention_cp's message for ulysses with fewer query heads than ranks (before any
    exchange, on every rank)."""
    q = torch.zeros(1, 2, D // 2, E)
    try:
        attention_cp(q, q[:, :, :1], q[:, :, :1], group=None, mode="ulysses")
    except ValueError as e:
        return str(e)
    return "no error"


def subgroup_cases(rank: int, world: int) -> dict:
    """Every attention case on CP groups of 2 inside the world ({0, 1}, {2, 3}, …): the group
    that does not hold global rank 0 is where a group rank taken for a global one fails."""
    groups = [dist.new_group([g, g + 1]) for g in range(0, world, 2)]  # every rank calls each
    group = groups[rank // 2]
    return {(m, lay): run_case(rank % 2, 2, m, lay, group=group)
            for m in ATTN_CP_MODES for lay in LAYOUTS}


def attention_job(rank: int, D: int) -> dict:
    """Every attention case of one rank (run inside test_torch_cp_hybrid's spawned job), plus
    its allocator peaks (test_torch_cp_attention_memory), the kernels' cases
    (test_torch_attention_kernels) and, at D = 4, the cases on subgroups."""
    from .test_torch_attention_kernels import kernel_job  # it imports this module

    out = {(m, lay): run_case(rank, D, m, lay) for m in ATTN_CP_MODES for lay in LAYOUTS}
    out["few_heads"] = error_of(D)
    out["memory"] = memory_job(rank, D)
    out["kernels"] = kernel_job(rank, D)
    if D == 4:
        out["subgroups"] = subgroup_cases(rank, D)
    return out


def results(D: int) -> list[dict]:
    """Every rank's attention cases, from the one process group per D that the hybrid tests
    spawn (spawning dominates these tests' time)."""
    from .test_torch_cp_hybrid import cp_results  # it imports this module

    return [r["attention"] for r in cp_results(D)]


def reference(D: int) -> dict[str, np.ndarray]:
    """One chip: causal GQA attention on the whole sequence and its gradients."""
    x = data(D)
    q, k, v = (torch.tensor(x[n]).requires_grad_() for n in ("q", "k", "v"))
    o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                       is_causal=True, enable_gqa=True).transpose(1, 2)
    (o * torch.tensor(x["W"])).sum().backward()
    return {"o": o.detach().numpy(), "dq": q.grad.numpy(), "dk": k.grad.numpy(),
            "dv": v.grad.numpy()}


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", ATTN_CP_MODES)
def test_attention_cp_matches_single_chip(mode, layout, D):
    """Each rank's o, dq, dk, dv, placed at its tokens' global positions, equal one chip."""
    ranks, ref = [r[(mode, layout)] for r in results(D)], reference(D)
    T = D * T_LOCAL
    # Only meaningful if the last rank's queries depend on keys other ranks hold.
    x = data(D)
    last = slice(T - T_LOCAL // 2, T)
    alone = F.scaled_dot_product_attention(
        *(torch.tensor(x[n][:, last]).transpose(1, 2) for n in "qkv"), is_causal=True,
        enable_gqa=True).transpose(1, 2)
    assert rel_err(ref["o"][:, last], alone) > 100 * TOL
    for name in ("o", "dq", "dk", "dv"):
        full = np.zeros_like(ref[name])
        for rank, r in enumerate(ranks):
            full[:, positions(rank, D, layout)] = r[name]
        assert_close(f"{mode}-{layout}-D{D}: {name}", ref[name], full, TOL)


def expected_bytes(mode: str, D: int) -> tuple[int, int]:
    """(forward, backward) bytes a rank receives, docs/architecture.md's attention rows (fp32)."""
    H, G = heads(D)
    T, b = D * T_LOCAL, 4
    if mode == "all_gather_kv":  # (D−1)/D·T·B·G·2E·b each way (backward: reduce-scatter)
        each = (D - 1) * T // D * B * G * 2 * E * b
        return each, each
    if mode == "ring":  # forward (D−1)·(T/D)·B·G·2E·b; backward K/V again + fp32 dK/dV
        kv = (D - 1) * (T // D) * B * G * 2 * E
        return kv * b, kv * (b + 4)
    # ulysses: (D−1)/D of the local q, the KV heads each rank needs (Gl per rank), and o back
    Gl = G // D if G % D == 0 else 1 if D % G == 0 else H // D
    each = (D - 1) * T_LOCAL * B * E * b * (2 * H // D + 2 * Gl)
    return each, each


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("mode", ATTN_CP_MODES)
def test_attention_cp_bytes(mode, D):
    """Every rank receives the table's bytes in both layouts (zigzag re-shards nothing)."""
    for layout in LAYOUTS:
        for rank, r in enumerate(results(D)):
            got = (r[(mode, layout)]["forward"], r[(mode, layout)]["backward"])
            assert got == expected_bytes(mode, D), (layout, rank, got)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_ring_saves_only_its_own_blocks(D):
    """The ring's forward saves this rank's q, k, v, o and log-sum-exp: the same bytes at every
    D for a fixed local shard; all_gather_kv keeps the gathered K/V, which grows with D."""
    H, G = heads(D)
    own = ring_saved_bytes_bound(batch=B, local_tokens=T_LOCAL, num_heads=H, num_kv_heads=G,
                                 head_dim=E)
    kv_gathered = D * T_LOCAL * B * G * 2 * E * 4
    for layout in LAYOUTS:
        for r in results(D):
            assert r[("ring", layout)]["saved"] == own
            assert r[("all_gather_kv", layout)]["saved"] >= kv_gathered


@pytest.mark.parametrize("block", [2, 3, 8])
def test_zigzag_balances_ring_work(block):
    """Score elements each rank computes, in tiles of `block` tokens (a causal tile counts
    half): under contiguous the last rank does 2D−1 times the first's; under zigzag every rank
    does the same; either way the tiles do exactly the causal work of whole segment pairs
    (tiles above the diagonal, and segment pairs whose keys all follow, are skipped)."""
    D, t = 4, 8

    def work(rank, layout, pairs):
        return sum((q.stop - q.start) * (k.stop - k.start) / (2 if causal else 1)
                   for hop in range(D) for q, k, causal in pairs(rank, (rank - hop) % D, layout))

    def tiles(q_rank, k_rank, layout):  # the tiles kernel's tiles of every segment pair
        return [tile for q, k, causal in _visible_pairs(q_rank, k_rank, D, t, layout)
                for tile in tile_pairs(q.stop - q.start, k.stop - k.start, causal, block)]

    def segment_pairs(q_rank, k_rank, layout):
        return _visible_pairs(q_rank, k_rank, D, t, layout)

    contiguous = [work(r, "contiguous", tiles) for r in range(D)]
    zigzag = [work(r, "zigzag", tiles) for r in range(D)]
    assert contiguous[-1] / contiguous[0] == 2 * D - 1
    assert len(set(zigzag)) == 1 and sum(zigzag) == sum(contiguous)
    for layout in LAYOUTS:
        assert [work(r, layout, tiles) for r in range(D)] == [
            work(r, layout, segment_pairs) for r in range(D)]


@pytest.mark.parametrize("block", [1, 5, BLOCK_TOKENS])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_blockwise_attention_matches_single_chip(layout, block):
    """The blockwise attention all_gather_kv and ring share (no process group: every rank's
    queries against a gathered K/V built here) equals one chip for tiles of one
    token, tiles that do not divide a segment, and one tile per segment."""
    D, t = 3, 10  # zigzag: segments of 5 tokens
    T = D * t
    H, G = 4, 2
    rng = np.random.default_rng(7)
    q, k, v = (torch.tensor(rng.standard_normal((B, T, n, E)), requires_grad=True)
               for n in (H, G, G))
    w = torch.tensor(rng.standard_normal((B, T, H, E)))
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                         v.transpose(1, 2), is_causal=True,
                                         enable_gqa=True).transpose(1, 2)
    ref_grads = torch.autograd.grad((ref * w).sum(), (q, k, v))
    pos = [local_positions(chip=r, chips=D, seq_len=T, layout=layout) for r in range(D)]
    gathered = torch.stack([torch.stack([k, v])[:, :, p] for p in pos])  # [D, 2, B, t, G, E]
    o = torch.zeros_like(ref)
    loss = 0
    for rank in range(D):
        o_rank = _GatheredAttention.apply(q[:, pos[rank]], gathered, rank, layout, E ** -0.5,
                                          attention_kernel("tiles", block=block))
        o[:, pos[rank]] = o_rank.detach()
        loss = loss + (o_rank * w[:, pos[rank]]).sum()
    assert_close(f"{layout} block {block}: o", ref.detach().numpy(), o.numpy(), 1e-6)
    for name, want, got in zip("qkv", ref_grads, torch.autograd.grad(loss, (q, k, v))):
        assert_close(f"{layout} block {block}: d{name}", want.numpy(), got.numpy(), 1e-6)
    with pytest.raises(ValueError, match="block must be a positive number of tokens, got 0"):
        attention_cp(q, k, v, group=None, mode="ring", block=0)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("D", [2, pytest.param(4, marks=pytest.mark.slow)])  # D = 4: the
def test_ulysses_refuses_more_ranks_than_heads(D):  # 4-rank job the slow tier runs anyway
    heads = D // 2
    assert all(r["few_heads"] == f"attn_cp='ulysses' needs query heads ({heads}) divisible "
               f"by chips={D}: more chips ({D}) than query heads ({heads}); chips must be one "
               "of " + ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
               for r in results(D))
    with pytest.raises(ValueError, match=r"query heads \(4\) divisible by chips=8"):
        check_attention_cp_shape(attn_cp="ulysses", chips=8, num_heads=4,
                                 num_kv_heads=2, seq_len=64, layout="contiguous")
    with pytest.raises(ValueError, match="seq_len=36 is not divisible by 8"):
        check_attention_cp_shape(attn_cp="ring", chips=4, num_heads=4,
                                 num_kv_heads=2, seq_len=36, layout="zigzag")
    with pytest.raises(ValueError, match=r"query heads \(6\) must be a multiple of key/value "
                       r"heads \(4\)"):
        check_attention_cp_shape(attn_cp="ring", chips=2, num_heads=6,
                                 num_kv_heads=4, seq_len=8, layout="contiguous")
    with pytest.raises(ValueError, match="attn_cp='flash' is not one of: all_gather_kv"):
        check_attention_cp_shape(attn_cp="flash", chips=2, num_heads=4,
                                 num_kv_heads=2, seq_len=8, layout="contiguous")


@pytest.mark.slow  # the world-of-4 job (every D = 4 case with it): the slow tier's
@pytest.mark.timeout(200)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", ATTN_CP_MODES)
def test_attention_cp_on_subgroups(mode, layout):
    """Two CP groups of 2 inside a world of 4 ({0, 1} and {2, 3}): each equals one chip, and the
    bytes are the table's (every collective takes group ranks, not global ones)."""
    ref = reference(2)
    ranks = [r["subgroups"][(mode, layout)] for r in results(4)]
    for first in (0, 2):
        for name in ("o", "dq", "dk", "dv"):
            full = np.zeros_like(ref[name])
            for rank in (0, 1):
                full[:, positions(rank, 2, layout)] = ranks[first + rank][name]
            assert_close(f"{mode}-{layout} group {{{first}, {first + 1}}}: {name}", ref[name],
                         full, TOL)
        for r in ranks[first:first + 2]:
            assert (r["forward"], r["backward"]) == expected_bytes(mode, 2)
