"""A one-chip GDN rule kernel (gdn_kernels: fla-core's, or the reference as its CPU stand-in)
composed with this package's CP exchanges through the kernel's public call alone.

The rule's state map over a shard is affine in the incoming state: h ↦ A h + b, h [K, V] per
(batch, value head), A [K, K], b [K, V]. A kernel call exposes that map through initial_state:
    final(initial_state = h0, values v) = A h0 + b(v),   b linear in v, A independent of v.
So ONE call with values v' = [0_K | v] (width K+V) from initial_state [I_K | 0] returns the packed
pair P = [A·I + b(0) | A·0 + b(v)] = [A | b], [B, H, K, K+V] float32: the form the exchanges
take (common.py). (Two calls, b from a zero state and A from the identity with zero values of
width K, give the same; one wider call shares the chunk-local work of both.)

Sequence-sharded modes (p2p, all_gather, log_scan), per segment of the shard (zigzag: two):
    1. P = summary call (float32 inputs, SUMMARY_DTYPE: the pair feeds every later rank);
    2. the mode's Exchange (p2p_exchange, …; zigzag: its ZigzagExchange) → h_in per segment;
    3. o = kernel(q, k, v, g, beta, initial_state=h_in).
Cost: 2 kernel calls per segment, the first at width K+V (≈ (K+V)/V + 1 of one rule call,
3× at K = V, forward and backward), against 1 for ulysses: after its all-to-all a rank holds
whole sequences of its heads, so one call from h0 gives o and the final state.
Gradients by autograd through the kernel calls and the exchanges (comm.py's differentiable
collectives); every rank runs the same graph of collectives, as in the reference path.

Packed documents (global cu_seqlens): each segment's calls take the document starts that fall
inside it as the kernel's own cu_seqlens (segment-local); a segment holding a start summarises
to [0 | b] by itself (the state entering its last document is zero), so the exchanges pass
nothing across it, and a segment that begins with a start is replayed from zero.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import torch

from ...cp_layout import Layout, local_positions
from .all_gather import all_gather_exchange, all_gather_zigzag_exchange
from .comm import rank_size
from .log_scan import log_scan_exchange, log_scan_zigzag_exchange
from .p2p import p2p_exchange, p2p_zigzag_exchange

SUMMARY_DTYPE = torch.float32
"""What the summary call computes in, whatever the inputs' dtype: its pair is composed into
every later rank's state (fla-core runs float32 dots as TF32 on GPUs that have it)."""

EXCHANGES = {
    "p2p": (p2p_exchange, p2p_zigzag_exchange),
    "all_gather": (all_gather_exchange, all_gather_zigzag_exchange),
    "log_scan": (log_scan_exchange, log_scan_zigzag_exchange),
}
"""Per sequence-sharded mode: (contiguous Exchange, ZigzagExchange) of common.py."""


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentDocuments:
    """The packed documents seen from one segment: its own calls' cu_seqlens and whether it
    begins a document (so enters from zero)."""

    cu_seqlens: torch.Tensor | None
    """Segment-local boundaries (int64 [n+1] on the host), None when no document starts
    inside the segment."""
    starts_fresh: bool


NO_DOCUMENTS = SegmentDocuments(cu_seqlens=None, starts_fresh=False)


@functools.lru_cache(maxsize=256)
def segment_documents(bounds: tuple[int, ...], *, rank: int, chips: int, seq_len: int,
                      layout: Layout) -> tuple[SegmentDocuments, ...]:
    """Per segment of this rank's shard (zigzag: two), where global packed documents
    (cu_seqlens values `bounds`) start inside it; computed on the host, once per shard."""
    positions = local_positions(chip=rank, chips=chips, seq_len=seq_len, layout=layout)
    parts = np.split(positions, 2 if layout == "zigzag" else 1)
    starts = np.array([b for b in bounds if 0 < b < seq_len], dtype=np.int64)
    answers = []
    for segment in parts:
        first, length = int(segment[0]), len(segment)
        inside = sorted({int(b) - first for b in starts if first < b < first + length})
        cu = None if not inside else torch.tensor([0, *inside, length], dtype=torch.int64)
        answers.append(SegmentDocuments(cu_seqlens=cu, starts_fresh=first in set(starts)))
    return tuple(answers)


def kernel_summary(kernel, q, k, v, g, beta, *, use_qk_l2norm: bool,
                   documents: SegmentDocuments = NO_DOCUMENTS) -> torch.Tensor:
    """This segment's packed pair P = [A | b] ([B, Hv, K, K+V], float32) from one kernel call
    (module docstring); differentiable in k, v, g, beta (q only shapes the discarded o)."""
    B, T, Hv, V = v.shape
    K = k.shape[-1]
    dtype = SUMMARY_DTYPE
    v_wide = torch.cat([v.new_zeros(B, T, Hv, K, dtype=dtype), v.to(dtype)], dim=-1)
    eye_KK = torch.eye(K, dtype=torch.float32, device=v.device)
    if documents.starts_fresh:  # nothing from before the segment reaches its end
        eye_KK = torch.zeros_like(eye_KK)
    identity_then_zeros = torch.cat([eye_KK.expand(B, Hv, K, K),
                                     torch.zeros(B, Hv, K, V, device=v.device)], dim=-1)
    _, P_BHKW = kernel(q.detach().to(dtype), k.to(dtype), v_wide, g.to(dtype), beta.to(dtype),
                       initial_state=identity_then_zeros, output_final_state=True,
                       use_qk_l2norm_in_kernel=use_qk_l2norm, cu_seqlens=documents.cu_seqlens)
    return P_BHKW.float().contiguous()


def chunk_gated_delta_rule_kernel_cp(kernel, q, k, v, g, beta, *, group, mode: str,
                                     h0_BHKV: torch.Tensor, output_final_state: bool,
                                     use_qk_l2norm: bool, layout: Layout = "contiguous",
                                     cu_seqlens: torch.Tensor | None = None):
    """This rank's shard of o ([B, t, Hv, Dv], q's dtype) and the global final state (or None)
    under a sequence-sharded `mode`, every rule step a call of `kernel` (module docstring).

    Arguments as in chunk_gated_delta_rule_cp (validated there); layout 'zigzag': the shard is
    segments r and 2D−1−r, each summarised and replayed on its own; cu_seqlens: the global
    packed-document boundaries (on the host), as there.
    """
    if mode not in EXCHANGES:
        raise ValueError(f"mode={mode!r} is not one of the sequence-sharded modes: "
                         f"{', '.join(EXCHANGES)}")
    contiguous, zigzag = EXCHANGES[mode]
    parts = 2 if layout == "zigzag" else 1
    segments = list(zip(*(x.chunk(parts, dim=1) for x in (q, k, v, g, beta))))
    rank, D = rank_size(group)
    documents = (NO_DOCUMENTS,) * parts if cu_seqlens is None else segment_documents(
        tuple(cu_seqlens.tolist()), rank=rank, chips=D, seq_len=q.shape[1] * D, layout=layout)
    pairs = [kernel_summary(kernel, *segment, use_qk_l2norm=use_qk_l2norm, documents=docs)
             for segment, docs in zip(segments, documents)]
    if layout == "zigzag":
        h_ins, final_BHKV = zigzag(tuple(pairs), h0_BHKV, group=group,
                                   output_final_state=output_final_state)
    else:
        h_in, final_BHKV = contiguous(pairs[0], h0_BHKV, group=group,
                                      output_final_state=output_final_state)
        h_ins = (h_in,)
    # A segment that begins a document enters from zero; h_in · 0 rather than a new zero
    # tensor keeps the exchange in this rank's backward graph, so every rank's backward
    # issues the same collectives in the same order.
    outputs = [kernel(*segment, output_final_state=False, use_qk_l2norm_in_kernel=use_qk_l2norm,
                      initial_state=h_in * 0 if docs.starts_fresh else h_in,
                      cu_seqlens=docs.cu_seqlens)[0]
               for segment, h_in, docs in zip(segments, h_ins, documents)]
    return (outputs[0] if parts == 1 else torch.cat(outputs, dim=1)), final_BHKV
