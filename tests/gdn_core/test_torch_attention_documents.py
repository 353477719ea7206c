"""Packed documents (cu_seqlens) in torch attention: one chip (attention.causal_attention) and
context parallelism (cp.attention.attention_cp) for every attn_cp × layout × kernel, on real
gloo process groups, against each document run alone through one chip's attention; and the
work between documents skipped (the kernel calls counted as they run).

Boundaries (DOCS, T = D·12; zigzag segments of 6): inside a shard, at the shard edge (and at
a zigzag segment edge), a document spanning every shard, 1-token documents, an empty one.
Legend: D ranks, t tokens per rank, T = D·t, B batch, H query heads, G key/value heads,
E head_dim.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gdn_core.attention_documents import cu_seqlens_values, split_pair
from gdn_core.config import AttentionConfig
from gdn_core.cp_layout import LAYOUTS, local_positions
from gdn_core.cp_modes import ATTN_CP_MODES
from gdn_core.testing import assert_close, rel_err
from gdn_core.torch_gdn.attention import GatedAttention, causal_attention, rotary_cos_sin
from gdn_core.torch_gdn.attention_kernels import ATTENTION_KERNELS, tile_pairs
from gdn_core.torch_gdn.cp.attention import attention_cp
from gdn_core.torch_gdn.cp.attention_pairs import visible_pairs

from .torch_dist import run_in_process_group

B, T_LOCAL, H, G, E = 1, 12, 4, 2, 8
BLOCK = 4  # tiles of 4 tokens: several per segment
TOL = 1e-4
BF16_TOL = 3e-2  # bf16 q, k, v against float32 (test_torch_attention_kernels' BF16_TOL)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def docs(D: int) -> dict[str, tuple[int, ...]]:
    """cu_seqlens per case for T = 12·D."""
    T = D * T_LOCAL
    return {
        # inside shard 0 (3), a 1-token document (3), the shard edge T/D (also a zigzag one)
        "edges": (0, 3, 4, T // D, T),
        # one document over every shard and zigzag segment (2 … T−3), 1-token ones, an empty
        "spanning": (0, 2, 2, T - 3, T - 2, T),
        # many short ones, boundaries off every edge
        "short": tuple(sorted({0, T, *range(1, T, 5)})),
    }


def data(D: int) -> dict[str, np.ndarray]:
    """q [B, T, H, E], k, v [B, T, G, E], loss weights W like q, float32; keys share one
    direction per head (peaked softmax rows)."""
    rng = np.random.default_rng(300 + D)
    T = D * T_LOCAL
    k = 2.4 * rng.standard_normal((1, 1, G, E)) + 0.6 * rng.standard_normal((B, T, G, E))
    return {"q": rng.standard_normal((B, T, H, E)).astype(np.float32),
            "k": k.astype(np.float32),
            "v": rng.standard_normal((B, T, G, E)).astype(np.float32),
            "W": rng.standard_normal((B, T, H, E)).astype(np.float32)}


def bf16_rounded(x: np.ndarray) -> np.ndarray:
    return torch.tensor(x).bfloat16().float().numpy()


def each_document_alone(x: dict, cu, round_to_bf16: bool = False) -> dict[str, np.ndarray]:
    """The oracle: every document through one chip's causal attention on its tokens alone
    (scaled_dot_product_attention), outputs and gradients of Σ o·W, placed at its positions."""
    q, k, v = (torch.tensor(bf16_rounded(x[n]) if round_to_bf16 else x[n]).requires_grad_()
               for n in "qkv")
    parts = []
    for a, b in zip(cu, cu[1:]):
        if b > a:
            parts.append(F.scaled_dot_product_attention(
                *(t[:, a:b].transpose(1, 2) for t in (q, k, v)), is_causal=True,
                enable_gqa=True).transpose(1, 2))
    o = torch.cat(parts, dim=1)
    (o * torch.tensor(x["W"])).sum().backward()
    return {"o": o.detach().numpy(), "dq": q.grad.numpy(), "dk": k.grad.numpy(),
            "dv": v.grad.numpy()}


def visible_entries(cu) -> int:
    """(query, key) entries block-diagonal causal attention sees: Σ n(n+1)/2 over documents."""
    return sum((b - a) * (b - a + 1) // 2 for a, b in zip(cu, cu[1:]))


def computed_entries(pairs) -> int:
    """Entries the tiles of these (q slice, k slice, causal) pairs compute: a causal tile
    counts its lower triangle with the diagonal."""
    total = 0
    for q, k, causal in pairs:
        for q_t, k_t, diag in tile_pairs(q.stop - q.start, k.stop - k.start, causal, BLOCK):
            n, m = q_t.stop - q_t.start, k_t.stop - k_t.start
            total += n * (n + 1) // 2 if diag else n * m
    return total


# ---- one chip, and the pair splitting (no process group) ------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["edges", "spanning", "short"])
def test_single_chip_equals_dense_block_diagonal_mask(case):
    """causal_attention with cu_seqlens equals dense attention under the block-diagonal causal
    mask (float64, written out; compared in float32), outputs and gradients;
    GatedAttention.forward takes it too,
    at global rotary positions."""
    D = 2
    T, cu = D * T_LOCAL, docs(D)[case]
    x = {n: torch.tensor(a, dtype=torch.float64, requires_grad=n != "W")
         for n, a in data(D).items()}
    pos = torch.arange(T)
    doc = torch.tensor(np.searchsorted(cu, np.arange(T), side="right") - 1)
    mask = (pos[None] <= pos[:, None]) & (doc[None] == doc[:, None])
    ref = F.scaled_dot_product_attention(*(x[n].transpose(1, 2) for n in "qkv"),
                                         attn_mask=mask, enable_gqa=True).transpose(1, 2)
    got = causal_attention(x["q"], x["k"], x["v"], cu_seqlens=torch.tensor(cu))
    grads = [torch.autograd.grad((o * x["W"]).sum(), [x[n] for n in "qkv"])
             for o in (ref, got)]
    assert_close(f"{case}: o", ref.detach(), got.detach(), 1e-6)
    for name, want, have in zip("qkv", *grads):
        assert_close(f"{case}: d{name}", want, have, 1e-6)
    cfg = AttentionConfig(num_heads=H, num_kv_heads=G, head_dim=E)
    layer = GatedAttention(cfg, 16, 1e-6).double()
    hidden = torch.randn(B, T, 16, dtype=torch.float64)
    cos, sin = rotary_cos_sin(pos[None], cfg)
    packed = layer(hidden, cos, sin, cu_seqlens=list(cu))
    start, stop = cu[-2], cu[-1]  # the last document alone, at its global positions
    alone = layer(hidden[:, start:stop], cos[:, start:stop], sin[:, start:stop])
    assert_close(f"{case}: layer, last document", alone.detach(),
                 packed[:, start:stop].detach(), 1e-6)


@pytest.mark.parametrize("D", [2, 3, 4, 8])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cross_document_work_is_skipped(layout, D):
    """Over every rank and key block, the tiles of the visible pairs compute exactly the
    entries block-diagonal causal attention sees (Σ n(n+1)/2 over documents; nothing between
    documents), for each boundary case and for 200 random ones; without documents, the causal
    T(T+1)/2."""
    T = D * T_LOCAL
    rng = np.random.default_rng(D)
    cases = list(docs(D).values()) + [
        (0, *sorted(rng.integers(0, T + 1, size=rng.integers(0, 6))), T) for _ in range(200)]
    for cu in cases:
        done = sum(computed_entries(visible_pairs(r, j, D, T_LOCAL, layout, cu))
                   for r in range(D) for j in range(D))
        assert done == visible_entries(cu), (cu, done)
    whole = sum(computed_entries(visible_pairs(r, j, D, T_LOCAL, layout))
                for r in range(D) for j in range(D))
    assert whole == T * (T + 1) // 2


def test_split_pair_skips_a_pair_whose_documents_ended():
    """Keys 0 … 5 before queries 12 … 17: the queries' first document starts at 8, after every
    key, so nothing is computed; starting at 4, one unmasked rectangle (queries of that
    document × its keys 4, 5); a diagonal segment is cut into causal squares."""
    q, k = slice(6, 12), slice(0, 6)
    assert split_pair(q, 12, k, 0, False, (0, 8, 24)) == []
    assert split_pair(q, 12, k, 0, False, (0, 4, 14, 24)) == [(slice(6, 8), slice(4, 6), False)]
    assert split_pair(q, 12, q, 12, True, (0, 4, 14, 15, 24)) == [
        (slice(6, 8), slice(6, 8), True), (slice(8, 9), slice(8, 9), True),
        (slice(9, 12), slice(9, 12), True)]


@pytest.mark.parametrize("cu, match", [
    ((0, 5, 23), "must run non-decreasing from 0 to seq_len=24"),
    ((0, 9, 4, 24), "must run non-decreasing"),
    ((24,), r"must be \[N\+1\] with N ≥ 1"),
    (torch.tensor([0.0, 24.0]), "must be an integer tensor"),
])
def test_malformed_cu_seqlens_are_refused(cu, match):
    with pytest.raises(ValueError, match=match):
        cu_seqlens_values(cu, seq_len=24)
    q = torch.zeros(1, 24, H, E)
    with pytest.raises(ValueError, match=match):
        causal_attention(q, q[:, :, :G], q[:, :, :G], cu_seqlens=cu)


# ---- context parallelism on gloo --------------------------------------------------------------

class CountingKernel:
    """An attention kernel that records the (q tokens, k tokens, causal) of every call."""

    def __init__(self, kernel, calls):
        self.kernel, self.calls, self.name = kernel, calls, kernel.name

    def forward(self, q, k, v, *, causal, scale):
        self.calls.append(("forward", q.shape[2], k.shape[2], causal))
        return self.kernel.forward(q, k, v, causal=causal, scale=scale)

    def backward(self, do, q, k, v, o, lse, *, causal, scale):
        self.calls.append(("backward", q.shape[2], k.shape[2], causal))
        return self.kernel.backward(do, q, k, v, o, lse, causal=causal, scale=scale)


def rank_job(rank: int, D: int) -> dict:
    """Every case of one rank: o, dq, dk, dv of its shard for each (mode, layout, kernel,
    dtype, documents), and the kernel calls each made."""
    from gdn_core.torch_gdn.attention_kernels import attention_kernel
    from gdn_core.torch_gdn.cp import attention as cp_attention

    calls: list = []
    cp_attention.attention_kernel = lambda name, block: CountingKernel(
        attention_kernel(name, block=block), calls)
    x = data(D)
    out = {}
    for (case, cu), mode, layout, kernel, dtype in all_cases(D):
        pos = local_positions(chip=rank, chips=D, seq_len=D * T_LOCAL, layout=layout)
        q, k, v = (torch.tensor(x[n][:, pos]).to(DTYPES[dtype]).requires_grad_()
                   for n in "qkv")
        calls.clear()
        o = attention_cp(q, k, v, group=None, mode=mode, layout=layout, kernel=kernel,
                         block=BLOCK, cu_seqlens=None if cu is None else torch.tensor(cu))
        (o.float() * torch.tensor(x["W"][:, pos])).sum().backward()
        out[case, mode, layout, kernel, dtype] = {
            "o": o.detach().float().numpy(), "dq": q.grad.float().numpy(),
            "dk": k.grad.float().numpy(), "dv": v.grad.float().numpy(), "calls": list(calls)}
    return out


def all_cases(D: int):
    """(documents case, mode, layout, kernel, dtype) of every run; case 'none': no cu_seqlens."""
    cases = [*docs(D).items(), ("none", None)]
    return [(c, m, lay, ker, dt) for c in cases for m in ATTN_CP_MODES for lay in LAYOUTS
            for ker in ATTENTION_KERNELS for dt in DTYPES]


@functools.cache
def results(D: int) -> list[dict]:
    return run_in_process_group(rank_job, world_size=D, timeout_s=240)


DS = [2, pytest.param(4, marks=pytest.mark.slow)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", ATTN_CP_MODES)
def test_cp_documents_equal_each_document_alone(mode, layout, D):
    """Each rank's o, dq, dk, dv, placed at its tokens' global positions, equal every document
    run alone on one chip: float32 within 1e-4 (both kernels), bf16 within BF16_TOL of the
    float32 attention of the bf16-rounded inputs."""
    ranks, x = results(D), data(D)
    for case, cu in docs(D).items():
        causal = each_document_alone(x, (0, D * T_LOCAL))["o"]  # documents must matter
        assert rel_err(causal, each_document_alone(x, cu)["o"]) > 100 * TOL
        for dtype in DTYPES:
            ref = each_document_alone(x, cu, round_to_bf16=dtype == "bfloat16")
            tol = TOL if dtype == "float32" else BF16_TOL
            for kernel in ATTENTION_KERNELS:
                for name in ("o", "dq", "dk", "dv"):
                    full = np.zeros_like(ref[name])
                    for rank, r in enumerate(ranks):
                        pos = local_positions(chip=rank, chips=D, seq_len=D * T_LOCAL,
                                              layout=layout)
                        full[:, pos] = r[case, mode, layout, kernel, dtype][name]
                    assert_close(f"{mode}-{layout}-D{D} {case} {kernel} {dtype}: {name}",
                                 ref[name], full, tol)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("D", DS, ids="D{}".format)
@pytest.mark.parametrize("mode", ATTN_CP_MODES)
def test_cp_kernel_calls_skip_cross_document_work(mode, D):
    """The kernel calls each mode made (counted as they ran, forward and backward alike) cover
    exactly the entries block-diagonal causal attention sees, summed over ranks — fewer than
    the causal run's; and without documents the calls are today's."""
    ranks = results(D)
    T = D * T_LOCAL
    for layout in LAYOUTS:
        for case, cu in [*docs(D).items(), ("none", None)]:
            for step in ("forward", "backward"):
                pairs = [(slice(0, n), slice(0, m), causal) for r in ranks
                         for name, n, m, causal in r[case, mode, layout, "tiles", "float32"][
                             "calls"] if name == step]
                want = T * (T + 1) // 2 if cu is None else visible_entries(cu)
                if mode == "ulysses":  # every rank attends the whole sequence (its heads)
                    want *= D
                assert computed_entries(pairs) == want, (layout, case, step)
