"""Chunked cross-entropy: the LM head and the loss over token chunks, no [tokens, V] buffer.

Each chunk's logits are computed, reduced to a summed loss and dropped; backward recomputes
them chunk by chunk (torch.utils.checkpoint per chunk), so at most one chunk's [c, V] float32
logits (and their gradient) exist at any time. The price is one extra LM-head forward matmul
in backward (hardware FLOPs, not model FLOPs).
Legend: N tokens (B·T flattened), D hidden, V vocabulary, c tokens per chunk.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

LOSS_CHUNK_LOGITS = 2**26
"""Logit elements per chunk by default (256 MiB of float32 logits): 270 tokens at Qwen3.5's
vocabulary of 248,320."""


def loss_chunk_tokens(vocab_size: int) -> int:
    """Default tokens per loss chunk: LOSS_CHUNK_LOGITS // vocab_size (at least 1)."""
    return max(1, LOSS_CHUNK_LOGITS // vocab_size)


def _chunk_loss_sum(hidden_cD: torch.Tensor, weight_VD: torch.Tensor,
                    targets_c: torch.Tensor) -> torch.Tensor:
    # The matmul follows autocast (bf16 under bfloat16); the softmax is float32.
    logits_cV = F.linear(hidden_cD, weight_VD).float()
    return F.cross_entropy(logits_cV, targets_c, reduction="sum")


def chunked_cross_entropy_sum(hidden_BTD: torch.Tensor, weight_VD: torch.Tensor,
                              targets_BT: torch.Tensor, *,
                              chunk_tokens: int | None = None) -> torch.Tensor:
    """Return Σ_tokens cross_entropy(hidden · weightᵀ, targets), a float32 scalar.

    Args:
        hidden_BTD: final normed hidden states [B, T, D].
        weight_VD: LM head weight [V, D].
        targets_BT: integer targets [B, T].
        chunk_tokens: tokens per chunk (default loss_chunk_tokens(V)); every rank of a CP group
            holds the same number of tokens, so all take the same chunks.
    """
    if chunk_tokens is None:
        chunk_tokens = loss_chunk_tokens(weight_VD.shape[0])
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens} must be a positive integer")
    if hidden_BTD.shape[:-1] != targets_BT.shape:
        raise ValueError(f"hidden_BTD {tuple(hidden_BTD.shape)} and targets_BT "
                         f"{tuple(targets_BT.shape)} must share [B, T]")
    hidden_ND = hidden_BTD.flatten(0, 1)
    targets_N = targets_BT.flatten().long()
    total = hidden_ND.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden_ND.shape[0], chunk_tokens):
        stop = start + chunk_tokens
        total = total + checkpoint(_chunk_loss_sum, hidden_ND[start:stop], weight_VD,
                                   targets_N[start:stop], use_reentrant=False)
    return total
