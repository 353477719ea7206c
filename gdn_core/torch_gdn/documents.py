"""Packed variable-length documents: where each token's document began.

A packed sequence is documents back to back; `cu_seqlens` (integer, [N+1], 0 = c_0 ≤ c_1 ≤ … ≤
c_N = T, flash-linear-attention's convention) says document i holds tokens c_i … c_{i+1} − 1,
in every row of the batch alike (fla packs along T with B = 1; a B-row batch here is B
sequences packed the same way). Under it the recurrent state is zero entering each document
after the first (the first starts from `initial_state`), and the causal conv sees no token of an
earlier document. Everything here works from global token positions, so a context-parallel rank (which
receives the global cu_seqlens: it is tiny) derives its own boundaries from its layout's
positions (gdn_core.cp_layout.local_positions) with the same two functions.
"""

from __future__ import annotations

import torch

from ..attention_documents import cu_seqlens_values
from .device_index import device_index


def check_cu_seqlens(cu_seqlens: torch.Tensor, *, seq_len: int) -> None:
    """Raise ValueError naming the values unless cu_seqlens is an integer [N+1] tensor running
    non-decreasing from 0 to seq_len (attention_documents.cu_seqlens_values: reads its values,
    one host copy when it lives on a GPU: keep it on the CPU)."""
    cu_seqlens_values(cu_seqlens, seq_len=seq_len)


def tokens_since_start(cu_seqlens: torch.Tensor, positions_T: torch.Tensor) -> torch.Tensor:
    """For each global position p, p − (the start of p's document): int64 [T] on positions'
    device. The causal conv of kernel K sees tap j ≤ K−1 of token p only where this is ≥ j.
    cu_seqlens lives on the host (train.packed_boundaries): its device copy is made once per
    boundaries and device (device_index), not once per layer and step."""
    cu = device_index(tuple, tuple(cu_seqlens.tolist()), device=positions_T.device)
    doc_T = torch.searchsorted(cu, positions_T, right=True) - 1
    return positions_T - cu[doc_T.clamp(0, cu.numel() - 1)]


def document_starts(cu_seqlens: torch.Tensor, positions_T: torch.Tensor) -> torch.Tensor:
    """bool [T]: True where the token at that global position begins a document other than the
    first (the state entering it is zero); global position 0 is never marked (initial_state
    enters there)."""
    return (tokens_since_start(cu_seqlens, positions_T) == 0) & (positions_T > 0)


def sequence_positions(seq_len: int, device) -> torch.Tensor:
    """Global positions 0 … seq_len−1 (int64) of a sequence held whole."""
    return torch.arange(seq_len, device=device)
