"""The `documents` setting of a training step: how its sequences are packed from documents.

    single            every sequence is one document (what every trial ran before packing)
    uniform:LO-HI     documents of LO … HI tokens (uniform, integer), drawn from a fixed seed
                      and packed back to back; the last one is cut at seq_len

`document_boundaries` turns a setting into cu_seqlens (int32 [N+1], 0 … seq_len: flash-linear-
attention's convention), the same for both frameworks and every CP layout: the GDN state resets
and attention is block-diagonal at each boundary (torch_gdn/documents.py, jax_gdn/documents.py).
"""

from __future__ import annotations

import re

import numpy as np

SINGLE_DOCUMENT = "single"
_UNIFORM = re.compile(r"uniform:(\d+)-(\d+)")
DOCUMENTS_HELP = ("single (one document per sequence) or uniform:LO-HI (document lengths drawn "
                  "uniformly from LO to HI tokens, fixed seed, packed back to back)")


def document_length_range(documents: str) -> tuple[int, int] | None:
    """(LO, HI) of a uniform:LO-HI setting, None for single; ValueError naming the value and
    what is accepted otherwise."""
    if documents == SINGLE_DOCUMENT:
        return None
    match = _UNIFORM.fullmatch(documents) if isinstance(documents, str) else None
    if match is None:
        raise ValueError(f"documents={documents!r} is not {DOCUMENTS_HELP}")
    low, high = int(match[1]), int(match[2])
    if not 1 <= low <= high:
        raise ValueError(f"documents={documents!r}: lengths need 1 <= LO <= HI, got LO={low}, "
                         f"HI={high}")
    return low, high


def check_documents(documents: str) -> None:
    document_length_range(documents)


def document_boundaries(documents: str, *, seq_len: int, seed: int = 0) -> np.ndarray | None:
    """cu_seqlens (int32 [N+1], 0 … seq_len) of one packed sequence, None for single.

    The lengths come from numpy's generator seeded with `seed` (the step's TrainConfig.seed),
    so every process of a trial, in either framework, packs the same documents."""
    span = document_length_range(documents)
    if span is None:
        return None
    rng = np.random.default_rng([seed, 0x9ACC])  # apart from the token stream's seed
    boundaries, end = [0], 0
    while end < seq_len:
        end = min(seq_len, end + int(rng.integers(span[0], span[1] + 1)))
        boundaries.append(end)
    return np.asarray(boundaries, dtype=np.int32)


__all__ = ["DOCUMENTS_HELP", "SINGLE_DOCUMENT", "check_documents", "document_boundaries",
           "document_length_range"]
