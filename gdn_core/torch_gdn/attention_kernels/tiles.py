"""The reference attention kernel, `tiles`: one segment pair blockwise in plain torch.

The pair's queries meet its keys in tiles of at most `block` tokens (BLOCK_TOKENS, cut to the
segment), flash-style: each tile's float32 scores are merged into float32 (output,
log-sum-exp) statistics; the backward recomputes each tile's probabilities from the given
(final) log-sum-exp. On a causal (diagonal) pair the query and key blocks share boundaries:
tiles on the diagonal are masked within, those below run unmasked, those above are skipped, so
only the causal work is done. The temporaries are about two float32 tiles of
[B, H, block, block] and pair-sized float32 statistics, whatever the sequence: nothing of size
s² or s·s'.

Precision: operands in the input dtype, products and statistics in float32. q, k, v and dO
enter the matmuls as given; P and dS are rounded to the input dtype before the matmuls that
read them (P·V, Pᵀ·dO, dS·K, dSᵀ·Q), as a bf16 flash kernel does; scores, softmax, output,
log-sum-exp, Δ and the gradients accumulate in float32. So float32 inputs run exactly in float32
(the ground truth), and bf16 inputs run bf16 attention with float32 statistics: the numerics of
the fused kernel, not a float32 attention beside it. That is the better reference for bf16:
fused and reference then differ by round-off order only (tests state both gaps to float32), and
like the fused kernel it keeps no float32 copy of q or of a gathered K/V, only tiles.
Legend: B batch, H query heads, G key/value heads, r = H/G, s query tokens, s' key tokens.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import torch

BLOCK_TOKENS = 512  # query / key tokens per tile (cut to the segment)


def tile_pairs(q_len: int, k_len: int, causal: bool,
               block: int) -> list[tuple[slice, slice, bool]]:
    """(query block, key block, causal) tiles of at most `block` tokens covering one segment
    pair of q_len queries and k_len keys; a causal pair (q_len = k_len) keeps the tiles on and
    below its diagonal, the diagonal ones causal."""
    def blocks(n):
        return [slice(s, min(s + block, n)) for s in range(0, n, block)]

    return [(q_blk, k_blk, causal and j == i) for i, q_blk in enumerate(blocks(q_len))
            for j, k_blk in enumerate(blocks(k_len)) if not causal or j <= i]


def merge_into(o_BHsE: torch.Tensor, lse_BHs: torch.Tensor, o_part: torch.Tensor,
               lse_part: torch.Tensor) -> None:
    """Merge a part's attention (o_part, lse_part: the same queries over other keys) into the
    running float32 o, lse in place: lse' = log(e^lse + e^lse_part),
    o' = o·e^(lse − lse') + o_part·e^(lse_part − lse'). A running lse of −inf (no key yet)
    takes the part as is."""
    merged = torch.logaddexp(lse_BHs, lse_part)
    o_BHsE.mul_(torch.exp(lse_BHs - merged)[..., None])
    o_BHsE.add_(o_part * torch.exp(lse_part - merged)[..., None])
    lse_BHs.copy_(merged)


def _operand(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x as a matmul in `dtype` reads it, in float32: rounded to dtype first when dtype is
    narrower than float32 (bf16, fp16); float32 (and float64) inputs compute in float32."""
    return (x.to(dtype) if dtype.itemsize < 4 else x).float()


def _scores(q_BGrqE, k_BGkE, scale: float, causal: bool) -> torch.Tensor:
    """float32 scores of one tile [B, G, r, q, k]; keys after the query −inf on a causal tile.
    Built in place (as are the tile's later steps), so one tile buffer is live, not several."""
    s = torch.einsum("bgrqe,bgke->bgrqk", q_BGrqE.float(), k_BGkE.float()).mul_(scale)
    if causal:
        n = s.shape[-1]
        s.masked_fill_(torch.ones(n, n, dtype=torch.bool, device=s.device).triu(1),
                       float("-inf"))
    return s


@dataclasses.dataclass(frozen=True, slots=True)
class TilesKernel:
    """The reference kernel (module docstring); `block`: tokens per tile."""

    block: int = BLOCK_TOKENS
    name: ClassVar[str] = "tiles"

    def forward(self, q_BHsE, k_BGsE, v_BGsE, *, causal: bool, scale: float):
        """(o [B, H, s, E] float32, lse [B, H, s] float32) of q over this pair's keys."""
        dtype, G = q_BHsE.dtype, k_BGsE.shape[1]
        q = q_BHsE.unflatten(1, (G, -1))  # [B, G, r, s, E], a view
        o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        for q_sl, k_sl, diag in tile_pairs(q.shape[3], k_BGsE.shape[2], causal, self.block):
            p = _scores(q[..., q_sl, :], k_BGsE[..., k_sl, :], scale, diag)
            lse_tile = torch.logsumexp(p, dim=-1)  # finite: every row sees at least one key
            p = _operand(p.sub_(lse_tile[..., None]).exp_(), dtype)
            o_tile = torch.einsum("bgrqk,bgke->bgrqe", p, v_BGsE[..., k_sl, :].float())
            del p
            merge_into(o[..., q_sl, :], lse[..., q_sl], o_tile, lse_tile)
        return o.flatten(1, 2), lse.flatten(1, 2)

    def backward(self, do_BHsE, q_BHsE, k_BGsE, v_BGsE, o_BHsE, lse_BHs, *, causal: bool,
                 scale: float):
        """float32 (dq [B, H, s, E], dk, dv [B, G, s', E]) of this pair, each tile's
        probabilities recomputed from the final log-sum-exp."""
        dtype, G = q_BHsE.dtype, k_BGsE.shape[1]
        q, do = q_BHsE.unflatten(1, (G, -1)), do_BHsE.unflatten(1, (G, -1))
        lse = lse_BHs.unflatten(1, (G, -1))
        delta = (do.float() * o_BHsE.unflatten(1, (G, -1)).float()).sum(-1)  # [B, G, r, s]
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk, dv = (torch.zeros(k_BGsE.shape, dtype=torch.float32, device=q.device)
                  for _ in range(2))
        for q_sl, k_sl, diag in tile_pairs(q.shape[3], k_BGsE.shape[2], causal, self.block):
            k, v, do_tile = k_BGsE[..., k_sl, :], v_BGsE[..., k_sl, :], do[..., q_sl, :].float()
            p = _scores(q[..., q_sl, :], k, scale, diag).sub_(lse[..., q_sl, None]).exp_()
            dv[..., k_sl, :] += torch.einsum("bgrqk,bgrqe->bgke", _operand(p, dtype), do_tile)
            ds = torch.einsum("bgrqe,bgke->bgrqk", do_tile, v.float())  # dP, then dS
            ds = _operand(ds.sub_(delta[..., q_sl, None]).mul_(p).mul_(scale), dtype)
            del p
            dq[..., q_sl, :] += torch.einsum("bgrqk,bgke->bgrqe", ds, k.float())
            dk[..., k_sl, :] += torch.einsum("bgrqk,bgrqe->bgke", ds, q[..., q_sl, :].float())
        return dq.flatten(1, 2), dk, dv
