"""Packed documents in causal attention: which (query, key) blocks stay visible.

A packed sequence is documents back to back; `cu_seqlens` (integer, [N+1], 0 = c_0 ≤ c_1 ≤ … ≤
c_N = T, flash-linear-attention's and flash-attn's varlen convention, GLOBAL positions) says
document i holds positions c_i … c_{i+1} − 1 (an empty document, c_i = c_{i+1}, holds none).
Attention becomes block-diagonal causal: the query at position p sees the key at p' iff

    start(p) ≤ p' ≤ p,   start(p) = c_doc(p),   doc(p) = max{i : c_i ≤ p}

(doc(p) is p's document id; start(p) the first position of its document). A query always sees
itself, so no row is ever empty. cu_seqlens is tiny, so every chip gets it whole and derives
its tokens' document ids and starts from their global positions (cp_layout.local_positions):
nothing about documents crosses chips. The same boundaries hold for every batch row (B = 1 in
flash-linear-attention's convention; any B here).

Rotary positions stay GLOBAL (the position in the packed sequence, not in the document), as
the published packed training does: documents only change which keys a query sees.

Plain Python/numpy, for both frameworks: torch cuts segment pairs by these boundaries on the
host (split_pair); JAX masks with document starts traced from a cu_seqlens array.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def cu_seqlens_values(cu_seqlens, *, seq_len: int) -> tuple[int, ...]:
    """The boundaries as Python ints, after checking them: raise ValueError naming the values
    unless cu_seqlens is an integer [N+1] sequence (N ≥ 1) running non-decreasing from 0 to
    seq_len. Accepts a torch tensor, a numpy array or a sequence of ints (a tensor on a GPU
    costs one host copy)."""
    if hasattr(cu_seqlens, "detach"):  # torch
        if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex:
            raise ValueError(f"cu_seqlens must be an integer tensor, got {cu_seqlens.dtype}")
        cu_seqlens = cu_seqlens.detach().cpu().numpy()
    array = np.asarray(cu_seqlens)
    if array.ndim != 1 or array.size < 2:
        raise ValueError(f"cu_seqlens {tuple(array.shape)} must be [N+1] with N ≥ 1")
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(f"cu_seqlens must be integers, got {array.dtype}")
    values = tuple(int(c) for c in array)
    if values[0] != 0 or values[-1] != seq_len or any(b < a for a, b in zip(values, values[1:])):
        shown = list(values) if len(values) <= 12 else [*values[:5], "…", *values[-5:]]
        raise ValueError(f"cu_seqlens={shown} must run non-decreasing from 0 to "
                         f"seq_len={seq_len}")
    return values


def document_ids(cu: Sequence[int], positions) -> np.ndarray:
    """doc(p) for each global position p: int64, max{i : c_i ≤ p}."""
    return np.searchsorted(np.asarray(cu), np.asarray(positions), side="right") - 1


def document_starts(cu: Sequence[int], positions) -> np.ndarray:
    """start(p) = c_doc(p) for each global position p: int64 (the first key p may see)."""
    return np.asarray(cu, dtype=np.int64)[document_ids(cu, positions)]


def pieces(cu: Sequence[int], first: int, size: int) -> list[tuple[int, int]]:
    """[start, stop) global runs of the segment first … first + size − 1 cut at document
    boundaries, in order (empty documents give no piece)."""
    stop = first + size
    cuts = sorted({first, stop, *(c for c in cu if first < c < stop)})
    return list(zip(cuts, cuts[1:]))


Pair = tuple[slice, slice, bool]


def split_pair(q_slice: slice, q_first: int, k_slice: slice, k_first: int, causal: bool,
               cu: Sequence[int]) -> list[Pair]:
    """The visible (query slice, key slice, causal) sub-pairs of one segment pair under
    documents, in local slices. The pair: queries at global q_first … q_first + s − 1 (local
    q_slice), keys at k_first … (local k_slice), s tokens each; causal=True on the diagonal
    (the same segment), False when every key precedes every query.

    Diagonal: one causal square per document piece of the segment (the triangles between
    documents are skipped). Keys before queries: only the document holding the segment's
    first query can reach back into the key segment, so at most ONE unmasked rectangle: the
    queries of that document × its keys in the key segment; nothing when that document starts
    after the key segment ends (every key's document has ended before the first query's
    began: the pair is skipped entirely). So no sub-pair needs a mask, and no score is
    computed that a query does not see."""
    s = q_slice.stop - q_slice.start
    if causal:
        return [(slice(q_slice.start + a - q_first, q_slice.start + b - q_first),
                 slice(k_slice.start + a - k_first, k_slice.start + b - k_first), True)
                for a, b in pieces(cu, q_first, s)]
    start = int(document_starts(cu, [q_first])[0])
    k_stop = k_first + (k_slice.stop - k_slice.start)
    if start >= k_stop:
        return []
    q_end = min(int(np.asarray(cu)[document_ids(cu, [q_first])[0] + 1]), q_first + s)
    return [(slice(q_slice.start, q_slice.start + q_end - q_first),
             slice(k_slice.start + max(start, k_first) - k_first, k_slice.stop), False)]
