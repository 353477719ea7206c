"""The reference attention kernel, `tiles`: one segment pair blockwise in plain torch.

The pair's queries meet its keys in tiles of at most `block` tokens (BLOCK_TOKENS, cut to the
segment), flash-style: each tile's float32 scores are merged into float32 (output,
log-sum-exp) statistics; the backward recomputes each tile's probabilities from the given
(final) log-sum-exp. On a causal (diagonal) pair the query and key blocks share boundaries:
tiles on the diagonal are masked within, those below run unmasked, those above are skipped, so
only the causal work is done. The temporaries are about two float32 tiles of
[B, H, block, block] and pair-sized float32 statistics, whatever the sequence: nothing of size
s² or s·s'.

Precision: float32 arithmetic on the operands as given. q, k, v and dO keep their dtype in
memory and are read into float32 one tile at a time (exact for bf16); scores, P, dS, output,
log-sum-exp, Δ and the gradients are float32. So float32 inputs run in float32 (the ground
truth) and bf16 inputs give the float32 attention of those bf16 values: bf16 attention with
float32 statistics, with no float32 copy of q or of a gathered K/V (only tiles), as the fused
kernel holds none. Why not also round P and dS to bf16 before their matmuls, as a bf16 flash
kernel does: tried, it made the reference no closer to the fused kernel (relative gap in dq
1.6e-2 against 1.5e-2, the bf16 pair test's inputs) and further from float32 (dq 1.45e-2
against 9.5e-3, which is the bf16 rounding of the inputs alone). Unrounded, a check of the
fused kernel against the reference measures the fused kernel's own rounding, not two kernels'.
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
        G = k_BGsE.shape[1]
        q = q_BHsE.unflatten(1, (G, -1))  # [B, G, r, s, E], a view
        o = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        for q_sl, k_sl, diag in tile_pairs(q.shape[3], k_BGsE.shape[2], causal, self.block):
            p = _scores(q[..., q_sl, :], k_BGsE[..., k_sl, :], scale, diag)
            lse_tile = torch.logsumexp(p, dim=-1)  # finite: every row sees at least one key
            o_tile = torch.einsum("bgrqk,bgke->bgrqe", p.sub_(lse_tile[..., None]).exp_(),
                                  v_BGsE[..., k_sl, :].float())
            del p
            merge_into(o[..., q_sl, :], lse[..., q_sl], o_tile, lse_tile)
        return o.flatten(1, 2), lse.flatten(1, 2)

    def backward(self, do_BHsE, q_BHsE, k_BGsE, v_BGsE, o_BHsE, lse_BHs, *, causal: bool,
                 scale: float):
        """float32 (dq [B, H, s, E], dk, dv [B, G, s', E]) of this pair, each tile's
        probabilities recomputed from the final log-sum-exp."""
        G = k_BGsE.shape[1]
        q, do = q_BHsE.unflatten(1, (G, -1)), do_BHsE.unflatten(1, (G, -1))
        lse = lse_BHs.unflatten(1, (G, -1))
        delta = (do.float() * o_BHsE.unflatten(1, (G, -1)).float()).sum(-1)  # [B, G, r, s]
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        dk, dv = (torch.zeros(k_BGsE.shape, dtype=torch.float32, device=q.device)
                  for _ in range(2))
        for q_sl, k_sl, diag in tile_pairs(q.shape[3], k_BGsE.shape[2], causal, self.block):
            k, v, do_tile = k_BGsE[..., k_sl, :], v_BGsE[..., k_sl, :], do[..., q_sl, :].float()
            p = _scores(q[..., q_sl, :], k, scale, diag).sub_(lse[..., q_sl, None]).exp_()
            dv[..., k_sl, :] += torch.einsum("bgrqk,bgrqe->bgke", p, do_tile)
            ds = torch.einsum("bgrqe,bgke->bgrqk", do_tile, v.float())  # dP, then dS
            ds.sub_(delta[..., q_sl, None]).mul_(p).mul_(scale)
            del p
            dq[..., q_sl, :] += torch.einsum("bgrqk,bgke->bgrqe", ds, k.float())
            dk[..., k_sl, :] += torch.einsum("bgrqk,bgrqe->bgke", ds, q[..., q_sl, :].float())
        return dq.flatten(1, 2), dk, dv
