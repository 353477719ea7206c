"""JAX Gated DeltaNet: the chunked rule, its token-by-token reference, layer, model, CP.

Main entry points: `chunk_gated_delta_rule` (one chip) and, for context parallelism over a
mesh axis, `chunk_gated_delta_rule_cp`.
"""

from .chunk import chunk_gated_delta_rule
from .naive import recurrent_gated_delta_rule

__all__ = ["chunk_gated_delta_rule", "recurrent_gated_delta_rule"]
