"""Packed variable-length documents in JAX: where each token's document began (as
torch_gdn.documents; see there for the cu_seqlens convention).

cu_seqlens (integer, [N+1], 0 = c_0 ≤ … ≤ c_N = T, all rows): the state is zero entering each
document after the first, and the causal conv sees no token of an earlier document. Works
from global token positions, traced or not, so a CP chip derives its boundaries from its own
positions (cp_layout) inside shard_map; cu_seqlens may be traced (its values are checked only
when concrete).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ..attention_documents import cu_seqlens_values


def check_cu_seqlens(cu_seqlens, *, seq_len: int) -> None:
    """Raise ValueError naming the values unless cu_seqlens is an integer [N+1] array running
    non-decreasing from 0 to seq_len (values checked only when concrete:
    attention_documents.cu_seqlens_values)."""
    shape = tuple(np.shape(cu_seqlens))
    if len(shape) != 1 or shape[0] < 2:
        raise ValueError(f"cu_seqlens {shape} must be [N+1] with N ≥ 1")
    if not jnp.issubdtype(jnp.result_type(cu_seqlens), jnp.integer):
        raise ValueError(f"cu_seqlens must be an integer array, got {jnp.result_type(cu_seqlens)}")
    if not isinstance(cu_seqlens, jax.core.Tracer):
        cu_seqlens_values(np.asarray(cu_seqlens), seq_len=seq_len)


def tokens_since_start(cu_seqlens, positions):
    """For each global position p (any shape), p − (the start of p's document), int32."""
    cu = jnp.asarray(cu_seqlens, jnp.int32)
    positions = jnp.asarray(positions, jnp.int32)
    doc = jnp.clip(jnp.searchsorted(cu, positions, side="right") - 1, 0, cu.shape[0] - 1)
    return positions - cu[doc]


def document_starts(cu_seqlens, positions):
    """bool, positions' shape: True where the token begins a document other than the first
    (the state entering it is zero); global position 0 is never marked."""
    positions = jnp.asarray(positions, jnp.int32)
    return (tokens_since_start(cu_seqlens, positions) == 0) & (positions > 0)
